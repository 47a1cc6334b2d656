"""The one attention entry point: checks inputs, picks a backend, runs it.

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0; GQA when Hkv < Hq)
    Lq   query length      Lk  key length      D   head dim
    N    packed documents in the batch (cu_seqlens has N + 1 entries)

Semantics (every backend, judged by `reference` in float64): query i of head h in batch b
may attend key j iff
    (layout is None or layout.mask[h_l, i // bs, j // bs])   h_l = h, or 0 for a shared layout
    and (layout.window is None or i - left <= j <= i + right)   the layout's token window
    and (not causal or j <= i + Lk - Lq)        bottom-right aligned, as flash-attn: j <= i when Lq == Lk
    and (kv_lens is None or j < kv_lens[b])
    and (cu_seqlens is None or i and j lie in the same document of row b).
A query row with no allowed key gives 0 and a zero gradient. With alibi_slopes (Hq,) or (B, Hq),
the score of (i, j) gets -slope[b, h] * |j - i - (Lk - Lq)| (ALiBi) before the softmax; the lse
includes it.

Log-sum-exp (`return_lse=True`): `attention` also returns lse (B, Hq, Lq), for each query row the
natural log of sum_j exp(scale * q_i . k_j) over its allowed keys j: float32 (float64 for float64
inputs), -inf for a row with no allowed key (its output is 0). It is what partial results of one
row over disjoint key sets merge by (`genoformer.kernels.ring`), and it is differentiable:
d lse_i / d (scale * q_i . k_j) = softmax_ij. Every backend returns it (reference, torch and triton
from the scores they already hold; sdpa from a second q k^T beside the SDPA call); flash-attn's lse
carries no gradient, so under autograd (torch.is_grad_enabled()) the flash-attn backends refuse
return_lse with the reason, and auto takes another. Without return_lse nothing extra is computed.

Packed variable-length sequences (`cu_seqlens`, flash-attn's varlen convention): several
documents share one row, and the int32 tensor cu_seqlens (N + 1,) gives the cumulative document
lengths over the flattened B * L tokens of the batch, row after row: cu_seqlens[0] == 0,
cu_seqlens[-1] == B * L, strictly increasing, and every row boundary (each multiple of L) is an
entry, so no document crosses a row. It needs Lq == Lk and excludes kv_lens (a row's padding is
simply its last document). A layout's blocks apply to positions within the row: the packed row is
one sequence to the layout, and causal means j <= i within the row (hence within the document).
Running each document alone gives the same rows as running the packed batch.

Backends:
    reference   dense float64 with an explicit mask (tests, tiny inputs)
    torch       block-sparse in plain PyTorch, memory O(allowed blocks), any device
    sdpa        torch's scaled_dot_product_attention; masks only as a bool tensor
    flash_attn_2  flash-attn 2 (`from flash_attn import flash_attn_func`; A100 and older; no layouts)
    flash_attn_4  flash-attn-4 (`import flash_attn.cute`; Hopper, Blackwell; no layouts; only the head
                dims whose gradients a GPU run checked: `flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS`)
    flash_attn  whichever flash-attn install can run the inputs, flash-attn-4 first (kept for
                existing configs; `genoformer.kernels.flash_attn_backend` documents both)
    triton      genoformer.kernels.triton_flash (CUDA, or CPU under TRITON_INTERPRET=1); fp16/bf16,
                head dims that are multiples of 8 from 16 to 256
    gluon       genoformer.kernels.gluon_flash: the Hopper-native (sm_90) Gluon forward with our Triton
                backward (gluon_flash._backward_kernels); causal or bidirectional, layouts whose block
                size is a multiple of 128, key padding, packed documents (without a layout), GQA;
                fp16/bf16, head dims 64 and 128 (docs/design/gluon.md)
    xformers    xformers' memory_efficient_attention (`genoformer.kernels.xformers_backend`; optional,
                `pip install xformers`): dense, key padding and packed documents (block-diagonal
                masks), no layouts, no lse; for GPUs older than Ampere (T4, V100)
    fp8         inference in FP8 (`genoformer.kernels.triton_fp8`): e4m3 q, k, v with per-block scales,
                both matmuls on the FP8 tensor cores (Ada sm_89, Hopper sm_90); dense, causal or not,
                key padding, GQA; no layouts, documents, lse or backward. On a CPU it is emulated
                (the kernel's arithmetic in PyTorch: slow, for tests and error budgets). Never
                chosen by auto: it changes the numbers (docs/inference.md gives its error budget)
    auto        CUDA: the first backend that supports the inputs in the measured order for the
                GPU's generation and the kind of input (`FASTEST_FIRST`; on sm_90 flash_attn_4, then
                gluon for dense inputs, then triton; triton on generations not measured; xformers on
                GPUs older than Ampere, `PRE_AMPERE`), else sdpa (dense) / torch (layout).
                Elsewhere: sdpa for dense inputs (with key padding or documents only while its
                bool mask has at most SDPA_MASK_ELEMENTS elements, with return_lse only while the
                score matrix has), torch for block-sparse layouts.
                Documents are never dropped: every backend runs them or refuses with the reason.
                A layout whose blocks are all allowed counts as dense.

Names: `Backend("flash_attn")`, `Backend("FLASH_ATTN")`, `Backend["auto"]` and `Backend["Triton"]` all
work, so a config may write a backend by value or by name in any case (jsonargparse, which reads
Enum fields by member name, then takes `attention_backend: flash_attn` as users write it).

Every backend is one row of `BACKENDS` (`BackendEntry`: how to run it, why it cannot run an
input, both behind the same signature), and `resolve` is the one path from a requested backend to
the one that runs: `attention` and `plan_attention` both call it.

The choice of `auto` is logged once per situation on the "genoformer.kernels" logger: at INFO
level, and at WARNING level when on a CUDA GPU it passes over the fastest measured backend (with
the reason and what to install), since that costs speed a user should know about.

Compiled models: `attention` traces into a torch.compile graph without breaks once the backend
is concrete and a layout's block lists are on the device. `plan_attention` does both outside
the graph (the model calls it per layer before running the blocks), so the choice of `auto`,
its log message and the layout preparation never enter a compiled region. The triton and gluon
backends run as torch custom ops; the flash-attn backends are the exception: their kernels are not
traceable, so the graph breaks around them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from genoformer.kernels import flash_attn_backend
from genoformer.kernels.backend import Backend
from genoformer.kernels.blocksparse_torch import blocksparse_attention
from genoformer.kernels.documents import check_cu_seqlens
from genoformer.kernels.flash_attn_backend import FlashAttn
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import reference_attention
from genoformer.kernels.sdpa import mask_elements, sdpa_attention

logger = logging.getLogger("genoformer.kernels")

SDPA_MASK_ELEMENTS = 1 << 24
"""Largest bool mask (elements) `auto` hands to SDPA for key padding, and largest score matrix
for its lse (return_lse); beyond it, torch runs."""

_logged_choices: set[tuple] = set()


# ------------------------------------------------------------------------------ the backends
class RunFn(Protocol):
    """The one signature of every backend's implementation: q (B, Hq, Lq, D), k, v (B, Hkv, Lk, D)
    -> (B, Hq, Lq, D) in q's dtype, and with return_lse (out, lse (B, Hq, Lq)), for inputs
    `attention` has checked."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        layout: BlockLayout | None,
        kv_lens: torch.Tensor | None,
        scale: float,
        cu_seqlens: torch.Tensor | None,
        return_lse: bool,
        alibi_slopes: torch.Tensor | None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


