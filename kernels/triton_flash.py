"""Triton FlashAttention: dense, causal and block-sparse attention with forward and backward.

Layers, in order (kernels in ``triton_flash_fwd.py`` / ``triton_flash_bwd.py``, launch
configurations in ``triton_flash_configs.py``):
  1. launchers ``flash_fwd`` / ``flash_bwd``: check every input, pick a configuration, launch;
  2. torch custom ops ``genoformer::triton_flash_fwd`` / ``genoformer::triton_flash_bwd`` with
     ``register_autograd`` and ``register_fake``, so torch.compile captures them without graph breaks,
     and ``_EagerAttention``, an autograd Function around the same two launchers for eager calls
     (the custom-op dispatch costs as much host time as a sparse layout's kernels take);
  3. ``triton_attention(...)``: the public, autograd-enabled function, and ``unsupported_reason(...)``
     which the dispatcher in ``genoformer.kernels.dispatch`` asks before choosing this backend.

Semantics (the float64 reference ``genoformer.kernels.reference`` is the judge): query i of head h
attends key j iff the layout allows block (i // bs, j // bs) for h, j <= i when causal,
j < kv_lens[b] when given, and i, j lie in one document when cu_seqlens packs several documents
per row.  A row with no allowed key outputs 0 and passes back zero gradient.

Long lists: a layout row or column much longer than the mean (BigBird's global block) is split
into chunks walked by several programs, whose partials small kernels add in a fixed order
(``SplitPlan``, ``split_plan``); deterministic like the rest.

Legend: q (B, H, Lq, D); k, v (B, HKV, Lk, D); H % HKV == 0 (GQA, query head h reads kv head
h // (H // HKV)); lse, delta (B, H, Lq) fp32 (the launchers' lse in base 2, +inf for an empty row;
``triton_attention(return_lse=True)`` hands it out in natural log, -inf for an empty row); layout
CSR lists: kv_counts (H_l, Mb) and kv_indices (H_l, Mb, W) per query block, q_counts (H_l, Nb) and
q_indices (H_l, Nb, W') per key block;
cu_seqlens (N+1,) int32 and, from it, doc_start / doc_end (B, L) int32 (each token's document
span in its row, ``genoformer.kernels.documents``) and doc_order (B, tiles) int32.

On a CPU the kernels run under Triton's interpreter when TRITON_INTERPRET=1 is set before this
module is imported (slow; for tests at small sizes only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
from typing import TYPE_CHECKING, Callable, NamedTuple

import torch
import triton
import triton.testing
from genoformer.kernels import triton_flash_configs as configs
from genoformer.kernels.documents import document_bounds
from genoformer.kernels.dropout import draw_rng, dropout_threshold
from genoformer.kernels.triton_flash_bwd import (
    bwd_dkdv_kernel,
    bwd_dq_kernel,
    bwd_preprocess_kernel,
    split_sum_kernel,
)
from genoformer.kernels.triton_flash_fwd import LOG2E, SCAN, attn_fwd_kernel, fwd_merge_kernel
from torch.utils.weak import WeakIdKeyDictionary
from triton.runtime.errors import OutOfResources
from triton.runtime.interpreter import InterpretedFunction

LN2 = math.log(2.0)  # natural log of a base-2 logarithm's unit: ln(x) == log2(x) * LN2

if TYPE_CHECKING:
    from genoformer.kernels.layout import BlockLayout

log = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = configs.HEAD_DIMS
"""Head dims the kernels run as they are; any other up to MAX_HEAD_DIM is zero-padded to one of them."""
MAX_HEAD_DIM = HEAD_DIMS[-1]

# True when this module was imported with TRITON_INTERPRET=1 (the kernels are then interpreted).
INTERPRETED = isinstance(attn_fwd_kernel, InterpretedFunction)


def autotune_enabled() -> bool:
    """Time every candidate configuration once per shape bucket on a GPU (GENOFORMER_TRITON_AUTOTUNE=0: off)."""
    return os.environ.get("GENOFORMER_TRITON_AUTOTUNE", "1") != "0"


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def tensor_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernels: str) -> str | None:
    """What every fused kernel (Triton, Gluon) needs of q, k, v alike: 4-D, float16 or bfloat16,
    one dtype, one device; None when they have it, else a sentence naming `kernels`."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"q, k, v must be 4-D (B, H, L, D); got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D"
    if q.dtype not in SUPPORTED_DTYPES:
        return f"the {kernels} kernels take float16 or bfloat16, got {q.dtype}: cast q, k, v (e.g. under autocast)"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if k.device != q.device or v.device != q.device:
        return f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}"
    return None


def layout_lists(layout: BlockLayout | None, device: torch.device, backward: bool = True):
    """What the kernels take of a layout: (block size, kv_counts, kv_indices, q_counts, q_indices),
    its CSR lists both ways on the device (cached by the layout); (0, None x 4) without one.
    backward False: the query lists (the backward's) are None, never built: a causal layout's
    global key block lists every query block, Mb^2 int32 at the length of a whole chromosome."""
    if layout is None:
        return 0, None, None, None, None
    return (layout.block_size, *layout.kv_indices(device), *(layout.q_indices(device) if backward else (None, None)))


def documents_reason(
    cu_seqlens: torch.Tensor, kv_lens: torch.Tensor | None, Lq: int, Lk: int, device: torch.device
) -> str | None:
    """Why packed documents (cu_seqlens) cannot run with these inputs, or None: the Triton and Gluon
    kernels' common terms."""
    if kv_lens is not None:
        return "cu_seqlens and kv_lens cannot be combined: end each row with its last document instead"
    if Lq != Lk:
        return f"cu_seqlens (packed documents) needs Lq == Lk, got {Lq} and {Lk}"
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or cu_seqlens.device != device:
        return (
            f"cu_seqlens must be an int32 tensor of shape (N+1,) on {device}, got {cu_seqlens.dtype} "
            f"{tuple(cu_seqlens.shape)} on {cu_seqlens.device}"
        )
    return None


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
) -> str | None:
    """None when the Triton kernels can run these inputs here, else a sentence saying why and what to do.

    cu_seqlens' values are checked by the entry point (``genoformer.kernels.documents``), not here."""
    if q.device.type == "cuda":
        if INTERPRETED:
            return (
                "the Triton kernels were loaded in interpreter mode (TRITON_INTERPRET=1) and cannot "
                "take CUDA tensors; unset TRITON_INTERPRET before importing genoformer"
            )
        major, _ = torch.cuda.get_device_capability(q.device)
        if major < 8:
            return (
                f"the Triton kernels need a GPU of compute capability 8.0 or newer (bf16 tensor cores); "
                f"{torch.cuda.get_device_name(q.device)} is {major}.x: use the sdpa or torch backend"
            )
    elif q.device.type == "cpu":
        if not INTERPRETED:
            return (
                "the Triton kernels run on CPU tensors only under the interpreter: set TRITON_INTERPRET=1 "
                "before importing genoformer (slow, meant for tests), or use a CUDA GPU"
            )
    else:
        return f"the Triton kernels run on CUDA tensors, got a tensor on {q.device.type}"
    reason = tensor_reason(q, k, v, "Triton")
    if reason is not None:
        return reason
    B, H, Lq, D = q.shape
    if not 1 <= D <= MAX_HEAD_DIM:
        return (
            f"head dim {D} is not supported by the Triton kernels (they take 1 to {MAX_HEAD_DIM}): "
            f"choose such a head dim, or use the sdpa or torch backend"
        )
    if k.shape[0] != B or v.shape[0] != B or k.shape[3] != D or v.shape[3] != D:
        return f"k and v must be (B={B}, HKV, Lk, D={D}); got k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape != v.shape:
        return f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    HKV, Lk = k.shape[1], k.shape[2]
    if HKV == 0 or H % HKV:
        return f"query heads ({H}) must be a multiple of key/value heads ({HKV})"
    if Lq == 0 or Lk == 0 or B == 0:
        return f"empty input (B={B}, Lq={Lq}, Lk={Lk}): nothing for the kernels to do"
    if causal and Lq != Lk and layout is not None:
        return f"causal attention with a layout needs Lq == Lk, got {Lq} and {Lk}"
    if kv_lens is not None:
        if kv_lens.shape != (B,) or kv_lens.dtype not in (torch.int32, torch.int64):
            return f"kv_lens must be an int32/int64 tensor of shape ({B},), got {kv_lens.dtype} {tuple(kv_lens.shape)}"
        if kv_lens.device != q.device:
            return f"kv_lens must be on q's device {q.device}, got {kv_lens.device}"
    if cu_seqlens is not None and (why := documents_reason(cu_seqlens, kv_lens, Lq, Lk, q.device)):
        return why
    if layout is not None:
        bs = layout.block_size
        if bs % 16:
            return f"layout block size {bs} must be a multiple of 16"
        h_l, mb, nb = layout.mask.shape
        if h_l not in (1, H):
            return f"layout has {h_l} heads; it must have 1 (shared) or {H} (one per query head)"
        if (mb, nb) != (triton.cdiv(Lq, bs), triton.cdiv(Lk, bs)):
            return (
                f"layout is {mb}x{nb} blocks of {bs} but Lq={Lq}, Lk={Lk} need "
                f"{triton.cdiv(Lq, bs)}x{triton.cdiv(Lk, bs)}: build the layout for these lengths"
            )
    return None


