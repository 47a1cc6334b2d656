"""Attention through the optional xformers package: ``memory_efficient_attention``, for GPUs older than Ampere.

On a T4 or V100 (sm_75, sm_70) neither our Triton kernels nor flash-attn run; `auto` then takes
xformers for dense inputs, key padding and packed documents (``dispatch.PRE_AMPERE``), which
SDPA could run only with a bool mask of B * L * S elements (packed documents and key padding)
and the PyTorch path at O(allowed blocks) memory. Install: ``pip install xformers`` (or the
extra, ``pip install 'genoformer[xformers]'``); its wheels are built for one torch release each
(xformers 0.0.35: torch 2.10, CUDA 12.8, sm_75, sm_80 and sm_90: no V100 kernels in the wheel),
so a mismatched install imports without its CUDA operators: the checks below then refuse it with
the versions it was built for (and `auto` takes another backend) rather than fail in the call.

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0; GQA when Hkv < Hq)
    L    query length      S   key length      D   head dim      G = Hq // Hkv
    T    tokens of a batch flattened into one sequence (xformers' block-diagonal masks)

How our inputs map (xformers takes (B, L, H, D), or (B, L, Hkv, G, D) for GQA with the keys
expanded over G by stride 0):
    dense, causal or not     memory_efficient_attention(attn_bias=None or LowerTriangularMask())
    packed rows (cu_seqlens) the batch as one sequence of B * L tokens, BlockDiagonal(Causal)Mask
                             from the document lengths: exactly our document semantics.
    key padding (kv_lens)    the queries as one sequence, the keys as B padded blocks of S:
                             BlockDiagonalPaddedKeysMask (kv_lens[b] valid keys of row b). Causal
                             with padding runs in two calls, as flash-attn does (xformers aligns
                             its causal offset to the bottom right): the queries before kv_lens[b]
                             causally against their key prefix (BlockDiagonalCausalWithOffsetPadded
                             KeysMask, equal lengths: offset 0), those from kv_lens[b] on, which see
                             every valid key, without the causal mask. A row with no valid key
                             outputs 0 (zeroed after the call).
    layouts                  not run (xformers has no block-sparse masks but block-diagonal ones).
    log-sum-exp              not returned: under autograd xformers' lse has no gradient; auto
                             takes another backend for return_lse.
``unsupported_reason`` says why an input cannot run and what to do; nothing imports xformers
before that check. Compiled models: the call runs outside torch.compile graphs
(``torch.compiler.disable``), as the flash-attn backends do.
"""

from __future__ import annotations

import functools
import importlib
import platform

import torch
from genoformer.kernels.flash_attn_backend import device_capability
from genoformer.kernels.layout import BlockLayout

INSTALL = "pip install xformers (or pip install 'genoformer[xformers]')"


@functools.cache
def import_error() -> str | None:
    """None when xformers' attention imports here with its CUDA operators, else a clause saying why
    not (cached per process)."""
    try:
        _ops()
    except ImportError as error:
        return f"xformers does not import (import xformers.ops failed: {error})"
    package = importlib.import_module("xformers")
    if getattr(package, "_has_cpp_library", True):
        return None
    failure = getattr(getattr(package, "_cpp_lib", None), "_cpp_library_load_exception", None)
    built = getattr(failure, "build_info", None)
    installed = f"xformers {getattr(package, '__version__', '')}".strip()
    if built is None:
        cause = str(failure).splitlines()[0] if failure is not None else "its C++/CUDA library did not load"
        return f"{installed} imports without its CUDA operators ({cause})"
    return (
        f"{installed} imports without its CUDA operators: it was built for PyTorch {built.torch_version} "
        f"and Python {built.python_version}, this is PyTorch {torch.__version__} and Python "
        f"{platform.python_version()} (install the xformers release built for this PyTorch)"
    )


def _ops():
    """xformers.ops (memory_efficient_attention) and xformers.ops.fmha.attn_bias."""
    ops = importlib.import_module("xformers.ops")
    bias = importlib.import_module("xformers.ops.fmha.attn_bias")
    return ops, bias


@torch.compiler.disable
def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
) -> str | None:
    """None when xformers can run these (valid) inputs here, else a sentence saying why and what to do."""
    error = import_error()
    if error is not None:
        return f"{error}; {INSTALL}, or use backend 'sdpa'."
    capability = device_capability(q.device)
    if capability is None:
        return f"xformers runs on CUDA GPUs only (inputs are on {q.device.type}); use backend 'sdpa' or 'torch'."
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"xformers takes float16, bfloat16 or float32 (got {q.dtype}); cast q, k, v or use 'sdpa'."
    if q.dtype == torch.bfloat16 and capability < (8, 0):
        return (
            f"bfloat16 needs an Ampere or newer GPU (sm_80+) in xformers' kernels, this one is "
            f"sm_{capability[0]}{capability[1]}; run in float16 (autocast dtype) or use 'sdpa'."
        )
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        return f"xformers' kernels take head dims that are multiples of 8 up to 256 (got {q.shape[-1]}); use 'sdpa'."
    if return_lse:
        return "the xformers backend does not return the log-sum-exp; use backend 'triton', 'torch' or 'sdpa'."
    if layout is not None and not bool(layout.mask.all()):
        return "xformers has no block-sparse layouts (only block-diagonal masks); use backend 'torch' or 'triton'."
    return None


