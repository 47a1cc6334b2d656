"""Attention kernels: reference, pure-PyTorch block-sparse, SDPA, flash-attn and Triton backends.

Public API:
    attention(q, k, v, *, causal, layout, kv_lens, scale, backend, cu_seqlens, return_lse, alibi_slopes)
                                                                      the one entry point
    alibi_slopes(num_heads)                                           ALiBi's slopes per head
    Backend                                                           which implementation runs
    BlockLayout                                                       block-sparse pattern
    LayoutSpec, SlidingWindow, GlobalTokens, BigBird, Strided, Union  layout recipes for configs

Each is imported from its module on first use (`from genoformer.kernels import attention` imports
genoformer.kernels.dispatch, and torch with it), so that importing a light module of the package,
such as genoformer.kernels.backend, imports nothing else. The Triton kernels
(genoformer.kernels.triton_flash) are imported only when they run. Ring attention over a sequence
sharded across processes, and its sharding contract, live in genoformer.kernels.ring (imported on
its own: it brings torch.distributed). Decoding over a key/value cache (flash-attn's
flash_attn_with_kvcache, and the decode step of our models) lives in genoformer.kernels.kvcache,
its Triton kernel in genoformer.kernels.triton_decode. genoformer.kernels.flash_attn_compat offers
flash-attn 2's functions (flash_attn_func, flash_attn_varlen_func, ...) over our kernels: swapping
`import flash_attn` for it is all a flash-attn user changes.
"""

from __future__ import annotations

if __name__ == "kernels":  # found as a top-level package because the checkout's root is on sys.path
    import genoformer

    genoformer.stand_aside(__name__)  # the installed package named kernels takes this folder's place

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genoformer.kernels.backend import Backend
    from genoformer.kernels.dispatch import alibi_slopes, attention
    from genoformer.kernels.layout import BigBird, BlockLayout, GlobalTokens, LayoutSpec, SlidingWindow, Strided, Union

_HOMES = {
    "attention": "dispatch",
    "alibi_slopes": "dispatch",
    "Backend": "backend",
    **dict.fromkeys(
        ("BigBird", "BlockLayout", "GlobalTokens", "LayoutSpec", "SlidingWindow", "Strided", "Union"), "layout"
    ),
}
"""Where each public name lives (a module of this package)."""


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = [
    "attention",
    "alibi_slopes",
    "Backend",
    "BlockLayout",
    "LayoutSpec",
    "SlidingWindow",
    "GlobalTokens",
    "BigBird",
    "Strided",
    "Union",
]
