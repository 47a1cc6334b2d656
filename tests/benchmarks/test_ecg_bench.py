"""The ECG benchmark runs every step end to end on the CPU at a tiny size (the figures come from
one GPU: `python -m benchmarks.ecg OUT`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ecg_benchmark_smoke_run(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.ecg", str(out), "--smoke", "--seeds", "2", "--ensemble", "2", "--run_dir", str(tmp_path / "run")],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["model"]) == {"64", "128", "256"}
    for rows in [*results["model"].values(), *results["baselines"].values()]:
        assert [row["horizon"] for row in rows] == [16, 48]
        assert all(row["mse"] > 0 and row["windows"] > 0 for row in rows)
    assert [row["lookback"] for row in results["model"]["256"]] == [256, 256]
    # two variants, two seeds each; the variant with the lower mean validation MSE was evaluated, and
    # the test MSE is the mean over its seeds' models
    variants = results["variants"]
    assert len(variants) == 2 and results["chosen"] in variants
    assert variants[results["chosen"]]["best_val_mse"] == min(v["best_val_mse"] for v in variants.values())
    for v in variants.values():
        per_seed = [r["best_val_mse"] for r in v["seeds"].values()]
        assert len(per_seed) == 2 and v["best_val_mse"] == pytest.approx(sum(per_seed) / 2)
    per_seed_model = results["model_per_seed"]
    assert set(per_seed_model) == {"0", "1"}
    for index, row in enumerate(results["single_models"]["256"]):
        seeds_mse = [per_seed_model[s]["256"][index]["mse"] for s in ("0", "1")]
        assert row["mse_seeds"] == seeds_mse and row["mse"] == pytest.approx(sum(seeds_mse) / 2)
        assert row["mse_by_step"] == pytest.approx(
            [sum(steps) / 2 for steps in zip(*(per_seed_model[s]["256"][index]["mse_by_step"] for s in ("0", "1")))])
    # --ensemble 2: the two seeds' models also forecast together (the mean of their forecasts), and that
    # ensemble is the model of the tables
    assert results["ensemble"] == 2 and results["ensemble_seeds"] == [[0, 1]]
    assert results["model"]["256"] == [{**row, "mse_seeds": [row["mse"]]} for row in results["ensembles"]["0"]["256"]]
    assert json.loads((out / "ensemble0_lookback256.json").read_text())["methods"]["forecaster"]["members"] == 2
    assert "single models, 256 (mean of 2)" in result.stdout and "ensemble of 2, look-back 256" in result.stdout
    assert len(results["model"]["256"][-1]["mse_by_step"]) == 48
    # the error by part of the horizon: steps 1-48 (the smoke run's longest horizon)
    (part,) = results["error_by_step"]
    assert part["forecast steps"] == "1-48" and part["AR"] == pytest.approx(results["baselines"]["ar"][-1]["mse"])
    for name in ("forecast.png", "lookback_curve.png", "error_by_step.png", "results.md"):
        assert (out / name).stat().st_size > 100
    assert "| horizon |" in result.stdout  # the table is printed last


def test_error_by_step_from_evaluations(tmp_path):
    """--steps_from draws the error by step of finished evaluations (each one's longest horizon)."""
    for name, level in (("model", 0.3), ("ar", 0.5)):
        rows = [{"horizon": h, "mse": level, "mse_by_step": [level] * h} for h in (96, 192)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"results": rows}))
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.ecg", str(tmp_path / "out"), "--steps_from",
         f"transformer={tmp_path / 'model.json'}", f"AR={tmp_path / 'ar.json'}"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| 97-192 | 0.300 | 0.500 |" in result.stdout and "193-" not in result.stdout
    assert (tmp_path / "out" / "error_by_step.png").stat().st_size > 100
    bad = subprocess.run([sys.executable, "-m", "benchmarks.ecg", str(tmp_path / "out"), "--steps_from", "model.json"],
                         cwd=REPO_ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "expected NAME=FILE" in bad.stderr
