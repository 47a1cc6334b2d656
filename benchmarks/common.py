"""The small harness every benchmark script stands on: where a number was measured, how it is
timed, and where it is written.

- **Where**: `describe_environment` (device, versions, date) and `command_line` (the command to
  type again) go into every result file; `environment_markdown` turns them into the line each
  BENCHMARKS.md section starts with. `ClockSampler` records the GPU's SM clock beside timings.
- **How**: `time_calls` times a callable after a warm-up (CUDA events on a GPU, the wall clock
  elsewhere) and `median` summarises it; `interleaved_rounds` runs several measurements in turn,
  round after round, so that ratios come from the same load on a shared machine; `TrainStep` is
  one optimizer step under autocast; `kept_weights`, `logged_messages` and `compile_counts` are
  what the training benchmarks check around their steps. The kernel scripts time with Triton's
  do_bench instead, set up by `add_kernel_timing_arguments` and `kernel_timing`.
- **Where to**: `publish` writes a script's NAME.json and NAME.md through the package's atomic
  writer (`genoformer.data.storage.write_text`; `write_json_file` and `write_atomically` for
  single files) and its section of BENCHMARKS.md, between two markers,

    <!-- NAME:start -->
    ...generated text...
    <!-- NAME:end -->

  so that re-running one script rewrites only its own section and leaves the rest of the file
  (hand-written prose, other scripts' sections) untouched.

Run the scripts from the repository root as modules (`python -m benchmarks.data ...`), so that
`benchmarks.common` imports without any path set-up.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import importlib.metadata
import importlib.util
import json
import logging
import math
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from genoformer.data.storage import write_text

__all__ = [
    "ClockSampler",
    "TrainStep",
    "add_kernel_timing_arguments",
    "command_line",
    "compile_counts",
    "describe_environment",
    "environment_markdown",
    "format_number",
    "interleaved_rounds",
    "kept_weights",
    "kernel_timing",
    "last_logged_step",
    "logged_messages",
    "markdown_table",
    "median",
    "publish",
    "replace_markdown_section",
    "reset_compile_counts",
    "synchronize",
    "time_calls",
    "write_atomically",
    "write_json_file",
]


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
    """Where and when a benchmark runs, as a flat dict of strings (JSON- and table-friendly).

    Args:
        device: the device the benchmark measures; None means CUDA when available, else CPU.

    Returns keys: device (GPU name or CPU model), device_type, cuda (CUDA runtime of the torch
    build, or "none"), gpu_count, cpu, torch, triton, python, platform, date_utc (ISO 8601).
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
        gpu_count = str(torch.cuda.device_count())
    else:
        device_name = cpu
        gpu_count = str(torch.cuda.device_count()) if torch.cuda.is_available() else "0"
    return {
        "device": device_name,
        "device_type": device.type,
        "cuda": torch.version.cuda or "none",
        "gpu_count": gpu_count,
        "cpu": cpu,
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


def environment_markdown(env: dict[str, str], command: str) -> str:
    """The header line every BENCHMARKS.md section starts with: device, versions, date, command."""
    cuda = f", CUDA {env['cuda']}" if env.get("device_type") == "cuda" else ""
    return (
        f"Measured on **{env['device']}**{cuda}, {env['date_utc']}; torch {env['torch']}, "
        f"triton {env['triton']}, Python {env['python']}.\n\n"
        f"Command (from the repository root): `{command}`"
    )


# -------------------------------------------------------------------------------- result files
def _cell(value: object) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else f"{value:.4g}" if isinstance(value, float) else str(value)
    # A pipe would end the cell and a newline the row; HTML line breaks keep both readable.
    return text.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def markdown_table(
    rows: Sequence[dict[str, object]],
    columns: Sequence[str] | None = None,
    align: dict[str, str] | None = None,
) -> str:
    """A GitHub markdown table of `rows` (one dict per row).

    Args:
        rows: the rows; a missing key or None gives an empty cell; floats print with 4
            significant digits (format them yourself for another precision).
        columns: header and order of the columns; default: every key, in order of first appearance.
        align: column -> "left", "right" or "center" (default left).

    Returns the table without a trailing newline ("" for no rows and no columns).
    """
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    if not columns:
        return ""
    markers = {"left": "---", "right": "---:", "center": ":---:"}
    align = align or {}
    for column, how in align.items():
        if how not in markers:
            raise ValueError(f"align[{column!r}] must be one of {sorted(markers)}, got {how!r}.")
    lines = [
        "| " + " | ".join(_cell(c) for c in columns) + " |",
        "| " + " | ".join(markers[align.get(c, "left")] for c in columns) + " |",
    ]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _markers(name: str) -> tuple[str, str]:
    if not name or any(ch.isspace() for ch in name) or "--" in name or ">" in name:
        raise ValueError(
            f"section name must be a non-empty word without spaces, '--' or '>', got {name!r}; "
            "use e.g. 'attention' or 'data-loading'."
        )
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_markdown_section(path: str | Path, name: str, text: str) -> Path:
    """Put `text` between the `<!-- name:start -->` and `<!-- name:end -->` markers of `path`.

    Creates the file (with a "# Benchmarks" title) when it is missing and appends the section
    when the file has no markers for `name`; otherwise only the text between the markers
    changes. Raises ValueError when the markers are unbalanced or out of order, naming the
    lines to fix. Returns the path.
    """
    path = Path(path)
    start, end = _markers(name)
    body = f"{start}\n{text.strip()}\n{end}"
    if not path.exists():
        return write_text(path, f"# Benchmarks\n\n{body}\n", overwrite=False)

    content = path.read_text()
    n_start, n_end = content.count(start), content.count(end)
    if n_start == 0 and n_end == 0:
        return write_text(path, content.rstrip("\n") + ("\n\n" if content.strip() else "") + body + "\n", overwrite=True)
    if n_start != 1 or n_end != 1:
        raise ValueError(
            f"{path} has {n_start} '{start}' and {n_end} '{end}' markers; expected exactly one of "
            "each: delete the extra or orphaned marker lines by hand, then run again."
        )
    i, j = content.index(start), content.index(end)
    if j < i:
        raise ValueError(f"{path}: '{end}' comes before '{start}'; swap or delete them by hand.")
    return write_text(path, content[:i] + body + content[j + len(end) :], overwrite=True)


def format_number(value: float | None, digits: int = 3) -> str:
    """A table cell: "—" for a missing value, "NaN", else `digits` significant digits."""
    if value is None:
        return "—"
    if value != value:
        return "NaN"
    return f"{value:.{digits}g}"


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader never sees half of it (replacing what is there):
    `genoformer.data.storage.write_text` with overwrite."""
    write_text(Path(path), text, overwrite=True)


def write_json_file(path: Path, payload: object) -> Path:
    """`payload` as indented JSON at `path`, written atomically (replacing what is there)."""
    return write_text(Path(path), json.dumps(payload, indent=1) + "\n", overwrite=True)


def publish(out: Path, name: str, summary: dict, text: str, markdown: Path | None = None,
            section: str | None = None) -> None:
    """The end of every benchmark run: OUT/NAME.json (the summary, from which the text can be
    rendered again) and OUT/NAME.md (the text), the `section` of the `markdown` file (e.g.
    BENCHMARKS.md) when both are given, and the text printed last."""
    out = Path(out)
    write_json_file(out / f"{name}.json", summary)
    write_atomically(out / f"{name}.md", text.rstrip("\n") + "\n")
    if markdown is not None:
        replace_markdown_section(markdown, section or name, text)
    print(text)


def last_logged_step(metrics_csv: Path) -> int:
    """The last optimizer step in a run's metrics.csv (CSVLogger), 0 when nothing was logged."""
    if not metrics_csv.is_file():
        return 0
    with open(metrics_csv) as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row.get("step")]
    return max(steps) if steps else 0