def _expanded(t_BHSD: torch.Tensor, groups: int) -> torch.Tensor:
    """Keys or values (B, Hkv, S, D) as xformers takes them: (B, S, Hkv, D), or for GQA
    (B, S, Hkv, G, D), expanded over the G query heads of their group by stride 0."""
    t_BSHD = t_BHSD.transpose(1, 2)
    if groups == 1:
        return t_BSHD
    B, S, H, D = t_BSHD.shape
    return t_BSHD.unsqueeze(3).expand(B, S, H, groups, D)


@torch.compiler.disable
def xformers_attention(
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
) -> torch.Tensor:
    """xformers attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D). Call only when
    `unsupported_reason` is None (the entry point `attention` does): a layout then has every block
    allowed, dense attention."""
    ops, bias = _ops()
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    q_x = q.transpose(1, 2).reshape(B, L, Hkv, groups, D) if groups > 1 else q.transpose(1, 2)
    k_x, v_x = (_expanded(t, groups) for t in (k, v))
    device = q.device

    def run(q_, k_, v_, attn_bias):
        out = ops.memory_efficient_attention(q_, k_, v_, attn_bias=attn_bias, scale=scale)
        return out.reshape(*out.shape[:2], Hq, D) if groups > 1 else out

    if cu_seqlens is not None:  # the batch as one sequence, documents as blocks
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        mask = (bias.BlockDiagonalCausalMask if causal else bias.BlockDiagonalMask).from_seqlens(lengths, device=device)
        flat = [t.reshape(1, B * t.shape[1], *t.shape[2:]) for t in (q_x, k_x, v_x)]
        return run(*flat, mask).reshape(B, L, Hq, D).transpose(1, 2)
    if kv_lens is None:
        return run(q_x, k_x, v_x, bias.LowerTriangularMask() if causal else None).transpose(1, 2)
    return _key_padding(run, bias, q_x, k_x, v_x, kv_lens, causal=causal, B=B, L=L, S=S, Hq=Hq, D=D)


def _key_padding(run, bias, q_x, k_x, v_x, kv_lens, *, causal, B, L, S, Hq, D):
    """Keys at positions >= kv_lens[b] masked (see the module docstring); (B, Hq, L, D)."""
    lens = kv_lens.clamp(0, S).tolist()
    keys = [t.reshape(1, B * S, *t.shape[2:]) for t in (k_x, v_x)]
    valid = [max(n, 1) for n in lens]  # a row without keys runs against one and is zeroed below
    out_BLHD = q_x.new_zeros(B, L, Hq, D)
    if not causal:
        mask = bias.BlockDiagonalPaddedKeysMask.from_seqlens(
            q_seqlen=[L] * B, kv_padding=S, kv_seqlen=valid, device=q_x.device
        )
        out_BLHD = run(q_x.reshape(1, B * L, *q_x.shape[2:]), *keys, mask).reshape(B, L, Hq, D)
    else:  # queries before kv_lens[b]: causal on their own prefix; the rest see every valid key
        before = [min(n, L) for n in valid]
        rows_BL = torch.arange(L, device=q_x.device) < torch.tensor(before, device=q_x.device)[:, None]
        mask = bias.BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
            q_seqlen=before, kv_padding=S, kv_seqlen=before, device=q_x.device
        )
        out_BLHD[rows_BL] = run(q_x[rows_BL][None], *keys, mask)[0]
        after = [L - n for n in before]
        if max(after) > 0:
            rest = [(b, n) for b, n in enumerate(after) if n > 0]
            mask = bias.BlockDiagonalPaddedKeysMask.from_seqlens(
                q_seqlen=[n for _, n in rest], kv_padding=S, kv_seqlen=[valid[b] for b, _ in rest], device=q_x.device
            )
            kept = [
                t.reshape(B, S, *t.shape[2:])[[b for b, _ in rest]].reshape(1, len(rest) * S, *t.shape[2:])
                for t in keys
            ]
            out_BLHD[~rows_BL] = run(q_x[~rows_BL][None], *kept, mask)[0]
    has_keys_B = torch.tensor([n > 0 for n in lens], device=q_x.device)
    return (out_BLHD * has_keys_B.view(B, 1, 1, 1).to(out_BLHD.dtype)).transpose(1, 2)
