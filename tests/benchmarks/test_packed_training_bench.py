"""The packed-training benchmark runs end to end on the CPU at a tiny size (the figures come from the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_packed_training_benchmark_smoke_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.packed_training", "--smoke", "--steps", "1", "--warmup", "0",
         "--out", str(tmp_path), "--markdown", str(tmp_path / "BENCHMARKS.md")],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    )
    summary = json.loads((tmp_path / "packed_training.json").read_text())
    assert [row["run"] for row in summary["results"]] == ["unpacked", "packed", "packed, compiled"]
    assert summary["batch"]["documents"] > summary["batch"]["rows"] == 4
    assert summary["equality"]["passes_2x_rule"] and summary["equality"]["packed_max_abs_err"] < 1e-4
    assert any("packed documents" in message for message in summary["auto_log"])
    assert (tmp_path / "packed_training.md").read_text().strip() in result.stdout
    assert "<!-- packed-training:start -->" in (tmp_path / "BENCHMARKS.md").read_text()
