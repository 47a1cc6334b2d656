"""Triton FlashAttention backward kernels, deterministic (no atomics).

Three launches, in reading order:
  1. ``bwd_preprocess_kernel``: delta = rowsum(dO * O) - dlse  (B, H, Lq) fp32, dlse the gradient
     that reaches the natural-log lse when the caller returned it (``attention(return_lse=True)``).
  2. ``bwd_dkdv_kernel``: one program per (batch, kv head, key tile); dK and dV stay in registers
     while it walks the query tiles that attend to its key tile (the transposed layout's CSR list),
     for each of the GROUP query heads of its kv head in turn: the GQA sum is a plain loop, so the
     result does not depend on scheduling.
  3. ``bwd_dq_kernel``: one program per (batch, query head, query tile); dQ in registers while it
     walks the same key tiles as the forward (``row_tile_range``).
Split lists (SPLIT; the launcher's ``SplitPlan``): a layout column or row far longer than the
others (BigBird's global block, attended by every query block) would keep one program running
long after the rest; its list is cut into contiguous chunks, each walked by its own program
(launched first), which writes an fp32 partial dK, dV or dQ to a scratch slot, and
  4. ``split_sum_kernel`` adds each split list's partials in slot order and writes the gradient:
     the sums, like everything else here, do not depend on scheduling.

Legend (D head dim, D_TILE the tiles' padded width), base-2 scores, the lse convention and the
packed documents (HAS_DOCS, DOC_START / DOC_END): see ``triton_flash_fwd.py``.  The padding
columns d >= D of q, k, v, dO read 0, so the matmuls over the head dim see zeros there and dQ,
dK, dV come out 0 in those columns, which the stores skip.
With p = exp2(s2 - lse) (the softmax) and dS = p * (dP - delta), dP = dO . V^T:
  dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.
dS is the gradient of the natural-log scores s = scale * q . k.  The lse's own gradient enters
through delta alone: d lse_i / d s_ij = p_ij, so a gradient g_i on lse_i adds g_i * p_ij to dS_ij,
which is dS = p * (dP - (delta - g)).
The band, the documents, VARLEN and the score modifiers are those of the forward
(``triton_flash_fwd.py``).  With a softcap, s = softcap * tanh(x), x = scale * q . k, so the
gradient reaching x is dS * (1 - t^2) (t the tanh the forward took); ALiBi's bias does not depend on
q or k.  With dropout (keep mask Z, kept probabilities scaled by r = 1 / (1 - p)):
  dV = (r Z * P)^T dO,   dS = P * (r Z * dP - delta),
delta = rowsum(dO * O) as before (O already holds the dropped, rescaled sum), the mask regenerated
from the seed (``triton_flash_fwd.dropout_keep``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from genoformer.kernels.triton_flash_fwd import (
    alibi_slope,
    base2_scores,
    clamp_ranges,
    doc_span,
    dropout_args,
    dropout_keep,
    head_ptr,
    load_tile,
    mma,
    order_ranges,
    query_rows,
    row_tile_range,
    scaled,
    seq_rows,
    slice_ptr,
    split_item,
    split_sum_rows,
    store_tile,
    stream_tile,
    tile_ptrs,
    tile_source,
    tile_start,
    tiles_ending_by,
    tiles_starting_before,
)


@triton.jit
def store_scaled(
    out_base, offs, sout_l, value, scale, rows_ok, offs_d, D: tl.constexpr, D_TILE: tl.constexpr, ALIGN8: tl.constexpr
):
    """Store scale * value in OUT's dtype at the rows offs of the slice out_base starts (a gradient's tile)."""
    ptrs = tile_ptrs(out_base, offs, sout_l, offs_d, ALIGN8)
    store_tile(ptrs, (value * scale).to(out_base.dtype.element_ty), rows_ok, offs_d, D, D_TILE)


@triton.jit
def bwd_preprocess_kernel(
    O,
    DO,
    DLSE,
    DELTA,
    so_b,
    so_h,
    so_l,
    sdo_b,
    sdo_h,
    sdo_l,
    H,
    Lq,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    # grid: (B * H, cdiv(Lq, BLOCK_M)).  DLSE (B, H, Lq) fp32, contiguous: the gradient of the
    # base-2 lse the forward stored (HAS_DLSE only)
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    row_ok = offs_m < Lq
    o = load_tile(
        tile_ptrs(head_ptr(O, b, so_b, h, so_h, ALIGN8), offs_m, so_l, offs_d, ALIGN8), row_ok, offs_d, D, D_TILE, True
    )
    do = load_tile(
        tile_ptrs(head_ptr(DO, b, sdo_b, h, sdo_h, ALIGN8), offs_m, sdo_l, offs_d, ALIGN8),
        row_ok,
        offs_d,
        D,
        D_TILE,
        True,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if HAS_DLSE:
        # a gradient g2 on lse2 = lse * log2(e) is g2 * log2(e) on the natural-log lse
        delta -= tl.load(DLSE + bh.to(tl.int64) * Lq + offs_m, mask=row_ok, other=0.0) * 1.4426950408889634
    tl.store(DELTA + bh.to(tl.int64) * Lq + offs_m, delta, mask=row_ok)


@triton.jit
def _dkdv_steps(
    dk,
    dv,
    k,
    v,
    q_src,
    do_src,
    lse_base,
    delta_base,
    sq_l,
    sdo_l,
    idx_ptr,
    bs,
    TPB,
    t_lo,
    t_hi,
    offs_n,
    start_n,
    kv_end,
    Lq,
    qk_scale,
    doc_lo,
    doc_hi,
    lo_off,
    hi_off,
    shift,
    cap_in,
    cap2,
    slope2,
    seed,
    rng_off,
    seq_head,
    drop_thr,
    drop_scale,
    BLOCK_M1: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    MASK: tl.constexpr,
    EVEN_Q: tl.constexpr,
    DOT_F32: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    TMA: tl.constexpr,
    DV_LATE: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    """Accumulate dK, dV (BLOCK_N1, D_TILE) over query tiles t_lo..t_hi (transposed: keys are rows).

    doc_lo, doc_hi (BLOCK_N1,): each key's document span, the queries that may see it (HAS_DOCS).
    Lq: the queries of this sequence (rows past it read q = 0 and lse = +inf, so their p is 0).
    DV_LATE: issue the dV matmul after dP = v . dO^T, beside dK's, instead of before it.  The same
    matmuls of the same tiles (bit-equal results), but the fp32 pT, its 16-bit copy (the dV
    matmul's operand, held until that asynchronous sm_90 matmul completes) and dP are no longer
    live at once: 16 registers a thread fewer at the peak of a 64 x 128 step at D 128 on sm_90,
    where the default order spills (on sm_80 it spills more; ptxas -v of the cross-compile,
    docs/design/kernels.md)."""
    MODS: tl.constexpr = ALIBI_ or SOFTCAP
    offs_d = tl.arange(0, D_TILE)
    k_pos = offs_n.to(tl.float32)  # ALiBi's key positions (the tile's rows)
    start_next = tile_start(t_lo, idx_ptr, bs, TPB, BLOCK_M1, SPARSE, t_lo < t_hi)
    for t in range(t_lo, t_hi):
        start_m = start_next  # loaded one step ahead: see tile_start
        start_next = tile_start(t + 1, idx_ptr, bs, TPB, BLOCK_M1, SPARSE, t + 1 < t_hi)
        offs_m = start_m + tl.arange(0, BLOCK_M1)
        # rows past Lq (unless EVEN_Q): q = 0 and lse = +inf make their p exactly 0
        q = stream_tile(q_src, start_m, offs_m, sq_l, offs_m < Lq, offs_d, D, D_TILE, not EVEN_Q, TMA, ALIGN8)
        if EVEN_Q:
            lse = tl.load(lse_base + offs_m)
        else:
            lse = tl.load(lse_base + offs_m, mask=offs_m < Lq, other=float("inf"))
        s2T = mma(k, tl.trans(q), None, DOT_F32)  # (BLOCK_N1, BLOCK_M1)
        if MODS:
            s2T, tT = base2_scores(
                s2T,
                (offs_m + shift).to(tl.float32)[None, :],
                k_pos[:, None],
                qk_scale,
                cap_in,
                cap2,
                slope2,
                ALIBI_,
                SOFTCAP,
                TANH_ASM,
            )
        pT = tl.math.exp2(scaled(s2T, qk_scale, MODS) - lse[None, :])
        if MASK:
            keep = offs_n[:, None] < kv_end
            if BAND_HI:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + hi_off)
            if BAND_LO:
                keep = keep & (offs_n[:, None] >= offs_m[None, :] + lo_off)
            if HAS_DOCS:
                keep = keep & (offs_m[None, :] >= doc_lo[:, None]) & (offs_m[None, :] < doc_hi[:, None])
            pT = tl.where(keep, pT, 0.0)
        do = stream_tile(do_src, start_m, offs_m, sdo_l, offs_m < Lq, offs_d, D, D_TILE, not EVEN_Q, TMA, ALIGN8)
        if EVEN_Q:
            delta = tl.load(delta_base + offs_m)
        else:
            delta = tl.load(delta_base + offs_m, mask=offs_m < Lq, other=0.0)
        pdT = pT  # what reaches dV: the kept probabilities, rescaled
        if DROPOUT:
            zT = tl.trans(dropout_keep(seed, rng_off, seq_head, offs_m, start_n, drop_thr, BLOCK_M1, BLOCK_N1))
            pdT = tl.where(zT, pT * drop_scale, 0.0)
        if not DV_LATE:
            dv = mma(pdT.to(do.dtype), do, dv, DOT_F32)
        dpT = mma(v, tl.trans(do), None, DOT_F32)  # (BLOCK_N1, BLOCK_M1)
        if DROPOUT:
            dpT = tl.where(zT, dpT * drop_scale, 0.0)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        if DV_LATE:  # pT's 16-bit copy made once dP is done: the two are never live together
            dv = mma(pdT.to(do.dtype), do, dv, DOT_F32)
        dk = mma(dsT.to(q.dtype), q, dk, DOT_F32)
    return dk, dv


@triton.jit(do_not_specialize=["band_lo", "band_hi", "drop_thr"])
def bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    DK,
    DV,
    PDK,
    PDV,
    LSE,
    DELTA,
    KV_LENS,
    CNT,
    IDX,
    ORDER,
    DOC_START,
    DOC_END,
    DOC_ORDER,
    CU_Q,
    CU_K,
    ALIBI,
    RNG,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_l,
    sv_b,
    sv_h,
    sv_l,
    sdo_b,
    sdo_h,
    sdo_l,
    sdk_b,
    sdk_h,
    sdk_l,
    sdv_b,
    sdv_h,
    sdv_l,
    spart_bh,
    spart_s,
    scnt_h,
    sidx_h,
    sidx_n,
    sord_h,
    sal_b,
    H,
    HKV,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    sm_scale,
    band_lo,
    band_hi,
    cap_in,
    cap2,
    drop_thr,
    drop_scale,
    BS: tl.constexpr,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK_M1: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    EVEN_Q: tl.constexpr,
    SCAN_: tl.constexpr,
    DOT_F32: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    TMA: tl.constexpr,
    HEADS_OUTER: tl.constexpr,
    SPLIT: tl.constexpr,
    DV_LATE: tl.constexpr,
    VARLEN: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    # grid: (B * HKV, key tiles), or (key tiles, B * HKV) when HEADS_OUTER; the longest columns
    # launched first: dense causal, key tile 0, or with documents the tiles in DOC_ORDER
    # (B, tiles) (by descending span); sparse, the layout columns in ORDER (by descending count,
    # taken from the group's first query head), each as BS // BLOCK_N1 tiles.
    # VARLEN: B * HKV is sequences * HKV and the key tiles those of the longest key sequence; a
    # tile past its sequence's keys stores nothing.
    # SPLIT (sparse only): ORDER holds the split plan's items (P, I, 4) instead, sord_h its head
    # stride: a program walks the entries [e_lo, e_hi) of its column's lists, and a chunk of a
    # split column (slot >= 0) writes its unscaled fp32 dK, dV to slot `slot` of PDK, PDV
    # (B, HKV, slots, BS, D) (strides spart_bh, spart_s, D), summed later by ``split_sum_kernel``
    bhk = tl.program_id(1 if HEADS_OUTER else 0)
    tile = tl.program_id(0 if HEADS_OUTER else 1)
    seq = bhk // HKV  # the batch row, or with VARLEN the sequence
    hk = bhk % HKV
    b = seq
    if VARLEN:
        b = seq * 0
    q_row0, seq_q = seq_rows(CU_Q, seq, Lq, VARLEN)
    k_row0, seq_k = seq_rows(CU_K, seq, Lk, VARLEN)
    shift = seq_k - seq_q
    e_lo = 0
    e_hi = 0
    slot = 0
    if SPARSE:
        tiles_per_col = BS // BLOCK_N1
        if SPLIT:
            col, e_lo, e_hi, slot = split_item(ORDER, hk, sord_h, tile // tiles_per_col)
        else:
            col = tl.load(ORDER + hk * GROUP * sord_h + tile // tiles_per_col)
        start_n = col * BS + (tile % tiles_per_col) * BLOCK_N1
    elif HAS_DOCS:
        start_n = tl.load(DOC_ORDER + b * tl.num_programs(0 if HEADS_OUTER else 1) + tile) * BLOCK_N1
    else:
        start_n = tile * BLOCK_N1
    kv_end = seq_k
    if HAS_KV_LENS:
        kv_end = tl.minimum(tl.maximum(tl.load(KV_LENS + b).to(tl.int32), 0), Lk)
    key_partial = start_n + BLOCK_N1 > kv_end  # the key-padding edge or the ragged tail
    lo_off = band_lo + shift
    hi_off = band_hi + shift

    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, D_TILE)
    k_row_ok = offs_n < seq_k
    # k and v stay in registers: (BLOCK_N1, D_TILE)
    k = load_tile(
        tile_ptrs(slice_ptr(K, b, sk_b, hk, sk_h, k_row0, sk_l, ALIGN8), offs_n, sk_l, offs_d, ALIGN8),
        k_row_ok,
        offs_d,
        D,
        D_TILE,
        True,
    )
    v = load_tile(
        tile_ptrs(slice_ptr(V, b, sv_b, hk, sv_h, k_row0, sv_l, ALIGN8), offs_n, sv_l, offs_d, ALIGN8),
        k_row_ok,
        offs_d,
        D,
        D_TILE,
        True,
    )
    dk = tl.zeros([BLOCK_N1, D_TILE], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, D_TILE], dtype=tl.float32)
    # queries that may see this key tile: [q_lo, q_hi), every one of its keys [q_full_lo, q_full_hi).
    # The band lo_off <= j - i <= hi_off: i >= j - hi_off (causal: i >= j) and i <= j - lo_off;
    # with documents, within the keys' documents (see doc_span)
    q_lo = start_n * 0
    q_full_lo = start_n * 0
    q_full_hi = seq_q + start_n * 0
    q_hi = seq_q + start_n * 0
    if BAND_HI:
        q_lo = start_n - hi_off
        q_full_lo = start_n + BLOCK_N1 - 1 - hi_off
    if BAND_LO:
        q_full_hi = tl.minimum(q_full_hi, start_n - lo_off + 1)
        q_hi = tl.minimum(q_hi, start_n + BLOCK_N1 - lo_off)
    doc_base = b.to(tl.int64) * Lk
    doc_lo = offs_n  # each key's document span (HAS_DOCS only): keys past Lk see no query
    doc_hi = offs_n
    if HAS_DOCS:
        doc_lo = tl.load(DOC_START + doc_base + offs_n, mask=k_row_ok, other=0)
        doc_hi = tl.load(DOC_END + doc_base + offs_n, mask=k_row_ok, other=0)
        lo, full_lo, full_hi, hi = doc_span(
            DOC_START, DOC_END, doc_base, start_n, tl.minimum(start_n + BLOCK_N1, Lk) - 1
        )
        q_lo = tl.maximum(q_lo, lo)
        q_full_lo = tl.maximum(q_full_lo, full_lo)
        q_full_hi = tl.minimum(q_full_hi, full_hi)
        q_hi = tl.minimum(q_hi, hi)
    seed, rng_off = dropout_args(RNG, DROPOUT)

    for g in range(GROUP):
        h = hk * GROUP + g
        slope2 = alibi_slope(ALIBI, sal_b, seq, h, ALIBI_)
        q_src = tile_source(slice_ptr(Q, b, sq_b, h, sq_h, q_row0, sq_l, ALIGN8), seq_q, sq_l, BLOCK_M1, D, D_TILE, TMA)
        do_src = tile_source(
            slice_ptr(DO, b, sdo_b, h, sdo_h, q_row0, sdo_l, ALIGN8), seq_q, sdo_l, BLOCK_M1, D, D_TILE, TMA
        )
        lse_base = LSE + (b * H + h).to(tl.int64) * Lq + q_row0
        delta_base = DELTA + (b * H + h).to(tl.int64) * Lq + q_row0
        # query tiles [t_lo, t_mid) and [t_full, t_end) are masked (the band's or the documents'
        # edges), [t_mid, t_full) need no mask; the column's other tiles are skipped
        count = 0
        idx_ptr = IDX
        TPB = 1
        if SPARSE:
            count = tl.load(CNT + h * scnt_h + col)
            idx_ptr = IDX + h * sidx_h + col * sidx_n
            TPB = BS // BLOCK_M1
        t_lo = 0
        t_mid = 0
        if BAND_HI or HAS_DOCS:
            t_lo = tiles_ending_by(q_lo, count, idx_ptr, BS, TPB, BLOCK_M1, SPARSE, SCAN_)
            t_mid = tiles_starting_before(q_full_lo, count, idx_ptr, BS, TPB, BLOCK_M1, SPARSE, SCAN_)
        if SPARSE:
            t_end = count * TPB
        else:
            t_end = tl.cdiv(seq_q, BLOCK_M1)
        t_full = t_end
        if BAND_LO or HAS_DOCS:
            t_full = tiles_ending_by(q_full_hi, count, idx_ptr, BS, TPB, BLOCK_M1, SPARSE, SCAN_)
            t_end = tiles_starting_before(q_hi, count, idx_ptr, BS, TPB, BLOCK_M1, SPARSE, SCAN_)
        t_lo, t_mid, t_full, t_end = order_ranges(t_lo, t_mid, t_full, t_end)
        if key_partial:
            t_mid = t_end
            t_full = t_end
        if start_n >= kv_end:  # every key of this tile is padding: dK = dV = 0
            t_lo = t_end
            t_mid = t_end
            t_full = t_end
        if SPLIT:  # this program's chunk of the list
            t_lo, t_mid, t_full, t_end = clamp_ranges(t_lo, t_mid, t_full, t_end, e_lo * TPB, e_hi * TPB)
        seq_head = seq * H + h
        dk, dv = _dkdv_steps(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            lse_base,
            delta_base,
            sq_l,
            sdo_l,
            idx_ptr,
            BS,
            TPB,
            t_lo,
            t_mid,
            offs_n,
            start_n,
            kv_end,
            seq_q,
            qk_scale,
            doc_lo,
            doc_hi,
            lo_off,
            hi_off,
            shift,
            cap_in,
            cap2,
            slope2,
            seed,
            rng_off,
            seq_head,
            drop_thr,
            drop_scale,
            BLOCK_M1,
            BLOCK_N1,
            D,
            D_TILE,
            BAND_LO,
            BAND_HI,
            SPARSE,
            True,
            EVEN_Q,
            DOT_F32,
            ALIGN8,
            HAS_DOCS,
            TMA,
            DV_LATE,
            ALIBI_,
            SOFTCAP,
            DROPOUT,
            TANH_ASM,
        )
        dk, dv = _dkdv_steps(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            lse_base,
            delta_base,
            sq_l,
            sdo_l,
            idx_ptr,
            BS,
            TPB,
            t_mid,
            t_full,
            offs_n,
            start_n,
            kv_end,
            seq_q,
            qk_scale,
            doc_lo,
            doc_hi,
            lo_off,
            hi_off,
            shift,
            cap_in,
            cap2,
            slope2,
            seed,
            rng_off,
            seq_head,
            drop_thr,
            drop_scale,
            BLOCK_M1,
            BLOCK_N1,
            D,
            D_TILE,
            BAND_LO,
            BAND_HI,
            SPARSE,
            False,
            EVEN_Q,
            DOT_F32,
            ALIGN8,
            HAS_DOCS,
            TMA,
            DV_LATE,
            ALIBI_,
            SOFTCAP,
            DROPOUT,
            TANH_ASM,
        )
        if BAND_LO or HAS_DOCS:  # the end of the band or of the documents' span
            dk, dv = _dkdv_steps(
                dk,
                dv,
                k,
                v,
                q_src,
                do_src,
                lse_base,
                delta_base,
                sq_l,
                sdo_l,
                idx_ptr,
                BS,
                TPB,
                t_full,
                t_end,
                offs_n,
                start_n,
                kv_end,
                seq_q,
                qk_scale,
                doc_lo,
                doc_hi,
                lo_off,
                hi_off,
                shift,
                cap_in,
                cap2,
                slope2,
                seed,
                rng_off,
                seq_head,
                drop_thr,
                drop_scale,
                BLOCK_M1,
                BLOCK_N1,
                D,
                D_TILE,
                BAND_LO,
                BAND_HI,
                SPARSE,
                True,
                EVEN_Q,
                DOT_F32,
                ALIGN8,
                HAS_DOCS,
                TMA,
                DV_LATE,
                ALIBI_,
                SOFTCAP,
                DROPOUT,
                TANH_ASM,
            )

    dk_base = slice_ptr(DK, b, sdk_b, hk, sdk_h, k_row0, sdk_l, ALIGN8)
    dv_base = slice_ptr(DV, b, sdv_b, hk, sdv_h, k_row0, sdv_l, ALIGN8)
    if SPLIT:
        if slot >= 0:  # a chunk of a split column: its partial sums, in fp32
            offs_r = offs_n - col * BS  # the rows of this tile within its layout block
            part = bhk.to(tl.int64) * spart_bh + slot.to(tl.int64) * spart_s
            store_tile(tile_ptrs(PDK + part, offs_r, D, offs_d, False), dk, k_row_ok, offs_d, D, D_TILE)
            store_tile(tile_ptrs(PDV + part, offs_r, D, offs_d, False), dv, k_row_ok, offs_d, D, D_TILE)
        else:
            store_scaled(dk_base, offs_n, sdk_l, dk, sm_scale, k_row_ok, offs_d, D, D_TILE, ALIGN8)
            store_scaled(dv_base, offs_n, sdv_l, dv, 1.0, k_row_ok, offs_d, D, D_TILE, ALIGN8)
    else:
        store_scaled(dk_base, offs_n, sdk_l, dk, sm_scale, k_row_ok, offs_d, D, D_TILE, ALIGN8)
        store_scaled(dv_base, offs_n, sdv_l, dv, 1.0, k_row_ok, offs_d, D, D_TILE, ALIGN8)


@triton.jit
def _dq_steps(
    dq,
    q,
    do,
    lse,
    delta,
    k_src,
    v_src,
    sk_l,
    sv_l,
    idx_ptr,
    bs,
    TPB,
    t_lo,
    t_hi,
    offs_m,
    kv_end,
    qk_scale,
    doc_lo,
    doc_hi,
    lo_off,
    hi_off,
    q_pos,
    cap_in,
    cap2,
    slope2,
    seed,
    rng_off,
    seq_head,
    drop_thr,
    drop_scale,
    BLOCK_M2: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    MASK: tl.constexpr,
    DOT_F32: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    TMA: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    """Accumulate dQ (BLOCK_M2, D_TILE) over key tiles t_lo..t_hi (doc_lo, doc_hi, q_pos: as in the forward)."""
    MODS: tl.constexpr = ALIBI_ or SOFTCAP
    offs_d = tl.arange(0, D_TILE)
    start_next = tile_start(t_lo, idx_ptr, bs, TPB, BLOCK_N2, SPARSE, t_lo < t_hi)
    for t in range(t_lo, t_hi):
        start_n = start_next  # loaded one step ahead: see tile_start
        start_next = tile_start(t + 1, idx_ptr, bs, TPB, BLOCK_N2, SPARSE, t + 1 < t_hi)
        offs_n = start_n + tl.arange(0, BLOCK_N2)
        k = stream_tile(k_src, start_n, offs_n, sk_l, offs_n < kv_end, offs_d, D, D_TILE, MASK, TMA, ALIGN8)
        v = stream_tile(v_src, start_n, offs_n, sv_l, offs_n < kv_end, offs_d, D, D_TILE, MASK, TMA, ALIGN8)
        s2 = mma(q, tl.trans(k), None, DOT_F32)  # (BLOCK_M2, BLOCK_N2)
        if MODS:
            s2, t2 = base2_scores(
                s2,
                q_pos[:, None],
                offs_n.to(tl.float32)[None, :],
                qk_scale,
                cap_in,
                cap2,
                slope2,
                ALIBI_,
                SOFTCAP,
                TANH_ASM,
            )
        p = tl.math.exp2(scaled(s2, qk_scale, MODS) - lse[:, None])
        if MASK:
            keep = offs_n[None, :] < kv_end
            if BAND_HI:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + hi_off)
            if BAND_LO:
                keep = keep & (offs_n[None, :] >= offs_m[:, None] + lo_off)
            if HAS_DOCS:
                keep = keep & (offs_n[None, :] >= doc_lo[:, None]) & (offs_n[None, :] < doc_hi[:, None])
            p = tl.where(keep, p, 0.0)
        dp = mma(do, tl.trans(v), None, DOT_F32)  # (BLOCK_M2, BLOCK_N2)
        if DROPOUT:
            z = dropout_keep(seed, rng_off, seq_head, offs_m, start_n, drop_thr, BLOCK_M2, BLOCK_N2)
            dp = tl.where(z, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t2 * t2)
        dq = mma(ds.to(k.dtype), k, dq, DOT_F32)
    return dq


@triton.jit(do_not_specialize=["band_lo", "band_hi", "drop_thr"])
def bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    DQ,
    PDQ,
    LSE,
    DELTA,
    KV_LENS,
    CNT,
    IDX,
    ORDER,
    DOC_START,
    DOC_END,
    DOC_ORDER,
    CU_Q,
    CU_K,
    ALIBI,
    RNG,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_l,
    sv_b,
    sv_h,
    sv_l,
    sdo_b,
    sdo_h,
    sdo_l,
    sdq_b,
    sdq_h,
    sdq_l,
    spart_bh,
    spart_s,
    scnt_h,
    sidx_h,
    sidx_m,
    sord_h,
    sal_b,
    H,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    sm_scale,
    band_lo,
    band_hi,
    cap_in,
    cap2,
    drop_thr,
    drop_scale,
    BS: tl.constexpr,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK_M2: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    SCAN_: tl.constexpr,
    DOT_F32: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    TMA: tl.constexpr,
    HEADS_OUTER: tl.constexpr,
    SPLIT: tl.constexpr,
    VARLEN: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    # grid: (B * H, query tiles), or (query tiles, B * H) when HEADS_OUTER; the longest rows
    # launched first (as in the forward; VARLEN too).  SPLIT: as in ``bwd_dkdv_kernel``, ORDER holds
    # the split plan's items and a chunk of a split row writes its unscaled fp32 dQ to PDQ
    # (B, H, slots, BS, D)
    pid = tl.program_id(1 if HEADS_OUTER else 0)
    tile = tl.program_id(0 if HEADS_OUTER else 1)
    seq = pid // H
    h = pid % H
    hk = h // GROUP
    b = seq
    if VARLEN:
        b = seq * 0
    q_row0, seq_q = seq_rows(CU_Q, seq, Lq, VARLEN)
    k_row0, seq_k = seq_rows(CU_K, seq, Lk, VARLEN)
    shift = seq_k - seq_q
    row = 0  # the layout row of this tile (SPARSE only)
    e_lo = 0
    e_hi = 0
    slot = 0
    if SPARSE:
        tiles_per_row = BS // BLOCK_M2
        if SPLIT:
            row, e_lo, e_hi, slot = split_item(ORDER, h, sord_h, tile // tiles_per_row)
        else:
            row = tl.load(ORDER + h * sord_h + tile // tiles_per_row)
        start_m = row * BS + (tile % tiles_per_row) * BLOCK_M2
    elif HAS_DOCS:
        start_m = tl.load(DOC_ORDER + b * tl.num_programs(0 if HEADS_OUTER else 1) + tile) * BLOCK_M2
    elif VARLEN:
        start_m = (tl.cdiv(seq_q, BLOCK_M2) - 1 - tile) * BLOCK_M2
    else:
        start_m = (tl.num_programs(0 if HEADS_OUTER else 1) - 1 - tile) * BLOCK_M2
    if VARLEN:
        if start_m < 0:  # past this sequence's tiles
            return
    kv_end = seq_k
    if HAS_KV_LENS:
        kv_end = tl.minimum(tl.maximum(tl.load(KV_LENS + b).to(tl.int32), 0), Lk)
    lo_off = band_lo + shift
    hi_off = band_hi + shift
    slope2 = alibi_slope(ALIBI, sal_b, seq, h, ALIBI_)
    seed, rng_off = dropout_args(RNG, DROPOUT)

    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, D_TILE)
    row_ok = offs_m < seq_q
    # q, dO, lse, delta stay in registers for the whole program
    q = load_tile(
        tile_ptrs(slice_ptr(Q, b, sq_b, h, sq_h, q_row0, sq_l, ALIGN8), offs_m, sq_l, offs_d, ALIGN8),
        row_ok,
        offs_d,
        D,
        D_TILE,
        True,
    )
    do = load_tile(
        tile_ptrs(slice_ptr(DO, b, sdo_b, h, sdo_h, q_row0, sdo_l, ALIGN8), offs_m, sdo_l, offs_d, ALIGN8),
        row_ok,
        offs_d,
        D,
        D_TILE,
        True,
    )
    lse = tl.load(LSE + (b * H + h).to(tl.int64) * Lq + q_row0 + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + (b * H + h).to(tl.int64) * Lq + q_row0 + offs_m, mask=row_ok, other=0.0)
    k_src = tile_source(slice_ptr(K, b, sk_b, hk, sk_h, k_row0, sk_l, ALIGN8), seq_k, sk_l, BLOCK_N2, D, D_TILE, TMA)
    v_src = tile_source(slice_ptr(V, b, sv_b, hk, sv_h, k_row0, sv_l, ALIGN8), seq_k, sv_l, BLOCK_N2, D, D_TILE, TMA)

    count, idx_ptr, TPB, doc_base, doc_lo, doc_hi = query_rows(
        row,
        start_m,
        offs_m,
        row_ok,
        b,
        h,
        Lq,
        CNT,
        scnt_h,
        IDX,
        sidx_h,
        sidx_m,
        BS,
        DOC_START,
        DOC_END,
        BLOCK_N2,
        SPARSE,
        HAS_DOCS,
    )
    t_lo, t_first, t_full, t_end = row_tile_range(
        start_m,
        kv_end,
        lo_off,
        hi_off,
        count,
        idx_ptr,
        BS,
        TPB,
        DOC_START,
        DOC_END,
        doc_base,
        Lq,
        BLOCK_M2,
        BLOCK_N2,
        BAND_LO,
        BAND_HI,
        SPARSE,
        HAS_DOCS,
        SCAN_,
    )
    if SPLIT:  # this program's chunk of the list
        t_lo, t_first, t_full, t_end = clamp_ranges(t_lo, t_first, t_full, t_end, e_lo * TPB, e_hi * TPB)
    dq = tl.zeros([BLOCK_M2, D_TILE], dtype=tl.float32)
    seq_head = seq * H + h
    q_pos = (offs_m + shift).to(tl.float32)  # ALiBi's distances are |i + shift - j|
    if HAS_DOCS or BAND_LO:  # the start of the documents' span or of the band
        dq = _dq_steps(
            dq,
            q,
            do,
            lse,
            delta,
            k_src,
            v_src,
            sk_l,
            sv_l,
            idx_ptr,
            BS,
            TPB,
            t_lo,
            t_first,
            offs_m,
            kv_end,
            qk_scale,
            doc_lo,
            doc_hi,
            lo_off,
            hi_off,
            q_pos,
            cap_in,
            cap2,
            slope2,
            seed,
            rng_off,
            seq_head,
            drop_thr,
            drop_scale,
            BLOCK_M2,
            BLOCK_N2,
            D,
            D_TILE,
            BAND_LO,
            BAND_HI,
            SPARSE,
            True,
            DOT_F32,
            ALIGN8,
            HAS_DOCS,
            TMA,
            ALIBI_,
            SOFTCAP,
            DROPOUT,
            TANH_ASM,
        )
    dq = _dq_steps(
        dq,
        q,
        do,
        lse,
        delta,
        k_src,
        v_src,
        sk_l,
        sv_l,
        idx_ptr,
        BS,
        TPB,
        t_first,
        t_full,
        offs_m,
        kv_end,
        qk_scale,
        doc_lo,
        doc_hi,
        lo_off,
        hi_off,
        q_pos,
        cap_in,
        cap2,
        slope2,
        seed,
        rng_off,
        seq_head,
        drop_thr,
        drop_scale,
        BLOCK_M2,
        BLOCK_N2,
        D,
        D_TILE,
        BAND_LO,
        BAND_HI,
        SPARSE,
        False,
        DOT_F32,
        ALIGN8,
        HAS_DOCS,
        TMA,
        ALIBI_,
        SOFTCAP,
        DROPOUT,
        TANH_ASM,
    )
    dq = _dq_steps(
        dq,
        q,
        do,
        lse,
        delta,
        k_src,
        v_src,
        sk_l,
        sv_l,
        idx_ptr,
        BS,
        TPB,
        t_full,
        t_end,
        offs_m,
        kv_end,
        qk_scale,
        doc_lo,
        doc_hi,
        lo_off,
        hi_off,
        q_pos,
        cap_in,
        cap2,
        slope2,
        seed,
        rng_off,
        seq_head,
        drop_thr,
        drop_scale,
        BLOCK_M2,
        BLOCK_N2,
        D,
        D_TILE,
        BAND_LO,
        BAND_HI,
        SPARSE,
        True,
        DOT_F32,
        ALIGN8,
        HAS_DOCS,
        TMA,
        ALIBI_,
        SOFTCAP,
        DROPOUT,
        TANH_ASM,
    )
    dq_base = slice_ptr(DQ, b, sdq_b, h, sdq_h, q_row0, sdq_l, ALIGN8)
    if SPLIT:
        if slot >= 0:  # a chunk of a split row: its partial sum, in fp32
            part = pid.to(tl.int64) * spart_bh + slot.to(tl.int64) * spart_s
            store_tile(tile_ptrs(PDQ + part, offs_m - row * BS, D, offs_d, False), dq, row_ok, offs_d, D, D_TILE)
        else:
            store_scaled(dq_base, offs_m, sdq_l, dq, sm_scale, row_ok, offs_d, D, D_TILE, ALIGN8)
    else:
        store_scaled(dq_base, offs_m, sdq_l, dq, sm_scale, row_ok, offs_d, D, D_TILE, ALIGN8)


@triton.jit
def split_sum_kernel(
    PART,
    OUT,
    SUMS,
    spart_bh,
    spart_s,
    sout_b,
    sout_h,
    sout_l,
    ssum_h,
    HO,
    L,
    scale,
    bs,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGN8: tl.constexpr,
):
    # grid: (B * HO, split rows * (bs // BLOCK)), HO the heads of OUT (kv heads for dK, dV; query
    # heads for dQ).  out[b, h, row * bs + r] = scale * sum of the row's chunks' partials, added in
    # slot order (the same order on every run: deterministic); SUMS (P, S, 3) lists each head's
    # split rows as (row, first slot, chunks), ssum_h its head stride (0: shared); an entry with
    # no chunk (a head with fewer split rows) writes nothing
    bh = tl.program_id(0)
    b = bh // HO
    h = bh % HO
    first, chunks, offs_r, offs_l, rows_ok = split_sum_rows(SUMS, h, ssum_h, bs, L, BLOCK)
    offs_d = tl.arange(0, D_TILE)
    part = PART + bh.to(tl.int64) * spart_bh
    acc = tl.zeros([BLOCK, D_TILE], dtype=tl.float32)  # stays in registers
    for c in range(chunks):
        slot = (first + c).to(tl.int64)
        acc += load_tile(tile_ptrs(part + slot * spart_s, offs_r, D, offs_d, False), rows_ok, offs_d, D, D_TILE, True)
    store_scaled(
        slice_ptr(OUT, b, sout_b, h, sout_h, b * 0, sout_l, ALIGN8),
        offs_l,
        sout_l,
        acc,
        scale,
        rows_ok,
        offs_d,
        D,
        D_TILE,
        ALIGN8,
    )
