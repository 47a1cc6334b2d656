"""Triton FlashAttention forward kernel (online softmax; the log-sum-exp is kept for the backward).

Reading order: tile addressing, load and store helpers, tile iteration helpers, the inner loop,
the kernel.  The launcher, the autograd function and the public entry point live in
``triton_flash.py``; the backward kernels in ``triton_flash_bwd.py``.

Legend (also used in the backward file):
  B batch, H query heads, HKV key/value heads, GROUP = H // HKV (GQA),
  Lq / Lk query / key lengths, D head dim (a multiple of 8 from 16 to 256),
  D_TILE the tiles' width in the head dim: the next power of two >= D (Triton's block shapes are
  powers of two).  Columns D..D_TILE of a tile are padding: loads fill them with 0, stores skip
  them, so q . k and p . v see zeros there and nothing beyond D is ever read or written.
  q, o, do, dq: (B, H, Lq, D)      k, v, dk, dv: (B, HKV, Lk, D)     lse, delta: (B, H, Lq) fp32
  A "tile" is the kernel's unit (BLOCK_M query rows x BLOCK_N key rows); a "layout block" is
  the BlockLayout's unit (bs x bs tokens), a multiple of every tile size used with it, so a tile
  never straddles two layout blocks and a layout block holds TPB = bs // BLOCK_N key tiles.
  ALIGN8: the launcher found every stride of q, k, v (but the head dim's) a multiple of 8 elements
  and D % 16 == 8.  Row and head offsets are then declared multiples of 8 (16 bytes): Triton
  specialises integer arguments on divisibility by 16 only, and without the hint a row stride of,
  say, 40 would turn every tile load into scalar loads without cp.async pipelining.

Scores are kept in base 2: s2 = (q . k) * scale * log2(e), p = exp2(s2 - m).  lse is stored in the
same base-2 units (internal to this module).  A query row with no allowed key ends with l == 0:
its output is 0 and its lse is +inf, so the backward's exp2(s2 - lse) is exactly 0 there.

Which tiles a query tile visits (dense, causal or block-sparse) is decided once per program by
``row_tile_range``: tiles [t_first, t_full) are entirely allowed and run without any mask; tiles
[t_full, t_end) hold the causal diagonal, the key-padding edge or the ragged tail and are masked;
tiles past t_end (above the diagonal, beyond kv_lens[b], or absent from the layout) are skipped.

Split rows (SPLIT, block-sparse only): a layout row listed in the launcher's ``SplitPlan`` as far
longer than the others is walked by several programs, each over one contiguous chunk of its list
(split-KV); each writes its unnormalised (acc, m, l) to scratch slots and ``fwd_merge_kernel``
combines them in slot order with a log-sum-exp merge, writing o and lse.

Packed documents (HAS_DOCS; see ``genoformer.kernels.documents``): DOC_START / DOC_END (B, L)
int32 give each token's document span [start, end) within its row, non-decreasing along the row.
A query tile's rows together see the keys [start(first row), end(last row)), and every row sees
[start(last row), end(first row)) (empty when the tile spans two documents). Tiles before the
first span are skipped, so a row packed with short documents costs about sum(len_i^2), not L^2;
tiles [t_lo, t_first) at the start of the span and [t_full, t_end) at its end are masked, those
in between run unmasked.  The dK/dV kernel does the same over query tiles with the key tile's
documents (queries and keys share the row's documents).

Diagonal band (BAND_LO, BAND_HI; causal attention and sliding windows): query i attends key j only
if lo_off <= j - i <= hi_off, where lo_off = band_lo + shift and hi_off = band_hi + shift, shift =
(keys) - (queries) of the sequence: the band is aligned to the bottom-right corner of the score
matrix, as flash-attn aligns it.  Causal is BAND_HI with band_hi = 0.  Like documents, a band cuts
each tile's key walk to [t_lo, t_end): the tiles wholly inside the band run unmasked, only the
(at most two) tiles on each of its edges are masked per token, so a window costs what its tokens
cost.

Score modifiers (forward and backward alike; base-2 units, see ``base2_scores``):
  SOFTCAP   s = softcap * tanh(scale * q . k / softcap) (tanh capping of the scaled score);
  ALIBI_    s -= slope[s, h] * |j - i - shift| (ALiBi; slopes per head or per sequence and head).
Dropout (DROPOUT): after the softmax, each probability is kept with probability 1 - p and scaled by
1 / (1 - p).  Which ones are kept is a pure function of (seed, offset, sequence * H + head, query,
key) (``dropout_keep``, Philox 4x32-10): the backward regenerates the same mask, a run is
deterministic for a given seed, and ``genoformer.kernels.dropout`` computes the same mask in PyTorch.

Variable-length batches (VARLEN; flash-attn's varlen convention): q is (1, H, total_q, D), k and v
(1, HKV, total_k, D), and CU_Q, CU_K (N + 1,) int32 give the sequences' first rows; program axis 0
runs over (sequence, head), and each sequence has its own lengths (its band's shift included), so
nothing is padded to the longest sequence.  lse and delta are (1, H, total_q).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
SCAN = 64  # layout entries inspected per step when counting a CSR list


@triton.jit
def mma(a, b, acc, DOT_F32: tl.constexpr):
    """tl.dot(a, b, acc); DOT_F32 widens the tiles to fp32 first (exact for fp16/bf16 values).

    Only the launcher's interpreter path sets DOT_F32: Triton's CPU interpreter (3.9) multiplies
    bf16 tiles wrongly, while on a GPU the tensor cores take the 16-bit tiles directly.
    """
    if DOT_F32:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def head_ptr(ptr, b, stride_b, h, stride_h, ALIGN8: tl.constexpr):
    """ptr + b * stride_b + h * stride_h (int64): the start of one (batch, head) slice."""
    offset = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    if ALIGN8:
        offset = tl.multiple_of(offset, 8)
    return ptr + offset


@triton.jit
def tile_ptrs(base, offs, stride, offs_d, ALIGN8: tl.constexpr):
    """Pointers of the (rows, D_TILE) tile base + offs[:, None] * stride + offs_d[None, :]."""
    rows = offs[:, None] * stride
    if ALIGN8:
        rows = tl.multiple_of(rows, [8, 1])
    return base + rows + offs_d[None, :]


@triton.jit
def load_tile(ptrs, rows_ok, offs_d, D: tl.constexpr, D_TILE: tl.constexpr, MASK_ROWS: tl.constexpr):
    """A (rows, D_TILE) tile of q, k, v, o or dO: rows where rows_ok is False (when MASK_ROWS) and
    the head-dim padding d >= D read 0.  A power-of-two head dim has no padding and no column mask."""
    if MASK_ROWS:
        if D < D_TILE:
            tile = tl.load(ptrs, mask=rows_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        if D < D_TILE:
            tile = tl.load(ptrs, mask=offs_d[None, :] < D, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def store_tile(ptrs, value, rows_ok, offs_d, D: tl.constexpr, D_TILE: tl.constexpr):
    """Store a (rows, D_TILE) tile where rows_ok, skipping the head-dim padding d >= D."""
    if D < D_TILE:
        tl.store(ptrs, value, mask=rows_ok[:, None] & (offs_d[None, :] < D))
    else:
        tl.store(ptrs, value, mask=rows_ok[:, None])


@triton.jit
def store_rows(
    o_base,
    lse_base,
    acc,
    l_i,
    m_i,
    so_l,
    offs_m,
    row_ok,
    offs_d,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    ALIGN8: tl.constexpr,
):
    """Normalise and store finished query rows: o = acc / l in O's dtype and lse = m + log2(l), at
    the rows offs_m of the (batch, head) or (sequence, head) slices that o_base and lse_base start;
    a row with no allowed key (l == 0) gets o = 0 and lse = +inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    o_ptrs = tile_ptrs(o_base, offs_m, so_l, offs_d, ALIGN8)
    store_tile(o_ptrs, o.to(o_base.dtype.element_ty), row_ok, offs_d, D, D_TILE)
    tl.store(lse_base + offs_m, lse, mask=row_ok)


