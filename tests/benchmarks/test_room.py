"""The size of the benchmarks room and its shared harness's share, and one GPU driver per area.

Definitions (the figures the room's targets, at most 7,000 lines and a harness of at least 25%, are
read in): the room is every tracked `benchmarks/*.py` and `benchmarks/*.sh`, counted as `wc -l`
counts (newlines; result files, docs and tests not counted):

    git ls-files 'benchmarks/*.py' 'benchmarks/*.sh' | xargs wc -l

The shared harness is what every script or driver stands on: `benchmarks/common.py` (command line,
timing, rounds, environment, result files, tables, verdicts), `benchmarks/report.py` (BENCHMARKS.md)
and `benchmarks/gpu_setup.sh` (the setup and step helpers every GPU driver sources); its share is
its lines over the room's. CEILING and FLOOR hold the room near its present size and share: lower
CEILING (raise FLOOR) as it shrinks, toward the targets.

Every measurement a GPU needs is a step of its area's driver: run without a step, a driver prints
its usage and exits 2, and every `bash benchmarks/gpu_AREA.sh STEP` that the docs, configs, scripts
and tests name is a step its usage lists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ("benchmarks/common.py", "benchmarks/report.py", "benchmarks/gpu_setup.sh")
CEILING = 13_100
FLOOR = 0.11
DRIVERS = {"gpu_setup.sh", "gpu_kernels.sh", "gpu_genome.sh", "gpu_timeseries.sh", "gpu_training.sh"}


def room_lines() -> dict[str, int]:
    """Lines of each tracked benchmarks/*.py and *.sh, as `wc -l` counts them."""
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/*.py", "benchmarks/*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {name: (ROOT / name).read_text().count("\n") for name in listed if (ROOT / name).is_file()}


def test_room_size_and_harness_share():
    lines = room_lines()
    total = sum(lines.values())
    share = sum(lines[name] for name in HARNESS) / total
    print(f"benchmarks/: {total:,} lines in {len(lines)} files, harness {share:.1%}")
    assert total <= CEILING, f"benchmarks/ has {total:,} lines (at most {CEILING:,}): fold new code into the harness"
    assert share >= FLOOR, f"the harness is {share:.1%} of benchmarks/ (at least {FLOOR:.0%})"


def test_one_gpu_driver_per_area():
    drivers = {Path(name).name for name in room_lines() if name.endswith(".sh")}
    assert drivers == DRIVERS, f"GPU drivers {sorted(drivers)}: a new measurement is a step of its area's driver"


def driver_steps(driver: str) -> set[str]:
    """The steps a driver's usage line names (run without one, it prints the line and exits 2)."""
    run = subprocess.run(["bash", f"benchmarks/{driver}"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stdout.startswith(f"usage: bash benchmarks/{driver} "), run.stdout + run.stderr
    return {alternative.split()[0] for alternative in run.stdout.split(".sh ", 1)[1].split("|")}


@pytest.fixture(scope="module")
def named_steps() -> dict[str, set[str]]:
    """Driver -> the steps `bash benchmarks/gpu_AREA.sh STEP` names in the docs, configs, scripts and tests
    (the dated rounds of docs/design/benchmark_history.md ran drivers since folded into these)."""
    listed = subprocess.run(
        ["git", "ls-files", "*.md", "*.yaml", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    named: dict[str, set[str]] = {}
    for name in listed:
        if name != "docs/design/benchmark_history.md" and (ROOT / name).is_file():
            for driver, step in re.findall(
                r"bash benchmarks/(gpu_[a-z_]+\.sh)(?: ([a-z][a-z0-9_]*))?", (ROOT / name).read_text()
            ):
                named.setdefault(driver, set()).update({step} - {""})
    return named


@pytest.mark.parametrize("driver", sorted(DRIVERS - {"gpu_setup.sh"}))
def test_the_steps_the_docs_name_are_the_drivers(driver, named_steps):
    unknown = named_steps.get(driver, set()) - driver_steps(driver)
    assert not unknown, f"{sorted(unknown)} named as steps of benchmarks/{driver}, which has no such step"


def test_no_doc_names_a_driver_that_is_gone(named_steps):
    assert set(named_steps) <= DRIVERS, f"{sorted(set(named_steps) - DRIVERS)} named but not in benchmarks/"
