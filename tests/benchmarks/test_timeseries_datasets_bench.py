"""The real-datasets benchmark runs end to end (`python -m benchmarks.timeseries_datasets --smoke`:
the MIT-BIH ECG at horizon 96), and its hook adds a checkpoint's rows to the tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timeseries_datasets import SHARED, add_model_results, main, render, wins, zero_shot


@pytest.mark.slow
def test_smoke_run_writes_the_tables_and_adds_model_rows(tmp_path):
    if not (SHARED / "ecg_mitbih208_360hz.csv").exists():
        pytest.skip(f"real data not found at {SHARED}")
    out = tmp_path / "out"
    summary = main([str(out), "--work", str(tmp_path / "work"), "--smoke"])
    methods = summary["datasets"]["ecg_mitbih208"]["methods"]
    assert set(methods) == {"seasonal_naive", "ar", "dlinear"} and all("96" in rows for rows in methods.values())
    assert json.loads((out / "timeseries_datasets.json").read_text())["horizons"] == [96]
    assert (out / "timeseries_datasets.png").stat().st_size > 0
    # the hook: an evaluate_forecast result of a checkpoint becomes a row, compared with every baseline
    model = {"results": [{"horizon": 96, "mse": methods["ar"]["96"]["mse"] * 0.9, "mae": 0.1, "windows": 1, "lookback": 1024}]}
    add_model_results(summary, "genoformer", "ecg_mitbih208", model)
    assert wins(summary) == [{"model": "genoformer", "beats seasonal naive at every horizon": "1 of 1",
                              "beats AR at every horizon": "1 of 1", "beats DLinear at every horizon":
                              f"{int(methods['dlinear']['96']['mse'] > methods['ar']['96']['mse'] * 0.9)} of 1"}]
    assert "| horizon | seasonal naive | AR | DLinear | genoformer |" in render(summary)


def test_zero_shot_rows_judge_the_general_forecaster_against_both_targets():
    def rows(*mses):
        return {str(h): {"mse": m, "mae": m} for h, m in zip((96, 720), mses)}

    summary = {"zero_shot": {"model": "general", "datasets": ["held", "unseen", "absent"]},
               "datasets": {"held": {"methods": {"general": rows(0.5, 1.0), "seasonal_naive": rows(0.6, 1.1), "ar": rows(0.46, 0.9)}},
                            "unseen": {"methods": {"general": rows(0.7, 1.0), "seasonal_naive": rows(0.6, 1.1), "ar": rows(0.7, 1.0)}}}}
    held, unseen = zero_shot(summary)  # a dataset without results is left out
    assert held["beats seasonal naive at every horizon"] == "yes" and held["within 10 % of AR at every horizon"] == "no"
    assert held["MSE / AR"] == "1.09 / 1.11"
    assert unseen["beats seasonal naive at every horizon"] == "no" and unseen["within 10 % of AR at every horizon"] == "yes"
    environment = json.loads((Path(__file__).parents[2] / "benchmarks/results/timeseries_datasets.json").read_text())["environment"]
    assert "`general` zero-shot" in render({**summary, "environment": environment, "command": "x", "horizons": [96, 720]})
