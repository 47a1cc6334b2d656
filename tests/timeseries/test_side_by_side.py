"""Results side by side: `evaluate_forecast` scores a checkpoint with the baselines in one table,
printed and written; `forecast` prints its score against the values after the origin; forecast
plots read dates where the store knows them."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
from matplotlib import dates

from genoformer.cli import main
from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.commands import forecast_figure
from genoformer.timeseries.model import ForecastConfig
from genoformer.timeseries.module import TimeSeriesForecaster


@pytest.fixture(scope="module")
def dated_store(tmp_path_factory) -> Path:
    """Ten days of a daily cycle every 10 minutes, with dates."""
    folder = tmp_path_factory.mktemp("dated")
    times = pd.date_range("2026-05-01", periods=1440, freq="10min")
    level = 20 + 5 * np.sin(2 * np.pi * np.arange(1440) / 144) + np.random.default_rng(0).normal(0, 0.3, 1440)
    pd.DataFrame({"time": times.strftime("%Y-%m-%d %H:%M"), "level": level.round(3)}).to_csv(
        folder / "level.csv", index=False
    )
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(folder / "level.csv"),
            "--out",
            str(folder / "level.zarr"),
            "--time_column",
            "time",
        ]
    )
    return folder / "level.zarr"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained forecaster of 16 steps (what is compared, not how well)."""
    module = TimeSeriesForecaster(
        TransformerConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=16),
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    path = tmp_path_factory.mktemp("model") / "h16.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_evaluate_forecast_prints_and_writes_one_table_of_the_model_and_the_baselines(
    dated_store, checkpoint, tmp_path, capsys
):
    out = tmp_path / "results.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(dated_store),
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--horizons",
            "16,32",
            "--ar_orders",
            "8,32",
            "--device",
            "cpu",
        ]
    )
    printed = capsys.readouterr().out
    table = out.with_suffix(".md").read_text()
    payload = json.loads(out.read_text())
    assert payload["table"] in printed and payload["table"] in table
    lines = payload["table"].splitlines()
    assert lines[0] == "| method | horizon 16 | horizon 32 |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| forecaster", "| seasonal naive", "| AR", "| DLinear"]
    assert lines[2].endswith(" | - |")  # the model forecasts 16 steps: no score at 32
    rows = {(row["method"], row["horizon"]): row for row in payload["results"]}
    assert set(rows) == {("forecaster", 16), *((m, h) for m in ("seasonal_naive", "ar", "dlinear") for h in (16, 32))}
    methods = ["forecaster", "seasonal_naive", "ar", "dlinear"]
    best = min(methods, key=lambda method: rows[method, 16]["mse"])
    assert f"**{rows[best, 16]['mse']:.4f}**" in lines[2 + methods.index(best)] and payload["table"].count("**") == 4
    assert set(payload["methods"]) == {"forecaster", "seasonal_naive", "ar", "dlinear"}
    assert payload["methods"]["ar"]["orders"]["16"]["order"] in (8, 32)


def test_evaluate_forecast_scores_what_it_is_given(dated_store, tmp_path, capsys):
    out = tmp_path / "ar.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(dated_store),
            "--baseline",
            "ar",
            "--horizons",
            "16",
            "--ar_orders",
            "8",
            "--out",
            str(out),
        ]
    )
    assert [(row["method"], row["horizon"]) for row in json.loads(out.read_text())["results"]] == [("ar", 16)]
    assert "| AR | " in capsys.readouterr().out


def test_forecast_prints_its_score_and_names_the_origin_that_has_one(dated_store, checkpoint, tmp_path, capsys):
    args = ["forecast", "--checkpoint", str(checkpoint), "--store", str(dated_store), "--device", "cpu"]
    main([*args, "--out", str(tmp_path / "end.npz")])
    printed = capsys.readouterr().out
    assert "nothing after sample 1440 to score the forecast against" in printed
    origin = shlex.split(re.search(r"--at \d+", printed).group(0))
    main([*args, "--out", str(tmp_path / "test.npz"), *origin])
    printed = capsys.readouterr().out
    at = int(origin[1])
    score = re.search(
        rf"score against the 16 samples after {at}: MSE (\S+), MAE (\S+) \(z-scored: MSE (\S+), "
        r"MAE (\S+)\)",
        printed,
    )
    assert score, printed
    with np.load(tmp_path / "test.npz") as saved:
        error = saved["forecast"].astype(np.float64) - saved["truth"]
        assert float(score.group(1)) == pytest.approx(np.mean(error**2), rel=1e-3)
        assert float(saved["score_mse"]) == pytest.approx(np.mean(error**2))
        assert str(saved["start_time"]) == "2026-05-01T00:00:00+00:00"


def test_a_forecast_plot_reads_dates_when_the_store_knows_them(dated_store, checkpoint, tmp_path):
    main(
        [
            "forecast",
            "--checkpoint",
            str(checkpoint),
            "--store",
            str(dated_store),
            "--device",
            "cpu",
            "--at",
            "1000",
            "--out",
            str(tmp_path / "f.npz"),
        ]
    )
    with np.load(tmp_path / "f.npz") as saved:
        arrays = dict(saved)
    axis = forecast_figure(arrays).axes[0].xaxis
    assert isinstance(axis.get_major_formatter(), (dates.AutoDateFormatter, dates.ConciseDateFormatter))
    lo, hi = axis.get_view_interval()  # matplotlib's days since 1970
    assert (
        pd.Timestamp("2026-05-06")
        < pd.Timestamp(lo, unit="D")
        < pd.Timestamp(hi, unit="D")
        < pd.Timestamp("2026-05-09")
    )
    arrays.pop("start_time")
    assert forecast_figure(arrays).axes[-1].get_xlabel() == "time (s)"
