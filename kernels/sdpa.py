"""Attention through torch.nn.functional.scaled_dot_product_attention (SDPA).

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0)
    L    query length      S   key length      D   head dim
    Bm / Hm  batch / heads of the bool mask (1 when the same for all)

Without key padding, packed documents (cu_seqlens), a layout and ALiBi, SDPA runs mask-free (`is_causal` for
causal with Lq == Lk), which lets PyTorch pick its fused flash / memory-efficient kernels. Key padding, documents,
block-sparse layouts and causal attention with Lq != Lk (bottom-right aligned, which SDPA's is_causal is not) go in
as a (Bm, Hm, L, S) bool mask, ALiBi as a float mask of its biases (-inf where the bool mask forbids): that costs
Bm * Hm * L * S elements, so the dispatcher only picks SDPA with a mask when `mask_elements` is small (`attention`
documents the limit).

SDPA returns NaN for a query row whose bool mask is all False. Such rows are opened to every
key before the call and their output multiplied by 0 afterwards, so they give 0 and a zero
gradient, as the contract requires.

SDPA does not return the log-sum-exp (torch's fused kernels keep it, but the public function
drops it, and the private ops that return it give it no gradient). With return_lse the lse is
computed beside the SDPA call, differentiably, from the (B, Hq, L, S) score matrix in float32
(float64 for float64 inputs): the output is the same as without it, at the cost of one more
q k^T and that matrix (`mask_elements` counts it, so that `auto` takes the torch backend for
long sequences).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import alibi_bias, allowed_mask, lse_dtype, masked_logsumexp


def _mask_free(L: int, S: int, *, causal: bool, layout, kv_lens, cu_seqlens, alibi_slopes) -> bool:
    """Whether SDPA runs these inputs without a mask (its is_causal is aligned top-left: Lq == Lk only)."""
    return layout is None and kv_lens is None and cu_seqlens is None and alibi_slopes is None and (not causal or L == S)


def mask_elements(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    layout: BlockLayout | None,
    kv_lens,
    cu_seqlens=None,
    return_lse: bool = False,
    causal: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> int:
    """Elements of the mask SDPA would need (0 when it runs mask-free), or with return_lse
    of the score matrix its lse is computed from, when that is larger."""
    B, Hq, L, _ = q.shape
    S = k.shape[2]
    if return_lse:
        return B * Hq * L * S
    if _mask_free(
        L, S, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, alibi_slopes=alibi_slopes
    ):
        return 0
    heads = Hq if alibi_slopes is not None else 1 if layout is None else layout.num_heads
    per_row = kv_lens is not None or cu_seqlens is not None or (alibi_slopes is not None and alibi_slopes.dim() == 2)
    return (B if per_row else 1) * heads * L * S


def sdpa_attention(
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
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SDPA attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D), and with
    return_lse the lse (B, Hq, L) (see the module docstring)."""
    gqa = q.shape[1] != k.shape[1]
    B, _, L, _ = q.shape
    S = k.shape[2]
    mask_BHLS = None
    bias_BHLS = None if alibi_slopes is None else alibi_bias(alibi_slopes, B, L, S, q.dtype)
    if _mask_free(
        L, S, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, alibi_slopes=alibi_slopes
    ):
        out_BHLD = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    else:
        mask_BHLS = allowed_mask(
            L, S, causal=causal, layout=layout, kv_lens=kv_lens, device=q.device, cu_seqlens=cu_seqlens, batch=B
        )
        if mask_BHLS is None:  # ALiBi alone
            attn_mask, row_ok_BHL1 = bias_BHLS, None
        else:
            row_ok_BHL1 = mask_BHLS.any(dim=-1, keepdim=True)
            opened_BHLS = mask_BHLS | ~row_ok_BHL1  # open empty rows: no NaN, zeroed just below
            attn_mask = opened_BHLS if bias_BHLS is None else bias_BHLS.masked_fill(~opened_BHLS, float("-inf"))
        out_BHLD = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=gqa)
        if row_ok_BHL1 is not None:
            out_BHLD = out_BHLD * row_ok_BHL1
    if not return_lse:
        return out_BHLD
    if mask_BHLS is None and causal:
        mask_BHLS = allowed_mask(L, S, causal=True, layout=None, kv_lens=None, device=q.device)
    return out_BHLD, _lse(q, k, mask_BHLS, q.shape[-1] ** -0.5 if scale is None else scale, alibi_slopes)


def _lse(
    q: torch.Tensor,
    k: torch.Tensor,
    mask_BHLS: torch.Tensor | None,
    scale: float,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, Hq, L) logsumexp of the allowed scaled scores (ALiBi's biases added), -inf for a row with none."""
    dtype = lse_dtype(q.dtype)
    k_BHSD = k.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores_BHLS = torch.matmul(q.to(dtype), k_BHSD.transpose(-1, -2)) * scale
    if alibi_slopes is not None:
        scores_BHLS = scores_BHLS + alibi_bias(alibi_slopes, q.shape[0], q.shape[2], k.shape[2], dtype)
    if mask_BHLS is not None:
        scores_BHLS = scores_BHLS.masked_fill(~mask_BHLS, torch.finfo(dtype).min)
    return masked_logsumexp(scores_BHLS, mask_BHLS)