class ReasonFn(Protocol):
    """None when the backend can run these (valid) inputs here, else a sentence: why not, what to do.
    return_lse: the caller wants the lse too (differentiable while grad mode is on)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        layout: BlockLayout | None,
        kv_lens: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        return_lse: bool,
        alibi_slopes: torch.Tensor | None,
    ) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One row of `BACKENDS`."""

    load: Callable[[], RunFn]
    """Returns the implementation, importing it first where it lives in an optional package's
    module (Triton): nothing of it is imported before a call runs it."""
    unsupported_reason: ReasonFn
    """Asked before every run (and by auto for each candidate); must not import what it judges
    missing, so that a machine without the package gets the reason, not an ImportError."""


def _runs_every_input(q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes) -> None:
    return None


def _load_triton() -> RunFn:
    from genoformer.kernels.triton_flash import triton_attention

    return triton_attention


def _triton_unsupported_reason(q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes) -> str | None:
    # (a compiled graph cannot trace find_spec; plan_attention asked it before the graph)
    if not torch.compiler.is_compiling() and importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install triton (or the extra: pip install 'genoformer[triton]')."
    from genoformer.kernels import triton_flash

    return triton_flash.unsupported_reason(
        q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens
    )


def _load_gluon() -> RunFn:
    from genoformer.kernels.gluon_flash import gluon_attention

    def run(q, k, v, *, causal, layout, kv_lens, scale, cu_seqlens, return_lse, alibi_slopes):
        return gluon_attention(
            q,
            k,
            v,
            causal=causal,
            layout=layout,
            kv_lens=kv_lens,
            cu_seqlens=cu_seqlens,
            scale=scale,
            return_lse=return_lse,
        )

    return run