def _check(q, k, v, causal, layout, kv_lens, cu_seqlens) -> None:
    reason = unsupported_reason(q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens)
    if reason is not None:
        raise ValueError(f"triton attention cannot run these inputs: {reason}")


def mods_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window=None,
    alibi_slopes=None,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    dropout_rng=None,
    varlen: Varlen | None = None,
    layout: BlockLayout | None = None,
    kv_lens=None,
    cu_seqlens=None,
) -> str | None:
    """None when the window, score modifiers and varlen batch suit q (B, H, Lq, D) and k, else a
    sentence saying what to change (values on the device are not read)."""
    B, H = q.shape[:2]
    if window is not None:
        if (
            not isinstance(window, tuple)
            or len(window) != 2
            or not all(side is None or (isinstance(side, int) and not isinstance(side, bool)) for side in window)
        ):
            return f"window must be a pair (left, right) of ints or None, got {window!r}"
    if alibi_slopes is not None:
        rows = varlen.cu_seqlens_q.shape[0] - 1 if varlen is not None else B
        if (
            not isinstance(alibi_slopes, torch.Tensor)
            or alibi_slopes.shape not in ((H,), (rows, H))
            or not alibi_slopes.is_floating_point()
        ):
            return (
                f"alibi_slopes must be a float tensor of shape ({H},) or ({rows}, {H}) (per head, or per "
                f"{'sequence' if varlen is not None else 'batch row'} and head), got "
                f"{getattr(alibi_slopes, 'dtype', type(alibi_slopes).__name__)} "
                f"{tuple(getattr(alibi_slopes, 'shape', ()))}"
            )
        if alibi_slopes.device != q.device:
            return f"alibi_slopes must be on q's device {q.device}, got {alibi_slopes.device}"
    if not (
        isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and math.isfinite(softcap) and softcap >= 0
    ):
        return f"softcap must be a finite float >= 0 (0: no capping), got {softcap!r}"
    if not (isinstance(dropout_p, (int, float)) and not isinstance(dropout_p, bool) and 0 <= dropout_p < 1):
        return f"dropout_p must be a float in [0, 1), got {dropout_p!r}"
    if dropout_rng is not None and (
        not isinstance(dropout_rng, torch.Tensor)
        or dropout_rng.shape != (2,)
        or dropout_rng.dtype != torch.int64
        or dropout_rng.device != q.device
    ):
        return (
            f"dropout_rng must be an int64 tensor (seed, offset) of shape (2,) on {q.device} "
            f"(genoformer.kernels.dropout.draw_rng makes one), got {dropout_rng!r}"
        )
    if varlen is not None:
        if B != 1:
            return f"a varlen batch concatenates its sequences along one row: q must be (1, H, total_q, D), got B={B}"
        if layout is not None or kv_lens is not None or cu_seqlens is not None:
            return "a varlen batch takes no layout, kv_lens or cu_seqlens: its cu_seqlens_q / cu_seqlens_k say it all"
        cu_q, cu_k = varlen.cu_seqlens_q, varlen.cu_seqlens_k
        for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
            if (
                not isinstance(cu, torch.Tensor)
                or cu.dtype != torch.int32
                or cu.dim() != 1
                or cu.shape[0] < 2
                or cu.device != q.device
            ):
                return (
                    f"{name} must be an int32 tensor (N + 1,) with N >= 1 on {q.device}, got "
                    f"{getattr(cu, 'dtype', type(cu).__name__)} {tuple(getattr(cu, 'shape', ()))}"
                )
        if cu_q.shape != cu_k.shape:
            return (
                f"cu_seqlens_q and cu_seqlens_k must list the same number of sequences, got "
                f"{cu_q.shape[0] - 1} and {cu_k.shape[0] - 1}"
            )
        if not (
            isinstance(varlen.max_seqlen_q, int)
            and isinstance(varlen.max_seqlen_k, int)
            and varlen.max_seqlen_q >= 0
            and varlen.max_seqlen_k >= 0
        ):
            return (
                f"max_seqlen_q and max_seqlen_k must be ints >= 0 (the longest sequences), got "
                f"{varlen.max_seqlen_q!r} and {varlen.max_seqlen_k!r}"
            )
    return None


def _check_mods(
    q, k, *, window, alibi_slopes, softcap, dropout_p, dropout_rng, varlen, layout, kv_lens, cu_seqlens
) -> ScoreMods:
    """ScoreMods of valid arguments (ValueError saying what to change otherwise): slopes as float32
    contiguous, a dropout rng drawn when none is given; the band is set by the caller."""
    reason = mods_reason(
        q,
        k,
        window=window,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        dropout_p=dropout_p,
        dropout_rng=dropout_rng,
        varlen=varlen,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
    )
    if reason is not None:
        raise ValueError(f"triton attention cannot run these inputs: {reason}")
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    rng = None
    if dropout_p > 0:
        rng = dropout_rng if dropout_rng is not None else draw_rng(q.device)
    return ScoreMods(alibi=alibi_slopes, softcap=float(softcap), dropout_p=float(dropout_p), rng=rng)


def _dot_f32(q: torch.Tensor) -> bool:
    """Widen bf16 tiles before tl.dot under the interpreter (see ``triton_flash_fwd.mma``)."""
    return INTERPRETED and q.dtype == torch.bfloat16


def _align8(head_dim: int, *tensors: torch.Tensor) -> bool:
    """Whether the kernels may declare row and head offsets multiples of 8 elements (``ALIGN8``).

    Only for D % 16 == 8 (24, 40, ...): Triton specialises integer arguments on divisibility by
    16, which contiguous tensors of other head dims already have.  Every stride but the head
    dim's must be a multiple of 8; the launcher's own outputs always are (D % 8 == 0).
    """
    return head_dim % 16 == 8 and all(s % 8 == 0 for t in tensors for s in t.stride()[:-1])


def _check_last_dim_contiguous(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} must be contiguous in its last (head) dim, got strides {t.stride()}: "
                f"call .contiguous() on it first"
            )


# --------------------------------------------------------------------------------------------
# Configuration choice (table per GPU generation and head dim, timed once per key when asked)
# --------------------------------------------------------------------------------------------

_TUNED: dict[tuple, object] = {}


def _generation(device: torch.device) -> configs.Generation:
    return configs.generation_for(torch.cuda.get_device_capability(device))


TUNE_WARMUP_MS = 200.0
"""Load run (the first candidate, untimed) before the candidates are timed. An idle H200 holds its
top clock (1980 MHz) for the first tens of milliseconds of load and settles near its 700 W power cap
at 1450-1900 MHz (docs/design/kernels.md): without the warm-up, the first
candidates timed would run faster than the rest."""

FINALIST_MARGIN = 1.03
"""Candidates timed within this factor of the fastest are timed a second time, in reverse order,
and ranked by the mean of both timings: one timing moves by 1-3% between runs on a shared GPU,
as much as the variants of one tile differ (docs/design/kernels.md)."""