@triton.jit
def seq_rows(CU, s, L, VARLEN: tl.constexpr):
    """(first row, length) of sequence s: CU[s] and CU[s + 1] - CU[s] with VARLEN, else (0, L)."""
    row0 = s * 0
    length = L + s * 0
    if VARLEN:
        row0 = tl.load(CU + s)
        length = tl.load(CU + s + 1) - row0
    return row0, length


@triton.jit
def slice_ptr(ptr, b, stride_b, h, stride_h, row0, stride_l, ALIGN8: tl.constexpr):
    """ptr + b * stride_b + h * stride_h + row0 * stride_l (int64): the first row of one (batch,
    head) slice, or of one sequence of it (VARLEN: row0 is the sequence's first row)."""
    offset = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + row0.to(tl.int64) * stride_l
    if ALIGN8:
        offset = tl.multiple_of(offset, 8)
    return ptr + offset


@triton.jit
def tanh(x, ASM: tl.constexpr):
    """tanh(x) in fp32: the GPU's tanh.approx.f32 with ASM (one MUFU instruction, as flash-attn's
    softcap; relative error below 2^-10), else 1 - 2 / (exp(2|x|) + 1) with x's sign (the
    interpreter, which runs no inline assembly)."""
    if ASM:
        y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        e = tl.exp(-2.0 * tl.abs(x))
        y = (1.0 - e) / (1.0 + e)
        y = tl.where(x < 0.0, -y, y)
    return y