def _gluon_unsupported_reason(q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes) -> str | None:
    if alibi_slopes is not None:
        return "the Gluon kernels take no ALiBi slopes: use the triton backend"
    if layout is not None and layout.window is not None:
        return "the Gluon kernels take no layout with a token window (exact=True): use the triton backend"
    if not torch.compiler.is_compiling():
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed: pip install triton (or the extra: pip install 'genoformer[triton]')."
        error = _gluon_import_error()
        if error is not None:
            return (
                f"the Gluon kernels do not import with this Triton ({error}): upgrade triton to 3.6 or newer "
                f"(torch 2.11 ships it), or use the triton backend"
            )
    from genoformer.kernels import gluon_flash

    return gluon_flash.unsupported_reason(q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens)


@functools.cache
def _gluon_import_error() -> str | None:
    """None when the Gluon kernels import here, else the ImportError's message (cached per process;
    a Triton older than 3.6 lacks Gluon or the parts of it they use).  Reported in the gluon
    backend's reason, never hidden: auto passes over it with that reason, and an explicit
    backend="gluon" raises it."""
    try:
        from genoformer.kernels import gluon_flash  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def _flash_attn(*versions: FlashAttn) -> BackendEntry:
    """A flash-attn backend that runs the first of `versions` able to run the inputs."""
    run = functools.partial(flash_attn_backend.flash_attn_attention, versions)
    return BackendEntry(
        load=lambda: run, unsupported_reason=functools.partial(flash_attn_backend.unsupported_reason, versions)
    )


def _load_xformers() -> RunFn:
    from genoformer.kernels.xformers_backend import xformers_attention

    def run(q, k, v, *, alibi_slopes, **kwargs):  # (alibi_slopes is None: the reason refuses them)
        return xformers_attention(q, k, v, **kwargs)

    return run


def _xformers_unsupported_reason(
    q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes
) -> str | None:
    if alibi_slopes is not None:
        return "genoformer's xformers adapter passes no ALiBi slopes: use the triton, sdpa or torch backend"
    if layout is not None and layout.window is not None:
        return "genoformer's xformers adapter runs no layout with a token window: use the triton or torch backend"
    if causal and q.shape[2] != k.shape[2]:
        return (
            "genoformer's xformers adapter runs causal attention with Lq == Lk only (bottom-right alignment "
            "otherwise): use the triton, sdpa or torch backend"
        )
    from genoformer.kernels import xformers_backend

    return xformers_backend.unsupported_reason(
        q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, return_lse=return_lse
    )


def _load_fp8() -> RunFn:
    from genoformer.kernels.triton_fp8 import fp8_attention

    def run(q, k, v, *, alibi_slopes, **kwargs):  # (alibi_slopes is None: the reason refuses them)
        return fp8_attention(q, k, v, **kwargs)

    return run


