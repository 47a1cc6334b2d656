"""CPU smoke run of benchmarks/flash_attn_check.py (the lead's GPU check of the flash-attn backends).

On a CPU nothing real is timed: the flash-attn and Triton backends report why they cannot run,
sdpa and torch are timed at tiny shapes, and the GPU sweep is collected and skipped, which still
checks that the script's pytest selection finds the sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_results_and_prints_the_table(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    benchmarks_md = tmp_path / "BENCHMARKS.md"
    benchmarks_md.write_text("# Benchmarks\n\nKept.\n")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.flash_attn_check", "--smoke", "--out", str(tmp_path),
         "--markdown", str(benchmarks_md)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "flash_attn_check.json").read_text())
    # the sweep found the GPU tests (5 backends x 10 cases + auto's table) and skipped them here
    assert results["sweep"]["returncode"] == 0 and results["sweep"]["counts"] == {"skipped": 51}
    assert [r["situation"] for r in results["situations"]][:3] == [
        "dense causal", "key padding, causal", "packed documents, causal",
    ]
    for record in results["situations"]:
        backends = record["backends"]
        assert set(backends) == {"flash_attn_4", "flash_attn_2", "triton", "sdpa", "torch"}
        for name in ("flash_attn_4", "flash_attn_2", "triton"):
            assert backends[name]["reason"], name
        assert backends["sdpa"]["fwd_ms"] > 0 and backends["torch"]["fwd_bwd_ms"] > 0
        assert record["auto"] in ("sdpa", "torch")
    assert "pip install flash-attn-4" in results["situations"][0]["backends"]["flash_attn_4"]["reason"]
    markdown = (tmp_path / "flash_attn_check.md").read_text()
    assert "Equivalence sweep (`python -m pytest tests/kernels/test_backends_gpu.py" in markdown
    assert benchmarks_md.read_text().startswith("# Benchmarks\n\nKept.\n\n<!-- flash-attn-check:start -->\n## flash-attn")
    assert done.stdout.strip().splitlines()[-6].startswith("| dense causal | sdpa |")
