"""Attention benchmark: our Triton kernels against FlashAttention-2, flash-attn-4 and both FlexAttention backends.

One run times forward and backward of `genoformer.kernels.triton_flash.triton_attention`
("ours") against
  * FA2: torch SDPA restricted to its flash backend (FlashAttention-2), dense causal only (the
    one pattern of the sweep it can express);
  * FA4: flash-attn-4 (`flash_attn.cute.flash_attn_func`, the flash-attn project's CuTe-DSL
    kernels for Hopper and Blackwell), dense causal. Our sliding window is block-granular
    (`BlockLayout.sliding_window`), flash-attn's `window_size` token-granular: they are not
    the same function, so FA4 is compared on causal only and the window goes to Flex;
  * Flex: `torch.compile(flex_attention)` (its Triton backend) with a BlockMask built from the
    very same `BlockLayout` that ours receives, so both compute the same function. The Triton
    backend visits the BlockMask's block lists and calls the mask_mod on partial blocks only
    (the causal diagonal), so its mask_mod is plain `kv <= q` (none when bidirectional), the
    cheapest a Flex user would write; a per-element layout lookup there would slow Flex's
    diagonal blocks and flatter our ratios;
  * Flex FLASH: the same compiled call with `kernel_options={"BACKEND": "FLASH"}`, Flex's
    flash-attn-4 backend (needs flash-attn-4 installed). It ignores the block lists when the
    mask_mod is trivial (torch/_inductor/kernel/flex/flex_flash_attention.py: no mask_mod, no
    block sparsity: dense attention), so its BlockMask's mask_mod states the layout itself: the
    layout's block looked up for (q, kv), and kv <= q when causal;
and writes a results JSON, a plot and the `attention` section of BENCHMARKS.md. A library that
is missing (flash-attn-4 on most machines, everything but ours and Flex on a CPU) is recorded
and its column left out; the run goes on.

Run from the repository root (the full GPU sweep takes about 5 to 6 minutes on an H200, most
of it compiling Flex and flash-attn-4's kernels):

    python -m benchmarks.attention --out OUT --markdown BENCHMARKS.md
    python -m benchmarks.attention --quick                       # L = 16k only
    python -m benchmarks.attention --device cpu --tiny --ours torch --out /tmp/b   # CPU smoke run
    python -m benchmarks.attention --render-from OUT/attention.json --out DIR --markdown BENCHMARKS.md
    python -m benchmarks.attention --render-from RUN1.json RUN2.json --out DIR   # merged: RUN2 replaces cases
    python -m benchmarks.attention --patterns sliding_window bigbird --lengths 16384 32768 --rounds 3 --out DIR
                                      # some rows again, then --render-from the table's JSON and DIR's

The last one measures nothing: it redraws the plot and rewrites the markdown section from a
results JSON, e.g. on a workstation after a GPU run whose only output was OUT.

Method
  * Shapes: bf16; L in 8k..64k: 16k first (the length of the issue's tables), then largest first,
    so that a `--budget-s` cut drops the least telling;
    batch B = max(1, 16384 // L) (16k tokens per batch up to L = 16k, one sequence beyond);
    heads H = 2048 // D, so the model width is the same for every head dim D.
  * Patterns (block size 128): `causal` (dense causal), `sliding_window` (bidirectional, key
    blocks within ±1024 tokens, block-granular as `BlockLayout.sliding_window` defines it;
    13% dense at 16k), `bigbird` (bidirectional: window 512 tokens + 1 global block + 2 seeded
    random blocks per query block), `custom` (causal: a 512-token window united with every
    16th key block, a strided "sparse transformer" layout that no dense kernel expresses).
  * Times: median of `triton.testing.do_bench` (warm-up, L2 flushed between calls) in ms, with
    autograd on (a training forward). The backward time is `out.backward(dout,
    retain_graph=True)` replayed on one stored forward graph, gradients reset to None before
    each call: backward alone, no forward in it. (AOTAutograd's donated buffers are switched
    off so that the compiled Flex backward may be replayed.) Compiling and autotuning happen
    in the correctness check or in do_bench's first call, outside the timed calls.
  * Flex is compiled for each shape (`static_flex`: `dynamic=False`). With torch.compile's
    automatic dynamic shapes, the second sequence length of a process got Flex kernels compiled
    for a symbolic length, which took 1.1-1.4x the time of static ones on the H200 and flattered
    ours. The recompile limit is raised to 128 and hitting it raises, instead of silently
    running eager Flex (which would materialise the L^2 scores).
  * FLOPs: 4 * B * H * pairs * D for the forward, 2.5 times that for the backward, where pairs
    is the exact number of (query, key) pairs the pattern allows (causal diagonal blocks
    counted by halves). "density" is pairs / (H * L^2), the fraction of the full score matrix.
  * Correctness against float64 (`float64_check` in the JSON): before the sweep, ours, Flex and
    Flex FLASH run every pattern at each head dim at L = 16 blocks (2048 tokens), B = 1, 4 heads,
    against `genoformer.kernels.reference` in float64; the same row errors and limits as below.
  * Correctness per configuration: every implementation is run against one reference
    (FA2 for causal, then FA4, Flex; Flex for the block-sparse patterns, our PyTorch
    block-sparse backend where Flex failed) on the same inputs. The error of a row (one
    query's output, one token's gradient) is max|impl - ref| over its D entries divided by
    max|ref| over them (at least the median row's, so that rows which are zero up to rounding,
    like dq of the first causal query, do not count); the table shows the worst row of the
    output and of (dq, dk, dv), flagged WRONG above 3e-2 (output) and 6e-2 (gradients). A
    WRONG result is never counted as meeting a target (ours) or as a yardstick (the others).
  * Inputs: standard normal, drawn afresh for every configuration.
  * Memory: peak `torch.cuda.max_memory_allocated` over one forward + backward (above what
    the inputs already hold), dense causal, L = 64k, 16 heads of 128, ours vs FA2.
  * Ceiling: bf16 8192^3 torch.matmul TFLOP/s in the same run.
  * Clocks: `nvidia-smi` samples the SM clock, power and temperature every 50 ms in the
    background; each timing keeps the summary of the samples taken during it (fwd_clock,
    bwd_clock in the JSON), and the header gives each implementation's median and lowest clock.
  * Ours' configurations: the launch configurations (tiles, variants) the tuner chose for each
    case, `ours.configs` in the JSON.
    A kernel timed after a power-hungry one may run at a lower clock.
  * A kernel that raises (or a missing module, or a compile failure) is recorded in the
    results and the run goes on; `--budget-s` skips (and records) what is left when the run
    gets too long for one GPU call.

Targets (ratio = ours' time / the other's, fwd and bwd each):
  * Floor: every pattern no slower than Flex (Triton backend), 8k..64k, D 64 and 128.
  * Goal: causal at most 1.15x FA4 at D = 128; block-sparse patterns at most 1.15x Flex FLASH.
  * Moonshot: the goal's comparisons at most 1.0x.

On a CPU (`--device cpu`), times come from a perf_counter loop, Flex runs uncompiled and
forward only (PyTorch has no CPU Flex backward and compiling takes ~20 s per shape),
`--ours torch` substitutes `attention(..., backend="torch")` for the Triton kernels, and
FA2, FA4 and Flex FLASH are recorded as CUDA-only.

Shape legend: B batch, H heads, L sequence length, D head dim, bs block size,
Mb / Nb query / key blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import functools
import gc
import importlib
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch._dynamo.config
import torch._functorch.config
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from benchmarks.common import (
    ClockSampler,
    command_line,
    describe_environment,
    environment_markdown,
    markdown_table,
    replace_markdown_section,
)
from genoformer.kernels.dispatch import Backend, attention, unsupported_reason
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import reference_attention, row_error

SECTION = "attention"
"""Name of the BENCHMARKS.md section this script owns."""

CHECK_TOLERANCE = {"fwd": 3e-2, "bwd": 6e-2}
"""Largest row error (see the module docstring) before a result is flagged WRONG: a few bf16
ulps of the row's largest entry. Two correct bf16 kernels differ by about 1e-2 (gradients) and
8e-3 (output); a skipped or misplaced block changes rows by 0.1 and more."""

GOAL_RATIO = 1.15
"""Goal: ours at most this multiple of FA4's (causal, D = 128) or Flex FLASH's (block-sparse) time."""
GOAL_HEAD_DIM = 128

OTHERS = {"fa2": "FA2", "fa4": "FA4", "flex": "Flex", "flex_flash": "Flex FLASH"}
"""The implementations ours is compared with: record key -> column name."""

FA4_INSTALL = "pip install flash-attn-4 (Hopper or Blackwell GPU)"


# ----------------------------------------------------------------------------- what to run
@dataclasses.dataclass(frozen=True)
class Sweep:
    """The shapes and pattern parameters of one run."""

    lengths: tuple[int, ...]
    head_dims: tuple[int, ...]
    tokens: int  # B * L for L <= tokens; B = 1 beyond
    width: int  # H * D
    block_size: int
    window: int  # sliding_window pattern: ± tokens
    bigbird_window: int
    bigbird_global_blocks: int
    bigbird_random_blocks: int
    custom_window: int  # custom pattern: causal window (tokens) | every custom_stride-th key block
    custom_stride: int
    memory_shape: tuple[int, int, int, int]  # (B, H, L, D) of the peak-memory comparison
    matmul_n: int  # the ceiling multiplies two (n, n) matrices
    dtype: str = "bfloat16"

    def batch(self, seq_len: int) -> int:
        return max(1, self.tokens // seq_len)

    def heads(self, head_dim: int) -> int:
        return self.width // head_dim


FULL = Sweep(
    lengths=(16384, 65536, 32768, 8192),  # the issue's reference length, then largest first (see the docstring)
    head_dims=(64, 128),
    tokens=16384,
    width=2048,
    block_size=128,
    window=1024,
    bigbird_window=512,
    bigbird_global_blocks=1,
    bigbird_random_blocks=2,
    custom_window=512,
    custom_stride=16,
    memory_shape=(1, 16, 65536, 128),
    matmul_n=8192,
)

TINY = Sweep(
    lengths=(256,),
    head_dims=(16, 32, 64),
    tokens=512,
    width=128,
    block_size=32,
    window=32,
    bigbird_window=32,
    bigbird_global_blocks=1,
    bigbird_random_blocks=1,
    custom_window=32,
    custom_stride=3,
    memory_shape=(1, 2, 512, 64),
    matmul_n=256,
)


class Pattern(str, enum.Enum):
    """Which (query, key) pairs attend."""

    CAUSAL = "causal"
    SLIDING_WINDOW = "sliding_window"
    BIGBIRD = "bigbird"
    CUSTOM = "custom"

    @property
    def causal(self) -> bool:
        return self in (Pattern.CAUSAL, Pattern.CUSTOM)

    @property
    def dense(self) -> bool:
        """Dense causal: the one pattern FA2 and FA4 compute too."""
        return self is Pattern.CAUSAL

    def layout(self, sweep: Sweep, seq_len: int) -> BlockLayout | None:
        """The layout ours receives (None: dense causal)."""
        bs = sweep.block_size
        if self is Pattern.SLIDING_WINDOW:
            return BlockLayout.sliding_window(seq_len, sweep.window, bs)
        if self is Pattern.BIGBIRD:
            return BlockLayout.bigbird(
                seq_len, sweep.bigbird_window, sweep.bigbird_global_blocks, sweep.bigbird_random_blocks, bs
            )
        if self is Pattern.CUSTOM:
            local = BlockLayout.sliding_window(seq_len, sweep.custom_window, bs)
            return (local | BlockLayout.strided(seq_len, sweep.custom_stride, bs)).with_causal()
        return None


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration of the sweep."""

    head_dim: int
    heads: int
    batch: int
    seq_len: int
    pattern: Pattern

    @property
    def label(self) -> str:
        return f"D={self.head_dim} L={_length_label(self.seq_len)} {self.pattern.value}"


