"""Dense reference attention in float64: the judge of every other backend.

Shape legend:
    B    batch            Hq   query heads      Hkv  key/value heads (Hq % Hkv == 0)
    L    query length     S    key length       D    head dim
    Hm   mask heads: 1 when the mask is the same for every head, else Hq
    Bm   mask batch: 1 without key padding, else B

It materialises the full (B, Hq, L, S) score matrix, so it is meant for tests and small inputs.
Packed rows (`cu_seqlens`, see `genoformer.kernels.documents`) add the same-document condition.
With return_lse it also gives each row's log-sum-exp (the convention of `genoformer.kernels.dispatch`:
natural log of the scaled scores' exponentials over the allowed keys, -inf for a row with none).
`row_error` is the benchmarks' measure of how far a result lies from another.

The flash-attn parameters, written out once here (the Triton kernels implement the same, see
``genoformer.kernels.triton_flash``): with shift = S - L (causal and windows are aligned to the
bottom-right corner of the score matrix, as flash-attn aligns them),
    causal          j <= i + shift
    window (l, r)   i + shift - l <= j <= i + shift + r   (None or negative: that side unbounded)
    softcap c > 0   score = c * tanh(scale * q . k / c)
    alibi_slopes    score -= slope[b, h] * |j - i - shift|   (slopes (Hq,) or (B, Hq))
    dropout_p       probabilities kept by `genoformer.kernels.dropout.keep_mask` (seed, offset in
                    dropout_rng), scaled by 1 / (1 - p); the lse is that of the scores, before dropout
    varlen          sequences concatenated along one row (`triton_flash.Varlen`), each computed
                    alone with its own L, S and shift; ALiBi slopes and dropout rows per sequence.
"""

from __future__ import annotations

import torch
from genoformer.kernels.documents import document_mask
from genoformer.kernels.dropout import keep_mask
from genoformer.kernels.layout import BlockLayout


def allowed_mask(
    q_len: int,
    kv_len: int,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
    device: torch.device | str = "cpu",
    cu_seqlens: torch.Tensor | None = None,
    batch: int = 1,
    window: tuple[int | None, int | None] | None = None,
) -> torch.Tensor | None:
    """The token-level bool mask (Bm, Hm, L, S) of allowed (query, key) pairs, None if all allowed.

    This is the single written-out form of the semantics in the interfaces contract:
    layout block allowed (and its own window), and (not causal or j <= i + S - L), and the window
    (module docstring), and (kv_lens is None or j < kv_lens[b]), and (cu_seqlens is None or i and j
    lie in the same document). `batch` is B, read only with cu_seqlens (whose documents cover the
    B * L tokens of the batch; then Bm = B).
    """
    mask_BHLS = None
    if layout is not None:
        mask_BHLS = layout.token_mask(causal).to(device).unsqueeze(0)  # (1, H_l, L, S)
    elif causal:
        mask_BHLS = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)[None, None]
    band_LS = window_mask(q_len, kv_len, window, device)
    if band_LS is not None:
        mask_BHLS = band_LS[None, None] if mask_BHLS is None else mask_BHLS & band_LS
    if kv_lens is not None:
        keys_S = torch.arange(kv_len, device=device)
        padding_B11S = (keys_S < kv_lens.to(device).view(-1, 1)).view(-1, 1, 1, kv_len)
        mask_BHLS = padding_B11S if mask_BHLS is None else mask_BHLS & padding_B11S
    if cu_seqlens is not None:
        same_doc_B1LS = document_mask(cu_seqlens.to(device), batch, q_len)
        mask_BHLS = same_doc_B1LS if mask_BHLS is None else mask_BHLS & same_doc_B1LS
    return mask_BHLS


def window_mask(
    q_len: int, kv_len: int, window: tuple[int | None, int | None] | None, device: torch.device | str = "cpu"
) -> torch.Tensor | None:
    """(L, S) bool: i + shift - left <= j <= i + shift + right (shift = S - L; a side None or
    negative is unbounded), or None when the window bounds nothing."""
    if window is None:
        return None
    left, right = (None if side is None or side < 0 else side for side in window)
    if left is None and right is None:
        return None
    offset_LS = (
        torch.arange(kv_len, device=device).view(1, -1)
        - torch.arange(q_len, device=device).view(-1, 1)
        - (kv_len - q_len)
    )  # j - i - shift
    band_LS = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if left is not None:
        band_LS &= offset_LS >= -left
    if right is not None:
        band_LS &= offset_LS <= right
    return band_LS


