"""CPU smoke run of benchmarks/kernel_variants.py under Triton's interpreter.

Every candidate the smoke run forces (the interpreter configuration, its conditional-rescale
forward and its heads-outer backward) must run and agree with the default candidate, and the
sparse-overhead diagnostic must run; the JSON, the Markdown and the closing table are checked.
The GPU-only parts (the sm_90 table with its TMA variants, do_bench, the profiler breakdown
against Flex) run on the GPU box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_times_and_checks_every_candidate(tmp_path):
    pytest.importorskip("triton", reason="triton is not installed: pip install triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "benchmarks.kernel_variants", "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "kernel_variants.json").read_text())
    assert [(c["case"], c["causal"]) for c in results["cases"]] == [("causal", True), ("sliding_window ±32", False)]
    for case in results["cases"]:
        for direction in ("fwd", "bwd"):
            entries = case[direction]
            assert len(entries) == (3 if direction == "bwd" else 2), entries  # the backward also tries dv_late
            assert any("+rescale_tau=8" in e["config"] or "+heads_outer" in e["config"] for e in entries)
            assert direction == "fwd" or any("+dv_late" in e["config"] for e in entries)
            for entry in entries:
                assert entry["error"] is None and entry["ms"] > 0, entry
                assert entry["err"] <= 3e-2, entry  # the variant computes what the default computes
    overhead = results["sparse_overhead"]
    assert all(overhead[k] > 0 for k in ("dense_fwd_ms", "sparse_fwd_ms", "dense_bwd_ms", "sparse_bwd_ms"))
    markdown = (tmp_path / "kernel_variants.md").read_text()
    assert markdown.startswith("## Kernel variants") and "**best**" in markdown and "Sparse-path overhead" in markdown
    assert "| case | pass | config |" in proc.stdout and "sparse-path overhead" in proc.stdout


def test_without_the_interpreter_the_smoke_run_says_how(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "benchmarks.kernel_variants", "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "TRITON_INTERPRET=1 python -m benchmarks.kernel_variants --smoke" in proc.stderr


@pytest.mark.slow
def test_only_and_extra_candidates(tmp_path):
    """--only keeps the named case, --seq-len sets its length; --extra adds plain candidates of that
    head dim beside the table's."""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "benchmarks.kernel_variants", "--smoke", "--out", str(tmp_path),
               "--only", "causal-32", "--seq-len", "48",
               "--extra", "fwd:32:16,16,4,1", "bwd:32:16,16,4,1,16,16,4,1", "fwd:64:16,16,4,1"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (case,) = json.loads((tmp_path / "kernel_variants.json").read_text())["cases"]
    assert case["case"] == "causal" and case["seq_len"] == 48
    assert [e["config"] for e in case["fwd"]][-1] == "(16, 16, 4, 1)" and len(case["fwd"]) == 3
    assert [e["config"] for e in case["bwd"]][-1] == "(16, 16, 4, 1, 16, 16, 4, 1)" and len(case["bwd"]) == 4
    for entry in case["fwd"] + case["bwd"]:
        assert entry["error"] is None and entry["err"] <= 3e-2, entry


def test_bad_only_or_extra_says_what_is_expected(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    base = [sys.executable, "-m", "benchmarks.kernel_variants", "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(base + ["--extra", "fwd:64:128,64"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "fwd:D:block_m,block_n,warps,stages" in proc.stderr
    proc = subprocess.run(base + ["--only", "nope-64"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "causal-32" in proc.stderr
