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
    proc = subprocess.run(base + ["--breakdown", "nope-128"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "--breakdown: no case" in proc.stderr and "custom-128" in proc.stderr


def test_no_candidates_skips_the_table(tmp_path):
    """--no-candidates leaves the profiles alone (on the CPU: nothing timed, an empty table)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "benchmarks.kernel_variants", "--smoke", "--out", str(tmp_path), "--no-candidates"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "kernel_variants.json").read_text())
    assert results["cases"] == [] and "sparse_overhead" not in results


def test_backward_profiles_render_beside_flex():
    """Each profiled case renders as ours' and Flex's kernels with the call's time; an older JSON
    stored one profile as a dict, and it still renders."""
    from benchmarks.kernel_variants import breakdown_lines

    profile = {"case": "custom", "head_dim": 128, "seq_len": 16384,
               "ours": {"bwd_dkdv_kernel": 0.62, "bwd_dq_kernel": 0.4}, "ours_call_ms": 1.27,
               "flex": {"triton_tem_fused_flex_attention_backward_1": 1.01}, "flex_call_ms": 1.23,
               "ours_configs": ["(64, 128, 8, 3, 128, 64, 8, 3) +heads_outer"]}
    lines = breakdown_lines({"backward_breakdown": [profile, {**profile, "seq_len": 32768}]})
    text = "\n".join(lines)
    assert text.count("Backward kernels, custom D=128") == 2 and "L=16k" in text and "L=32k" in text
    assert "- ours (the call: 1.27 ms): `bwd_dkdv_kernel` 0.62, `bwd_dq_kernel` 0.4" in text
    assert "- flex (the call: 1.23 ms)" in text and "+heads_outer" in text
    legacy = {k: v for k, v in profile.items() if not k.endswith("call_ms") and k != "ours_configs"}
    old = "\n".join(breakdown_lines({"backward_breakdown": legacy}))
    assert "- ours: `bwd_dkdv_kernel` 0.62" in old and "not recorded" in old