@triton.jit
def base2_scores(
    s, q_pos, k_pos, qk_scale, cap_in, cap2, slope2, ALIBI_: tl.constexpr, SOFTCAP: tl.constexpr, TANH_ASM: tl.constexpr
):
    """Base-2 scores of unscaled q . k tiles `s` with the score modifiers, and t, the softcap's tanh
    (its gradient is 1 - t^2; s2 itself when there is no softcap).

    SOFTCAP: s2 = cap2 * tanh(s * cap_in), cap_in = scale / softcap, cap2 = softcap * log2(e).
    ALIBI_: s2 -= slope2 * |q_pos - k_pos|, slope2 = slope * log2(e); q_pos (i + shift) and k_pos (j)
    are the tile's query and key positions as float32 (exact below 2^24; a subtraction and a fused
    multiply-add per score, no integer conversion), shaped to broadcast against s (rows and columns,
    or the other way round in the transposed dK/dV tiles).  Without either modifier the kernels
    scale by qk_scale themselves (``scaled``): that path is the plain kernels' instruction for
    instruction."""
    if SOFTCAP:
        t = tanh(s * cap_in, TANH_ASM)
        s2 = t * cap2
    else:
        s2 = s * qk_scale
        t = s2
    if ALIBI_:
        s2 = s2 - slope2 * tl.abs(q_pos - k_pos)
    return s2, t


@triton.jit
def scaled(x, qk_scale, MODS: tl.constexpr):
    """Scores in base-2 units: x itself when ``base2_scores`` made them (MODS), else x * qk_scale."""
    if MODS:
        y = x
    else:
        y = x * qk_scale
    return y