def _fp8_unsupported_reason(q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes) -> str | None:
    if alibi_slopes is not None:
        return "FP8 attention takes no ALiBi slopes: use the triton backend"
    if causal and q.shape[2] != k.shape[2]:
        return "FP8 attention runs causal attention with Lq == Lk only: use the triton backend"
    if not torch.compiler.is_compiling() and importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install triton (or the extra: pip install 'genoformer[triton]')."
    from genoformer.kernels import triton_fp8

    if q.device.type == "cpu":  # the emulation
        return triton_fp8.semantic_reason(q, layout=layout, cu_seqlens=cu_seqlens, return_lse=return_lse)
    return triton_fp8.unsupported_reason(
        q, k, v, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, return_lse=return_lse
    )


BACKENDS: dict[Backend, BackendEntry] = {
    Backend.REFERENCE: BackendEntry(lambda: reference_attention, _runs_every_input),
    Backend.TORCH: BackendEntry(lambda: blocksparse_attention, _runs_every_input),
    Backend.SDPA: BackendEntry(lambda: sdpa_attention, _runs_every_input),
    Backend.FLASH_ATTN: _flash_attn(FlashAttn.V4, FlashAttn.V2),
    Backend.FLASH_ATTN_2: _flash_attn(FlashAttn.V2),
    Backend.FLASH_ATTN_4: _flash_attn(FlashAttn.V4),
    Backend.TRITON: BackendEntry(_load_triton, _triton_unsupported_reason),
    Backend.GLUON: BackendEntry(_load_gluon, _gluon_unsupported_reason),
    Backend.XFORMERS: BackendEntry(_load_xformers, _xformers_unsupported_reason),
    Backend.FP8: BackendEntry(_load_fp8, _fp8_unsupported_reason),
}
"""Every backend but AUTO, which is a choice among them (`_choose`)."""


