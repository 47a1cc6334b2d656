"""The harness every benchmark script stands on: the command line, timing, rounds, where a number
was measured, result files, tables and target verdicts. A script holds only what it measures.

How to write a benchmark (`benchmarks/NAME.py`, run as `python -m benchmarks.NAME`)::

    \"\"\"One line on what it measures (the --help text), then the method.\"\"\"
    from benchmarks.common import Benchmark, Summary, Timer, at_least, table

    def arguments(parser):                      # its own options (optional)
        parser.add_argument("--length", type=int, default=16384)

    def measure(args) -> dict:                  # the numbers, as JSON; args.smoke: tiny, on a CPU, seconds
        timer = Timer(device, warmup_ms=25, rep_ms=100)
        return {"ours_ms": timer(lambda: ours(x)), "baseline_ms": timer(lambda: theirs(x))}

    def summarize(data: dict) -> Summary:        # tables and target verdicts from the numbers alone
        speedup = data["baseline_ms"] / data["ours_ms"]
        return Summary(tables=[table([{"ours ms": data["ours_ms"], "baseline ms": data["baseline_ms"]}])],
                       targets=[at_least("ours at least 1.2x the baseline", speedup, 1.2, unit="x")])

    BENCHMARK = Benchmark("name", "Title of its BENCHMARKS.md section", __doc__, measure, summarize,
                          baseline="what the same run measured to compare with", arguments=arguments)
    if __name__ == "__main__":
        BENCHMARK.main()

`Benchmark.main` gives every script the same options: `--out DIR` (the result goes to DIR/NAME.json,
written atomically; default runs/benchmarks), `--smoke` (tiny sizes on a CPU: what the tests run),
`--name` (save under another name, e.g. a run on another GPU) and `--from RESULT.json...`
(measure nothing: summarize the data of earlier result files again, several joined by the
script's `merge` under the benchmark's name). The result file holds the environment (device,
versions, date), the command line, the same-run baseline, the summary (tables, targets, notes) and
the raw data, and its text is printed. `python -m benchmarks.report` builds BENCHMARKS.md from
benchmarks/results/*.json: to publish a run, copy its NAME.json there and run the report (never
edit BENCHMARKS.md).

The pieces, for use inside `measure` and `summarize`:
- timing: `Timer` (do_bench medians on a GPU, a perf_counter loop on a CPU), `time_calls` (each
  call's ms after a warm-up), `free_memory` (garbage, CUDA's cache and peak, before a case),
  `median`, `interleaved_rounds` (measurements in turn, each one's best), `rotating_rounds` (each
  round starts one measurement later; every round kept),
  `Budget` (stop starting new cases when a GPU call's time runs out), `Attempts` (a failure is
  recorded with its traceback and the run goes on), `ClockSampler` (the GPU's SM clock beside
  the timings), `describe_environment` and `command_line`;
- attention-like callables f(q, k, v): `random_qkv`, `outputs` (out and grads), `compare` (worst
  row errors against a reference, within CHECK_TOLERANCE), `fwd_bwd_ms` (forward and backward-alone
  medians), `Impl`, `fa2` / `fa4` (the FlashAttention yardsticks), `median_of_rounds`,
  `tuner_choices` (the launch configurations our Triton tuner picked); the cases they run on:
  `Sweep` (`FULL`, `TINY`), `Pattern`, `Case`, `build_cases`, `length_label`, `allowed_pairs`
  (the exact pairs a layout allows), `flex_block_mask` and `static_flex` (FlexAttention on the
  same layouts);
- training: `TrainStep` (one optimizer step under autocast), `kept_weights`, `logged_messages`,
  `reset_compile_counts` / `compile_counts`, `last_logged_step`, `profile_breakdown` (device time
  per part of a step: attention, matmuls, ...), `RepeatedBatch`;
- statistics: `block_bootstrap` (a confidence interval of a mean difference over blocks);
- parts: `join` (the data of runs measured in parts, as one: a script's `merge`);
- commands: `argv` (a command line written as typed, its values filled in whole), `run_logged`
  (a child process whose output goes to a log, its tail in the error), `pack_parts` (a folder in
  parts the GPU tool can bring back);
- results: `table`, `at_most` / `at_least` / `verdict` (MET, NOT MET, NOT MEASURED), `fmt`,
  `ratio`, `markdown_table`, `render`, `write_result` / `read_result`, `write_json_file`.

Run the scripts from the repository root as modules, so that `benchmarks.common` imports
without any path set-up. Nothing in genoformer/, kernels/ or data/ imports benchmarks/.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import enum
import gc
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from genoformer.data.storage import write_text
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import row_error
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

__all__ = [
    "Attempts",
    "Benchmark",
    "Budget",
    "CHECK_TOLERANCE",
    "Case",
    "ClockSampler",
    "FULL",
    "Impl",
    "PARTS",
    "Pattern",
    "RepeatedBatch",
    "Summary",
    "Sweep",
    "TINY",
    "Timer",
    "TrainStep",
    "allowed_pairs",
    "argv",
    "at_least",
    "at_most",
    "block_bootstrap",
    "build_cases",
    "classify",
    "command_line",
    "compare",
    "compile_counts",
    "describe_environment",
    "error_text",
    "fa2",
    "fa4",
    "flex_block_mask",
    "fmt",
    "free_memory",
    "fwd_bwd_ms",
    "interleaved_rounds",
    "join",
    "kept_weights",
    "last_logged_step",
    "length_label",
    "logged_messages",
    "markdown_table",
    "median",
    "median_of_rounds",
    "outputs",
    "pack_parts",
    "profile_breakdown",
    "random_qkv",
    "ratio",
    "read_result",
    "render",
    "reset_compile_counts",
    "rotating_rounds",
    "run_logged",
    "static_flex",
    "synchronize",
    "table",
    "time_calls",
    "tuner_choices",
    "verdict",
    "write_json_file",
    "write_result",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
"""The committed result files BENCHMARKS.md is generated from."""


# --------------------------------------------------------------------------------------- where
def _cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _package_version(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return "not installed"
    return importlib.metadata.version(name)


def describe_environment(device: torch.device | str | None = None) -> dict[str, str]:
    """Where and when a benchmark runs, as a flat dict of strings.

    Args:
        device: the device the benchmark measures; None means CUDA when available, else CPU.

    Returns keys: device (GPU name or CPU model), device_type, cuda (CUDA runtime of the torch
    build, or "none"), gpu_count, cpu, torch, triton, python, platform, date_utc.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    cpu = _cpu_model()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        device_name = f"{name} (sm_{major}{minor}, {memory_gib:.0f} GiB)"
    else:
        device_name = cpu
    return {
        "device": device_name,
        "device_type": device.type,
        "cuda": torch.version.cuda or "none",
        "gpu_count": str(torch.cuda.device_count()) if torch.cuda.is_available() else "0",
        "cpu": cpu,
        "cpu_cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that started this process, as a user would type it again.

    `python -m package.module args` when run as a module, else `python path args` with the path
    relative to the working directory when it lies below it. argv defaults to sys.argv.
    """
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        program = ["python", "-m", spec.name.removesuffix(".__main__")]
    else:
        script = Path(argv[0]) if argv else Path("<unknown>")
        if script.is_absolute() and script.is_relative_to(Path.cwd()):
            script = script.relative_to(Path.cwd())
        program = ["python", script.as_posix()]
    return shlex.join(program + argv[1:])


# -------------------------------------------------------------------------------------- timing
def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device | str | None = None) -> None:
    """Collect garbage and, on CUDA, empty the allocator's cache and reset its peak statistics
    (before a case, so that one case's memory is not another's)."""
    gc.collect()
    if torch.cuda.is_available() and torch.device(device or "cuda").type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, calls: int) -> list[float]:
    """Milliseconds of each of `calls` calls of `fn` after `warmup` untimed ones: CUDA events
    around each call on a GPU, the wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(calls):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return times


def median(values: Sequence[float]) -> float:
    """The middle value (the upper one of the two for an even count): always a measured time."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class Timer:
    """Median ms of a call: `triton.testing.do_bench` on a GPU (warm-up, L2 flushed between
    calls), a perf_counter loop of about `rep_ms` on a CPU (a smoke run's numbers)."""

    def __init__(self, device: torch.device | str, warmup_ms: float, rep_ms: float) -> None:
        self.device, self.warmup_ms, self.rep_ms = torch.device(device), warmup_ms, rep_ms

    def __call__(self, fn: Callable[[], object], grad_to_none: Sequence[torch.Tensor] | None = None) -> float:
        if self.device.type == "cuda":
            import triton.testing

            return float(
                triton.testing.do_bench(
                    fn, warmup=self.warmup_ms, rep=self.rep_ms, grad_to_none=grad_to_none, return_mode="median"
                )
            )

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


def interleaved_rounds(
    measures: Mapping[str, Callable[[], float | Mapping[str, float]]],
    rounds: int,
    best: Callable[[float, float], float] = max,
) -> dict[str, float]:
    """Run every measurement once per round, in turn, for `rounds` rounds, and keep each value's
    best (`max` for rates, `min` for times). On a shared machine the load moves between minutes;
    interleaving gives every measurement the same share of it, so that their ratios hold. A
    measurement returns one value (kept under its name) or several named ones."""
    kept: dict[str, float] = {}
    for _ in range(rounds):
        for name, measure in measures.items():
            values = measure()
            for key, value in values.items() if isinstance(values, Mapping) else [(name, values)]:
                kept[key] = best(kept[key], value) if key in kept else value
    return kept


def rotating_rounds(measures: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list]:
    """Every measurement once per round, each round starting one measurement later (so that no
    measurement always follows the same one), for `rounds` rounds: name -> its results in
    round order. Take the median of them for a time that one slow spell of the machine moves
    in one round only."""
    names = list(measures)
    kept: dict[str, list] = {name: [] for name in names}
    for turn in range(rounds):
        start = turn % len(names) if names else 0
        for name in names[start:] + names[:start]:
            kept[name].append(measures[name]())
    return kept


class Budget:
    """The seconds a run may take: `spent` turns true once they are, so that a GPU call stops
    starting new cases and records the rest as skipped instead of losing everything to a
    timeout."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def spent(self) -> bool:
        return self.elapsed > self.seconds

    def skipped(self) -> str:
        """Why a case did not run (its table cell says it)."""
        return f"skipped: the time budget of {self.seconds:g} s was spent"


def error_text(exc: BaseException, limit: int = 300) -> str:
    """One line for a failure: the exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:limit]


class Attempts:
    """Runs steps that may fail without stopping the run: `attempt` returns (value, None) or
    (None, a one-line error) and keeps the traceback in `tracebacks` (saved with the data)."""

    def __init__(self) -> None:
        self.tracebacks: list[str] = []

    def attempt(self, what: str, fn: Callable[[], object]) -> tuple[object, str | None]:
        try:
            return fn(), None
        except Exception as exc:  # recorded in the results; the run goes on
            self.tracebacks.append(f"== {what}\n{traceback.format_exc()}")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return None, error_text(exc)


# ---------------------------------------------------------------------------------- GPU clocks
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class ClockSampler:
    """The SM clock, power draw and temperature of one GPU while a benchmark runs.

    `nvidia-smi -lms PERIOD` prints one line per sample; a reader thread stamps each line with
    time.monotonic() as it arrives, so that `window(start, end)` can summarise the samples taken
    during one timing. The clocks explain timings that move between rounds: a kernel timed right
    after a power-hungry one can run at a lower clock. Without a GPU or without nvidia-smi,
    `reason` says why nothing is sampled and every window is None.
    """

    QUERY = "clocks.sm,power.draw,temperature.gpu"

    def __init__(self, device: torch.device, period_ms: int = 50, command: str = "nvidia-smi") -> None:
        self.period_ms = period_ms
        self.samples: list[tuple[float, float, float, float]] = []  # (monotonic s, MHz, W, degrees C)
        self.reason: str | None = None
        self._proc: subprocess.Popen | None = None
        executable = shutil.which(command)
        if device.type != "cuda":
            self.reason = "not a CUDA run"
        elif executable is None:
            self.reason = f"{command} is not on PATH"
        else:
            # by UUID: CUDA_VISIBLE_DEVICES renumbers torch's devices, not nvidia-smi's
            uuid = _UUID.search(str(torch.cuda.get_device_properties(device).uuid))
            if uuid is None:
                self.reason = f"no UUID for {device} in its device properties"
                return
            self._proc = subprocess.Popen(
                [
                    executable,
                    f"--id=GPU-{uuid.group(0)}",
                    f"--query-gpu={self.QUERY}",
                    "--format=csv,noheader,nounits",
                    f"--loop-ms={period_ms}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 3:
                continue
            values = [float(f) if f.replace(".", "", 1).isdigit() else math.nan for f in fields]  # "[N/A]": NaN
            self.samples.append((time.monotonic(), *values))

    def window(self, start: float, end: float) -> dict | None:
        """Mean SM clock (MHz), its minimum, mean power (W) and top temperature (C) of the samples
        taken between two time.monotonic() readings; None when none was."""
        inside = [s for s in list(self.samples) if start <= s[0] <= end]
        if not inside:
            return None

        def mean(values: list[float]) -> float | None:
            present = [v for v in values if not math.isnan(v)]
            return statistics.fmean(present) if present else None

        clocks = [s[1] for s in inside if not math.isnan(s[1])]
        temps = [s[3] for s in inside if not math.isnan(s[3])]
        return {
            "sm_mhz": mean(clocks),
            "sm_mhz_min": min(clocks) if clocks else None,
            "power_w": mean([s[2] for s in inside]),
            "temp_c": max(temps) if temps else None,
            "samples": len(inside),
        }

    def close(self) -> dict:
        """Stop sampling; what the results record about it (period, sample count, or why none)."""
        if self._proc is not None:
            self._proc.terminate()
            _, errors = self._proc.communicate(timeout=10)
            self._reader.join(timeout=10)
            if not self.samples and self.reason is None:
                self.reason = f"nvidia-smi printed no sample: {errors.strip()[:200]}"
            self._proc = None
        return {"period_ms": self.period_ms, "samples": len(self.samples), "reason": self.reason}


# ------------------------------------------------------------------------------ training steps
class TrainStep:
    """One optimizer step: zero the gradients, the loss under autocast (none for float32),
    backward, the optimizer's step; `step()` returns the detached loss."""

    def __init__(
        self,
        loss_fn: Callable[[], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.loss_fn, self.optimizer, self.device, self.dtype = loss_fn, optimizer, device, dtype

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            loss = self.loss_fn()
        loss.backward()
        self.optimizer.step()
        return loss.detach()


@contextlib.contextmanager
def kept_weights(module: torch.nn.Module) -> Iterator[None]:
    """Put the module's parameters back as they were when the block ends, so that the next
    measurement starts from the same weights."""
    initial = {name: p.detach().clone() for name, p in module.named_parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(initial[name])


@contextlib.contextmanager
def logged_messages(logger: str = "genoformer.kernels", level: int = logging.INFO) -> Iterator[list[str]]:
    """The messages `logger` emits inside the block (e.g. which attention backend `auto` chose)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    target, handler = logging.getLogger(logger), Collect()
    old_level = target.level
    target.addHandler(handler)
    target.setLevel(level)
    try:
        yield messages
    finally:
        target.removeHandler(handler)
        target.setLevel(old_level)


def reset_compile_counts() -> None:
    """Zero torch.compile's counters before a compiled measurement."""
    from torch._dynamo.utils import counters

    counters.clear()


def compile_counts() -> dict[str, int]:
    """What torch.compile counted since `reset_compile_counts`: graph breaks (0 is what a
    compiled model wants) and distinct graphs."""
    from torch._dynamo.utils import counters

    return {"graph_breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"].get("unique_graphs", 0)}


def last_logged_step(metrics_csv: Path) -> int:
    """The last optimizer step in a run's metrics.csv (CSVLogger), 0 when nothing was logged."""
    if not metrics_csv.is_file():
        return 0
    with open(metrics_csv) as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row.get("step")]
    return max(steps) if steps else 0


# ------------------------------------------------------------------- attention-like callables
CHECK_TOLERANCE = {"fwd": 3e-2, "bwd": 6e-2}
"""Largest row error before a result is WRONG: a few bf16 ulps of the row's largest entry (two
correct bf16 kernels differ by about 8e-3 and 1e-2; a skipped block changes rows by 0.1 and more)."""


@dataclasses.dataclass
class Impl:
    """A callable (q, k, v) -> out on (B, H, L, D) tensors, or why there is none."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None
    error: str | None = None
    backward_error: str | None = None  # set when it runs forward only on this device


def fa2(causal: bool) -> Impl:
    """SDPA restricted to the flash backend: FlashAttention-2, dense."""

    def run(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Impl(run)


def fa4(module, causal: bool = True) -> Impl:
    """flash-attn-4's `flash_attn.cute.flash_attn_func`, dense, on (B, L, H, D) views."""

    def run(q, k, v):
        out = module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)  # (out, lse) in 4.0 betas

    return Impl(run)


@contextlib.contextmanager
def tuner_choices(triton_flash) -> Iterator[list[tuple[str, object]]]:
    """The launch configurations the Triton launchers' tuner (`triton_flash.choose_config`) returns
    while the block runs, as ("fwd" or "bwd", configuration), cached choices included."""
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


def random_qkv(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, seed: int):
    """q, k, v (leaves that require grad) and dout, standard normal, of one shape."""
    generator = torch.Generator(device).manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def outputs(fn: Callable, q, k, v, dout, backward: bool = True) -> tuple[torch.Tensor, tuple | None]:
    """out and (dq, dk, dv) of one forward + backward (None without the backward)."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    if not backward:
        return out.detach(), None
    out.backward(dout)
    grads = (q.grad, k.grad, v.grad)
    for t in (q, k, v):
        t.grad = None
    return out.detach(), grads


def compare(got: tuple, expected: tuple) -> dict:
    """Worst row errors of (out, grads) against the expected ones, and whether both are within
    CHECK_TOLERANCE (NaN never is)."""
    errors = {"fwd_rel_err": row_error(got[0], expected[0]), "bwd_rel_err": None}
    if got[1] is not None and expected[1] is not None:
        errors["bwd_rel_err"] = max(row_error(a, b) for a, b in zip(got[1], expected[1], strict=True))
    errors["ok"] = all(
        errors[f"{d}_rel_err"] <= CHECK_TOLERANCE[d] for d in ("fwd", "bwd") if errors[f"{d}_rel_err"] is not None
    )
    return errors


def fwd_bwd_ms(timer: Timer, fn: Callable, q, k, v, dout) -> dict[str, float]:
    """Forward and backward-alone medians in ms (the backward replayed on one stored graph)."""
    fwd = timer(lambda: fn(q, k, v))
    out = fn(q, k, v)
    bwd = timer(lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v])
    for t in (q, k, v):
        t.grad = None
    return {"fwd_ms": fwd, "bwd_ms": bwd}


def median_of_rounds(results: list[dict]) -> dict:
    """One implementation's {"fwd_ms", "bwd_ms", "error", ...} from several rounds: the median time
    of each direction over the rounds that measured it, the first error, every round kept."""
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


PARTS = (
    "attention",
    "matmuls",
    "norms, RoPE, SwiGLU, other elementwise",
    "loss",
    "optimizer",
    "data (host to device)",
    "other",
)
_KERNEL_RULES = (  # kernel (GPU) or operator (CPU) names -> part; first match wins
    (
        "attention",
        (
            "attn_fwd_kernel",
            "bwd_dkdv_kernel",
            "bwd_dq_kernel",
            "bwd_preprocess_kernel",
            "flash",
            "fmha",
            "flex_attention",
            "triton_tem_fused_flex",
            "scaled_dot_product",
            "_efficient_attention",
        ),
    ),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("loss", ("nll_loss", "log_softmax", "cross_entropy", "softmax_backward")),
    (
        "matmuls",
        (
            "gemm",
            "nvjet",
            "cutlass",
            "xmma",
            "cublas",
            "sm90_",
            "sm80_",
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::matmul",
            "aten::linear",
            "mm_",
            "splitk",
        ),
    ),
    ("data (host to device)", ("memcpy htod", "memcpy h2d", "aten::_to_copy_h2d")),
    (
        "norms, RoPE, SwiGLU, other elementwise",
        (
            "rms",
            "norm",
            "elementwise",
            "vectorized",
            "triton_poi",
            "triton_red",
            "triton_per",
            "reduce",
            "silu",
            "mul",
            "add",
            "cat",
            "copy",
            "fill",
            "embedding",
            "index",
            "where",
            "sum",
            "aten::",
        ),
    ),
)
_PARENT_RULES = (
    ("optimizer", ("optimizer.step", "adamw", "zero_grad")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "nllloss", "logsoftmax")),
    ("attention", ("genoformer::triton_flash", "flex_attention", "scaled_dot_product")),
)


def classify(kernel: str, parents: list[str] = ()) -> str:
    """The part of the step a kernel (or CPU operator) belongs to: its launching operators decide
    where they are telling (optimizer step, loss, attention op), else its own name."""
    chain = " | ".join(parents).lower()
    for part, needles in _PARENT_RULES:
        if any(needle in chain for needle in needles):
            return part
    return next((part for part, needles in _KERNEL_RULES if any(n in kernel.lower() for n in needles)), "other")


def profile_breakdown(step, device: torch.device, steps: int) -> dict:
    """Per-part device time (CPU: operator self time) of `steps` profiled steps, ms per step, and
    the 25 largest kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    synchronize(device)
    with profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    ) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps

    def parents(event) -> list[str]:
        names, parent = [event.name], event.cpu_parent
        while parent is not None:
            names, parent = names + [parent.name], parent.cpu_parent
        return names

    found = []  # (kernel or operator, part, ms)
    for event in prof.events():
        if device.type == "cuda":
            found += [
                (k.name, classify(k.name, parents(event)), k.duration / 1e3) for k in getattr(event, "kernels", [])
            ]
        elif event.device_type == DeviceType.CPU:
            found.append((event.name, classify(event.name, parents(event)), event.self_cpu_time_total / 1e3))
    parts, kernels = defaultdict(float), defaultdict(float)
    for name, part, ms in found:
        parts[part] += ms / steps
        kernels[name[:120], part] += ms / steps
    per_step = {part: parts.get(part, 0.0) for part in PARTS}
    top = sorted(kernels.items(), key=lambda item: -item[1])[:25]
    return {
        "parts": per_step,
        "total_ms": sum(per_step.values()),
        "wall_ms": wall_ms,
        "top_kernels": [(name, part, ms) for (name, part), ms in top],
    }


class RepeatedBatch(torch.utils.data.Dataset):
    """The same (already batched, already on the device) batch, n times."""

    def __init__(self, batch: dict, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        return self.batch


# -------------------------------------------------------- attention cases: shapes and patterns
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
    lengths=(16384, 65536, 32768, 8192),
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
    head_dims=(16, 32),
    tokens=512,
    width=64,
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
        return f"D={self.head_dim} L={length_label(self.seq_len)} {self.pattern.value}"


def build_cases(sweep: Sweep, patterns: list[Pattern]) -> list[Case]:
    for seq_len in sweep.lengths:
        if seq_len % sweep.block_size:
            raise ValueError(f"every length must be a multiple of the block size {sweep.block_size}, got {seq_len}.")
    return [
        Case(d, sweep.heads(d), sweep.batch(L), L, p) for L in sweep.lengths for d in sweep.head_dims for p in patterns
    ]


def length_label(seq_len: int) -> str:
    return f"{seq_len // 1024}k" if seq_len % 1024 == 0 else str(seq_len)


def allowed_pairs(layout: BlockLayout | None, causal: bool, seq_len: int, heads: int) -> int:
    """Exact number of allowed (query, key) pairs summed over heads (one batch element); a causal
    diagonal block of s tokens allows s (s + 1) / 2, and the last block may be partial."""
    if layout is None:
        return (seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len) * heads
    bs, Mb = layout.block_size, layout.num_q_blocks
    sizes_M = torch.full((Mb,), bs, dtype=torch.int64)
    sizes_M[-1] = seq_len - (Mb - 1) * bs
    pairs_MN = sizes_M[:, None] * sizes_M[None, :]
    if causal:
        block_M = torch.arange(Mb)
        pairs_MN = torch.where(block_M[None, :] < block_M[:, None], pairs_MN, 0) + torch.diag(
            sizes_M * (sizes_M + 1) // 2
        )
    per_layout_head_H = (layout.mask.to(torch.int64) * pairs_MN).sum((1, 2))
    return int(per_layout_head_H.sum()) * (heads // layout.num_heads)


# ---------------------------------------------------- FlexAttention masks of the same layouts
def _kv_block_lists(mask_HMN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts (1, H, Mb) and indices (1, H, Mb, Nb) int32 of the True blocks, ascending first."""
    counts_HM = mask_HMN.sum(-1, dtype=torch.int32)
    # A stable sort of "not allowed" lists the allowed key blocks first, in ascending order.
    indices_HMN = torch.argsort((~mask_HMN).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts_HM.unsqueeze(0), indices_HMN.unsqueeze(0)


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def flex_block_mask(
    layout: BlockLayout, causal: bool, heads: int, device: torch.device, index_only: bool = False
) -> BlockMask:
    """The FlexAttention BlockMask of `layout` (+ causal), from the layout's own block lists.

    Allowed blocks are "full" except, when causal, the diagonal ones ("partial": the mask_mod
    applies layout.mask[h, q // bs, kv // bs] and kv <= q there). The mask_mod states the whole
    rule, since uncompiled Flex (the CPU) reads only the mask_mod and the FLASH backend drops the
    block lists of a trivial one; `index_only` keeps only kv <= q, the same function for compiled
    Flex's Triton backend (never for FLASH). Built from block lists, it never materialises the
    (L, L) mask (4 GiB per head at 64k).
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
        full_HMN, partial_HMN = allowed_HMN, torch.zeros_like(allowed_HMN)
    lookup_HMN = allowed_HMN.expand(heads, -1, -1).contiguous()  # mask_mod sees the real head index

    def layout_mod(b, h, q_idx, kv_idx):
        allowed = lookup_HMN[h, q_idx // bs, kv_idx // bs]
        return allowed & (kv_idx <= q_idx) if causal else allowed

    mask_mod = (_causal_mask_mod if causal else None) if index_only else layout_mod
    return BlockMask.from_kv_blocks(
        *_kv_block_lists(partial_HMN),
        *_kv_block_lists(full_HMN),
        BLOCK_SIZE=bs,
        mask_mod=mask_mod,
        seq_lengths=(layout.q_len, layout.kv_len),
    )


def static_flex() -> Callable:
    """`torch.compile(flex_attention)` compiled for each shape it meets (dynamic=False)."""
    return torch.compile(flex_attention, dynamic=False)


# ---------------------------------------------------------------------- statistics, commands
def block_bootstrap(
    differences_N: np.ndarray, weights_N: np.ndarray, draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of a weighted mean difference over N blocks, the blocks
    resampled with replacement: a 95% interval that keeps the correlation inside each block
    (neighbouring bases, one window's forecasts).

    Args:
        differences_N: per block, the summed difference (e.g. bits of model A minus model B).
        weights_N: per block, what the mean divides by (e.g. bases).
    """
    differences_N, weights_N = np.asarray(differences_N, float), np.asarray(weights_N, float)
    rng = np.random.default_rng(seed)
    picks_RN = rng.integers(0, len(differences_N), size=(draws, len(differences_N)))
    means_R = differences_N[picks_RN].sum(1) / weights_N[picks_RN].sum(1)
    low, high = np.percentile(means_R, [2.5, 97.5])
    return float(differences_N.sum() / weights_N.sum()), float(low), float(high)


def pack_parts(folder: Path, dest: Path, part_bytes: int = 15 << 20) -> None:
    """One tar of `folder` in DEST/NAME.tar.part0, part1, ... of at most `part_bytes` each (the device
    tool brings back files of at most 16 MiB; `cat NAME.tar.part* | tar x` rejoins them); `folder` goes."""
    tar_path = dest / f"{folder.name}.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(folder, arcname=folder.name)
    shutil.rmtree(folder)
    with open(tar_path, "rb") as source:
        index = 0
        while chunk := source.read(part_bytes):
            (dest / f"{folder.name}.tar.part{index}").write_bytes(chunk)
            index += 1
    tar_path.unlink()


def argv(line: str, **values: object) -> list[str]:
    """A command line as its list of arguments: `line` split at spaces, each word `{name}` replaced
    whole by `str(values[name])` (a path with spaces stays one argument), e.g.
    `argv("score --checkpoint {model} --device cpu", model=path)`."""
    return [str(values[word[1:-1]]) if word[:1] + word[-1:] == "{}" else word for word in line.split()]


def run_logged(
    command: Sequence[str], log: Path, *, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Run a child process (e.g. `[sys.executable, "cli.py", "fit", ...]`) from the repository
    root with its output in `log`; raise with the log's tail when it fails or times out."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        try:
            code = subprocess.run(
                list(command),
                stdout=handle,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                timeout=timeout,
                env=None if env is None else dict(env),
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout:g} s"
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").replace("\r", "\n").splitlines()[-15:])
        raise RuntimeError(f"{shlex.join(command)} failed ({code}); the end of {log}:\n{tail}")


def join(runs: Sequence[Mapping]) -> dict:
    """The data of several runs as one, for benchmarks measured in parts (a task, a seed or a
    model per GPU call): mappings merged key by key, recursively; elsewhere a later run's value
    replaces an earlier one's. A script passes it as its `merge`."""
    joined: dict = {}
    for run in runs:
        for key, value in run.items():
            both = isinstance(value, Mapping) and isinstance(joined.get(key), Mapping)
            joined[key] = join([joined[key], value]) if both else value
    return joined


# ---------------------------------------------------------------------- tables and verdicts
def fmt(value: object, digits: int = 3) -> str:
    """A table cell: "" for None, "NaN", integers with thousands separators, other numbers with
    `digits` significant digits (no exponent below a million), strings as they are."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "NaN"
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.{digits}g}"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return f"{value:.{max(digits - 1 - math.floor(math.log10(abs(value))), 0) if value else 0}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is zero."""
    return None if a is None or b is None or b == 0 else a / b


def table(
    rows: Sequence[Mapping[str, object]],
    caption: str = "",
    columns: Sequence[str] | None = None,
    digits: int = 3,
    headline: bool = True,
) -> dict:
    """A table of a summary: rows of cells, numbers shown by `fmt` with `digits` significant
    digits. `headline=False` keeps it out of BENCHMARKS.md (printed and saved with the result)."""
    rows = [dict(row) for row in rows]
    columns = list(columns) if columns is not None else list(dict.fromkeys(k for row in rows for k in row))
    return {"caption": caption, "columns": columns, "rows": rows, "digits": digits, "headline": headline}


MET, NOT_MET, NOT_MEASURED = "MET", "NOT MET", "NOT MEASURED"


def verdict(target: str, measured: str, met: bool | None) -> dict:
    """A target's row: what was asked, what was measured, and MET, NOT MET or (None) NOT MEASURED."""
    return {"target": target, "measured": measured, "status": NOT_MEASURED if met is None else MET if met else NOT_MET}


def _bound(
    target: str, value: float | None, limit: float, met: Callable[[float], bool], unit: str, measured: str | None
) -> dict:
    if value is None or math.isnan(value):
        return verdict(target, measured or "not measured", None)
    return verdict(target, measured or f"{fmt(value)}{unit}", met(value))


def at_most(target: str, value: float | None, limit: float, unit: str = "", measured: str | None = None) -> dict:
    """MET when `value` <= `limit`; `measured` replaces the formatted value in the row."""
    return _bound(target, value, limit, lambda v: v <= limit, unit, measured)


def at_least(target: str, value: float | None, limit: float, unit: str = "", measured: str | None = None) -> dict:
    """MET when `value` >= `limit`; `measured` replaces the formatted value in the row."""
    return _bound(target, value, limit, lambda v: v >= limit, unit, measured)


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """A GitHub markdown table of `rows` (one dict per row; a missing key or None gives an empty
    cell; numbers through `fmt`, right-aligned). Columns default to every key in order."""
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    if not columns:
        return ""

    def cell(value: object) -> str:  # a pipe would end the cell and a newline the row
        return fmt(value, digits).replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")

    numeric = {
        c
        for c in columns
        if rows
        and all(isinstance(r.get(c), (int, float)) for r in rows if r.get(c) is not None)
        and any(r.get(c) is not None for r in rows)
    }
    lines = [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "| " + " | ".join("---:" if c in numeric else "---" for c in columns) + " |",
    ]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


@dataclasses.dataclass
class Summary:
    """What `summarize` makes of a run's data: tables (`table`), target verdicts (`verdict`,
    `at_most`, `at_least`), short notes (facts, one line each), a title when it depends on the
    data, and `failed` when the run found something wrong (the script then exits 1)."""

    tables: list[dict] = dataclasses.field(default_factory=list)
    targets: list[dict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    title: str | None = None
    failed: bool = False


# -------------------------------------------------------------------------------- result files
def write_json_file(path: Path, payload: object) -> Path:
    """`payload` as indented JSON at `path`, written atomically (replacing what is there)."""
    return write_text(Path(path), json.dumps(payload, indent=1) + "\n", overwrite=True)


def write_result(out: Path, result: dict) -> Path:
    """OUT/NAME.json, written atomically (a reader never sees half of it)."""
    return write_json_file(Path(out) / f"{result['name']}.json", result)


def read_result(path: Path) -> dict:
    """A result file, checked to be one (its keys), with a message that says what to pass instead."""
    result = json.loads(Path(path).read_text())
    missing = {"name", "title", "environment", "command", "summary", "data"} - set(result)
    if missing:
        raise ValueError(
            f"{path} is not a benchmark result file (no {', '.join(sorted(missing))}): pass a "
            "NAME.json that a benchmark's --out wrote"
        )
    return result


def _heading(result: dict) -> str:
    env = result["environment"]
    cores = f", {env['cpu_cores']} cores" if env.get("device_type") == "cpu" and env.get("cpu_cores") else ""
    # where the file went, the time budget and the dates of joined runs say nothing about the numbers
    command = re.sub(r" --(out|budget-s) [^\s;]+| \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\)", "", result["command"])
    first, *more = command.split("; then ")
    shown = f"`{first}`" + (f" (+ {len(more)} run{'s' * (len(more) > 1)} joined by --from)" if more else "")
    parts = [shown, env["device"].split(" (")[0] + cores, env["date_utc"]]
    return " · ".join(parts + ([f"same-run baseline: {result['baseline']}"] if result.get("baseline") else []))


def render(result: dict, level: int = 2, headline_only: bool = False, causes: Mapping[str, str] | None = None) -> str:
    """A result as markdown: the title, command, device, date and baseline, its tables, the
    target verdicts and the notes (`headline_only`: the tables meant for BENCHMARKS.md; `causes`:
    target -> why it is missed, a column beside the verdicts)."""
    summary = result["summary"]
    parts = [f"{'#' * level} {result['title']}", _heading(result)]
    for t in summary["tables"]:
        if headline_only and not t.get("headline", True):
            continue
        parts += [t["caption"]] if t.get("caption") else []
        parts.append(markdown_table(t["rows"], t["columns"], t.get("digits", 3)))
    if summary["targets"]:
        targets = [{**t, "gap and cause": (causes or {}).get(t["target"])} for t in summary["targets"]]
        columns = ["target", "measured", "status"] + ["gap and cause"] * bool(causes)
        parts.append(markdown_table(targets, columns))
    if summary["notes"]:
        parts.append("\n".join(f"- {note}" for note in summary["notes"]))
    return "\n\n".join(p for p in parts if p)


# ---------------------------------------------------------------------------- the command line
class Benchmark:
    """One benchmark script: its name (of the result file), the title of its section, its
    docstring (the --help text), `measure(args) -> data`, `summarize(data) -> Summary`, the
    baseline the same run measures, its own options (`arguments(parser)`), for scripts whose
    runs are joined (one length per GPU call) `merge(list of data) -> data`, for scripts with
    several kinds of run `name_of(args)` (the result's name unless --name gives one), and the
    module when it is not benchmarks.NAME."""

    def __init__(
        self,
        name: str,
        title: str,
        doc: str | None,
        measure: Callable[[argparse.Namespace], dict],
        summarize: Callable[[dict], Summary],
        *,
        baseline: str = "",
        arguments: Callable[[argparse.ArgumentParser], None] | None = None,
        merge: Callable[[list[dict]], dict] | None = None,
        name_of: Callable[[argparse.Namespace], str] | None = None,
        module: str | None = None,
    ) -> None:
        self.name, self.title, self.doc, self.baseline = name, title, doc or "", baseline
        self.measure, self.summarize, self.arguments, self.merge = measure, summarize, arguments, merge
        self.name_of = name_of or (lambda args: self.name)
        self.module = module or f"benchmarks.{name}"

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=f"python -m {self.module}", description=self.doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.add_argument(
            "--out",
            type=Path,
            default=REPO_ROOT / "runs" / "benchmarks",
            help=f"folder of the result file, OUT/{self.name}.json (default runs/benchmarks; the committed "
            "results are in benchmarks/results)",
        )
        parser.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU, in seconds (checks the script)")
        parser.add_argument("--name", help=f"name of the result file (default {self.name})")
        parser.add_argument(
            "--from",
            dest="from_results",
            type=Path,
            nargs="+",
            metavar="RESULT.json",
            help="measure nothing: summarize the data of earlier result files again"
            + (" (several are joined, later ones replacing earlier cases)" if self.merge else ""),
        )
        if self.arguments is not None:
            self.arguments(parser)
        return parser

    def result(self, data: dict, name: str, environment: dict, command: str) -> dict:
        summary = self.summarize(data)
        return {
            "name": name,
            "title": summary.title or self.title,
            "command": command,
            "environment": environment,
            "baseline": self.baseline,
            "summary": dataclasses.asdict(summary),
            "data": data,
        }

    def main(self, argv: Sequence[str] | None = None) -> dict:
        """Parse the command line, measure (or read --from), write OUT/NAME.json, print its text.
        Exits with status 1 when the summary says the run failed. A script with a --device option
        measures on the CPU with --smoke; asked for CUDA where there is none, it says so."""
        parser = self.parser()
        args = parser.parse_args(argv)
        if args.from_results and len(args.from_results) > 1 and not args.name:  # a join: the benchmark's name
            args.name = self.name
        args.name = args.name or self.name_of(args)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name):
            parser.error(f"--name must be a file name of letters, digits, '_', '.', '-', got {args.name!r}")
        if args.smoke and hasattr(args, "device"):
            args.device = "cpu"
        if (
            str(getattr(args, "device", "")).startswith("cuda")
            and not torch.cuda.is_available()
            and not args.from_results
        ):
            parser.error("no CUDA device here: run it on a GPU machine, or with --smoke on this CPU")
        if args.from_results:
            if len(args.from_results) > 1 and self.merge is None:
                parser.error(f"--from takes one result file for {self.name} (its runs are not joined)")
            earlier = [read_result(p) for p in args.from_results]
            data = self.merge([r["data"] for r in earlier]) if len(earlier) > 1 else earlier[0]["data"]
            command = "; then ".join(r["command"] for r in earlier)
            result = self.result(data, args.name, earlier[-1]["environment"], command)
        else:
            environment = describe_environment(getattr(args, "device", None))
            command = command_line() if argv is None else shlex.join(["python", "-m", self.module, *argv])
            result = self.result(self.measure(args), args.name, environment, command)
        write_result(args.out, result)
        print(render(result), flush=True)
        if result["summary"]["failed"]:
            sys.exit(1)
        return result
