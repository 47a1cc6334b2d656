"""The training-step benchmark runs end to end on the CPU at a tiny size (the figures come from the GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_train_step_benchmark_tiny_cpu_run(tmp_path):
    markdown = tmp_path / "BENCHMARKS.md"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.train_step", "--device", "cpu", "--tiny", "--batch-size", "2",
         "--steps", "1", "--warmup", "1", "--backends", "torch,sdpa", "--out", str(tmp_path), "--markdown", str(markdown)],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    )
    summary = json.loads((tmp_path / "train_step.json").read_text())
    backends = [r["backend"] for r in summary["results"]]
    assert backends == ["torch", "sdpa"]
    # identical weights and batch: both backends compute the same loss and gradients
    losses = [r["loss_at_init"] for r in summary["results"]]
    assert abs(losses[0] - losses[1]) < 1e-5
    assert summary["results"][1]["max_grad_rel_diff_vs_first"] < 1e-4
    assert any("backend" in message for message in summary["auto_log"])
    assert "<!-- training:start -->" in markdown.read_text()
