"""Attention through the optional flash-attn package (Dao et al.), CUDA fp16/bf16 only.

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0)
    L    query length      S   key length      D   head dim
    T    total unpadded key tokens of the batch (sum of kv_lens)

flash-attn takes (B, L, H, D) tensors and handles GQA itself. Key padding goes through its
variable-length entry point: keys and values are packed to (T, Hkv, D) with cumulative lengths.
It has no block-sparse layouts. The package is optional: `unsupported_reason` says how to
install it when it is missing, and nothing here imports it before that check.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from genoformer.kernels.layout import BlockLayout

INSTALL_HINT = "pip install flash-attn --no-build-isolation (or the extra: pip install 'genoformer[flash-attn]')"


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
) -> str | None:
    """None when flash-attn can run these inputs here, else a sentence saying why and what to do."""
    if importlib.util.find_spec("flash_attn") is None:
        return f"the flash-attn package is not installed: {INSTALL_HINT}."
    if q.device.type != "cuda":
        return f"flash-attn runs on CUDA only (inputs are on {q.device.type}); use backend 'sdpa' or 'torch'."
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn supports float16 and bfloat16 only (got {q.dtype}); cast q, k, v or use 'sdpa'."
    if layout is not None:
        return "flash-attn has no block-sparse layouts; use backend 'triton' or 'torch' with a layout."
    if q.shape[-1] > 256 or q.shape[-1] % 8 != 0:
        return f"flash-attn needs a head dim that is a multiple of 8 and at most 256 (got {q.shape[-1]})."
    if causal and kv_lens is not None:
        return (
            "flash-attn aligns its causal mask to the bottom right for unequal lengths, so it cannot "
            "combine causal with kv_lens; use backend 'triton', 'sdpa' or 'torch'."
        )
    return None


def flash_attn_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """flash-attn attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D).

    Call only when `unsupported_reason(...)` is None (the entry point `attention` does).
    """
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    B, Hq, L, D = q.shape
    S = k.shape[2]
    q_BLHD, k_BSHD, v_BSHD = (t.transpose(1, 2) for t in (q, k, v))
    if kv_lens is None:
        out_BLHD = flash_attn_func(q_BLHD, k_BSHD, v_BSHD, softmax_scale=scale, causal=causal)
        return out_BLHD.transpose(1, 2)

    # Empty key sets are given one key and their output zeroed afterwards (0 and zero gradient).
    lens_B = kv_lens.clamp_min(1).to(torch.int32)
    keep_BS = torch.arange(S, device=q.device) < lens_B.unsqueeze(1)
    k_THD, v_THD = k_BSHD[keep_BS], v_BSHD[keep_BS]
    cu_k = F.pad(lens_B.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = torch.arange(0, (B + 1) * L, L, device=q.device, dtype=torch.int32)
    out_TqHD = flash_attn_varlen_func(
        q_BLHD.reshape(B * L, Hq, D),
        k_THD,
        v_THD,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=L,
        max_seqlen_k=int(lens_B.max()),
        softmax_scale=scale,
        causal=False,
    )
    out_BHLD = out_TqHD.view(B, L, Hq, D).transpose(1, 2)
    return out_BHLD * (kv_lens > 0).view(B, 1, 1, 1).to(out_BHLD.dtype)