def build_cases(sweep: Sweep, patterns: list[Pattern]) -> list[Case]:
    cases = []
    for seq_len in sweep.lengths:
        if seq_len % sweep.block_size:
            raise ValueError(f"every length must be a multiple of the block size {sweep.block_size}, got {seq_len}.")
        for head_dim in sweep.head_dims:
            if sweep.width % head_dim:
                raise ValueError(f"head dim {head_dim} does not divide the model width {sweep.width}.")
            for pattern in patterns:
                cases.append(Case(head_dim, sweep.heads(head_dim), sweep.batch(seq_len), seq_len, pattern))
    return cases


def allowed_pairs(layout: BlockLayout | None, causal: bool, seq_len: int, heads: int) -> int:
    """Exact number of allowed (query, key) pairs summed over heads (one batch element).

    A causal diagonal block of s tokens allows s * (s + 1) / 2 pairs; the last block may be
    partial when seq_len is not a multiple of the block size.
    """
    if layout is None:
        per_head = seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len
        return per_head * heads
    bs, Mb = layout.block_size, layout.num_q_blocks
    sizes_M = torch.full((Mb,), bs, dtype=torch.int64)
    sizes_M[-1] = seq_len - (Mb - 1) * bs
    pairs_MN = sizes_M[:, None] * sizes_M[None, :]
    if causal:
        block_M = torch.arange(Mb)
        below_MN = block_M[None, :] < block_M[:, None]
        pairs_MN = torch.where(below_MN, pairs_MN, 0) + torch.diag(sizes_M * (sizes_M + 1) // 2)
    per_layout_head_H = (layout.mask.to(torch.int64) * pairs_MN).sum((1, 2))
    return int(per_layout_head_H.sum()) * (heads // layout.num_heads)


# ------------------------------------------------------------------------- implementations
@dataclasses.dataclass
class Impl:
    """A callable (q, k, v) -> out on (B, H, L, D) tensors, or why there is none."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None
    error: str | None = None
    backward_error: str | None = None  # set when it runs forward only on this device


def fa2(causal: bool) -> Impl:
    """SDPA restricted to the flash backend: FlashAttention-2, dense (causal or bidirectional)."""

    def run(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Impl(run)


def fa4(module) -> Impl:
    """flash-attn-4's `flash_attn.cute.flash_attn_func`, dense causal, on (B, L, H, D) views."""

    def run(q, k, v):
        out = module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        out = out[0] if isinstance(out, tuple) else out  # (out, lse) in 4.0 betas
        return out.transpose(1, 2)

    return Impl(run)


def _kv_block_lists(mask_HMN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts (1, H, Mb) and indices (1, H, Mb, Nb) int32 of the True blocks, ascending first."""
    counts_HM = mask_HMN.sum(-1, dtype=torch.int32)
    # A stable sort of "not allowed" lists the allowed key blocks first, in ascending order.
    indices_HMN = torch.argsort((~mask_HMN).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts_HM.unsqueeze(0), indices_HMN.unsqueeze(0)


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@contextlib.contextmanager
def tuner_choices(triton_flash) -> Iterator[list[tuple[str, object]]]:
    """The launch configurations that the Triton launchers' tuner (`triton_flash.choose_config`) returns
    while the block runs, as ("fwd" or "bwd", configuration), cached choices included: which tiles
    a measurement ran."""
    chosen: list[tuple[str, object]] = []
    choose = triton_flash.choose_config

    def recording(key, *args, **kwargs):
        config = choose(key, *args, **kwargs)
        chosen.append((key[0], config))
        return config

    triton_flash.choose_config = recording
    try:
        yield chosen
    finally:
        triton_flash.choose_config = choose


def static_flex() -> Callable:
    """`torch.compile(flex_attention)` compiled for each shape it meets (``dynamic=False``).

    Automatic dynamic shapes would compile a process's second sequence length for a symbolic
    length, and those Flex kernels took 1.1-1.4x the time of static ones on the H200 (the custom
    pattern at 32k after 16k): a comparison against them flatters ours.
    """
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(
    layout: BlockLayout, causal: bool, heads: int, device: torch.device, index_only: bool = False
) -> BlockMask:
    """The FlexAttention BlockMask of `layout` (+ causal), from the layout's own block lists.

    Blocks the layout allows are "full" (no mask_mod call) except, when causal, the diagonal
    blocks, which are "partial": there the mask_mod applies the token-level rule
    layout.mask[h, q // bs, kv // bs] and kv <= q. The mask_mod states the whole rule, because
    uncompiled Flex (the CPU run) reads only the mask_mod, and compiled Flex's FLASH backend
    drops the block lists when the mask_mod is trivial (it then computes dense attention).
    `index_only` drops the layout lookup from the mask_mod (kv <= q when causal, none
    otherwise): the same function for compiled Flex's Triton backend, which visits the block
    lists and calls the mask_mod on partial blocks only (allowed diagonal blocks), and never for
    the FLASH backend. Building from block lists, not with `create_block_mask`, never
    materialises the (L, L) token mask (4 GiB per head at 64k); the CPU test checks that both
    constructions agree.
    """
    bs = layout.block_size
    if layout.q_len % bs:
        raise ValueError(f"Flex comparison needs L ({layout.q_len}) to be a multiple of the block size {bs}.")
    allowed_HMN = layout.mask.to(device)
    block_M = torch.arange(layout.num_q_blocks, device=device)
    if causal:
        full_HMN = allowed_HMN & (block_M[None, :] < block_M[:, None])
        partial_HMN = allowed_HMN & (block_M[None, :] == block_M[:, None])
    else:
        full_HMN = allowed_HMN
        partial_HMN = torch.zeros_like(allowed_HMN)
    # mask_mod sees the real head index; give it one mask per head.
    lookup_HMN = allowed_HMN.expand(heads, -1, -1).contiguous()

    if index_only:
        mask_mod = _causal_mask_mod if causal else None
    elif causal:

        def mask_mod(b, h, q_idx, kv_idx):
            return lookup_HMN[h, q_idx // bs, kv_idx // bs] & (kv_idx <= q_idx)

    else:

        def mask_mod(b, h, q_idx, kv_idx):
            return lookup_HMN[h, q_idx // bs, kv_idx // bs]

    partial_num, partial_idx = _kv_block_lists(partial_HMN)
    full_num, full_idx = _kv_block_lists(full_HMN)
    return BlockMask.from_kv_blocks(
        partial_num,
        partial_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=bs,
        mask_mod=mask_mod,
        seq_lengths=(layout.q_len, layout.kv_len),
    )


# ---------------------------------------------------------------------------------- timing
class Timer:
    """Median time of a call in ms: triton's do_bench on CUDA, a perf_counter loop on a CPU."""

    def __init__(self, device: torch.device, warmup_ms: float, rep_ms: float) -> None:
        self.device, self.warmup_ms, self.rep_ms = device, warmup_ms, rep_ms

    def __call__(self, fn: Callable[[], object], grad_to_none: list[torch.Tensor] | None = None) -> float:
        if self.device.type == "cuda":
            import triton.testing

            return float(
                triton.testing.do_bench(
                    fn, warmup=self.warmup_ms, rep=self.rep_ms, grad_to_none=grad_to_none, return_mode="median"
                )
            )
        return self._cpu(fn, grad_to_none)

    def _cpu(self, fn, grad_to_none) -> float:
        def once() -> float:
            for t in grad_to_none or ():
                t.grad = None
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3

        estimate = max(once(), 1e-3)  # also the first warm-up call
        for _ in range(min(100, int(self.warmup_ms / estimate))):
            once()
        return statistics.median(once() for _ in range(min(100, max(3, int(self.rep_ms / estimate)))))


def median_of_rounds(results: list[dict]) -> dict:
    """One implementation's {"fwd_ms", "bwd_ms", "error", "fwd_clock", "bwd_clock"} from several
    rounds: the median time of each direction over the rounds that measured it, the first error;
    with more than one round the rounds' times and GPU clocks are kept too (fwd_ms_rounds,
    fwd_clock_rounds, ...)."""
    if len(results) == 1:
        return results[0]
    merged = {"error": next((r["error"] for r in results if r["error"] is not None), None)}
    for direction in ("fwd_ms", "bwd_ms"):
        times = [r[direction] for r in results if r[direction] is not None]
        merged[direction] = statistics.median(times) if times else None
        merged[f"{direction}_rounds"] = [r[direction] for r in results]
    for clock in ("fwd_clock", "bwd_clock"):
        merged[f"{clock}_rounds"] = [r.get(clock) for r in results]
    return merged


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text[:300]


class Bench:
    """State of one run: device, timer, the implementations it found, errors, time budget."""

    def __init__(self, args: argparse.Namespace, sweep: Sweep) -> None:
        self.device = torch.device(args.device)
        self.sweep = sweep
        self.dtype = getattr(torch, sweep.dtype)
        self.timer = Timer(self.device, args.warmup_ms, args.rep_ms)
        self.ours_kind = args.ours
        self.rounds = args.rounds
        self.seed = args.seed
        self.deadline = time.monotonic() + args.budget_s
        self.budget_s = args.budget_s
        self.tracebacks: list[str] = []
        self.clock = ClockSampler(self.device)
        if self.device.type == "cuda":
            # A recompile past the limit would silently fall back to eager Flex, which
            # materialises L^2 scores: raise instead, and allow enough shapes for the sweep.
            torch._dynamo.config.recompile_limit = 128
            torch._dynamo.config.fail_on_recompile_limit_hit = True
            # The backward is timed by replaying it on a retained graph, which donated
            # buffers forbid.
            torch._functorch.config.donated_buffer = False
            self.flex = static_flex()
        else:
            # Uncompiled Flex on purpose (see the module docstring): its advice to compile is noise here.
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            self.flex = flex_attention

    def attempt(self, what: str, fn: Callable[[], object]) -> tuple[object, str | None]:
        """fn() or, when it raises, (None, a one-line error); the traceback goes to the log."""
        try:
            return fn(), None
        except Exception as exc:  # recorded in the results table; the sweep goes on
            self.tracebacks.append(f"== {what}\n{traceback.format_exc()}")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None, _error_text(exc)

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    # ----------------------------------------------------------------------- implementations
    def ours(self, causal: bool, layout: BlockLayout | None, q, k, v) -> Impl:
        if self.ours_kind in ("torch", "gluon"):
            backend = Backend(self.ours_kind)
            reason = unsupported_reason(backend, q, k, v, causal=causal, layout=layout, kv_lens=None, cu_seqlens=None,
                                        return_lse=False)
            if reason is not None:
                return Impl(None, error=f"unsupported: {reason}")
            return Impl(functools.partial(attention, causal=causal, layout=layout, backend=backend))
        module, error = self.triton_module
        if error is not None:
            return Impl(None, error=error)
        reason = module.unsupported_reason(q, k, v, causal=causal, layout=layout, kv_lens=None)
        if reason is not None:
            return Impl(None, error=f"unsupported: {reason}")
        return Impl(functools.partial(module.triton_attention, causal=causal, layout=layout))

    def ours_choices(self) -> contextlib.AbstractContextManager[list[tuple[str, object]]]:
        """``tuner_choices`` of ours' Triton module; none with `--ours torch`."""
        module = self.triton_module[0] if self.ours_kind in ("triton", "gluon") else None
        return tuner_choices(module) if module is not None else contextlib.nullcontext([])

    @functools.cached_property
    def triton_module(self):
        """(genoformer.kernels.triton_flash, None), or (None, why it does not import)."""
        return self.attempt(
            "import genoformer.kernels.triton_flash", lambda: importlib.import_module("genoformer.kernels.triton_flash")
        )

    @functools.cached_property
    def fa4_module(self):
        """(flash_attn.cute, None), or (None, why not: not installed, or not on this device)."""
        if self.device.type != "cuda":
            return None, "flash-attn-4 runs on CUDA only"
        module, error = self.attempt("import flash_attn.cute", lambda: importlib.import_module("flash_attn.cute"))
        if error is not None:
            return None, f"flash-attn-4 not importable ({error}): {FA4_INSTALL}"
        return module, None

    def others(self, case: Case, layout: BlockLayout | None) -> dict[str, Impl]:
        """The implementations compared with ours on this case, by record key."""
        impls = {}
        if case.pattern.dense:
            impls["fa2"] = fa2(causal=True)
            module, error = self.fa4_module
            impls["fa4"] = fa4(module) if error is None else Impl(None, error=error)
        impls.update(self.flex_impls(case.pattern.causal, case.heads, case.seq_len, layout, case.label))
        return impls

    def flex_impls(self, causal: bool, heads: int, seq_len: int, layout: BlockLayout | None, label: str) -> dict:
        """{"flex": Flex's Triton backend, "flex_flash": its FLASH backend} on this layout's BlockMask."""
        layout = layout or BlockLayout.dense(seq_len, block_size=self.sweep.block_size)
        impls = {}
        # compiled Flex's Triton backend needs no layout lookup in its mask_mod (see flex_block_mask)
        index_only = self.device.type == "cuda"
        block_mask, error = self.attempt(
            f"{label}: flex block mask", lambda: flex_block_mask(layout, causal, heads, self.device, index_only)
        )
        if error is not None:
            impls["flex"] = Impl(None, error=error)
        elif self.device.type != "cuda":

            def forward_only(q, k, v):
                return self.flex(q.detach(), k.detach(), v.detach(), block_mask=block_mask)

            impls["flex"] = Impl(forward_only, backward_error="FlexAttention has no CPU backward")
        else:
            impls["flex"] = Impl(functools.partial(self.flex, block_mask=block_mask))
        _, fa4_error = self.fa4_module
        if self.device.type != "cuda":
            impls["flex_flash"] = Impl(None, error="Flex's FLASH backend runs on CUDA only")
            return impls
        if fa4_error is not None:
            impls["flex_flash"] = Impl(None, error=f"Flex FLASH needs {fa4_error}")
            return impls
        # the FLASH backend keeps the block lists only with a mask_mod that is not trivial: the whole rule
        flash_mask, error = self.attempt(
            f"{label}: flex FLASH block mask", lambda: flex_block_mask(layout, causal, heads, self.device)
        )
        impls["flex_flash"] = Impl(None, error=error) if error is not None else Impl(
            functools.partial(self.flex, block_mask=flash_mask, kernel_options={"BACKEND": "FLASH"})
        )
        return impls

    # -------------------------------------------------------------------------- measurements
    def inputs(self, batch: int, heads: int, seq_len: int, head_dim: int, salt: int):
        generator = torch.Generator(self.device).manual_seed(self.seed * 1_000_003 + salt)
        shape = (batch, heads, seq_len, head_dim)
        q, k, v, dout = (
            torch.randn(shape, generator=generator, device=self.device, dtype=self.dtype) for _ in range(4)
        )
        return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout

    def time_impl(self, what: str, impl: Impl, q, k, v, dout) -> dict:
        """{"fwd_ms", "bwd_ms", "error"}: forward and backward-alone medians."""
        result = {"fwd_ms": None, "bwd_ms": None, "error": impl.error, "fwd_clock": None, "bwd_clock": None}
        if impl.fn is None:
            return result
        began = time.monotonic()
        result["fwd_ms"], error = self.attempt(f"{what} fwd", lambda: self.timer(lambda: impl.fn(q, k, v)))
        result["fwd_clock"] = self.clock.window(began, time.monotonic())
        if error is not None:
            result["error"] = f"fwd: {error}"
            return result
        if impl.backward_error is not None:
            result["error"] = f"bwd: {impl.backward_error}"
            return result

        def backward_ms() -> float:
            out = impl.fn(q, k, v)
            ms = self.timer(lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v])
            for t in (q, k, v):
                t.grad = None
            return ms

        began = time.monotonic()
        result["bwd_ms"], error = self.attempt(f"{what} bwd", backward_ms)
        result["bwd_clock"] = self.clock.window(began, time.monotonic())
        if error is not None:
            result["error"] = f"bwd: {error}"
        return result

    def outputs(self, impl: Impl, q, k, v, dout) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """out and (dq, dk, dv) of one forward + backward (grads None when forward only)."""
        for t in (q, k, v):
            t.grad = None
        out = impl.fn(q, k, v)
        if impl.backward_error is not None:
            return out.detach(), None
        out.backward(dout)
        grads = (q.grad, k.grad, v.grad)
        for t in (q, k, v):
            t.grad = None
        return out.detach(), grads

    def reference(self, case: Case, references: list[tuple[str, Impl]], q, k, v, dout):
        """(name, outputs) of the first reference that runs, or (None, None)."""
        for name, ref in references:
            if ref.fn is None:
                continue
            expected, error = self.attempt(
                f"{case.label}: {name} reference", functools.partial(self.outputs, ref, q, k, v, dout)
            )
            if error is None:
                return name, expected
            ref.fn, ref.error = None, error  # recorded with its timings, and not run again
        return None, None

    def check(self, case: Case, impl: Impl, name: str, reference: tuple, q, k, v, dout) -> dict:
        """Row errors (see `row_error`) of one implementation against the reference's outputs."""
        ref_name, expected = reference
        result = {"reference": ref_name, "fwd_rel_err": None, "bwd_rel_err": None, "ok": None, "error": None}
        if impl.fn is None:
            result["error"] = f"{name} unavailable: {impl.error}" if impl.error else f"{name} unavailable"
            return result
        if expected is None:
            result["error"] = "no reference ran"
            return result
        got, error = self.attempt(f"{case.label}: {name} run", lambda: self.outputs(impl, q, k, v, dout))
        if error is not None:
            result["error"] = f"{name}: {error}"  # the timings record where it fails
            return result
        result["fwd_rel_err"] = row_error(got[0], expected[0])
        if got[1] is not None and expected[1] is not None:
            result["bwd_rel_err"] = max(row_error(a, b) for a, b in zip(got[1], expected[1], strict=True))
        errors = [(result[f"{d}_rel_err"], CHECK_TOLERANCE[d]) for d in ("fwd", "bwd")]
        result["ok"] = all(e <= tol for e, tol in errors if e is not None)  # NaN compares False: never ok
        return result

    def run_case(self, case: Case, index: int) -> dict:
        """The case's record: its shape, pattern and FLOPs, then the measurements (or why none)."""
        layout = case.pattern.layout(self.sweep, case.seq_len)
        causal = case.pattern.causal
        pairs = allowed_pairs(layout, causal, case.seq_len, case.heads)
        record = {
            "head_dim": case.head_dim,
            "heads": case.heads,
            "batch": case.batch,
            "seq_len": case.seq_len,
            "pattern": case.pattern.value,
            "causal": causal,
            "block_size": self.sweep.block_size if layout is not None else None,
            "layout_block_density": layout.density if layout is not None else None,
            "density": pairs / (case.heads * case.seq_len**2),
            "fwd_flops": 4 * case.batch * pairs * case.head_dim,
            "skipped": None,
        }
        if self.out_of_time():
            record["skipped"] = f"time budget (--budget-s {self.budget_s:g}) spent"
            return record
        _, error = self.attempt(case.label, lambda: self.measure_case(case, layout, index, record))
        if error is not None:
            record["skipped"] = f"failed: {error}"
        self.release()
        return record

    def measure_case(self, case: Case, layout: BlockLayout | None, index: int, record: dict) -> None:
        """Fill `record` with the checks and the timings of ours and every other implementation."""
        causal = case.pattern.causal
        q, k, v, dout = self.inputs(case.batch, case.heads, case.seq_len, case.head_dim, salt=index)
        ours = self.ours(causal, layout, q, k, v)
        others = self.others(case, layout)
        references = [(OTHERS[key], others[key]) for key in ("fa2", "fa4", "flex") if key in others]
        if layout is not None:
            references.append(
                ("torch", Impl(functools.partial(attention, causal=causal, layout=layout, backend=Backend.TORCH)))
            )
        reference = self.reference(case, references, q, k, v, dout)
        with self.ours_choices() as chosen:  # ours' first call: the tuner picks its configurations here
            record["check"] = self.check(case, ours, "ours", reference, q, k, v, dout)
        timed, checks = {"ours": ours}, {}
        for key in OTHERS:
            if key not in others:
                record[key] = None  # not compared on this pattern
                continue
            impl, check = others[key], None
            if impl.fn is not None and OTHERS[key] != reference[0]:  # the reference is not checked against itself
                check = self.check(case, impl, OTHERS[key], reference, q, k, v, dout)
                if check["error"] is not None and check["fwd_rel_err"] is None and reference[0] is not None:
                    impl = Impl(None, error=check["error"])  # it failed to run: not timed again
            timed[key], checks[key] = impl, check
        # every implementation once per round, the rounds one after another: a slow spell of the
        # machine lands in one round of each, not in every timing of one implementation. Each round
        # starts one implementation later, so that no implementation always follows the same one
        # (in fixed order on the H200, ours' first round, after the light correctness checks, was its
        # fastest in 89 of 128 timed passes, and later ones followed Flex FLASH: docs/design/kernels.md)
        keys = list(timed)
        rounds = []
        for turn in range(self.rounds):
            start = turn % len(keys)
            rounds.append({key: self.time_impl(f"{case.label} {OTHERS.get(key, key)}", timed[key], q, k, v, dout)
                           for key in keys[start:] + keys[:start]})
        for key in timed:
            record[key] = median_of_rounds([r[key] for r in rounds])
            if key != "ours":
                record[key]["check"] = checks[key]
        record["ours"]["configs"] = [f"{kind} {config}" for kind, config in chosen]
        del q, k, v, dout

    def float64_check(self, patterns: list[Pattern]) -> list[dict]:
        """Ours, Flex and Flex FLASH against the float64 reference at a small shape (16 layout blocks,
        B = 1, 4 heads): every pattern of the run at each head dim, output and gradients."""
        seq_len, heads = 16 * self.sweep.block_size, 4
        checks = []
        for head_dim in self.sweep.head_dims:
            for index, pattern in enumerate(patterns):
                case = Case(head_dim, heads, 1, seq_len, pattern)
                record = {"head_dim": head_dim, "seq_len": seq_len, "heads": heads, "pattern": pattern.value}
                _, error = self.attempt(f"float64 check {case.label}",
                                        lambda: record.update(self._float64_check(case, 500_000 + index)))
                if error is not None:
                    record["error"] = error
                checks.append(record)
                self.release()
        return checks

    def _float64_check(self, case: Case, salt: int) -> dict:
        layout, causal = case.pattern.layout(self.sweep, case.seq_len), case.pattern.causal
        q, k, v, dout = self.inputs(case.batch, case.heads, case.seq_len, case.head_dim, salt=salt)
        exact_inputs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        exact = Impl(functools.partial(reference_attention, causal=causal, layout=layout))
        reference = ("float64", self.outputs(exact, *exact_inputs, dout.double()))
        impls = {"ours": self.ours(causal, layout, q, k, v),
                 **self.flex_impls(causal, case.heads, case.seq_len, layout, f"float64 check {case.label}")}
        return {key: self.check(case, impl, OTHERS.get(key, key), reference, q, k, v, dout)
                for key, impl in impls.items()}

    def release(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def matmul_tflops(self) -> dict:
        n = self.sweep.matmul_n
        a = torch.randn(n, n, device=self.device, dtype=self.dtype)
        b = torch.randn(n, n, device=self.device, dtype=self.dtype)
        ms, error = self.attempt("matmul ceiling", lambda: self.timer(lambda: torch.matmul(a, b)))
        return {"n": n, "ms": ms, "tflops": None if ms is None else 2 * n**3 / (ms * 1e9), "error": error}

    def peak_memory(self) -> dict:
        """Peak memory of one dense causal forward + backward above the inputs, ours vs FA2."""
        B, H, L, D = self.sweep.memory_shape
        result = {"batch": B, "heads": H, "seq_len": L, "head_dim": D, "pattern": "causal"}
        if self.device.type != "cuda":
            result["error"] = "peak memory is measured on CUDA only"
            return result
        q, k, v, dout = self.inputs(B, H, L, D, salt=999_999)
        for name, impl in (("ours", self.ours(True, None, q, k, v)), ("fa2", fa2(causal=True))):
            if impl.fn is None:
                result[name] = {"peak_mib": None, "error": impl.error}
                continue
            peak, error = self.attempt(f"memory {name}", functools.partial(self._peak_mib, impl, q, k, v, dout))
            result[name] = {"peak_mib": peak, "error": error}
        del q, k, v, dout
        self.release()
        return result

    def _peak_mib(self, impl: Impl, q, k, v, dout) -> float:
        """Peak allocated MiB of one forward + backward, above what was allocated before it."""
        self.outputs(impl, q, k, v, dout)  # warm-up: compiles and autotunes outside the peak
        self.release()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        impl.fn(q, k, v).backward(dout)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        for t in (q, k, v):
            t.grad = None
        return peak / 2**20


def run(args: argparse.Namespace, sweep: Sweep) -> dict:
    bench = Bench(args, sweep)
    started = time.monotonic()
    results = {
        "environment": describe_environment(bench.device),
        "command": command_line(),
        "settings": {
            **dataclasses.asdict(sweep),
            "patterns": [p.value for p in args.patterns],
            "ours": args.ours,
            "warmup_ms": args.warmup_ms,
            "rep_ms": args.rep_ms,
            "rounds": args.rounds,
            "rounds_rotate": True,  # each round starts one implementation later (older JSONs lack it)
            "flex_static": True,  # Flex compiled for each shape (older JSONs lack it)
            "flex_flash_layout_mask": True,  # Flex FLASH's mask_mod states the layout (older JSONs lack it)
        },
        "matmul": bench.matmul_tflops(),
        "memory": bench.peak_memory(),
        "cases": [],
    }
    print(f"matmul ceiling: {_fmt(results['matmul']['tflops'])} TFLOP/s", flush=True)
    if args.float64_check:
        results["float64_check"] = bench.float64_check(args.patterns)
        print(f"[{time.monotonic() - started:6.1f}s] {float64_check_text(results)}", flush=True)
    for index, case in enumerate(build_cases(sweep, args.patterns)):
        record = bench.run_case(case, index)
        results["cases"].append(record)
        print(f"[{time.monotonic() - started:6.1f}s] {_progress_line(record)}", flush=True)
        results["wall_s"] = time.monotonic() - started
        results["tracebacks"] = bench.tracebacks
        if args.out is not None:  # kept current, so that a killed run still leaves its numbers
            _write_json(results, args.out)
    results["wall_s"] = time.monotonic() - started
    results["tracebacks"] = bench.tracebacks
    results["clock"] = bench.clock.close()
    return results


# -------------------------------------------------------------------------------- analysis
def clock_summary(results: dict) -> str:
    """A sentence on the GPU's SM clock during each implementation's timings ("" for runs that
    predate the sampler): the median and the lowest of the per-timing mean clocks."""
    clock = results.get("clock")
    if clock is None:
        return ""
    if clock.get("reason"):
        return f" SM clock not recorded ({clock['reason']})."
    parts = []
    for key in ("ours", *OTHERS):
        means = []
        for r in results["cases"]:
            timing = r.get(key) or {}
            for name in ("fwd_clock", "bwd_clock"):
                windows = timing.get(f"{name}_rounds", [timing.get(name)])
                means += [w["sm_mhz"] for w in windows if w and w.get("sm_mhz") is not None]
        if means:
            parts.append(f"{OTHERS.get(key, key)} {statistics.median(means):.0f} (lowest {min(means):.0f})")
    if not parts:
        return " SM clock: no sample fell inside a timing."
    return (f" SM clock during the timings, MHz (nvidia-smi every {clock['period_ms']} ms; the mean of each "
            f"timing, then their median and lowest over the run): {', '.join(parts)}.")


def _length_label(seq_len: int) -> str:
    return f"{seq_len // 1024}k" if seq_len % 1024 == 0 else str(seq_len)


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    if math.isnan(value):
        return "NaN"
    if abs(value) >= 10**digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _time(record: dict, impl: str, direction: str) -> float | None:
    timing = record.get(impl)
    return None if timing is None else timing.get(f"{direction}_ms")


def _trusted_time(record: dict, impl: str, direction: str) -> float | None:
    """The time, unless the implementation's check found it wrong (a fast wrong kernel counts for nothing)."""
    check = record.get("check") if impl == "ours" else (record.get(impl) or {}).get("check")
    return None if (check or {}).get("ok") is False else _time(record, impl, direction)


def _tflops(record: dict, impl: str, direction: str) -> float | None:
    ms = _time(record, impl, direction)
    if ms is None:
        return None
    return record["fwd_flops"] * (2.5 if direction == "bwd" else 1.0) / (ms * 1e9)


def _pair(record: dict, value: Callable[[dict, str, str], float | None], *args: str) -> str:
    return f"{_fmt(value(record, *args, 'fwd'))} / {_fmt(value(record, *args, 'bwd'))}"


def _time_ratio(record: dict, impl: str, direction: str) -> float | None:
    """ours ÷ impl; none against a yardstick whose result was WRONG (its time is shown, not compared)."""
    return _ratio(_time(record, "ours", direction), _trusted_time(record, impl, direction))


def present_columns(results: dict) -> list[str]:
    """The other implementations with at least one time in the run: a missing library has no column."""
    return [
        key for key in OTHERS if any(_time(r, key, d) is not None for r in results["cases"] for d in ("fwd", "bwd"))
    ]


def absent_columns(results: dict) -> dict[str, str]:
    """Column name -> why it is absent (the first error recorded for it)."""
    present = present_columns(results)
    out = {}
    for key, name in OTHERS.items():
        if key in present:
            continue
        errors = [(r.get(key) or {}).get("error") for r in results["cases"]]
        out[name] = next((e for e in errors if e), "not run")
    return out


def _check_text(check: dict | None) -> str:
    if not check or check.get("reference") is None or check.get("ok") is None:
        return "—"  # not checked: the notes say why
    verdict = "ok" if check["ok"] else "WRONG"
    bwd = f" / {_fmt(check['bwd_rel_err'], 2)}" if check["bwd_rel_err"] is not None else ""
    return f"{verdict} {_fmt(check['fwd_rel_err'], 2)}{bwd} vs {check['reference']}"


def float64_check_text(results: dict) -> str:
    """One sentence on the float64 check: each implementation's worst row errors, and what was WRONG."""
    checks = results.get("float64_check")
    if not checks:
        return "Not checked against float64 in this run (--no-float64-check, or a run that predates the check)."
    parts = []
    for key in ("ours", "flex", "flex_flash"):
        done = [(r, r[key]) for r in checks if (r.get(key) or {}).get("ok") is not None]
        if not done:
            why = next(((r.get(key) or {}).get("error") or r.get("error") for r in checks), None) or "not run"
            parts.append(f"{OTHERS.get(key, key)}: not checked ({why[:120]})")
            continue
        fwd = max(c["fwd_rel_err"] for _, c in done)
        bwd = [c["bwd_rel_err"] for _, c in done if c["bwd_rel_err"] is not None]
        wrong = [f"{r['pattern']} D={r['head_dim']}" for r, c in done if not c["ok"]]
        text = f"{OTHERS.get(key, key)} worst {_fmt(fwd, 2)} / {_fmt(max(bwd), 2) if bwd else '—'}"
        parts.append(text + (f", WRONG on {', '.join(wrong)}" if wrong else ", ok"))
    first = checks[0]
    return (f"Against float64 at L = {first['seq_len']}, {first['heads']} heads, every pattern of the run at "
            f"D {', '.join(str(d) for d in sorted({r['head_dim'] for r in checks}))} (worst row error, "
            f"output / gradients): " + "; ".join(parts) + ".")


def _notes(record: dict, columns: list[str]) -> str:
    if record.get("skipped"):
        return f"skipped: {record['skipped']}"
    notes = []
    for key in ["ours", *columns]:
        timing = record.get(key)
        name = OTHERS.get(key, "ours")
        if timing and timing.get("error"):
            notes.append(f"{name}: {timing['error'][:160]}")
        if timing and (timing.get("check") or {}).get("ok") is False:
            notes.append(f"{name} {_check_text(timing['check'])}")
    check = record.get("check") or {}
    if check.get("error"):
        notes.append(f"check: {check['error'][:160]}")
    return "; ".join(dict.fromkeys(notes))


def _display_order(results: dict) -> list[dict]:
    order = {p.value: i for i, p in enumerate(Pattern)}
    return sorted(results["cases"], key=lambda r: (r["head_dim"], r["seq_len"], order[r["pattern"]]))


def results_rows(results: dict) -> list[dict]:
    columns = present_columns(results)
    rows = []
    for r in _display_order(results):
        row = {
            "D": r["head_dim"],
            "L": _length_label(r["seq_len"]),
            "B×H": f"{r['batch']}×{r['heads']}",
            "pattern": r["pattern"],
            "density": f"{r['density']:.3f}",
            "ours ms": _pair(r, _time, "ours"),
        }
        for key in columns:
            row[f"{OTHERS[key]} ms"] = _pair(r, _time, key) if r.get(key) is not None else "—"
        for key in columns:
            row[f"ours÷{OTHERS[key]}"] = _pair(r, _time_ratio, key) if r.get(key) is not None else "—"
        row["ours TFLOP/s"] = _pair(r, _tflops, "ours")
        row["check (fwd / bwd err)"] = _check_text(r.get("check"))
        row["notes"] = _notes(r, columns)
        rows.append(row)
    return rows


def issue_tables(results: dict) -> list[str]:
    """The issue's two summary tables (ours ÷ other, fwd / bwd): causal vs FA2 and FA4 over L at D = 128
    (and D = 64 at 16k), and the block-sparse patterns at 16k, D = 128, vs both Flex backends."""
    cases = {(r["pattern"], r["head_dim"], r["seq_len"]): r for r in results["cases"] if not r.get("skipped")}
    columns = present_columns(results)
    lines = []
    causal_keys = sorted(
        ((d, length) for p, d, length in cases if p == Pattern.CAUSAL.value and d == GOAL_HEAD_DIM),
        key=lambda key: key[1],
    )
    causal_keys += [(d, length) for p, d, length in cases if p == Pattern.CAUSAL.value and d != GOAL_HEAD_DIM
                    and length == 16384]
    dense_others = [key for key in ("fa2", "fa4", "flex", "flex_flash") if key in columns]
    if causal_keys and dense_others:
        rows = []
        for key in dense_others:
            row = {"fwd / bwd time ratio (ours ÷ other; > 1: we are slower)": f"ours ÷ {OTHERS[key]}"}
            for d, length in causal_keys:
                r = cases[(Pattern.CAUSAL.value, d, length)]
                header = f"{_length_label(length)} x{r['batch']}" if r["batch"] > 1 else _length_label(length)
                header = header if d == GOAL_HEAD_DIM else f"d{d}, {header}"
                row[header] = _pair(r, _time_ratio, key)
            rows.append(row)
        lines += [f"Causal, heads of {GOAL_HEAD_DIM} unless noted (H·D = {results['settings']['width']}):",
                  "", markdown_table(rows), ""]
    sparse_others = [key for key in ("flex", "flex_flash") if key in columns]
    sparse = [(p, cases.get((p.value, GOAL_HEAD_DIM, 16384))) for p in Pattern]
    sparse = [(p, r) for p, r in sparse if r is not None]
    if sparse and sparse_others:
        rows = []
        for pattern, r in sparse:
            row = {f"16k, D {GOAL_HEAD_DIM}, block {results['settings']['block_size']}": pattern.value,
                   "density": f"{r['density']:.3f}"}
            for key in sparse_others:
                row[f"ours ÷ {OTHERS[key]}"] = _pair(r, _time_ratio, key)
            rows.append(row)
        lines += ["Block-sparse (causal: Flex with a dense causal block mask):", "", markdown_table(rows), ""]
    return lines


def _worst(items: list[tuple[float | None, str]]) -> tuple[float | None, str, int]:
    """(largest value, its label, number of missing values) over (value, label) items."""
    present = [(v, label) for v, label in items if v is not None and not math.isnan(v)]
    missing = len(items) - len(present)
    if not present:
        return None, "", missing
    value, label = max(present, key=lambda item: item[0])
    return value, label, missing


def _target_row(name: str, criterion: str, items, limit: float, not_compared: int = 0, absent: str = "") -> dict:
    """One target: MET when every item (ratio, label) is at most `limit` and none is missing.

    Items whose yardstick did not run (a library missing, a compile failure) are left out and
    counted in `not_compared`; with no item left the target is NOT MEASURED.
    """
    extra = (f"; {not_compared} not compared (the other implementation did not run, or its result was WRONG)"
             if not_compared else "")
    if not items:
        return {"target": name, "criterion": criterion, "measured": (absent or "not in this run") + extra,
                "status": "NOT MEASURED"}
    worst, label, missing = _worst(items)
    if worst is None:
        measured = f"no valid measurement: {missing} failed, wrong or missing" + extra
        return {"target": name, "criterion": criterion, "measured": measured, "status": "NOT MET"}
    passed = worst <= limit and not missing
    measured = f"worst {worst:.2f}x ({label}) over {len(items) - missing} measurements"
    if missing:
        measured += f"; {missing} failed, wrong or missing"
    return {"target": name, "criterion": criterion, "measured": measured + extra,
            "status": "MET" if passed else "NOT MET"}


def _comparisons(results: dict, which: Callable[[dict], str | None]) -> tuple[list, int]:
    """(ratio, label) items of ours ÷ the implementation `which(record)` names (None: not in this
    target), and how many were left out because that implementation has no trusted time."""
    items, not_compared = [], 0
    for r in results["cases"]:
        key = which(r)
        if key is None:
            continue
        for d in ("fwd", "bwd"):
            label = f"{r['pattern']} D={r['head_dim']} L={_length_label(r['seq_len'])} {d} vs {OTHERS[key]}"
            other = _trusted_time(r, key, d)
            ours = _trusted_time(r, "ours", d)
            if other is None and ours is not None:
                not_compared += 1
                continue
            items.append((_ratio(ours, other), label))
    return items, not_compared


def _goal_yardstick(r: dict) -> str | None:
    if r["pattern"] == Pattern.CAUSAL.value:
        return "fa4" if r["head_dim"] == GOAL_HEAD_DIM else None
    return "flex_flash"


def evaluate_targets(results: dict) -> list[dict]:
    """Floor, Goal, Moonshot and memory. A configuration that failed, was skipped, or
    whose check flagged ours WRONG counts as missing, and a target with anything missing is NOT MET."""
    absent = absent_columns(results)
    floor, floor_nc = _comparisons(results, lambda r: "flex")
    goal, goal_nc = _comparisons(results, _goal_yardstick)
    absent_goal = "; ".join(f"{name} absent: {why}" for name, why in absent.items() if name in ("FA4", "Flex FLASH"))
    memory = results["memory"]
    ours_mib = (memory.get("ours") or {}).get("peak_mib")
    fa2_mib = (memory.get("fa2") or {}).get("peak_mib")
    mem_label = (
        f"ours {_fmt(ours_mib, 4)} MiB vs FA2 {_fmt(fa2_mib, 4)} MiB, causal, B={memory['batch']} "
        f"H={memory['heads']} L={_length_label(memory['seq_len'])} D={memory['head_dim']}"
    )
    run_errors = [f"{name}: {(memory.get(name) or {}).get('error')}" for name in ("ours", "fa2")
                  if (memory.get(name) or {}).get("error")]
    memory_items = [] if memory.get("error") else [(_ratio(ours_mib, fa2_mib), mem_label + "".join(
        f" ({e})" for e in run_errors))]
    return [
        _target_row("floor", "every pattern: ours ≤ Flex (Triton backend), fwd and bwd, every L and D", floor, 1.0,
                    floor_nc, absent.get("Flex", "")),
        _target_row("goal", f"causal D={GOAL_HEAD_DIM}: ours ≤ {GOAL_RATIO}× FA4; block-sparse: ours ≤ "
                    f"{GOAL_RATIO}× Flex FLASH", goal, GOAL_RATIO, goal_nc, absent_goal),
        _target_row("moonshot", "the goal's comparisons at ≤ 1.0×", goal, 1.0, goal_nc, absent_goal),
        _target_row("memory", f"peak fwd+bwd memory at L={_length_label(memory['seq_len'])}: ours ≤ 2× SDPA flash",
                    memory_items, 2.0, 0, memory.get("error") or ""),
    ]


# --------------------------------------------------------------------------------- outputs
_COLORS = {Pattern.CAUSAL: "C0", Pattern.SLIDING_WINDOW: "C2", Pattern.BIGBIRD: "C3", Pattern.CUSTOM: "C4"}
_STYLES = {"flex": "-o", "flex_flash": "--s", "fa4": ":^", "fa2": "-.v"}


def plot_ratios(results: dict, path: Path) -> Path:
    """ours ÷ other time ratios vs L: one panel per head dim and direction, a line per pattern and other."""
    cases = [r for r in results["cases"] if not r.get("skipped")]
    head_dims = sorted({r["head_dim"] for r in results["cases"]}) or [0]
    columns = present_columns(results)
    fig = Figure(figsize=(11, 3.6 * len(head_dims) + 0.8))
    FigureCanvasAgg(fig)
    for row, head_dim in enumerate(head_dims):
        for col, direction in enumerate(("fwd", "bwd")):
            ax = fig.add_subplot(len(head_dims), 2, 2 * row + col + 1)
            for pattern in Pattern:
                mine = sorted(
                    (r for r in cases if r["head_dim"] == head_dim and r["pattern"] == pattern.value),
                    key=lambda r: r["seq_len"],
                )
                for key in columns:
                    points = [(r["seq_len"], _time_ratio(r, key, direction)) for r in mine]
                    points = [(x, y) for x, y in points if y is not None and y > 0]
                    if points:
                        ax.plot(
                            [x for x, _ in points],
                            [y for _, y in points],
                            _STYLES[key],
                            color=_COLORS[pattern],
                            label=f"{pattern.value}: ours÷{OTHERS[key]}",
                        )
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.minorticks_off()
            lengths = sorted({r["seq_len"] for r in results["cases"]})
            if lengths:
                ax.set_xticks(lengths, [_length_label(x) for x in lengths])
            ax.set_xlabel("sequence length L")
            ax.set_ylabel("time ratio (< 1: ours faster)")
            ax.set_title(f"D={head_dim}, {'forward' if direction == 'fwd' else 'backward'}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    env = results["environment"]
    fig.suptitle(
        f"Attention time ratios on {env['device']} (torch {env['torch']}, triton {env['triton']})", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=90)
    return path


def render_markdown(results: dict, figure_link: str | None) -> str:
    settings = results["settings"]
    matmul = results["matmul"]
    on_cuda = results["environment"]["device_type"] == "cuda"
    ceiling = (
        f"{_fmt(matmul['tflops'])} TFLOP/s"
        if matmul.get("tflops") is not None
        else f"not measured ({matmul.get('error')})"
    )
    timer = "medians of `triton.testing.do_bench`" if on_cuda else "medians of a perf_counter loop (CPU)"
    rounds = settings.get("rounds", 1)
    if rounds > 1:
        timer += f", then the median over {rounds} rounds in which every implementation ran in turn"
        if settings.get("rounds_rotate"):
            timer += " (each round starting one implementation later)"
    if not on_cuda:
        flex = "uncompiled `flex_attention`, forward only (CPU)"
    elif settings.get("flex_static"):
        flex = "`torch.compile(flex_attention, dynamic=False)` (compiled for each shape)"
    else:
        flex = ("`torch.compile(flex_attention)` (automatic dynamic shapes: the second length of each process "
                "ran Flex kernels compiled for a symbolic length, slower than static ones)")
    if settings.get("flex_flash_layout_mask"):
        flash_mask = "on a BlockMask whose mask_mod states the layout (the FLASH backend ignores the block lists of a trivial mask_mod)"
    else:
        flash_mask = ("on the Triton backend's BlockMask, whose trivial mask_mod made the FLASH backend ignore the block "
                      "lists of the bidirectional patterns (those rows are to be re-measured)")
    absent = absent_columns(results)
    lines = [
        "## Attention kernels",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        f"{settings['dtype']}, B·L = {settings['tokens']} tokens (B = 1 beyond), H·D = {settings['width']}, "
        f"block size {settings['block_size']}; ours = `{settings['ours']}`. Cells are forward / backward. "
        f"Times are {timer} in ms; the backward is timed alone, replayed on a stored forward graph "
        "(`out.backward(dout, retain_graph=True)`). FA2 is torch SDPA restricted to the flash backend, FA4 "
        "flash-attn-4's `flash_attn.cute.flash_attn_func`; both on dense causal only (our window is "
        f"block-granular, flash-attn's `window_size` token-granular). Flex is {flex} with a BlockMask built "
        "from the same BlockLayout (on a GPU its mask_mod, called on the causal diagonal blocks only, is plain "
        f"`kv <= q`), Flex FLASH the same call with `kernel_options={{\"BACKEND\": \"FLASH\"}}` {flash_mask}. "
        f"Patterns: causal; sliding_window ±{settings['window']} tokens, bidirectional; bigbird (window "
        f"{settings['bigbird_window']}, {settings['bigbird_global_blocks']} global, "
        f"{settings['bigbird_random_blocks']} random blocks); custom (causal window {settings['custom_window']} "
        f"| every {settings['custom_stride']}th key block). TFLOP/s count 4·B·H·pairs·D (forward) and 2.5× that "
        "(backward) over the allowed pairs; density = allowed pairs / (H·L²). The check is "
        "max|ours − ref| / max|ref| within a row (one query's output, one token's gradient), worst "
        "row of the output / of dq, dk, dv (see benchmarks/attention.py), WRONG above "
        f"{CHECK_TOLERANCE['fwd']:g} / {CHECK_TOLERANCE['bwd']:g}; every other implementation is checked the "
        f"same way and a WRONG one is named in the notes. Matmul ceiling ({settings['dtype']} "
        f"{matmul['n']}³ torch.matmul): **{ceiling}**. Wall time of the run: {_fmt(results.get('wall_s'))} s."
        + clock_summary(results),
        "",
    ]
    if absent:
        lines += ["Columns absent from this run: " + "; ".join(f"{k} ({v})" for k, v in absent.items()) + ".", ""]
    lines += [float64_check_text(results), ""]
    lines += issue_tables(results)
    lines += [
        markdown_table(results_rows(results)),
        "",
        "### Targets",
        "",
        markdown_table(evaluate_targets(results)),
    ]
    if figure_link:
        lines += ["", f"![attention time ratios: ours ÷ the other implementations vs L]({figure_link})"]
    return "\n".join(lines)


def summary_text(results: dict) -> str:
    """A compact plain table for the end of the log."""
    keep = ("D", "L", "pattern", "ours ms")
    rows = [
        {k: v for k, v in r.items() if k in keep or k.startswith("ours÷") or k.startswith("check")}
        for r in results_rows(results)
    ]
    columns = present_columns(results)
    errors = [
        f"  {r['D']} {r['L']} {r['pattern']}: {r['notes'][:160]}" for r in results_rows(results) if r["notes"]
    ]
    memory = results["memory"]
    mem = {name: _fmt((memory.get(name) or {}).get("peak_mib"), 4) for name in ("ours", "fa2")}
    absent = absent_columns(results)
    parts = [
        markdown_table(rows),
        "",
        markdown_table([{k: v for k, v in t.items() if k != "criterion"} for t in evaluate_targets(results)]),
        "",
        f"matmul ceiling {_fmt(results['matmul']['tflops'])} TFLOP/s; peak memory MiB ours {mem['ours']} "
        f"FA2 {mem['fa2']}; columns: ours, {', '.join(OTHERS[k] for k in columns) or 'no other'}"
        + (f"; absent: {', '.join(absent)}" if absent else "")
        + f"; wall {_fmt(results.get('wall_s'))} s",
    ]
    if errors:
        parts += ["errors (all in the JSON and attention_errors.log):"] + errors[:12]
    return "\n".join(parts)


def _progress_line(record: dict) -> str:
    case = f"D={record['head_dim']} L={_length_label(record['seq_len'])} {record['pattern']}"
    if record.get("skipped"):
        return f"{case}: skipped ({record['skipped']})"
    keys = ["ours", *(key for key in OTHERS if record.get(key) is not None)]
    parts = [f"{OTHERS.get(key, 'ours')} {_pair(record, _time, key)}" for key in keys]
    text = f"{case} ms fwd/bwd: " + ", ".join(parts) + f"; check {_check_text(record.get('check'))}"
    notes = _notes(record, list(OTHERS))
    return text + (f"; {notes}" if notes else "")


def _write_json(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    partial_path = out / "attention.json.tmp"
    partial_path.write_text(json.dumps(results, indent=1))
    partial_path.replace(out / "attention.json")


def write_outputs(results: dict, out: Path | None, markdown: Path | None) -> None:
    figure = None
    if out is not None:
        _write_json(results, out)
        if results.get("tracebacks"):
            (out / "attention_errors.log").write_text("\n".join(results["tracebacks"]))
        figure = plot_ratios(results, out / "attention.png")
    if markdown is not None:
        link = None if figure is None else Path(os.path.relpath(figure.resolve(), markdown.resolve().parent)).as_posix()
        replace_markdown_section(markdown, SECTION, render_markdown(results, link))
    if out is not None:
        link = None if figure is None else figure.name
        (out / "attention.md").write_text(render_markdown(results, link) + "\n")


# ------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attention",
        description="Time our Triton attention kernels against FlashAttention-2 (SDPA flash), flash-attn-4 and "
        "compiled FlexAttention (Triton and FLASH backends) on the same block masks; write JSON, a plot and "
        "BENCHMARKS.md.",
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="device to measure (default cuda)")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny shapes (L=256, D 16..64) for a CPU smoke run of the harness"
    )
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument("--quick", action="store_true", help="a first check: L = 16k only")
    lengths.add_argument(
        "--lengths", type=int, nargs="+", help="sequence lengths, run in this order (default 16384 65536 32768 8192)"
    )
    parser.add_argument("--head-dims", type=int, nargs="+", help="head dims (default 64 128; H = 2048 / D)")
    parser.add_argument(
        "--patterns",
        type=Pattern,
        nargs="+",
        default=list(Pattern),
        metavar="PATTERN",
        help=f"patterns to run, of {', '.join(p.value for p in Pattern)} (default all)",
    )
    parser.add_argument(
        "--ours",
        default="triton",
        choices=("triton", "gluon", "torch"),
        help="what 'ours' is: the Triton kernels (default), the Hopper path (attention(backend='gluon'): the Gluon "
             "forward, the Triton backward; sm_90 only), or attention(backend='torch') where Triton cannot run",
    )
    parser.add_argument(
        "--out", type=Path, help="write attention.json, attention.png, attention.md (and attention_errors.log) here"
    )
    parser.add_argument(
        "--markdown", type=Path, help="rewrite the 'attention' section of this file (e.g. BENCHMARKS.md)"
    )
    parser.add_argument(
        "--render-from",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="measure nothing: re-render --out / --markdown from an earlier attention.json; from several, "
        "merged in order (a later run's measured cases replace an earlier run's, same D, L and pattern)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="skip (and record) the configurations left after this many seconds; keep it below the GPU call's "
        "timeout with a minute to spare (default 330)",
    )
    parser.add_argument("--warmup-ms", type=float, help="do_bench warm-up in ms (default 10; 2 with --tiny)")
    parser.add_argument("--rep-ms", type=float, help="do_bench measuring time in ms (default 40; 10 with --tiny)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--no-float64-check", dest="float64_check", action="store_false",
        help="skip the check of ours, Flex and Flex FLASH against float64 at a small shape before the sweep "
        "(it compiles Flex once more per pattern and head dim)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every implementation of a case this many times, in turns (ours, the others; then the others "
        "from the second, ours last; ...), and keep each one's median: a slow spell of a shared machine then "
        "moves one round, not one column (the 64k custom forward measured 1.19x and 1.02x Flex in two runs of "
        "the same code)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.warmup_ms is None:
        args.warmup_ms = 2.0 if args.tiny else 10.0
    if args.rep_ms is None:
        args.rep_ms = 10.0 if args.tiny else 40.0
    return args


def sweep_from_args(args: argparse.Namespace) -> Sweep:
    sweep = TINY if args.tiny else FULL
    if args.quick:
        sweep = dataclasses.replace(sweep, lengths=(16384,))
    if args.lengths:
        sweep = dataclasses.replace(sweep, lengths=tuple(args.lengths))
    if args.head_dims:
        sweep = dataclasses.replace(sweep, head_dims=tuple(args.head_dims))
    return sweep


def merge_results(runs: list[dict]) -> dict:
    """One results dict from runs of the same sweep, in order: a later run's measured cases replace
    an earlier run's (same head dim, length and pattern), skipped ones never replace measured ones.
    The float64 checks merge the same way (a later run's replaces an earlier one's of the same head
    dim and pattern). Environment, matmul ceiling and memory come from the last run; the command
    lists every run's command with its date, and `merged_from` keeps them."""
    if len(runs) == 1:
        return runs[0]
    merged = {**runs[-1], "cases": [], "tracebacks": []}
    by_case: dict[tuple, dict] = {}
    checks: dict[tuple, dict] = {}
    for run in runs:
        for record in run["cases"]:
            key = (record["head_dim"], record["seq_len"], record["pattern"])
            if key not in by_case or not record.get("skipped"):
                by_case[key] = record
        for check in run.get("float64_check") or ():
            checks[(check["head_dim"], check["pattern"])] = check
        merged["tracebacks"] += run.get("tracebacks", [])
    merged["cases"] = list(by_case.values())
    if checks:
        merged["float64_check"] = list(checks.values())
    merged["merged_from"] = [{"command": r["command"], "date_utc": r["environment"]["date_utc"]} for r in runs]
    merged["command"] = "; then ".join(f"{r['command']} ({r['environment']['date_utc']})" for r in runs)
    merged["wall_s"] = sum(r.get("wall_s") or 0.0 for r in runs)
    return merged


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.render_from is not None:
        results = merge_results([json.loads(path.read_text()) for path in args.render_from])
    else:
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("no CUDA device here: run the CPU smoke version with --device cpu --tiny --ours torch")
        results = run(args, sweep_from_args(args))
    print(summary_text(results), flush=True)
    write_outputs(results, args.out, args.markdown)
    return results


if __name__ == "__main__":
    main()
