"""How `benchmarks/train.py` measures beyond the shared timing of `benchmarks.common`: the
matmul ceiling, the profiler's per-part breakdown, and step time inside `Trainer.fit`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import lightning as L
import torch

from benchmarks.common import median, synchronize, time_calls


# --------------------------------------------------------------------------------- ceiling
def matmul_ceiling_tflops(device: torch.device, size: int = 8192, repeats: int = 20) -> float:
    """bf16 (CPU: fp32) size^3 torch.matmul rate in TFLOP/s: what the device reaches on a GEMM."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = time_calls(lambda: a @ b, device, warmup=3, calls=repeats)
    return 2 * size**3 / (median(times) / 1e3) / 1e12


# ----------------------------------------------------------------------- profile breakdown

PARTS = (
    "attention", "matmuls", "norms, RoPE, SwiGLU, other elementwise", "loss", "optimizer", "data (host to device)",
    "other",
)

# Kernel names (GPU) or operator names (CPU) -> part; first match wins, checked in order.
_KERNEL_RULES = (
    ("attention", ("attn_fwd_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel", "bwd_preprocess_kernel", "flash",
                   "fmha", "flex_attention", "triton_tem_fused_flex", "scaled_dot_product", "_efficient_attention")),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("loss", ("nll_loss", "log_softmax", "cross_entropy", "softmax_backward")),
    ("matmuls", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "sm80_", "aten::mm", "aten::addmm",
                 "aten::bmm", "aten::matmul", "aten::linear", "mm_", "splitk")),
    ("data (host to device)", ("memcpy htod", "memcpy h2d", "aten::_to_copy_h2d")),
    ("norms, RoPE, SwiGLU, other elementwise", ("rms", "norm", "elementwise", "vectorized", "triton_poi", "triton_red",
                                       "triton_per", "reduce", "silu", "mul", "add", "cat", "copy", "fill",
                                       "embedding", "index", "where", "sum", "aten::")),
)
_PARENT_RULES = (
    ("optimizer", ("optimizer.step", "adamw", "zero_grad")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "nllloss", "logsoftmax")),
    ("attention", ("genoformer::triton_flash", "flex_attention", "scaled_dot_product")),
)


def classify(kernel: str, parents: Iterable[str] = ()) -> str:
    """The part of the step a kernel (or CPU operator) belongs to: its launching operators decide
    where they are telling (optimizer step, loss, attention op), else its own name."""
    chain = " | ".join(parents).lower()
    for part, needles in _PARENT_RULES:
        if any(needle in chain for needle in needles):
            return part
    name = kernel.lower()
    for part, needles in _KERNEL_RULES:
        if any(needle in name for needle in needles):
            return part
    return "other"


def profile_breakdown(step: Callable[[], object], device: torch.device, steps: int = 3) -> dict:
    """Per-part device time of `steps` profiled steps (after one unprofiled), in ms per step.

    On a GPU every CUDA kernel is attributed through `classify` (its name and the operators
    that launched it); on a CPU every operator's self time. Returns {"parts": {part: ms},
    "total_ms": busy time per step, "wall_ms": profiled wall time per step, "top_kernels":
    [(name, part, ms), ...] (the 25 largest)}.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    found: list[tuple[str, str, float]] = []  # (kernel or operator, part, ms)
    events = prof.events()
    for event in events:
        if device.type == "cuda":
            parents = None
            for kernel in getattr(event, "kernels", []):
                parents = _parents(event) if parents is None else parents
                found.append((kernel.name, classify(kernel.name, parents), kernel.duration / 1e3))
        elif event.device_type == DeviceType.CPU:
            found.append((event.name, classify(event.name, _parents(event)), event.self_cpu_time_total / 1e3))
    if device.type == "cuda" and not found:  # kernels not linked to operators: by name alone
        found = [(e.name, classify(e.name), e.device_time_total / 1e3) for e in events if e.device_type == DeviceType.CUDA]
    parts: dict[str, float] = defaultdict(float)
    kernels: dict[tuple[str, str], float] = defaultdict(float)
    for name, part, ms in found:
        parts[part] += ms / steps
        kernels[(name, part)] += ms / steps
    per_step = {part: parts.get(part, 0.0) for part in PARTS}
    top = sorted(kernels.items(), key=lambda item: -item[1])[:25]
    return {
        "parts": per_step,
        "total_ms": sum(per_step.values()),
        "wall_ms": wall_ms,
        "top_kernels": [(name[:120], part, ms) for (name, part), ms in top],
    }


def _parents(event) -> list[str]:
    names = [event.name]
    parent = event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


# ------------------------------------------------------------------------ inside Trainer.fit


class StepTimer(L.Callback):
    """Wall time of the training steps after `warmup`, measured in `Trainer.fit` (one device
    synchronisation at each end, none in between)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start: float | None = None
        self.end: float | None = None
        self.timed_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            synchronize(pl_module.device)
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.start is not None:
            self.timed_steps += 1
            if trainer.global_step >= trainer.max_steps:
                synchronize(pl_module.device)
                self.end = time.perf_counter()

    @property
    def step_ms(self) -> float:
        if self.start is None or self.end is None or not self.timed_steps:
            raise RuntimeError("StepTimer saw no timed steps: max_steps must exceed the warm-up steps.")
        return (self.end - self.start) / self.timed_steps * 1e3
