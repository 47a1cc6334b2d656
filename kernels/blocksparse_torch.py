"""Block-sparse attention in plain PyTorch: memory grows with the allowed blocks, not with L^2.

Shape legend:
    B    batch              Hkv  key/value heads       G   query heads per kv head (Hq = Hkv * G)
    Gl   layout groups: 1 when the layout is shared by all heads, else G
    Hl   layout kv-heads: 1 when shared, else Hkv        (the layout is viewed as (Hl, Gl, ...))
    bs   block size         Mb / Nb  query / key blocks  mc  query blocks in the current chunk
    C    the most key blocks any query block of the current chunk attends
    D    head dim           W = C * bs   gathered key positions per query block

How it works: query blocks are sorted by how many key blocks they attend and grouped into
chunks of similar width C (so one wide row, a BigBird global block say, does not pad every other
row to its width); per chunk of mc query blocks:
  1. gather the C allowed key/value blocks of each query block (layout.kv_indices), giving
     keys (B, Hkv, Gl, mc, W, D): only blocks the layout allows are ever touched;
  2. scores (B, Hkv, G, mc, bs, W) = q_block @ keys^T * scale, in float32 (float64 for float64
     inputs; half-precision inputs are upcast once, the output cast back);
  3. mask the gathered positions: padding slots of kv_indices, keys past the sequence end,
     causal (j <= i + S - L), the layout's token window, key padding (j < kv_lens[b]) and packed
     documents (j inside the query's document, `genoformer.kernels.documents`); add ALiBi's
     -slope * |j - i - (S - L)|; softmax with fully masked rows -> 0;
  4. out_block = probs @ values; with return_lse also each row's logsumexp of its valid scores
     (-inf for a row with none), from the same scores.

Memory bound. A chunk holds O(B * Hq * mc * bs * W) scores (plus a bool mask and the
probabilities of the same size) and O(B * Hkv * Gl * mc * W * D) gathered keys and values.
mc is chosen per chunk so that this is at most `chunk_elements` (one query block at least), so the
forward peak is O(chunk_elements + output), whatever L is. Under autograd, when there is more
than one chunk, every chunk is wrapped in activation checkpointing, so training keeps only
the chunk inputs and outputs (O(B * Hq * L * D)) and recomputes one chunk at a time in the
backward pass: the peak stays O(chunk_elements + B * Hq * L * D), never L^2.
Total work is proportional to the number of allowed blocks (layout.density * Mb * Nb).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from genoformer.kernels.documents import document_bounds
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import masked_logsumexp
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 1 << 24
"""Default budget (elements) of one chunk's score matrix: 64 MiB of float32."""

DENSE_BLOCK_SIZE = 64
"""Block size used when no layout is given (dense attention treated as a full layout)."""


def blocksparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D).

    Same semantics as `reference_attention`, return_lse too (lse (B, Hq, L) in the compute dtype:
    float32, float64 for float64 inputs). Inputs are assumed valid (`attention` checks them);
    layout None means dense.
    """
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = D**-0.5 if scale is None else scale
    if layout is None:
        layout = BlockLayout.dense(L, S, DENSE_BLOCK_SIZE)
    if causal and L == S:  # (Lq != Lk: no layout; the causal bound is applied per token below)
        layout = layout.with_causal()
    bs = layout.block_size
    Mb, Nb = layout.num_q_blocks, layout.num_kv_blocks
    Hl, Gl = (1, 1) if layout.num_heads == 1 else (Hkv, G)

    counts_HM, indices_HMC = layout.kv_indices(q.device)
    C = indices_HMC.shape[-1]
    counts_HGM = counts_HM.view(Hl, Gl, Mb).long()
    indices_HGMC = indices_HMC.view(Hl, Gl, Mb, C).long()

    # Half-precision inputs compute in float32 (like a kernel's fp32 accumulators), which also
    # keeps the sums of dk, dv over query blocks in float32. Zero-pad to whole blocks; padded
    # keys are masked below, padded query rows are cropped.
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_BHGMbD = F.pad(q.to(compute_dtype), (0, 0, 0, Mb * bs - L)).view(B, Hkv, G, Mb, bs, D)
    k_BHNbD = F.pad(k.to(compute_dtype), (0, 0, 0, Nb * bs - S)).view(B, Hkv, Nb, bs, D)
    v_BHNbD = F.pad(v.to(compute_dtype), (0, 0, 0, Nb * bs - S)).view(B, Hkv, Nb, bs, D)

    chunks = _chunks_by_width(counts_HGM.amax(dim=(0, 1)), B * Hq * bs * bs + 2 * B * Hkv * Gl * bs * D, chunk_elements)
    use_checkpoint = torch.is_grad_enabled() and len(chunks) > 1 and any(t.requires_grad for t in (q, k, v))
    # packed documents: each query's allowed key span [start, end) within its row, (B, L) each
    doc_bounds = None if cu_seqlens is None else document_bounds(cu_seqlens, B, L)
    slopes_BHG = None
    if alibi_slopes is not None:  # (B or 1, Hkv, G): the slope of each query head
        slopes_BHG = alibi_slopes.to(compute_dtype).reshape(-1, Hkv, G)
    kwargs = dict(
        block_size=bs,
        kv_len=S,
        causal=causal,
        kv_lens=kv_lens,
        doc_bounds=doc_bounds,
        scale=scale,
        return_lse=return_lse,
        window=layout.window,
        shift=S - L,
        slopes_BHG=slopes_BHG,
    )
    outs = []
    for rows_m, width in chunks:
        args = (
            q_BHGMbD.index_select(3, rows_m),
            k_BHNbD,
            v_BHNbD,
            counts_HGM.index_select(2, rows_m),
            indices_HGMC.index_select(2, rows_m)[..., :width],
            rows_m,
        )
        if use_checkpoint:
            outs.append(checkpoint(_attend_chunk, *args, use_reentrant=False, **kwargs))
        else:
            outs.append(_attend_chunk(*args, **kwargs))
    # Chunks hold the query blocks sorted by width; put them back in order.
    unsort_M = torch.argsort(torch.cat([rows_m for rows_m, _ in chunks]))
    if return_lse:
        outs, lses = zip(*outs)
    out_BHGMbD = torch.cat(outs, dim=3).index_select(3, unsort_M)  # (B, Hkv, G, Mb, bs, D)
    out_BHLD = out_BHGMbD.reshape(B, Hq, Mb * bs, D)[:, :, :L].to(q.dtype)
    if not return_lse:
        return out_BHLD
    lse_BHGMb = torch.cat(lses, dim=3).index_select(3, unsort_M)  # (B, Hkv, G, Mb, bs)
    return out_BHLD, lse_BHGMb.reshape(B, Hq, Mb * bs)[:, :, :L]


def _chunks_by_width(
    width_M: torch.Tensor, elements_per_block_pair: int, chunk_elements: int
) -> list[tuple[torch.Tensor, int]]:
    """Group the query blocks into chunks of similar width (allowed key blocks).

    Each chunk pads its rows to its widest row only, so rows are sorted by width first: a few
    wide rows (a BigBird global block, the bottom of a causal layout) then no longer pad every
    other row to their width. A chunk of n rows of width w costs about
    n * w * elements_per_block_pair elements, kept within chunk_elements (one row at least).
    Returns [(query-block indices (n,) int64, width)], the indices on width_M's device.
    """
    order_M = torch.argsort(width_M, stable=True)
    widths = width_M[order_M].tolist()
    chunks = []
    start = 0
    while start < len(widths):
        end = start + 1
        while end < len(widths) and (end + 1 - start) * max(1, widths[end]) * elements_per_block_pair <= chunk_elements:
            end += 1
        chunks.append((order_M[start:end], max(1, widths[end - 1])))
        start = end
    return chunks


def _attend_chunk(
    q_BHGmbD: torch.Tensor,
    k_BHNbD: torch.Tensor,
    v_BHNbD: torch.Tensor,
    counts_HGm: torch.Tensor,
    indices_HGmC: torch.Tensor,
    rows_m: torch.Tensor,
    *,
    block_size: int,
    kv_len: int,
    causal: bool,
    kv_lens: torch.Tensor | None,
    doc_bounds: tuple[torch.Tensor, torch.Tensor] | None,
    scale: float,
    return_lse: bool,
    window: tuple[int | None, int | None] | None,
    shift: int,
    slopes_BHG: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of the query blocks `rows_m` (mc,) against their gathered key blocks:
    (B, Hkv, G, mc, bs, D), and with return_lse the rows' lse (B, Hkv, G, mc, bs)."""
    B, Hkv, G, mc, bs, D = q_BHGmbD.shape
    Hl, Gl, _, C = indices_HGmC.shape
    W = C * bs
    device = q_BHGmbD.device

    # 1. gather: keys (B, Hkv, Gl, mc, C, bs, D) -> (B, Hkv, Gl, mc, W, D)
    heads_H111 = torch.arange(Hkv, device=device).view(Hkv, 1, 1, 1)
    k_BHGmWD = k_BHNbD[:, heads_H111, indices_HGmC].reshape(B, Hkv, Gl, mc, W, D)
    v_BHGmWD = v_BHNbD[:, heads_H111, indices_HGmC].reshape(B, Hkv, Gl, mc, W, D)

    # 2. scores (B, Hkv, G, mc, bs, W); Gl == 1 broadcasts over the G query heads of a kv head
    scores = torch.matmul(q_BHGmbD, k_BHGmWD.transpose(-1, -2)) * scale

    # 3. which gathered positions are real allowed keys
    offsets_bs = torch.arange(bs, device=device)
    keys_HGmW = (indices_HGmC.unsqueeze(-1) * bs + offsets_bs).reshape(Hl, Gl, mc, W)
    slot_ok_HGmC = torch.arange(C, device=device) < counts_HGm.unsqueeze(-1)
    valid = slot_ok_HGmC.repeat_interleave(bs, dim=-1) & (keys_HGmW < kv_len)
    valid = valid.view(1, Hl, Gl, mc, 1, W)
    queries_mbs = (rows_m * bs).view(mc, 1) + offsets_bs  # (mc, bs)
    offset_HGmbW = keys_HGmW.view(Hl, Gl, mc, 1, W) - queries_mbs.view(1, 1, mc, bs, 1)  # j - i
    if causal:
        valid = valid & (offset_HGmbW <= shift)
    if window is not None:
        left, right = window
        if left is not None:
            valid = valid & (offset_HGmbW >= -left)
        if right is not None:
            valid = valid & (offset_HGmbW <= right)
    if slopes_BHG is not None:  # ALiBi: (B or 1, Hkv, G, mc, bs, W)
        distance = (offset_HGmbW - shift).abs().to(scores.dtype).view(1, Hl, Gl, mc, bs, W)
        scores = scores - slopes_BHG.view(-1, Hkv, G, 1, 1, 1) * distance
    if kv_lens is not None:
        valid = valid & (keys_HGmW.unsqueeze(0) < kv_lens.view(-1, 1, 1, 1, 1)).unsqueeze(-2)
    if doc_bounds is not None:
        starts_BL, ends_BL = doc_bounds
        # query rows past L (block padding) are cropped later: give them the last row's span
        rows_mbs = queries_mbs.clamp_max(starts_BL.shape[1] - 1)
        starts_B11mb1 = starts_BL[:, rows_mbs].view(-1, 1, 1, mc, bs, 1)
        ends_B11mb1 = ends_BL[:, rows_mbs].view(-1, 1, 1, mc, bs, 1)
        keys_1HGm1W = keys_HGmW.view(1, Hl, Gl, mc, 1, W)
        valid = valid & (keys_1HGm1W >= starts_B11mb1) & (keys_1HGm1W < ends_B11mb1)

    # Finite fill: fully masked rows get a uniform softmax that the product with `valid` zeroes,
    # with a zero (never NaN) gradient.
    scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1) * valid

    # 4. weighted sum (B, Hkv, G, mc, bs, D)
    out = torch.matmul(probs, v_BHGmWD)
    if not return_lse:
        return out
    return out, masked_logsumexp(scores, valid)