# ------------------------------------------------------------------------------ entry points
def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's slopes (num_heads,) float32 (Press et al., "Train short, test long"): 2^(-8 (h + 1) / n)
    for n = num_heads a power of two; otherwise those of the largest power of two n' below it, then
    every other slope of 2 n' for the remaining heads, as the paper's code does."""
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}.")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    power = 1 << (num_heads.bit_length() - 1)
    slopes = geometric(power) + geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float32)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: Backend | str = Backend.AUTO,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with optional causality, block-sparse layout and key padding.

    Args:
        q: (B, Hq, Lq, D) queries, a float dtype.
        k: (B, Hkv, Lk, D) keys, same dtype and device as q, Hq % Hkv == 0.
        v: (B, Hkv, Lk, D) values.
        causal: key j is visible to query i only if j <= i + Lk - Lq (bottom-right aligned: j <= i
            when Lq == Lk; with a layout it needs Lq == Lk).
        layout: block-sparse pattern built for exactly these lengths (layout.q_len == Lq,
            layout.kv_len == Lk) with 1 (shared) or Hq heads, its token window (if any) included;
            None for dense attention.
        kv_lens: (B,) integer tensor on q's device: keys at positions >= kv_lens[b] are masked.
        scale: multiplier of q k^T; default 1 / sqrt(D).
        backend: a `Backend`, or its value or name as a string in any case; AUTO picks one (see
            the module docstring). Inside a compiled graph pass the backend of `plan_attention`
            instead: choosing reads the layout on the host, which would break the graph.
        cu_seqlens: (N+1,) int32 tensor on q's device: packed documents (see the module docstring);
            query i attends key j only inside its own document. Needs Lq == Lk; not with kv_lens.
        return_lse: also return each query row's log-sum-exp (see the module docstring).
        alibi_slopes: (Hq,) or (B, Hq) float tensor on q's device: ALiBi, -slope * |j - i - (Lk - Lq)|
            added to each score (see the module docstring); None for none.

    Returns:
        (B, Hq, Lq, D) tensor in q's dtype; with return_lse the pair (out, lse), lse (B, Hq, Lq)
        float32 (float64 for float64 inputs), -inf for a row with no allowed key.
    """
    backend = _as_backend(backend)
    _check_inputs(
        q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, alibi_slopes=alibi_slopes
    )
    scale = q.shape[-1] ** -0.5 if scale is None else _check_scale(scale)
    plan = _resolve(
        backend,
        q,
        k,
        v,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )
    run = BACKENDS[plan.backend].load()
    return run(
        q,
        k,
        v,
        causal=causal,
        layout=plan.layout,
        kv_lens=kv_lens,
        scale=scale,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    """What `attention` runs for one kind of input: a concrete backend and the layout to pass."""

    backend: Backend
    """Never AUTO."""
    layout: BlockLayout | None
    """The layout given, or None where auto found every block allowed (the dense paths are faster)."""


def plan_attention(
    backend: Backend | str,
    *,
    batch: int,
    q_heads: int,
    kv_heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> AttentionPlan:
    """The backend and layout `attention` would use for inputs of this description, resolved eagerly.

    AUTO is chosen (and logged once, see the module docstring); an explicit backend is checked
    (ValueError saying why when it cannot run such inputs). Pass the batch's cu_seqlens (or any
    tensor of that kind) when the inputs are packed: only its presence, dtype and device are
    read; so is alibi_slopes' (any tensor of that kind). For the Triton backend the layout's block
    lists are built on `device` here, so that a compiled caller finds them ready (the backward's
    only while grad mode is on). return_lse as for `attention`, judged in the caller's grad
    mode (call it where the attention will run: under no_grad flash-attn may return lse).
    Cheap to call on every forward pass: nothing is allocated beyond one element per call.
    """
    backend = _as_backend(backend)
    # One real element, expanded: backends judge device, dtype and shapes, never the values.
    one = torch.empty((1, 1, 1, 1), device=device, dtype=dtype)
    q = one.expand(batch, q_heads, q_len, head_dim)
    k = one.expand(batch, kv_heads, kv_len, head_dim)
    plan = _resolve(
        backend,
        q,
        k,
        k,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )
    if plan.backend is Backend.TRITON and plan.layout is not None:
        plan.layout.kv_indices(device)
        if torch.is_grad_enabled():  # the backward's lists; inference never builds them
            plan.layout.q_indices(device)
    return plan


def unsupported_reason(
    backend: Backend | str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> str | None:
    """None when `backend` can run these (valid) inputs here, else a sentence saying why and what to do.

    reference, torch and sdpa run every valid input; auto always finds a backend.
    """
    backend = _as_backend(backend)
    if backend is Backend.AUTO:
        return None
    return BACKENDS[backend].unsupported_reason(
        q,
        k,
        v,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )


def _resolve(
    backend: Backend, q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse=False, alibi_slopes=None
) -> AttentionPlan:
    """The one way from the backend asked for to the one that runs: AUTO chosen (and logged once),
    anything else checked (ValueError with its reason when it cannot run the inputs)."""
    if backend is Backend.AUTO:
        layout = _dense_if_full(layout)
        chosen = _choose(
            q,
            k,
            v,
            causal=causal,
            layout=layout,
            kv_lens=kv_lens,
            cu_seqlens=cu_seqlens,
            return_lse=return_lse,
            alibi_slopes=alibi_slopes,
        )
        return AttentionPlan(chosen, layout)
    reason = unsupported_reason(
        backend,
        q,
        k,
        v,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )
    if reason is not None:
        raise ValueError(f"backend {backend.value!r} cannot run these inputs: {reason}")
    return AttentionPlan(backend, layout)


def _dense_if_full(layout: BlockLayout | None) -> BlockLayout | None:
    """None for a layout whose blocks are all allowed and that has no token window: it is dense, and
    the dense paths are faster."""
    full = layout is not None and layout.window is None and bool(layout.mask.all())
    return None if full else layout


# ------------------------------------------------------------------------------- choosing
class FastestFirst(NamedTuple):
    """Backends for one GPU generation, fastest first as measured; auto takes the first that runs."""

    dense: tuple[Backend, ...]
    """No layout, no key padding, no packed documents."""
    varlen: tuple[Backend, ...]
    """No layout, with key padding (kv_lens) or packed documents (cu_seqlens)."""
    block_sparse: tuple[Backend, ...]
    """A layout (with or without the others)."""

    def for_inputs(self, *, layout: BlockLayout | None, kv_lens, cu_seqlens) -> tuple[Backend, ...]:
        """The row for inputs of this kind."""
        if layout is not None:
            return self.block_sparse
        return self.dense if kv_lens is None and cu_seqlens is None else self.varlen


FASTEST_FIRST = {
    # H200 (sm_90), bf16, B*L = 16k tokens, H*D = 2048, flash-attn-4 4.0.0b36: benchmarks/results/
    # attention.json (BENCHMARKS.md, "Attention kernels"). Dense causal, 16k and 64k, head dims 64
    # and 128: flash-attn-4 took 1/1.25 to 1/1.53 of our time, forward and backward; ours took
    # 0.54x to 0.88x the time of FlashAttention-2 (SDPA's flash backend). flash-attn-4 runs only
    # the head dims whose gradients were checked (flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS); the
    # others go to triton. Block-sparse layouts run on our kernels only (flash_attn_backend).
    # gluon (benchmarks/gluon_bench.py, benchmarks/results/gluon_fwd.json): its forward took
    # 0.79-0.96 of our Triton forward's time at D 64 and 128, 8k to 32k, causal and not (its
    # backward then being the Triton one). It runs layouts, key padding and documents too, but
    # stays out of those rows: with the global row split like the Triton forward's, its forward on
    # layouts took 0.75-0.89x the Triton forward's time at D 128 but 0.94-1.05x at D 64 (H100,
    # benchmarks/results/gluon_layouts.json), and a row here holds one order for every
    # head dim; key padding and packed documents are checked, not timed.
    (9, 0): FastestFirst(
        dense=(Backend.FLASH_ATTN_4, Backend.GLUON, Backend.TRITON, Backend.FLASH_ATTN_2),
        varlen=(Backend.FLASH_ATTN_4, Backend.TRITON, Backend.FLASH_ATTN_2),
        block_sparse=(Backend.TRITON,),
    ),
}
"""Measured order per compute capability; rerun benchmarks/attention.py on a GPU to add a row."""

UNMEASURED = FastestFirst(dense=(Backend.TRITON,), varlen=(Backend.TRITON,), block_sparse=(Backend.TRITON,))
"""Generations without a measured row (sm_80, sm_100, ...): our kernels, then sdpa / torch."""

PRE_AMPERE = FastestFirst(dense=(Backend.XFORMERS,), varlen=(Backend.XFORMERS,), block_sparse=())
"""GPUs older than Ampere (T4 sm_75, V100 sm_70), where neither our kernels nor flash-attn run: xformers
when installed, else sdpa / torch (with a warning giving the install line). Not measured here (no
such GPU): chosen because xformers runs key padding and packed documents without SDPA's bool mask of
B * L * S elements, and dense inputs with the same CUTLASS kernel that SDPA's memory-efficient
backend uses."""


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What auto runs for one kind of input on this machine, and why (`explain_auto`)."""

    backend: Backend
    """Never AUTO."""
    why: str
    """Why this one: the order it was first in, or the rule off CUDA."""
    passed_over: tuple[tuple[Backend, str], ...]
    """The faster backends of the measured order that cannot run these inputs here, each with its
    reason (which says what to do, such as the package to install)."""
    measured: bool
    """Whether the order came from measurements on this GPU's generation (`FASTEST_FIRST`)."""


def explain_auto(
    q,
    k,
    v,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens=None,
    cu_seqlens=None,
    return_lse: bool = False,
    alibi_slopes=None,
) -> AutoChoice:
    """The backend auto would run for inputs like these here, with why and what it passes over.

    Reads only what the inputs are (device, dtype, shapes, which of layout, kv_lens, cu_seqlens
    are given; a layout whose blocks are all allowed counts as dense), never their values, so it
    can be asked with expanded one-element tensors, as `plan_attention` does. Logs nothing."""
    layout = _dense_if_full(layout)
    capability = flash_attn_backend.device_capability(q.device)  # None off CUDA
    passed_over = []
    measured = capability in FASTEST_FIRST
    if capability is not None:
        order = FASTEST_FIRST.get(capability, UNMEASURED if capability >= (8, 0) else PRE_AMPERE).for_inputs(
            layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens
        )
        arch = f"sm_{capability[0]}{capability[1]}"
        for candidate in order:
            why = unsupported_reason(
                candidate,
                q,
                k,
                v,
                causal=causal,
                layout=layout,
                kv_lens=kv_lens,
                cu_seqlens=cu_seqlens,
                return_lse=return_lse,
                alibi_slopes=alibi_slopes,
            )
            if why is None:
                named = ", ".join(backend.value for backend in order)
                where = f"the order measured on {arch}" if measured else f"the order for {arch} (not measured there)"
                return AutoChoice(
                    candidate, f"first of {where} that runs these inputs: {named}", tuple(passed_over), measured
                )
            passed_over.append((candidate, why))
    elements = mask_elements(
        q,
        k,
        layout=None,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        causal=causal,
        alibi_slopes=alibi_slopes,
    )
    where = "none of the CUDA backends runs these inputs" if capability is not None else f"on {q.device.type}"
    if layout is None and elements <= SDPA_MASK_ELEMENTS:
        return AutoChoice(Backend.SDPA, f"{where}: sdpa runs dense inputs", tuple(passed_over), measured)
    why = (
        "torch runs block-sparse layouts"
        if layout is not None
        else (f"torch runs inputs whose mask exceeds sdpa's {SDPA_MASK_ELEMENTS:,} elements")
    )
    return AutoChoice(Backend.TORCH, f"{where}: {why}", tuple(passed_over), measured)


def _choose(q, k, v, *, causal, layout, kv_lens, cu_seqlens, return_lse, alibi_slopes=None) -> Backend:
    situation = (
        f"{'block-sparse' if layout is not None else 'dense'}, {'causal' if causal else 'bidirectional'}"
        f"{', key padding' if kv_lens is not None else ''}{', GQA' if q.shape[1] != k.shape[1] else ''}"
        f"{', packed documents' if cu_seqlens is not None else ''}{', lse' if return_lse else ''}"
        f"{', token window' if layout is not None and layout.window is not None else ''}"
        f"{', ALiBi' if alibi_slopes is not None else ''}"
    )
    choice = explain_auto(
        q,
        k,
        v,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
        return_lse=return_lse,
        alibi_slopes=alibi_slopes,
    )
    capability = flash_attn_backend.device_capability(q.device)
    measured = f" (measured faster on sm_{capability[0]}{capability[1]})" if choice.measured else ""
    reason = " ".join(f"{candidate.value!r}{measured}: {why}" for candidate, why in choice.passed_over) or None
    _log_once("cuda" if capability is not None else q.device.type, choice.backend, situation, reason)
    return choice.backend


def _log_once(device_type: str, choice: Backend, situation: str, reason: str | None) -> None:
    key = (device_type, choice, situation, reason)
    if key in _logged_choices:
        return
    _logged_choices.add(key)
    if device_type == "cuda" and reason:
        # Passing over a faster backend on a GPU costs speed: say so where a user sees it.
        logger.warning(
            "attention on cuda, %s: backend %r, not a faster one, because %s",
            situation,
            choice.value,
            reason,
        )
    else:
        logger.info("attention on %s, %s: backend %r", device_type, situation, choice.value)


# ------------------------------------------------------------------------------ validation
def _as_backend(backend: Backend | str) -> Backend:
    if isinstance(backend, Backend):
        return backend
    try:
        return Backend(backend)
    except ValueError:
        choices = ", ".join(repr(b.value) for b in Backend)
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {choices} (any case).") from None


def _check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float (or None for 1/sqrt(D)), got {scale!r}.")
    return float(scale)


def _check_inputs(
    q, k, v, *, causal: bool, layout: BlockLayout | None, kv_lens, cu_seqlens=None, alibi_slopes=None
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (B, H, L, D), got shape {tuple(t.shape)}; "
                "split heads first, e.g. x.view(B, L, H, D).transpose(1, 2)."
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a float tensor, got {t.dtype}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them.")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}.")
    B, Hq, Lq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape (B, Hkv, Lk, D), got {tuple(k.shape)} and {tuple(v.shape)}."
        )
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(
            f"k, v (B, Hkv, Lk, D) = {tuple(k.shape)} must match q (B, Hq, Lq, D) = {tuple(q.shape)} "
            "in batch size and head dim."
        )
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(
            f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) for grouped-query "
            "attention; choose num_kv_heads dividing num_heads."
        )
    if min(B, Lq, Lk, D) == 0:
        raise ValueError(
            f"empty inputs: q {tuple(q.shape)}, k {tuple(k.shape)}; batch, lengths and head dim must be > 0."
        )
    if causal and Lq != Lk and layout is not None:
        raise ValueError(
            f"causal attention with a layout needs Lq == Lk (got {Lq} and {Lk}); build the layout without "
            "the blocks above the diagonal you want masked and pass causal=False."
        )
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a float tensor (Hq,) or (B, Hq), got {type(alibi_slopes).__name__}.")
        if alibi_slopes.shape not in ((Hq,), (B, Hq)) or not alibi_slopes.is_floating_point():
            raise ValueError(
                f"alibi_slopes must be a float tensor of shape ({Hq},) or ({B}, {Hq}), got {alibi_slopes.dtype} "
                f"{tuple(alibi_slopes.shape)}; e.g. genoformer.kernels.alibi_slopes({Hq})."
            )
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q on {q.device}; move it to q's device.")
    if layout is not None:
        if not isinstance(layout, BlockLayout):
            raise TypeError(
                f"layout must be a BlockLayout (build one with a spec: spec.build(seq_len, num_heads)), "
                f"got {type(layout).__name__}."
            )
        if (layout.q_len, layout.kv_len) != (Lq, Lk):
            raise ValueError(
                f"layout was built for q_len={layout.q_len}, kv_len={layout.kv_len} but the inputs have "
                f"Lq={Lq}, Lk={Lk}; build the layout for the actual lengths."
            )
        if layout.num_heads not in (1, Hq):
            raise ValueError(
                f"layout has {layout.num_heads} heads; it must have 1 (shared) or Hq={Hq} (one per query head)."
            )
    if cu_seqlens is not None:
        if kv_lens is not None:
            raise ValueError(
                "cu_seqlens and kv_lens cannot be combined: with packed documents a row's padding is its "
                "last document; pass kv_lens=None and end cu_seqlens' row with that document."
            )
        if Lq != Lk:
            raise ValueError(f"cu_seqlens (packed documents) needs Lq == Lk, got {Lq} and {Lk}.")
        check_cu_seqlens(cu_seqlens, batch=B, seq_len=Lq, device=q.device)
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor):
            raise TypeError(f"kv_lens must be a (B,) integer tensor, got {type(kv_lens).__name__}.")
        if kv_lens.shape != (B,) or kv_lens.is_floating_point() or kv_lens.is_complex() or kv_lens.dtype == torch.bool:
            raise ValueError(
                f"kv_lens must be an integer tensor of shape ({B},), got {kv_lens.dtype} "
                f"{tuple(kv_lens.shape)}; e.g. torch.tensor(lengths, dtype=torch.int32)."
            )
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens is on {kv_lens.device} but q on {q.device}; move it with kv_lens.to(q.device).")
        if torch.compiler.is_compiling():
            return  # the value check reads the tensor on the host: a graph break; eager calls make it
        low, high = torch.stack([kv_lens.min(), kv_lens.max()]).tolist()
        if low < 0 or high > Lk:
            raise ValueError(f"kv_lens values must lie in [0, Lk={Lk}], got min {low} and max {high}.")