def alibi_bias(slopes: torch.Tensor, batch: int, q_len: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """(B or 1, Hq, L, S): -slope * |j - i - shift| (shift = S - L) for slopes (Hq,) or (B, Hq)."""
    offset_LS = (
        torch.arange(kv_len, device=slopes.device).view(1, -1)
        - torch.arange(q_len, device=slopes.device).view(-1, 1)
        - (kv_len - q_len)
    )
    slopes_BH11 = slopes.to(dtype).reshape(-1, slopes.shape[-1], 1, 1)
    return -slopes_BH11 * offset_LS.abs().to(dtype)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    window: tuple[int | None, int | None] | None = None,
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    dropout_rng: torch.Tensor | None = None,
    varlen=None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + mask) v computed in float64, cast back to q.dtype.

    q: (B, Hq, L, D), k and v: (B, Hkv, S, D). A query row with no allowed key gives 0 and a
    zero gradient. Inputs are assumed valid (the entry point `attention` checks them).
    return_lse: also return lse (B, Hq, L) in `lse_dtype(q.dtype)`, logsumexp_j(scores) over the
    allowed keys (-inf for a row with none), differentiable (its gradient is the row's softmax).
    window, alibi_slopes, softcap, dropout_p with dropout_rng (int64 (seed, offset); needed when
    dropout_p > 0), varlen (a `triton_flash.Varlen`; q (1, Hq, total_q, D)): see the module docstring.
    """
    if varlen is not None:
        return _varlen_reference(
            q,
            k,
            v,
            varlen,
            causal=causal,
            scale=scale,
            return_lse=return_lse,
            window=window,
            alibi_slopes=alibi_slopes,
            softcap=softcap,
            dropout_p=dropout_p,
            dropout_rng=dropout_rng,
        )
    return _reference(
        q,
        k,
        v,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        scale=scale,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        window=window,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        dropout_p=dropout_p,
        dropout_rng=dropout_rng,
    )


def _reference(
    q,
    k,
    v,
    *,
    causal,
    layout,
    kv_lens,
    scale,
    cu_seqlens,
    return_lse,
    window,
    alibi_slopes,
    softcap,
    dropout_p,
    dropout_rng,
    first_row: int = 0,
):
    """`reference_attention` of a batch (dropout rows counted from first_row)."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    group = Hq // Hkv
    q64 = q.to(torch.float64)
    k64 = k.to(torch.float64).repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    v64 = v.to(torch.float64).repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    scores_BHLS = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    if softcap > 0:
        scores_BHLS = softcap * torch.tanh(scores_BHLS / softcap)
    if alibi_slopes is not None:
        scores_BHLS = scores_BHLS + alibi_bias(alibi_slopes.to(q.device), B, L, S, torch.float64)
    mask_BHLS = allowed_mask(
        L,
        S,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        device=q.device,
        cu_seqlens=cu_seqlens,
        batch=B,
        window=window,
    )
    if mask_BHLS is None:
        probs_BHLS = torch.softmax(scores_BHLS, dim=-1)
    else:
        # A finite fill keeps fully masked rows NaN-free (their softmax is uniform); multiplying
        # by the mask then zeroes them, and the gradient through the product is zero there too.
        scores_BHLS = scores_BHLS.masked_fill(~mask_BHLS, torch.finfo(torch.float64).min)
        probs_BHLS = torch.softmax(scores_BHLS, dim=-1) * mask_BHLS
    if dropout_p > 0:
        kept_BHLS = keep_mask(dropout_rng, dropout_p, B, Hq, L, S, first_row).to(q.device)
        probs_BHLS = probs_BHLS * kept_BHLS / (1.0 - dropout_p)
    out_BHLD = torch.matmul(probs_BHLS, v64).to(q.dtype)
    if not return_lse:
        return out_BHLD
    return out_BHLD, masked_logsumexp(scores_BHLS, mask_BHLS).to(lse_dtype(q.dtype))


def _varlen_reference(
    q, k, v, varlen, *, causal, scale, return_lse, window, alibi_slopes, softcap, dropout_p, dropout_rng
):
    """Each sequence of a varlen batch alone (`_reference`), written back in place (differentiable)."""
    cu_q, cu_k = varlen.cu_seqlens_q.tolist(), varlen.cu_seqlens_k.tolist()
    outs, lses = [], []
    for s in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s]
        result = _reference(
            q[:, :, rows],
            k[:, :, keys],
            v[:, :, keys],
            causal=causal,
            layout=None,
            kv_lens=None,
            scale=scale,
            cu_seqlens=None,
            return_lse=True,
            window=window,
            alibi_slopes=slopes,
            softcap=softcap,
            dropout_p=dropout_p,
            dropout_rng=dropout_rng,
            first_row=s,
        )
        outs.append(result[0])
        lses.append(result[1])
    out = torch.cat(outs, dim=2)
    return (out, torch.cat(lses, dim=2)) if return_lse else out


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the lse every backend returns for inputs of `dtype`: float32, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_logsumexp(scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """logsumexp over the last dim of `scores` whose masked entries hold finfo.min, -inf for a
    row with no valid entry; `valid` broadcasts against scores (None: every entry counts).

    The finite fill keeps the gradient finite: a fully masked row's logsumexp is finite before
    the final where, which passes it a zero gradient (no inf - inf, no NaN).
    """
    lse = torch.logsumexp(scores, dim=-1)
    if valid is None:
        return lse
    return lse.masked_fill(~valid.any(dim=-1), float("-inf"))


def row_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The worst row's relative error of `got` against `expected` (same shape; a row is the last
    dim: one query's output, one token's gradient); NaN when either holds a non-finite value.

    A row's error is max |got - expected| / max |expected| over the row, with the row's scale
    floored at the median row's: rows that are zero up to rounding (dq of a query that sees one
    key) are judged against typical rows. A few bf16 roundings give ~1e-2; a row computed from
    the wrong keys gives 0.1 and more.
    """
    got, expected = got.detach().float(), expected.detach().float()
    if not (torch.isfinite(got).all() and torch.isfinite(expected).all()):
        return float("nan")
    diff_rows = (got - expected).abs().amax(-1)
    scale_rows = expected.abs().amax(-1)
    floor = scale_rows.median().clamp_min(torch.finfo(torch.float32).tiny)
    return float((diff_rows / scale_rows.clamp_min(floor)).max())