def choose_config(key: tuple, candidates: tuple, run: Callable[[object], None], device: torch.device):
    """The launchers' tuner: the fastest candidate for this key (timed when first seen, cached), or
    the first when tuning is off. `run(candidate)` launches the kernels with it.

    The launchers look this function up in the module at every call, so a benchmark may wrap it
    (benchmarks/attention.py records which configurations ran) or replace it
    (benchmarks/sanitize.py runs every candidate).

    A later candidate that fails to compile or launch here (a sm_90 variant on a Triton that
    lacks what it uses, or one whose tiles do not fit in shared memory with a score modifier) is
    left out with a WARNING; the first, a plain configuration, must run.
    """
    if key in _TUNED:
        return _TUNED[key]
    if len(candidates) == 1 or not autotune_enabled() or torch.cuda.is_current_stream_capturing():
        return candidates[0]

    def timed(c) -> float:
        return triton.testing.do_bench(lambda: run(c), warmup=10, rep=50, return_mode="median")

    # warm-up (TUNE_WARMUP_MS); the first candidate must run, so an error here is raised as is
    triton.testing.do_bench(lambda: run(candidates[0]), warmup=0, rep=TUNE_WARMUP_MS)
    times = []
    for index, c in enumerate(candidates):
        try:
            times.append(timed(c))
        except (triton.CompilationError, OutOfResources, RuntimeError, ValueError) as error:
            if index == 0:
                raise
            log.warning(
                "Triton attention: configuration %s does not run on this GPU (%s: %s); tuning without it",
                c,
                type(error).__name__,
                str(error).splitlines()[0] if str(error) else "",
            )
            times.append(math.inf)
    finalists = [i for i, t in enumerate(times) if t <= FINALIST_MARGIN * min(times)]
    if len(finalists) > 1:
        for i in reversed(finalists):
            times[i] = (times[i] + timed(candidates[i])) / 2
    best = candidates[min(finalists, key=times.__getitem__)]
    _TUNED[key] = best
    return best


_DQ_STREAMS: dict[int, torch.cuda.Stream] = {}


