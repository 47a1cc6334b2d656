"""Attention through torch.nn.functional.scaled_dot_product_attention (SDPA).

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0)
    L    query length      S   key length      D   head dim
    Bm / Hm  batch / heads of the bool mask (1 when the same for all)

Without key padding, packed documents (cu_seqlens) and a layout, SDPA runs mask-free (`is_causal` for causal), which
lets PyTorch pick its fused flash / memory-efficient kernels. Key padding, documents and
block-sparse layouts go in as a (Bm, Hm, L, S) bool mask: that costs Bm * Hm * L * S bytes, so the dispatcher
only picks SDPA with a mask when `mask_elements` is small (`attention` documents the limit).

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
from genoformer.kernels.reference import allowed_mask, lse_dtype, masked_logsumexp


def mask_elements(
    q: torch.Tensor, k: torch.Tensor, *, layout: BlockLayout | None, kv_lens, cu_seqlens=None,
    return_lse: bool = False,
) -> int:
    """Elements of the bool mask SDPA would need (0 when it runs mask-free), or with return_lse
    of the score matrix its lse is computed from, when that is larger."""
    B, Hq, L, _ = q.shape
    S = k.shape[2]
    if return_lse:
        return B * Hq * L * S
    if layout is None and kv_lens is None and cu_seqlens is None:
        return 0
    heads = 1 if layout is None else layout.num_heads
    batch = 1 if kv_lens is None and cu_seqlens is None else B
    return batch * heads * L * S


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SDPA attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D), and with
    return_lse the lse (B, Hq, L) (see the module docstring)."""
    gqa = q.shape[1] != k.shape[1]
    mask_BHLS = None
    if layout is None and kv_lens is None and cu_seqlens is None:
        out_BHLD = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    else:
        mask_BHLS = allowed_mask(
            q.shape[2], k.shape[2], causal=causal, layout=layout, kv_lens=kv_lens, device=q.device,
            cu_seqlens=cu_seqlens, batch=q.shape[0],
        )
        row_ok_BHL1 = mask_BHLS.any(dim=-1, keepdim=True)
        opened_BHLS = mask_BHLS | ~row_ok_BHL1  # open empty rows: no NaN, zeroed just below
        out_BHLD = F.scaled_dot_product_attention(q, k, v, attn_mask=opened_BHLS, scale=scale, enable_gqa=gqa)
        out_BHLD = out_BHLD * row_ok_BHL1
    if not return_lse:
        return out_BHLD
    if mask_BHLS is None and causal:
        mask_BHLS = allowed_mask(q.shape[2], k.shape[2], causal=True, layout=None, kv_lens=None, device=q.device)
    return out_BHLD, _lse(q, k, mask_BHLS, q.shape[-1] ** -0.5 if scale is None else scale)


def _lse(q: torch.Tensor, k: torch.Tensor, mask_BHLS: torch.Tensor | None, scale: float) -> torch.Tensor:
    """(B, Hq, L) logsumexp of the allowed scaled scores, -inf for a row with none."""
    dtype = lse_dtype(q.dtype)
    k_BHSD = k.to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores_BHLS = torch.matmul(q.to(dtype), k_BHSD.transpose(-1, -2)) * scale
    if mask_BHLS is not None:
        scores_BHLS = scores_BHLS.masked_fill(~mask_BHLS, torch.finfo(dtype).min)
    return masked_logsumexp(scores_BHLS, mask_BHLS)
