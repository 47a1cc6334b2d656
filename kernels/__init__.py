"""Attention kernels: reference, pure-PyTorch block-sparse, SDPA, flash-attn and Triton backends.

Public API:
    attention(q, k, v, *, causal, layout, kv_lens, scale, backend, cu_seqlens, return_lse)
                                                                      the one entry point
    Backend                                                           which implementation runs
    BlockLayout                                                       block-sparse pattern
    LayoutSpec, SlidingWindow, GlobalTokens, BigBird, Strided, Union  layout recipes for configs

The Triton kernels (genoformer.kernels.triton_flash) are imported only when they run.
Ring attention over a sequence sharded across processes, and its sharding contract, live in
genoformer.kernels.ring (imported on its own: it brings torch.distributed).
"""

from genoformer.kernels.dispatch import Backend, attention
from genoformer.kernels.layout import (
    BigBird,
    BlockLayout,
    GlobalTokens,
    LayoutSpec,
    SlidingWindow,
    Strided,
    Union,
)

__all__ = [
    "attention",
    "Backend",
    "BlockLayout",
    "LayoutSpec",
    "SlidingWindow",
    "GlobalTokens",
    "BigBird",
    "Strided",
    "Union",
]