def _dq_stream(device: torch.device) -> torch.cuda.Stream:
    """The second stream of a GPU on which dq_stream configurations run the dQ kernel (one per
    device, made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DQ_STREAMS:
        _DQ_STREAMS[index] = torch.cuda.Stream(device=index)
    return _DQ_STREAMS[index]


def _bucket(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=None)
def fwd_candidates(
    device: torch.device, head_dim: int, block_size: int | None, dropout: bool = False
) -> tuple[configs.FwdConfig, ...]:
    if device.type == "cpu":
        return (configs.fit_fwd(configs.INTERPRETER_FWD, block_size),)
    gen = _generation(device)
    fit = configs.fit_dropout if dropout else (lambda c: c)
    return tuple(dict.fromkeys(fit(configs.fit_fwd(c, block_size)) for c in configs.fwd_candidates(gen, head_dim)))


@functools.lru_cache(maxsize=None)
def bwd_candidates(device: torch.device, head_dim: int, block_size: int | None) -> tuple[configs.BwdConfig, ...]:
    if device.type == "cpu":
        return (configs.fit_bwd(configs.INTERPRETER_BWD, block_size),)
    gen = _generation(device)
    return tuple(dict.fromkeys(configs.fit_bwd(c, block_size) for c in configs.bwd_candidates(gen, head_dim)))


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether tensor descriptors can read these tensors: a CUDA GPU of compute capability 9 or
    newer, every base 16-byte aligned and every stride but the head dim's a multiple of 16 bytes
    (TMA's rules). Sets Triton's allocator for the descriptors the kernels create on the device."""
    t0 = tensors[0]
    if INTERPRETED or t0.device.type != "cuda" or torch.cuda.get_device_capability(t0.device)[0] < 9:
        return False
    if not all(
        t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1]) for t in tensors
    ):
        return False
    triton.set_allocator(_descriptor_scratch)
    return True


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch memory for tensor descriptors made inside a kernel (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


@functools.lru_cache(maxsize=None)
def _without_tma(candidates: tuple, ready: bool) -> tuple:
    """The candidates, their TMA variants turned into pointer loads when the inputs do not allow TMA."""
    if ready:
        return candidates
    return tuple(dict.fromkeys(dataclasses.replace(c, tma=False) for c in candidates))


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


_ORDERS = WeakIdKeyDictionary()  # counts tensor (by identity) -> its launch order
_DUMMIES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def placeholder(device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """One element, never read: the argument of an absent CSR list, document table or partial buffer."""
    if (device, dtype) not in _DUMMIES:
        _DUMMIES[device, dtype] = torch.zeros(1, dtype=dtype, device=device)
    return _DUMMIES[device, dtype]


def csr_args(counts: torch.Tensor | None, indices: torch.Tensor | None, like: torch.Tensor):
    """Kernel arguments of a CSR list: counts, indices, order, and their head and row strides.

    order (H_l, rows) int32 lists each head's rows by descending count: the kernels launch the
    longest rows first (longest-processing-time scheduling: a global row of a BigBird layout
    visits every block and would otherwise be the last program running).  A shared layout (one
    head) gets head stride 0.
    """
    if counts is None:
        dummy = placeholder(like.device)
        return dummy, dummy, dummy, 0, 0, 0, 0
    order = _ORDERS.get(counts)
    if order is None:  # once per layout and device: layouts cache their CSR tensors (kernels.layout)
        order = _ORDERS[counts] = torch.argsort(counts, dim=-1, descending=True, stable=True).to(torch.int32)
    shared = counts.shape[0] == 1
    return (
        counts,
        indices,
        order,
        0 if shared else counts.stride(0),
        0 if shared else indices.stride(0),
        indices.stride(1),
        0 if shared else order.stride(0),
    )


# --------------------------------------------------------------------------------------------
# Split lists: a long CSR list walked by several programs (one chunk each), then summed
# --------------------------------------------------------------------------------------------

SPLIT_RATIO = 2
"""A CSR list is split when it holds more than SPLIT_RATIO chunks' worth of layout blocks."""
SPLIT_MIN_CHUNK = 8
"""The shortest chunk, in layout blocks (tests lower it to split the lists of tiny layouts)."""


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Which lists of one CSR layout several programs share, and how their partials are summed.

    The rule (``split_plan``): chunk = max(SPLIT_MIN_CHUNK, ceil(mean list length)) layout blocks;
    a list longer than SPLIT_RATIO * chunk is cut into ceil(count / chunk) equal contiguous chunks.
    Dense, causal and window layouts have no list over twice the mean, so they are never split;
    BigBird's global row and column are (128 blocks against a mean of about 13 at 16k tokens).

    P plan heads: 1 for a shared layout, else one per program head (a kv head for dK/dV, whose
    lists are the longest of its query heads', a query head for dQ).
    items (P, I, 4) int32: the programs' work in launch order, (row, first entry, end entry,
        slot): the chunks of split lists first (longest list first, its chunks in order), then
        the whole lists by descending count (slot -1: written straight to the output).  A head
        with fewer items than I ends with empty items whose slot is the last, never summed.
    sums (P, S, 3) int32: per split list, (row, first slot, chunks), its chunks' slots
        consecutive; a head with fewer split lists than S ends with (0, 0, 0) (nothing written).
    slots: partial slots per head, the never-summed one included when a head has empty items.
    """

    items: torch.Tensor
    sums: torch.Tensor
    slots: int


def split_plan(counts_HR: torch.Tensor, group: int, min_chunk: int) -> SplitPlan | None:
    """The plan for CSR counts (H_l, R) (CPU) read by programs that each take `group` query heads'
    lists (dK/dV: H // HKV; dQ and the forward: 1); None when no list is long."""
    H_l, R = counts_HR.shape
    counts_PR = counts_HR.long()
    if H_l > 1 and group > 1:  # one program walks the lists of its kv head's query heads
        counts_PR = counts_PR.view(H_l // group, group, R).amax(1)
    chunk = max(min_chunk, math.ceil(counts_PR.float().mean().item()))
    if not bool((counts_PR > SPLIT_RATIO * chunk).any()):
        return None
    items_P, sums_P, slots = [], [], 0
    for counts_R in counts_PR.tolist():
        order = sorted(range(R), key=lambda r: -counts_R[r])  # stable: ties keep the row order
        chunked, whole, sums = [], [], []
        for r in order:
            n = counts_R[r]
            if n > SPLIT_RATIO * chunk:
                pieces = math.ceil(n / chunk)
                step = math.ceil(n / pieces)
                sums.append((r, len(chunked), pieces))
                chunked += [(r, lo, min(lo + step, n), len(chunked) + j) for j, lo in enumerate(range(0, n, step))]
            else:
                whole.append((r, 0, n, -1))
        items_P.append(chunked + whole)
        sums_P.append(sums)
        slots = max(slots, len(chunked))  # one slot per chunk
    width = max(len(items) for items in items_P)
    if any(len(items) < width for items in items_P):
        slots += 1  # the slot of empty items, never summed
    items_PI4 = torch.tensor(
        [items + [(0, 0, 0, slots - 1)] * (width - len(items)) for items in items_P], dtype=torch.int32
    )
    longest = max(len(sums) for sums in sums_P)
    sums_PS3 = torch.tensor([sums + [(0, 0, 0)] * (longest - len(sums)) for sums in sums_P], dtype=torch.int32)
    return SplitPlan(items_PI4, sums_PS3, slots)


_PLANS = WeakIdKeyDictionary()  # counts tensor (by identity) -> {(group, min_chunk): SplitPlan | None}


def _split_plan(counts: torch.Tensor, group: int) -> SplitPlan | None:
    """``split_plan`` of a layout's CSR counts, on their device; built once per layout and device
    (layouts cache their CSR tensors), like the launch orders."""
    plans = _PLANS.setdefault(counts, {})
    key = (group, SPLIT_MIN_CHUNK)
    if key not in plans:
        plan = split_plan(counts.cpu(), group, SPLIT_MIN_CHUNK)
        if plan is not None:
            plan = SplitPlan(plan.items.to(counts.device), plan.sums.to(counts.device), plan.slots)
        plans[key] = plan
    return plans[key]


def _plan_items(plan: SplitPlan | None, order: torch.Tensor, sord_h: int) -> tuple[torch.Tensor, int]:
    """What the kernels' ORDER argument gets: the plan's items and their head stride (0: shared),
    or without a plan the launch order and its stride."""
    if plan is None:
        return order, sord_h
    return plan.items, 0 if plan.items.shape[0] == 1 else plan.items.stride(0)


def _partials(
    plan: SplitPlan | None, batch: int, heads: int, block_size: int, head_dim: int, like: torch.Tensor, count: int
) -> list[torch.Tensor]:
    """`count` fp32 partial buffers (B, heads, slots, bs, D) of a split plan (dummies without one)."""
    if plan is None:
        return [placeholder(like.device, torch.float32)] * count
    return [
        torch.empty((batch, heads, plan.slots, block_size, head_dim), dtype=torch.float32, device=like.device)
        for _ in range(count)
    ]


def split_rows(kv_counts: torch.Tensor | None, order: torch.Tensor, sord_h: int, q: torch.Tensor, block_size: int):
    """A forward's split of long query-block rows (BigBird's global block), walked in chunks by
    several programs: (plan or None, the kernels' ORDER argument and its head stride, the partials
    po (B, H, slots, bs, D) and the running max and sum pm, pl (B, H, slots, bs, 1), fp32; dummies
    without a plan).  kv_counts None (dense) has no plan.

    The three are views of one buffer (slots, B * H, bs * (D + 2)): a chunk's acc, m and l lie
    together, at (slot * B * H + b * H + h) * bs * (D + 2), which the Gluon forward computes from
    po's address alone (``gluon_fwd._ws_consumer``); the Triton kernels read the views' strides."""
    B, H, _, D = q.shape
    plan = _split_plan(kv_counts, 1) if kv_counts is not None else None
    items, sitems_h = _plan_items(plan, order, sord_h)
    if plan is None:
        dummy = placeholder(q.device, torch.float32)
        return plan, items, sitems_h, dummy, dummy, dummy
    bs = block_size
    part = torch.empty((plan.slots, B, H, bs * (D + 2)), dtype=torch.float32, device=q.device)

    def view(lo: int, width: int) -> torch.Tensor:  # (B, H, slots, bs, width)
        # explicit strides: a view's reshape may give a dim of size 1 (H = 1) any stride, and the
        # kernels address a (b, h) by b * H + h times the head stride
        chunk = bs * (D + 2)
        return part.as_strided((B, H, plan.slots, bs, width), (H * chunk, chunk, B * H * chunk, width, 1), lo * bs)

    return plan, items, sitems_h, view(0, D), view(D, 1), view(D + 1, 1)


def merge_split_rows(
    plan: SplitPlan,
    po: torch.Tensor,
    pm: torch.Tensor,
    pl: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    block_size: int,
    align8: bool,
) -> None:
    """o's and lse's rows of the plan's split lists (forward): the log-sum-exp merge of their
    chunks' partials po (B, H, slots, bs, D), pm, pl (B, H, slots, bs, 1) (``fwd_merge_kernel``)."""
    B, H, Lq, D = o.shape
    block = configs.split_sum_block(block_size)
    fwd_merge_kernel[(B * H, plan.sums.shape[1] * (block_size // block))](
        po,
        pm,
        pl,
        o,
        lse,
        plan.sums,
        po.stride(1),
        po.stride(2),
        pm.stride(1),
        pm.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        0 if plan.sums.shape[0] == 1 else plan.sums.stride(0),
        H,
        Lq,
        block_size,
        D=D,
        D_TILE=configs.tile_dim(D),
        BLOCK=block,
        ALIGN8=align8,
    )


def _split_sum(
    plan: SplitPlan, part: torch.Tensor, out: torch.Tensor, scale: float, block_size: int, align8: bool
) -> None:
    """out's rows of the plan's split lists: scale times the sum of their chunks' partials."""
    B, HO, L, D = out.shape
    block = configs.split_sum_block(block_size)
    split_sum_kernel[(B * HO, plan.sums.shape[1] * (block_size // block))](
        part,
        out,
        plan.sums,
        part.stride(1),
        part.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        0 if plan.sums.shape[0] == 1 else plan.sums.stride(0),
        HO,
        L,
        scale,
        block_size,
        D=D,
        D_TILE=configs.tile_dim(D),
        BLOCK=block,
        ALIGN8=align8,
    )


def doc_args(cu_seqlens: torch.Tensor | None, batch: int, seq_len: int, like: torch.Tensor):
    """Kernel arguments of packed documents: doc_start, doc_end (B, L) int32, or dummies without."""
    if cu_seqlens is None:
        dummy = placeholder(like.device)
        return dummy, dummy
    return document_bounds(cu_seqlens, batch, seq_len)


def doc_order(doc_start: torch.Tensor, doc_end: torch.Tensor, block: int, causal: bool, keys: bool) -> torch.Tensor:
    """(B, tiles) int32: each row's tiles of `block` tokens by descending work (longest first).

    A tile's work is the length of the token span it meets: a query tile sees the keys
    [start(first), end(last)) (causal: up to its own end), a key tile is seen by the queries
    [start(first), end(last)) (causal: from its own start).  Dense inputs only: a layout's rows
    keep the layout's order.
    """
    L = doc_start.shape[1]
    first_T = torch.arange(0, L, block, device=doc_start.device)
    last_T = (first_T + block).clamp_max(L) - 1
    lo_BT, hi_BT = doc_start[:, first_T], doc_end[:, last_T]
    if causal and keys:
        lo_BT = torch.maximum(lo_BT, first_T.to(lo_BT.dtype))
    elif causal:
        hi_BT = torch.minimum(hi_BT, (last_T + 1).to(hi_BT.dtype))
    return torch.argsort(hi_BT - lo_BT, dim=1, descending=True, stable=True).to(torch.int32).contiguous()


def _check_csr(name: str, counts, indices, device) -> None:
    if counts is None:
        return
    if (
        counts.dtype != torch.int32
        or indices.dtype != torch.int32
        or counts.device != device
        or indices.device != device
        or not counts.is_contiguous()
        or not indices.is_contiguous()
    ):
        raise ValueError(
            f"{name} CSR lists must be contiguous int32 tensors on {device}; "
            f"get them from layout.kv_indices(device) / layout.q_indices(device)"
        )


class Varlen(NamedTuple):
    """Sequences concatenated along one row, as flash-attn's varlen functions take them: q is
    (1, H, total_q, D), k and v (1, HKV, total_k, D), sequence s holds the query rows
    [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and the key rows [cu_seqlens_k[s], cu_seqlens_k[s + 1]);
    its query and key lengths differ freely (causal and windows align to each sequence's
    bottom-right corner).  cu_seqlens_q, cu_seqlens_k: (N + 1,) int32 on q's device, non-decreasing
    from 0 to total_q / total_k; max_seqlen_q, max_seqlen_k: at least every sequence's length (the
    grid is sized by them, as in flash-attn; the values are not read on the host)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreMods:
    """What the launchers add to plain attention (see ``triton_flash_fwd.py``):

    band: (lo, hi), key j allowed for query i only if lo <= j - i - shift <= hi (None: that side
        unbounded), shift = Lk - Lq, or each sequence's key length minus its query length (Varlen);
        `causal` of the launchers is hi = min(hi, 0).
    alibi: (H,) or (S, H) float32, contiguous: ALiBi slopes per head, or per batch row (Varlen:
        per sequence) and head; the score of (i, j) gets -slope * |j - i - shift|.
    softcap: > 0 caps the scaled scores: softcap * tanh(score / softcap); 0 leaves them.
    dropout_p: in [0, 1), the probability that dropout zeroes an attention probability (the kept
        ones are scaled by 1 / (1 - dropout_p)); 0 turns dropout off.
    rng: int64 (2,) on q's device, (seed, offset) of the dropout mask (``genoformer.kernels.dropout``);
        needed when dropout_p > 0.
    """

    band: tuple[int | None, int | None] = (None, None)
    alibi: torch.Tensor | None = None
    softcap: float = 0.0
    dropout_p: float = 0.0
    rng: torch.Tensor | None = None


NO_MODS = ScoreMods()


def _band(mods: ScoreMods, causal: bool) -> tuple[int | None, int | None]:
    lo, hi = mods.band
    if causal:
        hi = 0 if hi is None else min(hi, 0)
    return lo, hi


def _mod_args(mods: ScoreMods, causal: bool, scale: float, like: torch.Tensor) -> tuple[tuple, dict, dict]:
    """The kernels' arguments for the band and the score modifiers: (ALIBI, RNG, sal_b), the runtime
    scalars, the constexprs."""
    lo, hi = _band(mods, causal)
    alibi = mods.alibi if mods.alibi is not None else placeholder(like.device, torch.float32)
    rng = mods.rng if mods.dropout_p > 0 else placeholder(like.device, torch.int64)
    sal_b = alibi.stride(0) if alibi.dim() == 2 else 0
    scalars = dict(
        band_lo=0 if lo is None else lo,
        band_hi=0 if hi is None else hi,
        cap_in=scale / mods.softcap if mods.softcap > 0 else 0.0,
        cap2=mods.softcap * LOG2E if mods.softcap > 0 else 0.0,
        drop_thr=dropout_threshold(mods.dropout_p),
        drop_scale=1.0 / (1.0 - mods.dropout_p),
    )
    constexprs = dict(
        BAND_LO=lo is not None,
        BAND_HI=hi is not None,
        ALIBI_=mods.alibi is not None,
        SOFTCAP=mods.softcap > 0,
        DROPOUT=mods.dropout_p > 0,
        TANH_ASM=not INTERPRETED,
    )
    return (alibi, rng, sal_b), scalars, constexprs


def _mods_key(mods: ScoreMods, causal: bool, varlen: Varlen | None) -> tuple:
    """What of the modifiers selects a different kernel (the tuner's key)."""
    lo, hi = _band(mods, causal)
    return (
        lo is not None,
        hi is not None,
        mods.alibi is not None,
        mods.softcap > 0,
        mods.dropout_p > 0,
        varlen is not None,
    )


def _varlen_args(varlen: Varlen | None, like: torch.Tensor):
    """CU_Q, CU_K and the number of sequences (0 without Varlen)."""
    if varlen is None:
        dummy = placeholder(like.device)
        return dummy, dummy, 0
    return varlen.cu_seqlens_q, varlen.cu_seqlens_k, varlen.cu_seqlens_q.shape[0] - 1


def empty_like_rows(
    t: torch.Tensor, shape: tuple[int, int, int, int] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """An uninitialised (B, H, L, D) tensor laid out as t is: (B, L, H, D) in memory (a transposed
    view) when t's heads lie inside its rows (flash-attn's layout, a model's projections), else
    contiguous.  The launchers' outputs and gradients follow their inputs this way, so that a
    (B, L, H, D) caller gets (B, L, H, D)-contiguous results without a copy."""
    B, H, L, D = t.shape if shape is None else shape
    dtype = t.dtype if dtype is None else dtype
    if t.stride(1) < t.stride(2) and H > 1 and L > 1:
        return torch.empty((B, L, H, D), dtype=dtype, device=t.device).transpose(1, 2)
    return torch.empty((B, H, L, D), dtype=dtype, device=t.device)


MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second dimension, where the forward (and the backward unless
``heads_outer``) put the tiles of one (batch, head): a 4.6 Mbp chromosome in one window is 72,526
query tiles of 64 rows."""

INT32_OFFSETS = 2**31
"""The kernels address a row of a (batch, head) slice as row * row stride in 32-bit integers
(only the slice's start is 64-bit): a slice must end below this many elements."""


def rows_fit_int32(t: torch.Tensor, margin: int = 256) -> bool:
    """Whether the kernels' 32-bit row offsets reach every row of t (B, H, L, D), with `margin`
    rows past the end (the last tile's masked rows): a (B, L, H, D) buffer viewed as (B, H, L, D)
    has a row stride of H * D, so at a million tokens and H * D = 2,048 its last row lies 2^31
    elements in. A contiguous copy has a row stride of D."""
    return (t.shape[2] + margin) * t.stride(2) + t.shape[3] <= INT32_OFFSETS


def fwd_tiles(cfg: configs.FwdConfig, Lq: int, units: int, block_size: int) -> int:
    """Query tiles of one (batch, head) the forward launches with `cfg` (the grid's second
    dimension): a layout's rows (or split-plan items) `units` of block_size // block_m tiles each,
    else the query length in tiles."""
    return units * (block_size // cfg.block_m) if units else triton.cdiv(Lq, cfg.block_m)


def bwd_tiles(
    cfg: configs.BwdConfig, Lq: int, Lk: int, key_units: int, query_units: int, block_size: int
) -> tuple[int, int]:
    """(key tiles of the dK/dV kernel, query tiles of the dQ kernel) per (batch, head) with `cfg`."""
    key = key_units * (block_size // cfg.block_n1) if key_units else triton.cdiv(Lk, cfg.block_n1)
    query = query_units * (block_size // cfg.block_m2) if query_units else triton.cdiv(Lq, cfg.block_m2)
    return key, query


def grid_fitting(candidates: tuple, tiles: Callable[[object], tuple[int, ...]], what: str) -> tuple:
    """The candidates whose tile counts fit the grid's second dimension (a ``heads_outer``
    configuration puts them in the first, which has no such limit); ValueError when none does."""
    fitting = tuple(c for c in candidates if getattr(c, "heads_outer", False) or max(tiles(c)) <= MAX_GRID_Y)
    if not fitting:
        counts = sorted({max(tiles(c)) for c in candidates})
        raise ValueError(
            f"the Triton {what} cannot launch {counts[0]:,} tiles per head with any configuration (CUDA "
            f"allows {MAX_GRID_Y:,} in a grid's second dimension): shorten the window, or use a layout "
            "with a larger block size"
        )
    return fitting


def flash_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor | None,
    kv_counts: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    block_size: int,
    causal: bool,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
    config: configs.FwdConfig | None = None,
    *,
    mods: ScoreMods = NO_MODS,
    varlen: Varlen | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher: returns o (B, H, Lq, D) in q's dtype (laid out as q, ``empty_like_rows``) and
    lse (B, H, Lq) fp32 (base 2).

    causal: key j <= i + Lk - Lq (bottom-right aligned; j <= i when Lq == Lk).  mods: the band and
    score modifiers (``ScoreMods``); varlen: sequences concatenated along one row (``Varlen``; not
    with a layout, kv_lens or cu_seqlens).
    config: run this launch configuration instead of choosing one (benchmarks/kernel_variants.py);
    it must fit the layout's block size (``triton_flash_configs.fit_fwd``); its TMA variant
    becomes pointer loads where the inputs do not allow TMA.
    """
    _check_last_dim_contiguous(q=q, k=k, v=v)
    _check_csr("kv", kv_counts, kv_indices, q.device)
    if not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale}")
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    sparse = kv_counts is not None
    o = empty_like_rows(q)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    cnt, idx, order, scnt_h, sidx_h, sidx_m, sord_h = csr_args(kv_counts, kv_indices, q)
    lens = kv_lens if kv_lens is not None else cnt
    docs = cu_seqlens is not None
    doc_start, doc_end = doc_args(cu_seqlens, B, Lq, q)
    cu_q, cu_k, sequences = _varlen_args(varlen, q)
    (alibi, rng, sal_b), scalars, mod_constexprs = _mod_args(mods, causal, scale, q)
    d_tile = configs.tile_dim(D)  # the kernels mask the head-dim padding D..d_tile
    align8 = _align8(D, q, k, v)
    plan, items, sitems_h, po, pm, pl = split_rows(kv_counts, order, sord_h, q, block_size)

    def run(cfg: configs.FwdConfig) -> None:
        units = items.shape[1] if sparse else 0  # layout rows or plan items
        if sparse:
            tiles = units * (block_size // cfg.block_m)
        else:
            tiles = triton.cdiv(varlen.max_seqlen_q if varlen is not None else Lq, cfg.block_m)
        tile_order = doc_order(doc_start, doc_end, cfg.block_m, causal, keys=False) if docs and not sparse else cnt
        attn_fwd_kernel[(sequences * H if varlen is not None else B * H, tiles)](
            q,
            k,
            v,
            o,
            lse,
            po,
            pm,
            pl,
            lens,
            cnt,
            idx,
            items,
            doc_start,
            doc_end,
            tile_order,
            cu_q,
            cu_k,
            alibi,
            rng,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            o.stride(0),
            o.stride(1),
            o.stride(2),
            po.stride(1) if plan else 0,
            po.stride(2) if plan else 0,
            pm.stride(1) if plan else 0,
            pm.stride(2) if plan else 0,
            scnt_h,
            sidx_h,
            sidx_m,
            sitems_h,
            sal_b,
            H,
            H // HKV,
            Lq,
            Lk,
            scale * LOG2E,
            scalars["band_lo"],
            scalars["band_hi"],
            scalars["cap_in"],
            scalars["cap2"],
            scalars["drop_thr"],
            scalars["drop_scale"],
            block_size if sparse else 1,
            D=D,
            D_TILE=d_tile,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            SPARSE=sparse,
            HAS_KV_LENS=kv_lens is not None,
            SCAN_=SCAN,
            DOT_F32=_dot_f32(q),
            ALIGN8=align8,
            HAS_DOCS=docs,
            TMA=cfg.tma,
            RESCALE_TAU=cfg.rescale_tau,
            SPLIT=plan is not None,
            VARLEN=varlen is not None,
            **mod_constexprs,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        if plan is not None:
            merge_split_rows(plan, po, pm, pl, o, lse, block_size, align8)

    tma = _tma_ready(q, k, v)
    cands = _without_tma(
        fwd_candidates(q.device, D, block_size if sparse else None, mods.dropout_p > 0)
        if config is None
        else (config,),
        tma,
    )
    units = items.shape[1] if sparse else 0
    rows = varlen.max_seqlen_q if varlen is not None else Lq
    cands = grid_fitting(cands, lambda c: (fwd_tiles(c, rows, units, block_size),), "forward")
    # (which candidates fit depends on the exact length, not its bucket alone)
    key = (
        "fwd",
        q.device.index,
        D,
        q.dtype,
        causal,
        sparse,
        docs,
        block_size,
        tma,
        _bucket(Lq),
        _bucket(Lk),
        _mods_key(mods, causal, varlen),
        cands,
    )
    run(cands[0] if config is not None else choose_config(key, cands, run, q.device))
    return o, lse


def flash_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    kv_lens: torch.Tensor | None,
    kv_counts: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    q_counts: torch.Tensor | None,
    q_indices: torch.Tensor | None,
    block_size: int,
    causal: bool,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
    config: configs.BwdConfig | None = None,
    dlse: torch.Tensor | None = None,
    *,
    mods: ScoreMods = NO_MODS,
    varlen: Varlen | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launcher: returns dq, dk, dv (in the inputs' dtype, laid out as q, k, v:
    ``empty_like_rows``). Deterministic.

    config: as for ``flash_fwd``.  dlse: (B, H, Lq) the gradient of ``flash_fwd``'s (base-2) lse,
    None when nothing downstream differentiates it.  mods, varlen: those of the forward.
    """
    _check_last_dim_contiguous(do=do, q=q, k=k, v=v, o=o)
    _check_csr("kv", kv_counts, kv_indices, q.device)
    _check_csr("q", q_counts, q_indices, q.device)
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    sparse = kv_counts is not None
    if sparse and q_counts is None:
        raise ValueError("block-sparse backward needs both CSR lists: layout.kv_indices and layout.q_indices")
    dq = empty_like_rows(q)
    dk = empty_like_rows(k)
    dv = empty_like_rows(v)
    delta = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    d_tile = configs.tile_dim(D)  # the kernels mask the head-dim padding D..d_tile
    align8 = _align8(D, q, k, v, o, do)
    pre_m = 64 if d_tile <= 128 else 32
    while triton.cdiv(Lq, pre_m) > MAX_GRID_Y:  # a whole chromosome: more rows per program
        pre_m *= 2
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    bwd_preprocess_kernel[(B * H, triton.cdiv(Lq, pre_m))](
        o,
        do,
        dlse if dlse is not None else placeholder(q.device, torch.float32),
        delta,
        o.stride(0),
        o.stride(1),
        o.stride(2),
        do.stride(0),
        do.stride(1),
        do.stride(2),
        H,
        Lq,
        D=D,
        D_TILE=d_tile,
        BLOCK_M=pre_m,
        ALIGN8=align8,
        HAS_DLSE=dlse is not None,
    )
    kcnt, kidx, korder, skcnt_h, skidx_h, skidx_m, skord_h = csr_args(kv_counts, kv_indices, q)
    qcnt, qidx, qorder, sqcnt_h, sqidx_h, sqidx_n, sqord_h = csr_args(q_counts, q_indices, q)
    lens = kv_lens if kv_lens is not None else kcnt
    bs = block_size if sparse else 1
    qk_scale = scale * LOG2E
    docs = cu_seqlens is not None
    doc_start, doc_end = doc_args(cu_seqlens, B, Lq, q)
    cu_q, cu_k, sequences = _varlen_args(varlen, q)
    (alibi, rng, sal_b), scalars, mod_constexprs = _mod_args(mods, causal, scale, q)
    mod_scalars = (
        scalars["band_lo"],
        scalars["band_hi"],
        scalars["cap_in"],
        scalars["cap2"],
        scalars["drop_thr"],
        scalars["drop_scale"],
    )
    rows = sequences if varlen is not None else B  # the grid's batch axis
    # long key-block columns (BigBird's global block) are walked in chunks by several programs
    key_plan = _split_plan(q_counts, H // HKV) if sparse else None
    key_items, skey_items_h = _plan_items(key_plan, qorder, sqord_h)
    pdk, pdv = _partials(key_plan, B, HKV, bs, D, q, 2)
    # and so are long query-block rows (BigBird's global block again)
    query_plan = _split_plan(kv_counts, 1) if sparse else None
    query_items, squery_items_h = _plan_items(query_plan, korder, skord_h)
    (pdq,) = _partials(query_plan, B, H, bs, D, q, 1)

    def run(cfg: configs.BwdConfig) -> None:
        side = _dq_stream(q.device) if cfg.dq_stream and q.is_cuda else None
        if side is not None:  # dQ reads only what exists now (inputs, delta): fork after the preprocess
            side.wait_stream(torch.cuda.current_stream(q.device))
        # a layout block ragged at Lq may list query tiles past Lq: keep the row masks then
        even_q = varlen is None and Lq % (block_size if sparse else cfg.block_m1) == 0
        key_units = key_items.shape[1] if sparse else 0  # layout columns or plan items
        if sparse:
            key_tiles = key_units * (bs // cfg.block_n1)
        else:
            key_tiles = triton.cdiv(varlen.max_seqlen_k if varlen is not None else Lk, cfg.block_n1)
        key_order = doc_order(doc_start, doc_end, cfg.block_n1, causal, keys=True) if docs and not sparse else qcnt
        grid = (key_tiles, rows * HKV) if cfg.heads_outer else (rows * HKV, key_tiles)
        bwd_dkdv_kernel[grid](
            q,
            k,
            v,
            do,
            dk,
            dv,
            pdk,
            pdv,
            lse,
            delta,
            lens,
            qcnt,
            qidx,
            key_items,
            doc_start,
            doc_end,
            key_order,
            cu_q,
            cu_k,
            alibi,
            rng,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            do.stride(0),
            do.stride(1),
            do.stride(2),
            dk.stride(0),
            dk.stride(1),
            dk.stride(2),
            dv.stride(0),
            dv.stride(1),
            dv.stride(2),
            pdk.stride(1) if key_plan else 0,
            pdk.stride(2) if key_plan else 0,
            sqcnt_h,
            sqidx_h,
            sqidx_n,
            skey_items_h,
            sal_b,
            H,
            HKV,
            H // HKV,
            Lq,
            Lk,
            qk_scale,
            scale,
            *mod_scalars,
            bs,
            D=D,
            D_TILE=d_tile,
            BLOCK_M1=cfg.block_m1,
            BLOCK_N1=cfg.block_n1,
            SPARSE=sparse,
            HAS_KV_LENS=kv_lens is not None,
            EVEN_Q=even_q,
            SCAN_=SCAN,
            DOT_F32=_dot_f32(q),
            ALIGN8=align8,
            HAS_DOCS=docs,
            TMA=cfg.tma,
            HEADS_OUTER=cfg.heads_outer,
            SPLIT=key_plan is not None,
            DV_LATE=cfg.dv_late,
            VARLEN=varlen is not None,
            **mod_constexprs,
            num_warps=cfg.warps1,
            num_stages=cfg.stages1,
        )
        if key_plan is not None:
            _split_sum(key_plan, pdk, dk, scale, bs, align8)
            _split_sum(key_plan, pdv, dv, 1.0, bs, align8)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            run_dq(cfg)
        if side is not None:  # join: the caller's stream sees dq (its memory stays alive until then)
            torch.cuda.current_stream(q.device).wait_stream(side)

    def run_dq(cfg: configs.BwdConfig) -> None:
        query_units = query_items.shape[1] if sparse else 0  # layout rows or plan items
        if sparse:
            query_tiles = query_units * (bs // cfg.block_m2)
        else:
            query_tiles = triton.cdiv(varlen.max_seqlen_q if varlen is not None else Lq, cfg.block_m2)
        query_order = doc_order(doc_start, doc_end, cfg.block_m2, causal, keys=False) if docs and not sparse else kcnt
        grid = (query_tiles, rows * H) if cfg.heads_outer else (rows * H, query_tiles)
        bwd_dq_kernel[grid](
            q,
            k,
            v,
            do,
            dq,
            pdq,
            lse,
            delta,
            lens,
            kcnt,
            kidx,
            query_items,
            doc_start,
            doc_end,
            query_order,
            cu_q,
            cu_k,
            alibi,
            rng,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            do.stride(0),
            do.stride(1),
            do.stride(2),
            dq.stride(0),
            dq.stride(1),
            dq.stride(2),
            pdq.stride(1) if query_plan else 0,
            pdq.stride(2) if query_plan else 0,
            skcnt_h,
            skidx_h,
            skidx_m,
            squery_items_h,
            sal_b,
            H,
            H // HKV,
            Lq,
            Lk,
            qk_scale,
            scale,
            *mod_scalars,
            bs,
            D=D,
            D_TILE=d_tile,
            BLOCK_M2=cfg.block_m2,
            BLOCK_N2=cfg.block_n2,
            SPARSE=sparse,
            HAS_KV_LENS=kv_lens is not None,
            SCAN_=SCAN,
            DOT_F32=_dot_f32(q),
            ALIGN8=align8,
            HAS_DOCS=docs,
            TMA=cfg.tma,
            HEADS_OUTER=cfg.heads_outer,
            SPLIT=query_plan is not None,
            VARLEN=varlen is not None,
            **mod_constexprs,
            num_warps=cfg.warps2,
            num_stages=cfg.stages2,
        )
        if query_plan is not None:
            _split_sum(query_plan, pdq, dq, scale, bs, align8)

    tma = _tma_ready(q, k, v, do)
    cands = _without_tma(
        bwd_candidates(q.device, D, block_size if sparse else None) if config is None else (config,), tma
    )
    key_units = key_items.shape[1] if sparse else 0
    query_units = query_items.shape[1] if sparse else 0
    tiled_q, tiled_k = (varlen.max_seqlen_q, varlen.max_seqlen_k) if varlen is not None else (Lq, Lk)
    cands = grid_fitting(cands, lambda c: bwd_tiles(c, tiled_q, tiled_k, key_units, query_units, bs), "backward")
    key = (
        "bwd",
        q.device.index,
        D,
        q.dtype,
        causal,
        sparse,
        docs,
        block_size,
        tma,
        H // HKV,
        _bucket(Lq),
        _bucket(Lk),
        _mods_key(mods, causal, varlen),
        cands,
    )
    run(cands[0] if config is not None else choose_config(key, cands, run, q.device))
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# Custom ops (torch.compile sees one opaque node per pass) and autograd
# --------------------------------------------------------------------------------------------

_MOD_SCHEMA = (
    "int? band_lo=None, int? band_hi=None, Tensor? alibi=None, float softcap=0.0, float dropout_p=0.0, "
    "Tensor? rng=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int max_seqlen_q=0, "
    "int max_seqlen_k=0"
)
_FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? kv_counts, Tensor? kv_indices, "
    "Tensor? q_counts, Tensor? q_indices, int block_size, bool causal, float scale, "
    f"Tensor? cu_seqlens, {_MOD_SCHEMA}) -> (Tensor, Tensor)"
)
_BWD_SCHEMA = (
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? kv_lens, "
    "Tensor? kv_counts, Tensor? kv_indices, Tensor? q_counts, Tensor? q_indices, int block_size, "
    f"bool causal, float scale, Tensor? cu_seqlens, Tensor? dlse, {_MOD_SCHEMA}) -> (Tensor, Tensor, Tensor)"
)


def _unflatten(
    band_lo=None,
    band_hi=None,
    alibi=None,
    softcap=0.0,
    dropout_p=0.0,
    rng=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=0,
    max_seqlen_k=0,
) -> tuple[ScoreMods, Varlen | None]:
    """The launchers' ScoreMods and Varlen from the custom ops' flat arguments."""
    mods = ScoreMods((band_lo, band_hi), alibi, softcap, dropout_p, rng)
    varlen = None if cu_seqlens_q is None else Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return mods, varlen


def _flatten(mods: ScoreMods, varlen: Varlen | None) -> tuple:
    """The custom ops' flat arguments of ScoreMods and Varlen (``_unflatten``'s inverse)."""
    if varlen is None:
        varlen = (None, None, 0, 0)
    return (*mods.band, mods.alibi, mods.softcap, mods.dropout_p, mods.rng, *varlen)


def _fwd_impl(
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, *flat
):
    mods, varlen = _unflatten(*flat)
    return flash_fwd(
        q, k, v, kv_lens, kv_counts, kv_indices, block_size, causal, scale, cu_seqlens, mods=mods, varlen=varlen
    )


def _bwd_impl(
    do,
    q,
    k,
    v,
    o,
    lse,
    kv_lens,
    kv_counts,
    kv_indices,
    q_counts,
    q_indices,
    block_size,
    causal,
    scale,
    cu_seqlens,
    dlse,
    *flat,
):
    mods, varlen = _unflatten(*flat)
    do = do if do.stride(-1) == 1 and rows_fit_int32(do) else do.contiguous()  # (32-bit row offsets)
    return flash_bwd(
        do,
        q,
        k,
        v,
        o,
        lse,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        block_size,
        causal,
        scale,
        cu_seqlens,
        dlse=dlse,
        mods=mods,
        varlen=varlen,
    )


_fwd_op = torch.library.custom_op("genoformer::triton_flash_fwd", _fwd_impl, mutates_args=(), schema=_FWD_SCHEMA)
_bwd_op = torch.library.custom_op("genoformer::triton_flash_bwd", _bwd_impl, mutates_args=(), schema=_BWD_SCHEMA)


@_fwd_op.register_fake
def _fwd_fake(
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, *flat
):
    B, H, Lq, D = q.shape
    return empty_like_rows(q), q.new_empty((B, H, Lq), dtype=torch.float32)


@_bwd_op.register_fake
def _bwd_fake(
    do,
    q,
    k,
    v,
    o,
    lse,
    kv_lens,
    kv_counts,
    kv_indices,
    q_counts,
    q_indices,
    block_size,
    causal,
    scale,
    cu_seqlens,
    dlse,
    *flat,
):
    return empty_like_rows(q), empty_like_rows(k), empty_like_rows(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens = inputs[:12]
    band_lo, band_hi, alibi, softcap, dropout_p, rng, cu_q, cu_k, max_q, max_k = _flatten(*_unflatten(*inputs[12:]))
    o, lse = output
    ctx.save_for_backward(
        q, k, v, o, lse, kv_lens, kv_counts, kv_indices, q_counts, q_indices, cu_seqlens, alibi, rng, cu_q, cu_k
    )
    ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
    ctx.band, ctx.softcap, ctx.dropout_p, ctx.max_seqlens = (band_lo, band_hi), softcap, dropout_p, (max_q, max_k)
    ctx.num_inputs = len(inputs)  # the backward returns one gradient per input (12 without the modifiers)
    # an unused output's gradient arrives as None, not as zeros (eager and in AOT autograd's
    # traced backward alike): without return_lse the backward does nothing more than before
    ctx.set_materialize_grads(False)


def _backward(ctx, do, dlse, bwd=_bwd_op):
    # dlse: the gradient of the (base-2) lse output, None (eager) when nothing downstream uses it
    # (`triton_attention(return_lse=True)` hands it out in natural log); do is None when only
    # the lse is used. The custom op's autograd (traced by torch.compile, where
    # torch.compiler.is_compiling() is False inside AOT autograd's backward) must call the
    # backward op; the eager Function calls the implementation directly.
    q, k, v, o, lse, kv_lens, kv_counts, kv_indices, q_counts, q_indices, cu_seqlens, alibi, rng, cu_q, cu_k = (
        ctx.saved_tensors
    )
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = bwd(
        do,
        q,
        k,
        v,
        o,
        lse,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        ctx.block_size,
        ctx.causal,
        ctx.scale,
        cu_seqlens,
        dlse,
        *ctx.band,
        alibi,
        ctx.softcap,
        ctx.dropout_p,
        rng,
        cu_q,
        cu_k,
        *ctx.max_seqlens,
    )
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' forward and backward without the custom-op dispatch, for eager mode.

    The dispatch (schema defaults, redispatch, the autograd wrapper) took about half of the host
    time of a call on an H200's host, and a block-sparse layout's kernels finish in about as long:
    at 6 % density the call was host-bound (docs/design/kernels.md). torch.compile traces the
    custom ops instead (`triton_attention` picks)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse, bwd=_bwd_impl)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def padded_head_dim(head_dim: int) -> int:
    """The head dim the kernels run a head of `head_dim` (1 to 256) in: itself when it is a multiple
    of 8 from 16 on (``HEAD_DIMS``), else the next such; the launcher pads q, k, v with zeros."""
    return max(16, -(-head_dim // 8) * 8)


def _pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """t (B, H, L, D) with zero columns up to `width`, laid out as t (``empty_like_rows``)."""
    out = empty_like_rows(t, (*t.shape[:3], width))
    out[..., t.shape[-1] :] = 0
    out[..., : t.shape[-1]] = t
    return out


def _window_band(
    window: tuple[int | None, int | None] | None, layout: BlockLayout | None, Lq: int, Lk: int
) -> tuple[int | None, int | None]:
    """The kernels' band (relative to the bottom-right diagonal) of a window (left, right) (relative
    to it too) and of a layout's own window (``BlockLayout.window``: relative to j = i), intersected."""
    lo = hi = None
    if window is not None:
        left, right = window
        lo = None if left is None or left < 0 else -left
        hi = None if right is None or right < 0 else right
    if layout is not None and layout.window is not None:
        shift = Lk - Lq
        left, right = layout.window
        if left is not None:
            lo = -left - shift if lo is None else max(lo, -left - shift)
        if right is not None:
            hi = right - shift if hi is None else min(hi, right - shift)
    return lo, hi


def triton_attention(
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
    varlen: Varlen | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention in Triton (forward and backward), dense, causal or block-sparse, packed or not.

    q: (B, H, Lq, D), k and v: (B, HKV, Lk, D), fp16 or bf16, D from 1 to 256 (a D that is not a
    multiple of 8 from 16 on is zero-padded to the next one, ``padded_head_dim``; a D that is not a
    power of two runs in tiles of the next power of two, the padding masked), H % HKV == 0.
    Tensors whose head dim is strided are copied to contiguous; other strides (for example a
    (B, L, H, D) buffer viewed as (B, H, L, D)) are read in place, and the output and gradients
    are laid out like their inputs.
    causal: j <= i + Lk - Lq (bottom-right aligned as in flash-attn; j <= i when Lq == Lk).
    layout: a BlockLayout over (Lq, Lk); only its listed blocks are visited, and its own token
    window (``BlockLayout.window``) applies.  A layout that allows every block its window meets
    runs as dense attention with that window (tile ranges computed, no block lists).
    kv_lens: (B,) int, keys >= kv_lens[b] are padding.
    cu_seqlens: (N+1,) int32, documents packed in the rows (valid as ``genoformer.kernels.documents``
    checks it; Lq == Lk, no kv_lens): a token attends only inside its document, and a tile's work
    is cut to its documents' span.
    window: (left, right), flash-attn's sliding window: key j allowed for query i only if
    i + Lk - Lq - left <= j <= i + Lk - Lq + right (None or a negative value: unbounded); exact to
    the token, and only the tiles the window meets are visited.
    alibi_slopes: (H,) or (B, H) float (Varlen: (sequences, H)): ALiBi, -slope * |i + Lk - Lq - j|
    added to each score.  softcap: > 0 caps the scaled scores, softcap * tanh(s / softcap).
    dropout_p: attention dropout, in [0, 1): each probability is kept with probability 1 - p and
    scaled by 1 / (1 - p); dropout_rng: int64 (2,) (seed, offset) on q's device
    (``genoformer.kernels.dropout``; None draws one from torch's generator).  The backward
    regenerates the same mask.
    varlen: sequences concatenated along one row (``Varlen``; B == 1; not with a layout, kv_lens or
    cu_seqlens), each with its own query and key length.
    Returns (B, H, Lq, D) in q's dtype; with return_lse also the lse (B, H, Lq) fp32 in natural log
    (-inf for a row with no allowed key; the forward's base-2 row statistic converted; the scores
    it sums include the softcap and ALiBi, before dropout), whose gradient the backward takes
    (``triton_flash_bwd``).  Raises ValueError saying what to change when the kernels cannot run
    the inputs (see ``unsupported_reason``).
    """
    _check(q, k, v, causal, layout, kv_lens, cu_seqlens)
    mods = _check_mods(
        q,
        k,
        window=window,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        dropout_p=dropout_p,
        dropout_rng=dropout_rng,
        varlen=varlen,
        layout=layout,
        kv_lens=kv_lens,
        cu_seqlens=cu_seqlens,
    )
    # strided head dims, and row strides whose 32-bit row offsets would overflow, are copied
    q, k, v = (t if t.stride(-1) == 1 and rows_fit_int32(t) else t.contiguous() for t in (q, k, v))
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if D != padded_head_dim(D):
        q, k, v = (_pad_head_dim(t, padded_head_dim(D)) for t in (q, k, v))
    if not all(rows_fit_int32(t) for t in (q, k, v)):
        raise ValueError(
            f"triton attention cannot run these inputs: {q.shape[2]:,} rows of {q.shape[3]} elements per "
            f"head exceed the kernels' 32-bit row offsets ({INT32_OFFSETS:,} elements); shorten the window"
        )
    band = _window_band(window, layout, q.shape[2], k.shape[2])
    if layout is not None and layout.window is not None and layout.covers_window(causal):
        layout = None  # the window's own tile ranges do what the block lists would
    mods = dataclasses.replace(mods, band=band)
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    block_size, kv_counts, kv_indices, q_counts, q_indices = layout_lists(layout, q.device, backward)
    forward = _fwd_op if torch.compiler.is_compiling() else _EagerAttention.apply
    o, lse2 = forward(
        q,
        k,
        v,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        block_size,
        causal,
        scale,
        cu_seqlens,
        *_flatten(mods, varlen),
    )
    if o.shape[-1] != D:
        o = o[..., :D]
    if not return_lse:
        return o
    # base 2 -> natural log; the kernels' +inf of an empty row (exp2(s2 - inf) == 0) -> -inf
    return o, torch.where(lse2 == float("inf"), float("-inf"), lse2 * LN2)