@triton.jit
def dropout_keep(seed, rng_off, seq_head, offs_m, start_n, thr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: which probabilities of the queries offs_m and the keys start_n ..
    start_n + BLOCK_N - 1 (start_n a multiple of 8) survive dropout; positions count from the
    sequence's first row.

    One Philox 4x32-10 call (key: the 64-bit seed; counter: (key // 8, query, seq_head, offset))
    gives four 32-bit words, i.e. eight 16-bit values, one per key of a group of eight: key
    8g + c takes half c % 2 (low, high) of word c // 2, and is kept when that value >= thr
    (thr = round(p * 65536)).  The eight (BLOCK_M, BLOCK_N // 8) results are interleaved into
    the tile by joins; ``genoformer.kernels.dropout`` is the same function in PyTorch."""
    G: tl.constexpr = BLOCK_N // 8
    zero = tl.zeros([BLOCK_M, G], dtype=tl.int32)
    c0 = zero + (start_n // 8 + tl.arange(0, G))[None, :]
    c1 = zero + offs_m[:, None]
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero + seq_head, zero + rng_off)
    k0 = ((r0 & 0xFFFF).to(tl.int32) >= thr).to(tl.int8)
    k1 = ((r0 >> 16).to(tl.int32) >= thr).to(tl.int8)
    k2 = ((r1 & 0xFFFF).to(tl.int32) >= thr).to(tl.int8)
    k3 = ((r1 >> 16).to(tl.int32) >= thr).to(tl.int8)
    k4 = ((r2 & 0xFFFF).to(tl.int32) >= thr).to(tl.int8)
    k5 = ((r2 >> 16).to(tl.int32) >= thr).to(tl.int8)
    k6 = ((r3 & 0xFFFF).to(tl.int32) >= thr).to(tl.int8)
    k7 = ((r3 >> 16).to(tl.int32) >= thr).to(tl.int8)
    # join appends an axis of 2: [..., s, t, u] of these nested joins is key 4s + 2t + u of the group
    keep = tl.join(tl.join(tl.join(k0, k4), tl.join(k2, k6)), tl.join(tl.join(k1, k5), tl.join(k3, k7)))
    return tl.reshape(keep, (BLOCK_M, BLOCK_N)) != 0


@triton.jit
def tile_source(base, rows, stride, BLOCK: tl.constexpr, D: tl.constexpr, D_TILE: tl.constexpr, TMA: tl.constexpr):
    """What ``stream_tile`` reads: with TMA a tensor descriptor over the (rows, D) slice at base
    (row stride `stride`, (BLOCK, D_TILE) boxes), else the base pointer itself."""
    if TMA:
        source = tl.make_tensor_descriptor(base, shape=[rows, D], strides=[stride, 1], block_shape=[BLOCK, D_TILE])
    else:
        source = base
    return source


@triton.jit
def stream_tile(
    source,
    start,
    offs,
    stride,
    rows_ok,
    offs_d,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    TMA: tl.constexpr,
    ALIGN8: tl.constexpr,
):
    """The (rows, D_TILE) tile of rows offs = start + arange of a tile the loop streams, read as
    ``load_tile`` does: through the tensor descriptor (TMA: rows past the slice and the head-dim
    padding arrive as zeros, rows_ok zeroes the rest) or through pointers."""
    if TMA:
        tile = source.load([start, 0])
        if MASK_ROWS:
            tile = tl.where(rows_ok[:, None], tile, 0.0)
    else:
        tile = load_tile(tile_ptrs(source, offs, stride, offs_d, ALIGN8), rows_ok, offs_d, D, D_TILE, MASK_ROWS)
    return tile


@triton.jit
def tile_start(t, idx_ptr, bs, TPB, BLOCK: tl.constexpr, SPARSE: tl.constexpr, valid):
    """First token of the t-th visited tile: t * BLOCK when dense, else inside the layout's list
    (read only where `valid`, 0 elsewhere).

    The loops call it one step ahead (tile t + 1 while computing tile t) and carry the result:
    with the layout entry loaded in the step that uses it, Triton's pipeliner (3.6 to 3.9, sm_80
    and sm_90) turns that scalar load into a cp.async of its own and waits for every copy in
    flight before each step (``async_wait {num = 0}``), so the tiles of the next steps are no
    longer prefetched; loaded a step ahead it stays a plain load, hidden behind the step's
    matmuls, and the tile loads keep their 2-3 step prefetch, as in the dense kernels.

    TPB (tiles per layout block) must be a compile-time constant: the kernels take the layout's
    block size as the constexpr BS, so that `t // TPB` is a shift. With a runtime block size it
    was an integer division in every step (a MUFU.RCP sequence), 6-9% of the custom pattern's
    backward on the H200 (docs/design/kernels.md).
    """
    start = t * BLOCK
    if SPARSE:
        entry = t // TPB
        start = tl.load(idx_ptr + entry, mask=valid, other=0) * bs + (t - entry * TPB) * BLOCK
    return start


@triton.jit
def tiles_ending_by(x, count, idx_ptr, bs, TPB, BLOCK: tl.constexpr, SPARSE: tl.constexpr, SCAN_: tl.constexpr):
    """How many of the visited tiles (ascending; see ``tile_start``) end at or before token x."""
    if SPARSE:
        n = 0  # layout blocks of the list that end by x
        for c in range(0, count, SCAN_):
            offs = c + tl.arange(0, SCAN_)
            valid = offs < count
            blk = tl.load(idx_ptr + offs, mask=valid, other=0)
            n += tl.sum((valid & ((blk + 1) * bs <= x)).to(tl.int32), axis=0)
        t = n * TPB
        if n < count:
            blk = tl.load(idx_ptr + n)
            t += tl.minimum(tl.maximum(x - blk * bs, 0) // BLOCK, TPB)
    else:
        t = tl.maximum(x, 0) // BLOCK
    return t


@triton.jit
def tiles_starting_before(x, count, idx_ptr, bs, TPB, BLOCK: tl.constexpr, SPARSE: tl.constexpr, SCAN_: tl.constexpr):
    """How many of the visited tiles (ascending; see ``tile_start``) start before token x."""
    if SPARSE:
        n = 0  # layout blocks of the list that start before x
        for c in range(0, count, SCAN_):
            offs = c + tl.arange(0, SCAN_)
            valid = offs < count
            blk = tl.load(idx_ptr + offs, mask=valid, other=0)
            n += tl.sum((valid & (blk * bs < x)).to(tl.int32), axis=0)
        t = n * TPB
        if n > 0:
            blk = tl.load(idx_ptr + n - 1)
            t = (n - 1) * TPB + tl.minimum(tl.cdiv(x - blk * bs, BLOCK), TPB)
    else:
        t = tl.cdiv(tl.maximum(x, 0), BLOCK)
    return t


@triton.jit
def doc_span(DOC_START, DOC_END, doc_base, first, last):
    """(lo, full_lo, full_hi, hi) of the consecutive tokens first..last of one row: together they
    see [lo, hi), each of them sees [full_lo, full_hi) (empty when they span two documents)."""
    lo = tl.load(DOC_START + doc_base + first)
    full_lo = tl.load(DOC_START + doc_base + last)
    full_hi = tl.load(DOC_END + doc_base + first)
    hi = tl.load(DOC_END + doc_base + last)
    return lo, full_lo, full_hi, hi


@triton.jit
def order_ranges(t_lo, t_first, t_full, t_end):
    """Clamp the four tile bounds so that [t_lo, t_first) masked, [t_first, t_full) unmasked and
    [t_full, t_end) masked cover every visited tile exactly once."""
    t_lo = tl.minimum(t_lo, t_end)
    t_first = tl.minimum(tl.maximum(t_first, t_lo), t_end)
    t_full = tl.minimum(tl.maximum(t_full, t_first), t_end)
    return t_lo, t_first, t_full, t_end


@triton.jit
def split_item(ITEMS, head, sitems_h, item):
    """(row, first entry, end entry, slot) of one item of a split plan (``triton_flash.SplitPlan``)."""
    ptr = ITEMS + head * sitems_h + item * 4
    return tl.load(ptr), tl.load(ptr + 1), tl.load(ptr + 2), tl.load(ptr + 3)


@triton.jit
def split_sum_rows(SUMS, head, ssum_h, bs, L, BLOCK: tl.constexpr):
    """The rows of one program of a split list's sum (``split_sum_kernel``, ``fwd_merge_kernel``;
    grid axis 1: split lists x bs // BLOCK): the list's first slot and chunk count, its rows within
    the layout block (BLOCK,), their positions in the sequence and which of them to write (none
    for an entry with no chunk: a head with fewer split lists)."""
    tiles = bs // BLOCK
    entry = SUMS + head * ssum_h + (tl.program_id(1) // tiles) * 3
    row = tl.load(entry)
    first = tl.load(entry + 1)
    chunks = tl.load(entry + 2)
    offs_r = (tl.program_id(1) % tiles) * BLOCK + tl.arange(0, BLOCK)
    offs_l = row * bs + offs_r
    return first, chunks, offs_r, offs_l, offs_l < tl.where(chunks > 0, L, 0)


@triton.jit
def clamp_ranges(t_lo, t_mid, t_full, t_end, c_lo, c_hi):
    """The ordered tile bounds cut to the chunk [c_lo, c_hi): each range keeps its tiles inside it."""
    t_lo = tl.minimum(tl.maximum(t_lo, c_lo), c_hi)
    t_mid = tl.minimum(tl.maximum(t_mid, c_lo), c_hi)
    t_full = tl.minimum(tl.maximum(t_full, c_lo), c_hi)
    t_end = tl.minimum(tl.maximum(t_end, c_lo), c_hi)
    return t_lo, t_mid, t_full, t_end


@triton.jit
def query_rows(
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
    bs,
    DOC_START,
    DOC_END,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    HAS_DOCS: tl.constexpr,
):
    """What a query tile reads before its key loop (forward and dQ).

    Returns (count, idx_ptr, TPB): its layout row's CSR list and the key tiles per layout block
    (SPARSE only; count 0 for a tile past Lq in the ragged last layout row: no work); and
    (doc_base, doc_lo, doc_hi): the batch row's offset into the document spans and each query
    row's span (HAS_DOCS only; rows past Lq see no key)."""
    count = 0
    idx_ptr = IDX
    TPB = 1
    if SPARSE:
        count = tl.load(CNT + h * scnt_h + row)
        count = tl.where(start_m < Lq, count, 0)
        idx_ptr = IDX + h * sidx_h + row * sidx_m
        TPB = bs // BLOCK_N
    doc_base = b.to(tl.int64) * Lq
    doc_lo = offs_m
    doc_hi = offs_m
    if HAS_DOCS:
        doc_lo = tl.load(DOC_START + doc_base + offs_m, mask=row_ok, other=0)
        doc_hi = tl.load(DOC_END + doc_base + offs_m, mask=row_ok, other=0)
    return count, idx_ptr, TPB, doc_base, doc_lo, doc_hi


@triton.jit
def row_tile_range(
    start_m,
    kv_end,
    lo_off,
    hi_off,
    count,
    idx_ptr,
    bs,
    TPB,
    DOC_START,
    DOC_END,
    doc_base,
    Lq,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    SCAN_: tl.constexpr,
):
    """(t_lo, t_first, t_full, t_end) for the query tile [start_m, start_m + BLOCK_M) over its key tiles.

    Key tiles [t_lo, t_first) and [t_full, t_end) are masked, [t_first, t_full) need no mask; the
    rest are skipped.  Without documents or a band's lower edge t_lo = t_first = 0.  A key tile
    [n, n + BLOCK_N) needs no mask when full_lo <= n and n + BLOCK_N <= full_end, and is visited at
    all when it overlaps [lo, hi): the band lo_off <= j - i <= hi_off gives, for the tile's first
    and last rows, lo = start_m + lo_off, full_lo = start_m + BLOCK_M - 1 + lo_off,
    full_end = start_m + hi_off + 1 and hi = start_m + BLOCK_M + hi_off; documents and kv_end cut
    them further.  In sparse mode the key tiles are those of the row's CSR list (idx_ptr, count;
    ascending layout-block indices), and the counts come from one vectorised pass over the list.
    """
    full_end = kv_end
    hi = kv_end
    if BAND_HI:
        full_end = tl.minimum(start_m + hi_off + 1, kv_end)
        hi = tl.minimum(start_m + BLOCK_M + hi_off, kv_end)
    lo = start_m * 0
    full_lo = start_m * 0
    if BAND_LO:
        lo = tl.maximum(start_m + lo_off, 0)
        full_lo = start_m + BLOCK_M - 1 + lo_off
    if HAS_DOCS:
        # (a sparse tile past Lq, in the ragged last layout row, has count 0: nothing to visit)
        doc_lo, doc_full_lo, doc_full_hi, doc_hi = doc_span(
            DOC_START, DOC_END, doc_base, tl.minimum(start_m, Lq - 1), tl.minimum(start_m + BLOCK_M, Lq) - 1
        )
        lo = tl.maximum(lo, doc_lo)
        full_lo = tl.maximum(full_lo, doc_full_lo)
        full_end = tl.minimum(full_end, doc_full_hi)
        hi = tl.minimum(hi, doc_hi)
    t_lo = 0
    t_first = 0
    if HAS_DOCS or BAND_LO:
        t_lo = tiles_ending_by(lo, count, idx_ptr, bs, TPB, BLOCK_N, SPARSE, SCAN_)
        t_first = tiles_starting_before(full_lo, count, idx_ptr, bs, TPB, BLOCK_N, SPARSE, SCAN_)
    if SPARSE:
        n_full = 0  # entries whose whole layout block is allowed for every row of this tile
        n_part = 0  # entries that start before hi (visited at all)
        for c in range(0, count, SCAN_):
            offs = c + tl.arange(0, SCAN_)
            valid = offs < count
            blk = tl.load(idx_ptr + offs, mask=valid, other=0)
            n_full += tl.sum((valid & ((blk + 1) * bs <= full_end)).to(tl.int32), axis=0)
            n_part += tl.sum((valid & (blk * bs < hi)).to(tl.int32), axis=0)
        t_full = n_full * TPB
        if n_full < n_part:
            # the first partial block may still start with unmasked tiles
            blk = tl.load(idx_ptr + n_full)
            t_full += tl.minimum(tl.maximum(full_end - blk * bs, 0) // BLOCK_N, TPB)
        t_end = n_part * TPB
        if n_part > 0:
            blk = tl.load(idx_ptr + n_part - 1)
            t_end = (n_part - 1) * TPB + tl.minimum(tl.cdiv(hi - blk * bs, BLOCK_N), TPB)
    else:
        t_full = tl.maximum(full_end, 0) // BLOCK_N
        t_end = tl.cdiv(tl.maximum(hi, 0), BLOCK_N)
    if HAS_DOCS or BAND_LO:
        t_lo, t_first, t_full, t_end = order_ranges(t_lo, t_first, t_full, t_end)
    return t_lo, t_first, t_full, t_end


@triton.jit
def _fwd_steps(
    acc,
    l_i,
    m_i,
    q,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
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
    RESCALE_TAU: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    """Online-softmax update over key tiles t_lo..t_hi; MASK=False is the unmasked fast path.

    doc_lo, doc_hi (BLOCK_M,): each query row's document span (read only when HAS_DOCS); q_pos
    (BLOCK_M,) float32: i + shift, ALiBi's row positions (read only with ALIBI_).
    RESCALE_TAU > 0: the running max m_i (and with it acc, l_i) is only moved when some row's
    max grew by more than RESCALE_TAU; otherwise p = exp2(s2 - m_i) <= 2^RESCALE_TAU, exact in
    fp32 and bf16 alike, and the (BLOCK_M, D_TILE) multiply of acc is skipped. A row with
    nothing allowed yet (m_i = -inf) always counts as grown once it sees a key.
    The softmax's row sum l_i counts every probability; DROPOUT zeroes the dropped ones only in
    what reaches acc (the kernel scales acc by 1 / (1 - p) at the end).
    """
    MODS: tl.constexpr = ALIBI_ or SOFTCAP
    offs_d = tl.arange(0, D_TILE)
    start_next = tile_start(t_lo, idx_ptr, bs, TPB, BLOCK_N, SPARSE, t_lo < t_hi)
    for t in range(t_lo, t_hi):
        start_n = start_next  # loaded one step ahead: see tile_start
        start_next = tile_start(t + 1, idx_ptr, bs, TPB, BLOCK_N, SPARSE, t + 1 < t_hi)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = stream_tile(k_src, start_n, offs_n, sk_l, offs_n < kv_end, offs_d, D, D_TILE, MASK, TMA, ALIGN8)
        s = mma(q, tl.trans(k), None, DOT_F32)  # (BLOCK_M, BLOCK_N) fp32, unscaled q . k
        if MODS:  # now base-2 scores
            s, _ = base2_scores(
                s,
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
        if MASK:
            keep = offs_n[None, :] < kv_end
            if BAND_HI:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + hi_off)
            if BAND_LO:
                keep = keep & (offs_n[None, :] >= offs_m[:, None] + lo_off)
            if HAS_DOCS:
                keep = keep & (offs_n[None, :] >= doc_lo[:, None]) & (offs_n[None, :] < doc_hi[:, None])
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, scaled(tl.max(s, 1), qk_scale, MODS))
            # a row with nothing allowed so far keeps m = -inf; subtract 0 to avoid inf - inf
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, scaled(tl.max(s, 1), qk_scale, MODS))
            m_sub = m_new
        if RESCALE_TAU > 0:
            if tl.max((m_new > m_i + RESCALE_TAU).to(tl.int32), 0) > 0:
                alpha = tl.math.exp2(m_i - m_sub)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            m_sub = m_i
            if MASK:
                m_sub = tl.where(m_i == float("-inf"), 0.0, m_i)
            p = tl.math.exp2(scaled(s, qk_scale, MODS) - m_sub[:, None])  # (BLOCK_M, BLOCK_N), <= 2^RESCALE_TAU
            l_i = l_i + tl.sum(p, 1)
        else:
            p = tl.math.exp2(scaled(s, qk_scale, MODS) - m_sub[:, None])  # (BLOCK_M, BLOCK_N)
            alpha = tl.math.exp2(m_i - m_sub)  # rescales what was accumulated with the old max
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        if DROPOUT:
            p = tl.where(dropout_keep(seed, rng_off, seq_head, offs_m, start_n, drop_thr, BLOCK_M, BLOCK_N), p, 0.0)
        v = stream_tile(v_src, start_n, offs_n, sv_l, offs_n < kv_end, offs_d, D, D_TILE, MASK, TMA, ALIGN8)
        acc = mma(p.to(v.dtype), v, acc, DOT_F32)
    return acc, l_i, m_i


@triton.jit
def alibi_slope(ALIBI, sal_b, seq, h, ALIBI_: tl.constexpr):
    """The ALiBi slope of (sequence, head) in base 2 (ALIBI (S, H) fp32, sal_b its sequence stride,
    0 for slopes per head); 0 without ALiBi."""
    slope2 = 0.0
    if ALIBI_:
        slope2 = tl.load(ALIBI + seq * sal_b + h) * 1.4426950408889634  # log2(e)
    return slope2


@triton.jit
def dropout_args(RNG, DROPOUT: tl.constexpr):
    """The dropout seed and offset (RNG: two int64; the offset's low 32 bits), 0 without dropout."""
    seed = tl.zeros([], dtype=tl.int64)
    rng_off = 0
    if DROPOUT:
        seed = tl.load(RNG)
        rng_off = tl.load(RNG + 1).to(tl.int32)
    return seed, rng_off


@triton.jit(do_not_specialize=["band_lo", "band_hi", "drop_thr"])
def attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    PO,
    PM,
    PL,
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
    so_b,
    so_h,
    so_l,
    spart_bh,
    spart_s,
    sml_bh,
    sml_s,
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
    band_lo,
    band_hi,
    cap_in,
    cap2,
    drop_thr,
    drop_scale,
    BS: tl.constexpr,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BAND_LO: tl.constexpr,
    BAND_HI: tl.constexpr,
    SPARSE: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    SCAN_: tl.constexpr,
    DOT_F32: tl.constexpr,
    ALIGN8: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    TMA: tl.constexpr,
    RESCALE_TAU: tl.constexpr,
    SPLIT: tl.constexpr,
    VARLEN: tl.constexpr,
    ALIBI_: tl.constexpr,
    SOFTCAP: tl.constexpr,
    DROPOUT: tl.constexpr,
    TANH_ASM: tl.constexpr,
):
    # grid: (B * H, query tiles), the longest rows launched first: dense, the last tiles (the
    # longest causal rows), or with documents the tiles in DOC_ORDER (B, tiles) (by descending
    # span); sparse, the layout rows in ORDER (by descending count), each as BS // BLOCK_M
    # tiles, so that a long row (a global block) does not finish last.
    # VARLEN: grid (sequences * H, cdiv(longest query sequence, BLOCK_M)); a sequence's own tiles,
    # its last first, and the programs past its end exit at once.
    # SPLIT (sparse only; split-KV): ORDER holds the split plan's items (P, I, 4) (row, first
    # entry, end entry, slot; ``triton_flash.SplitPlan``), sord_h its head stride; a program walks
    # the entries [e_lo, e_hi) of its row's list, and a chunk of a split row (slot >= 0) writes
    # its unnormalised acc to PO (B, H, slots, BS, D) (strides spart_bh, spart_s, D) and its
    # running max and sum to PM, PL (B, H, slots, BS) (strides sml_bh, sml_s, 1), merged later by
    # ``fwd_merge_kernel``
    pid = tl.program_id(0)
    seq = pid // H  # the batch row, or with VARLEN the sequence
    h = pid % H
    hk = h // GROUP
    b = seq
    if VARLEN:
        b = seq * 0  # one batch row holds every sequence
    q_row0, seq_q = seq_rows(CU_Q, seq, Lq, VARLEN)
    k_row0, seq_k = seq_rows(CU_K, seq, Lk, VARLEN)
    shift = seq_k - seq_q  # the band is aligned to the bottom-right corner
    row = 0  # the layout row of this tile (SPARSE only)
    e_lo = 0
    e_hi = 0
    slot = 0
    if SPARSE:
        tiles_per_row = BS // BLOCK_M
        if SPLIT:
            row, e_lo, e_hi, slot = split_item(ORDER, h, sord_h, tl.program_id(1) // tiles_per_row)
        else:
            row = tl.load(ORDER + h * sord_h + tl.program_id(1) // tiles_per_row)
        start_m = row * BS + (tl.program_id(1) % tiles_per_row) * BLOCK_M
    elif HAS_DOCS:
        start_m = tl.load(DOC_ORDER + b * tl.num_programs(1) + tl.program_id(1)) * BLOCK_M
    elif VARLEN:
        start_m = (tl.cdiv(seq_q, BLOCK_M) - 1 - tl.program_id(1)) * BLOCK_M
    else:
        start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
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

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_TILE)
    row_ok = offs_m < seq_q
    q_base = slice_ptr(Q, b, sq_b, h, sq_h, q_row0, sq_l, ALIGN8)
    k_base = slice_ptr(K, b, sk_b, hk, sk_h, k_row0, sk_l, ALIGN8)
    v_base = slice_ptr(V, b, sv_b, hk, sv_h, k_row0, sv_l, ALIGN8)
    # q stays in registers for the whole program: (BLOCK_M, D_TILE)
    q = load_tile(tile_ptrs(q_base, offs_m, sq_l, offs_d, ALIGN8), row_ok, offs_d, D, D_TILE, True)

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
        BLOCK_N,
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
        BLOCK_M,
        BLOCK_N,
        BAND_LO,
        BAND_HI,
        SPARSE,
        HAS_DOCS,
        SCAN_,
    )
    if SPLIT:  # this program's chunk of the list
        t_lo, t_first, t_full, t_end = clamp_ranges(t_lo, t_first, t_full, t_end, e_lo * TPB, e_hi * TPB)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of s2
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s2 - m)
    acc = tl.zeros([BLOCK_M, D_TILE], dtype=tl.float32)
    k_src = tile_source(k_base, seq_k, sk_l, BLOCK_N, D, D_TILE, TMA)
    v_src = tile_source(v_base, seq_k, sv_l, BLOCK_N, D, D_TILE, TMA)
    seq_head = seq * H + h
    q_pos = (offs_m + shift).to(tl.float32)  # ALiBi's distances are |i + shift - j|
    if HAS_DOCS or BAND_LO:  # the start of the documents' span or of the band
        acc, l_i, m_i = _fwd_steps(
            acc,
            l_i,
            m_i,
            q,
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
            BLOCK_M,
            BLOCK_N,
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
            RESCALE_TAU,
            ALIBI_,
            SOFTCAP,
            DROPOUT,
            TANH_ASM,
        )
    acc, l_i, m_i = _fwd_steps(
        acc,
        l_i,
        m_i,
        q,
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
        BLOCK_M,
        BLOCK_N,
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
        RESCALE_TAU,
        ALIBI_,
        SOFTCAP,
        DROPOUT,
        TANH_ASM,
    )
    acc, l_i, m_i = _fwd_steps(
        acc,
        l_i,
        m_i,
        q,
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
        BLOCK_M,
        BLOCK_N,
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
        RESCALE_TAU,
        ALIBI_,
        SOFTCAP,
        DROPOUT,
        TANH_ASM,
    )
    if DROPOUT:  # the kept probabilities' 1 / (1 - p)
        acc = acc * drop_scale

    o_base = slice_ptr(O, b, so_b, h, so_h, q_row0, so_l, ALIGN8)
    lse_base = LSE + (b * H + h).to(tl.int64) * Lq + q_row0
    if SPLIT:
        if slot >= 0:  # a chunk of a split row: its unnormalised state, in fp32
            offs_r = offs_m - row * BS  # the rows of this tile within its layout block
            part = pid.to(tl.int64) * spart_bh + slot.to(tl.int64) * spart_s
            store_tile(tile_ptrs(PO + part, offs_r, D, offs_d, False), acc, row_ok, offs_d, D, D_TILE)
            ml = pid.to(tl.int64) * sml_bh + slot.to(tl.int64) * sml_s + offs_r
            tl.store(PM + ml, m_i, mask=row_ok)
            tl.store(PL + ml, l_i, mask=row_ok)
        else:
            store_rows(o_base, lse_base, acc, l_i, m_i, so_l, offs_m, row_ok, offs_d, D, D_TILE, ALIGN8)
    else:
        store_rows(o_base, lse_base, acc, l_i, m_i, so_l, offs_m, row_ok, offs_d, D, D_TILE, ALIGN8)


@triton.jit
def fwd_merge_kernel(
    PO,
    PM,
    PL,
    O,
    LSE,
    SUMS,
    spart_bh,
    spart_s,
    sml_bh,
    sml_s,
    so_b,
    so_h,
    so_l,
    ssum_h,
    H,
    Lq,
    bs,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK: tl.constexpr,
    ALIGN8: tl.constexpr,
):
    # grid: (B * H, split rows * (bs // BLOCK)).  Merges the chunks of a split row (SUMS (P, S, 3):
    # row, first slot, chunks; an entry with no chunk writes nothing), in slot order: with
    # m = max_c m_c and w_c = exp2(m_c - m), o = sum_c w_c acc_c / sum_c w_c l_c and
    # lse = m + log2(sum_c w_c l_c); a row no chunk saw a key of (l = 0) gets o = 0, lse = +inf
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    first, chunks, offs_r, offs_m, row_ok = split_sum_rows(SUMS, h, ssum_h, bs, Lq, BLOCK)
    offs_d = tl.arange(0, D_TILE)
    ml = bh.to(tl.int64) * sml_bh + offs_r  # PM and PL share their strides
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for c in range(chunks):
        m = tl.maximum(m, tl.load(PM + ml + (first + c).to(tl.int64) * sml_s, mask=row_ok, other=float("-inf")))
    m_sub = tl.where(m == float("-inf"), 0.0, m)  # a row no chunk saw a key of: its weights are 0
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, D_TILE], dtype=tl.float32)  # stays in registers
    part = PO + bh.to(tl.int64) * spart_bh
    for c in range(chunks):
        slot = (first + c).to(tl.int64)
        w = tl.math.exp2(tl.load(PM + ml + slot * sml_s, mask=row_ok, other=float("-inf")) - m_sub)
        l_i += w * tl.load(PL + ml + slot * sml_s, mask=row_ok, other=0.0)
        acc += w[:, None] * load_tile(
            tile_ptrs(part + slot * spart_s, offs_r, D, offs_d, False), row_ok, offs_d, D, D_TILE, True
        )
    o_base = slice_ptr(O, b, so_b, h, so_h, b * 0, so_l, ALIGN8)
    store_rows(o_base, LSE + bh.to(tl.int64) * Lq, acc, l_i, m, so_l, offs_m, row_ok, offs_d, D, D_TILE, ALIGN8)