# -------------------------------------------------------------------------------------- timing
def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def interleaved_rounds(measures: Mapping[str, Callable[[], float | Mapping[str, float]]], rounds: int,
                       best: Callable[[float, float], float] = max) -> dict[str, float]:
    """Run every measurement once per round, in turn, for `rounds` rounds, and keep each value's
    best (`max` for rates, `min` for times). On a shared machine the load moves between minutes;
    interleaving gives every measurement the same share of it, so that their ratios hold. A
    measurement returns one value (kept under its name) or several named ones."""
    kept: dict[str, float] = {}
    for _ in range(rounds):
        for name, measure in measures.items():
            values = measure()
            for key, value in (values.items() if isinstance(values, Mapping) else [(name, values)]):
                kept[key] = best(kept[key], value) if key in kept else value
    return kept


def add_kernel_timing_arguments(parser: argparse.ArgumentParser, rep_ms: float) -> None:
    """--device, --warmup-ms and --rep-ms of the scripts that time our Triton kernels (on a CPU
    only under Triton's interpreter, with --smoke)."""
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="device to measure (default cuda)")
    parser.add_argument("--warmup-ms", type=float, help="do_bench warm-up in ms (default 25; 0 with --smoke)")
    parser.add_argument("--rep-ms", type=float, help=f"do_bench measuring time in ms (default {rep_ms:g}; 1 with --smoke)")


def kernel_timing(args: argparse.Namespace, rep_ms: float, smoke_command: str) -> torch.device:
    """Fill in the timing defaults of `add_kernel_timing_arguments` and return the device; exit
    with the smoke command when the kernels cannot run on the device asked for."""
    if args.warmup_ms is None:
        args.warmup_ms = 0.0 if args.smoke else 25.0
    if args.rep_ms is None:
        args.rep_ms = 1.0 if args.smoke else rep_ms
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"no CUDA device here: run the CPU smoke version: {smoke_command}")
    from genoformer.kernels.triton_flash import INTERPRETED

    if device.type == "cpu" and not INTERPRETED:
        sys.exit(f"the Triton kernels run on a CPU only under the interpreter: {smoke_command}")
    return device


# ------------------------------------------------------------------------------ training steps
class TrainStep:
    """One optimizer step: zero the gradients, the loss under autocast (none for float32),
    backward, the optimizer's step; `step()` returns the detached loss."""

    def __init__(self, loss_fn: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer,
                 device: torch.device, dtype: torch.dtype) -> None:
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
                [executable, f"--id=GPU-{uuid.group(0)}", f"--query-gpu={self.QUERY}",
                 "--format=csv,noheader,nounits", f"--loop-ms={period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        return {"sm_mhz": mean(clocks), "sm_mhz_min": min(clocks) if clocks else None,
                "power_w": mean([s[2] for s in inside]), "temp_c": max(temps) if temps else None,
                "samples": len(inside)}

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
