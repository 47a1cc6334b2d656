"""CPU smoke run of benchmarks/flash_attn_check.py (the GPU check of the flash-attn backends).

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
    # the sweep found the GPU tests (6 backends x 10 cases, flash-attn-4's trusted head dims x 3
    # cases, auto's table) and skipped them here
    from genoformer.kernels.flash_attn_backend import FLASH_ATTN_4_HEAD_DIMS

    trusted = set().union(*FLASH_ATTN_4_HEAD_DIMS.values())
    expected = 6 * 10 + 3 * len(trusted) + 1
    assert results["sweep"]["returncode"] == 0 and results["sweep"]["counts"] == {"skipped": expected}
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


def test_head_dim_sweep_smoke_run_writes_the_table_and_the_row_to_paste(tmp_path):
    """--head-dims on a CPU: torch runs every case and passes; flash-attn-4 reports why it cannot run,
    so no head dim is trusted, and the run still writes its JSON, Markdown and the row to paste."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.flash_attn_check", "--head-dims", "--smoke", "--out", str(tmp_path),
         "--backends", "flash_attn_4", "torch", "--workers", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "flash_attn_head_dims.json").read_text())
    torch_records = [r for r in results["records"] if r["backend"] == "torch"]
    assert len(torch_records) == 2 * 12 and all(r["ok"] for r in torch_records)
    assert {name for r in torch_records for name in r["tensors"]} == {"out", "dq", "dk", "dv"}
    assert len({r["shape"]["L"] for r in torch_records}) > 2  # lengths drawn, not picked
    assert all(r["shape"]["Hkv"] == (2 if "GQA" in r["case"] else 8) for r in torch_records)
    assert all(("cu_seqlens" in r["shape"]) == r["case"].startswith("packed") for r in torch_records)
    assert all(r["reason"] and not r["ok"] for r in results["records"] if r["backend"] == "flash_attn_4")
    assert results["trusted"] == []
    assert "| 16 | not run: flash-attn-4 does not import" in (tmp_path / "flash_attn_head_dims.md").read_text()
    assert done.stdout.strip().splitlines()[-1] == "    (major, minor): frozenset({}),"
