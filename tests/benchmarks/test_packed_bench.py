"""CPU smoke test of benchmarks/packed.py (a packed row against one long sequence and a loop).

The script runs end to end at tiny shapes with the Triton kernels under the interpreter, as the
lead would start it on a CPU; its targets are then checked on made-up timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REPO))
        import benchmarks.packed as packed

        yield packed


@pytest.mark.slow
def test_smoke_run_writes_results(tmp_path, bench):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nKept.\n")
    command = [sys.executable, "-m", "benchmarks.packed", "--device", "cpu", "--smoke", "--out", str(tmp_path),
               "--markdown", str(markdown)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "packed.json").read_text())
    record = results["record"]
    assert sum(record["documents"]) == bench.SMOKE.row_len and len(record["documents"]) > 2
    assert record["check"]["ok"] is True, record["check"]
    for way in ("packed", "unpacked", "alone"):
        assert record["times"][way]["fwd_ms"] > 0 and record["times"][way]["step_ms"] > 0, way
    assert record["step_flops"]["packed"] < record["step_flops"]["unpacked"]
    assert (tmp_path / "packed.md").read_text().startswith("## Packed variable-length sequences")
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| information: packed tokens/s")  # the table comes last
    section = markdown.read_text()
    assert "Kept." in section and "<!-- packed:start -->\n## Packed variable-length sequences" in section


def test_document_lengths_fill_the_row_within_the_range(bench):
    lengths = bench.document_lengths(bench.FULL, seed=0)
    assert sum(lengths) == bench.FULL.row_len
    assert all(bench.FULL.min_doc <= n <= bench.FULL.max_doc for n in lengths[:-1]) and 1 <= lengths[-1]
    assert lengths == bench.document_lengths(bench.FULL, seed=0) != bench.document_lengths(bench.FULL, seed=1)


def test_targets_met_not_met_and_wrong_results(bench):
    def results(packed_ms, ok=True):
        times = {"packed": {"fwd_ms": 1.0, "step_ms": packed_ms}, "unpacked": {"fwd_ms": 9.0, "step_ms": 30.0},
                 "alone": {"fwd_ms": 2.0, "step_ms": 6.0}}
        return {"record": {"times": times, "step_flops": {"packed": 1e12, "unpacked": 8e12, "alone": 1e12},
                           "check": {"ok": ok, "fwd_rel_err": 0.01, "bwd_rel_err": 0.02}}}

    status = [t["status"] for t in bench.targets(results(5.0))]
    assert status == ["MET", "MET", "NOT MET", ""]  # 6x the tokens/s; FLOPs per ms 2e11 vs 2.67e11: 0.75x
    assert [t["status"] for t in bench.targets(results(4.0))][2] == "MET"  # FLOPs per ms 2.5e11 vs 2.67e11: 0.94x
    assert [t["status"] for t in bench.targets(results(40.0))][0] == "NOT MET"  # 0.75x the tokens/s
    assert [t["status"] for t in bench.targets(results(1.0, ok=False))] == ["NOT MET"] * 3 + [""]
