"""CPU smoke test of benchmarks/head_dims.py (padded head dims: timings against FA2 and the GPU sweep).

The script runs end to end at tiny shapes with the Triton kernels under the interpreter, as the
lead would start it on a CPU; its GPU sweep is then collected and skipped (no CUDA), which still
checks that the pytest selection it runs finds the padded-head-dim tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# tests/kernels/test_triton_attention.py: 8 padded head dims, 80 and 96 in both dtypes -> 10
# (dim, dtype) pairs x 5 kinds, plus the test that `auto` chooses triton for them
PADDED_GPU_TESTS = 10 * 5 + 1


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO))
        import benchmarks.head_dims as head_dims

        yield head_dims


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("head_dims")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    markdown = out / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nKept.\n")
    command = [sys.executable, "-m", "benchmarks.head_dims", "--device", "cpu", "--smoke", "--out", str(out),
               "--markdown", str(markdown)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out


@pytest.mark.slow
def test_smoke_run_writes_results_and_runs_the_sweep(smoke_run):
    proc, out = smoke_run
    results = json.loads((out / "head_dims.json").read_text())
    assert [case["head_dim"] for case in results["cases"]] == [80, 96, 128]
    for case in results["cases"]:
        assert case["check"]["ok"] is True, case["check"]
        for impl in ("ours", "fa2"):
            assert case[impl]["fwd_ms"] > 0 and case[impl]["bwd_ms"] > 0, case
    sweep = results["sweep"]
    assert sweep["returncode"] == 0, sweep
    assert sweep["counts"].get("skipped") == PADDED_GPU_TESTS, sweep["summary"]
    assert "needs a CUDA GPU" in (out / "head_dims_tests.log").read_text()
    markdown = (out / "head_dims.md").read_text()
    assert markdown.startswith("## Padded head dims") and "| D=96 bwd: ours < FA2 at D=96 |" in markdown
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| GPU sweep")  # the table comes last
    section = (out / "BENCHMARKS.md").read_text()
    assert "Kept." in section and "<!-- head_dims:start -->\n## Padded head dims" in section


def _case(head_dim, ours, fa2, ok=True):
    timing = lambda pair: {"fwd_ms": pair[0], "bwd_ms": pair[1]}  # noqa: E731
    return {"head_dim": head_dim, "fwd_flops": 1e12, "ours": timing(ours), "fa2": timing(fa2),
            "check": {"ok": ok, "fwd_rel_err": 0.01, "bwd_rel_err": 0.02}}


def test_targets_met_not_met_and_wrong_results(bench):
    results = {
        "shapes": {"reference_dim": 128},
        "cases": [_case(96, (2.05, 7.5), (2.5, 7.2)), _case(128, (2.0, 7.0), (3.4, 8.9))],
        "sweep": {"returncode": 0, "counts": {"passed": 51}, "summary": "51 passed in 80s"},
    }
    status = {t["target"]: t["status"] for t in bench.targets(results)}
    assert status == {
        "D=96 fwd: ours ≤ 1.05× ours at D=128": "MET",  # 1.025
        "D=96 fwd: ours < FA2 at D=96": "MET",  # 0.82
        "D=96 bwd: ours ≤ 1.05× ours at D=128": "NOT MET",  # 1.07
        "D=96 bwd: ours < FA2 at D=96": "NOT MET",  # 1.04
        "GPU sweep of the padded head dims (float64 reference, 2× rule)": "MET",
    }
    results["cases"][0]["check"]["ok"] = False  # fast but wrong meets nothing
    results["sweep"] = {"returncode": 1, "counts": {"passed": 50, "failed": 1}, "summary": "1 failed, 50 passed"}
    assert {t["status"] for t in bench.targets(results)} == {"NOT MET"}
    assert [row["check vs FA2 (fwd / bwd err)"][:5] for row in bench.rows(results)] == ["WRONG", "ok 0."]
