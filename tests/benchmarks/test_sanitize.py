"""The compute-sanitizer harness: its cases pass the float64 check under the Triton interpreter,
and it reads sanitizer reports right (the sanitizer itself runs on the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sanitize import CASES, parse_report

REPO_ROOT = Path(__file__).resolve().parents[2]

MEMCHECK_CLEAN = """========= COMPUTE-SANITIZER
case causal_odd_length: ok
========= ERROR SUMMARY: 0 errors
"""
MEMCHECK_ERRORS = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at attn_fwd_kernel+0x1c30
=========     by thread (0,0,0) in block (3,0,0)
========= ERROR SUMMARY: 3 errors
"""
RACECHECK = "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n"


def test_reports_are_read():
    assert parse_report(MEMCHECK_CLEAN, "memcheck")["errors"] == 0
    bad = parse_report(MEMCHECK_ERRORS, "memcheck")
    assert bad["errors"] == 3 and bad["kernels"] == ["attn_fwd_kernel"]
    race = parse_report(RACECHECK, "racecheck")
    assert race["errors"] == 1 and race["warnings"] == 1
    assert parse_report("killed before the summary", "memcheck")["errors"] is None  # never read as clean


@pytest.mark.slow
def test_smoke_run_checks_every_case_against_float64(tmp_path):
    result = subprocess.run([sys.executable, "-m", "benchmarks.sanitize", "--smoke", "--out", str(tmp_path)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tool,) = summary["tools"]
    assert [c["case"] for c in tool["cases"]] == [c.name for c in CASES]
    assert all(c["ok"] and c["finite"] for c in tool["cases"])
    assert "| tool | launch configs | errors |" in result.stdout
    assert (tmp_path / "summary.md").read_text().startswith("## compute-sanitizer")
