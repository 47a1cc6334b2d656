"""Helpers shared by the benchmark scripts: where a number was measured, and BENCHMARKS.md upkeep.

Every benchmark script writes its own section of BENCHMARKS.md between two markers,

    <!-- NAME:start -->
    ...generated text...
    <!-- NAME:end -->

so that re-running one script rewrites only its own section and leaves the rest of the file
(hand-written prose, other scripts' sections) untouched. Each section opens with the header
from `environment_markdown`: the device, the library versions, the date and the exact command.

Run the scripts from the repository root as modules (`python -m benchmarks.attention ...`), so
that `benchmarks.common` imports without any path set-up.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
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
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = [
    "ClockSampler",
    "command_line",
    "last_logged_step",
    "describe_environment",
    "environment_markdown",
    "markdown_table",
    "replace_markdown_section",
]


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
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Benchmarks\n\n{body}\n")
        return path

    content = path.read_text()
    n_start, n_end = content.count(start), content.count(end)
    if n_start == 0 and n_end == 0:
        path.write_text(content.rstrip("\n") + ("\n\n" if content.strip() else "") + body + "\n")
        return path
    if n_start != 1 or n_end != 1:
        raise ValueError(
            f"{path} has {n_start} '{start}' and {n_end} '{end}' markers; expected exactly one of "
            "each: delete the extra or orphaned marker lines by hand, then run again."
        )
    i, j = content.index(start), content.index(end)
    if j < i:
        raise ValueError(f"{path}: '{end}' comes before '{start}'; swap or delete them by hand.")
    path.write_text(content[:i] + body + content[j + len(end) :])
    return path


def format_number(value: float | None, digits: int = 3) -> str:
    """A table cell: "—" for a missing value, "NaN", else `digits` significant digits."""
    if value is None:
        return "—"
    if value != value:
        return "NaN"
    return f"{value:.{digits}g}"


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


def write_atomically(path: Path, text: str) -> None:
    """Write text to path through a temporary file beside it, so that a reader never sees half."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def last_logged_step(metrics_csv: Path) -> int:
    """The last optimizer step in a run's metrics.csv (CSVLogger), 0 when nothing was logged."""
    import csv

    if not metrics_csv.is_file():
        return 0
    with open(metrics_csv) as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle) if row.get("step")]
    return max(steps) if steps else 0


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
