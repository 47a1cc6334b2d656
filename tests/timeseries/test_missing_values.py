"""Missing values through the model, the losses and the evaluator; the command line of real-file
reading."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_helpers import fails
from genoformer.data.timeseries.store import TimeSeriesStore

from genoformer.cli import main
from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.baselines import DirectAR, SeasonalNaive, fill_lookback
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer, instance_normalize
from genoformer.timeseries.module import TimeSeriesForecaster
from genoformer.timeseries.protocol import ProtocolSplit, evaluate_protocol, zscore_stats


def tiny(seed=0, **forecast):
    torch.manual_seed(seed)
    values = dict(patch_len=8, context=104, horizon=16, n_channels=1, quantiles=[0.1, 0.9], **forecast)
    return TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64), ForecastConfig(**values)
    ).eval()


def test_masked_normalisation_is_the_plain_one_when_everything_is_observed():
    x_BCL = torch.randn(2, 3, 50) * 4 + 1
    plain, plain_stats = instance_normalize(x_BCL, samples=20)
    masked, masked_stats = instance_normalize(x_BCL, samples=20, observed_BCL=torch.ones_like(x_BCL, dtype=torch.bool))
    assert torch.allclose(plain, masked, atol=1e-5) and torch.allclose(plain_stats.scale_BC1, masked_stats.scale_BC1)
    x_BCL[0, 0, 5] = float("nan")
    z, stats = instance_normalize(x_BCL, observed_BCL=torch.isfinite(x_BCL))
    kept = torch.cat([x_BCL[0, 0, :5], x_BCL[0, 0, 6:]])
    assert z[0, 0, 5] == 0 and torch.isclose(stats.mean_BC1[0, 0, 0], kept.mean())


@pytest.mark.parametrize("linear_order", [0, 12])
def test_a_missing_sample_reads_like_padding(linear_order):
    """The first patch of a context whose first samples are missing looks to the model exactly
    like the left padding of a shorter context: same tokens, same statistics, same forecast."""
    model = tiny(linear_order=linear_order)
    if linear_order:
        model.set_linear(
            torch.eye(linear_order + 1, dtype=torch.float64), torch.randn(linear_order + 1, 16, dtype=torch.float64)
        )
    series = torch.sin(torch.arange(104.0) / 5)[None, None] * 3 + 2
    missing = series.clone()
    missing[..., :5] = float("nan")
    point, quantiles = model(missing)
    short_point, short_quantiles = model(series[..., 5:])
    assert torch.isfinite(point).all() and torch.isfinite(quantiles).all()
    assert torch.allclose(point, short_point, atol=1e-5) and torch.allclose(quantiles, short_quantiles, atol=1e-5)
    # a gap in the middle changes the forecast, but only through the mask: any value behind it gives the same
    middle = series.clone()
    middle[..., 40:48] = float("nan")
    assert not torch.allclose(model(middle)[0], model(series)[0])


def test_losses_leave_missing_targets_out():
    module = TimeSeriesForecaster(
        TransformerConfig(d_model=32, n_layers=1, n_heads=4, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=16),
    )
    module.train()
    context = torch.randn(4, 1, 64)
    context[0, 0, 10:30] = float("nan")
    target = torch.randn(4, 1, 16)
    target[1, 0, 3:] = float("nan")
    values = module.losses(context, target)
    assert all(torch.isfinite(v) for v in values.values())
    values["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    point, _ = module.model(context)
    observed = torch.isfinite(target)
    assert torch.isclose(values["mse"], torch.square(point - target)[observed].mean())


def test_evaluator_leaves_missing_truths_out_by_hand():
    values = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 30, 16, np.nan, 4, 8]], dtype=np.float32)
    mean, std = zscore_stats(values[:, :14])
    z = (values[0].astype(np.float64) - mean[0]) / std[0]

    def last_value(context_NCP, horizon):
        return np.repeat(fill_lookback(context_NCP)[:, :, -1:], horizon, axis=2)

    rows = evaluate_protocol(last_value, [values], lookback=3, horizons=[1, 2], progress=False, batch_size=2)
    # horizon 1: starts 16..19; the truth at 17 is missing, and start 18 sees z[17] missing: z[16] carried forward
    errors1 = [z[15] - z[16], z[16] - z[18], z[18] - z[19]]
    assert rows[0]["mse"] == pytest.approx(np.mean(np.square(errors1)))
    assert (rows[0]["windows"], rows[0]["missing_targets"], rows[0]["windows_without_targets"]) == (3, 1, 1)
    # horizon 2: starts 16, 17, 18; step 2 of start 16 and step 1 of start 17 are missing
    step1 = [z[15] - z[16], z[16] - z[18]]
    step2 = [z[16] - z[18], z[16] - z[19]]
    assert rows[1]["mse_by_step"] == pytest.approx([np.mean(np.square(step1)), np.mean(np.square(step2))])
    assert rows[1]["mse"] == pytest.approx(np.mean(np.square(step1 + step2)))
    assert (rows[1]["windows"], rows[1]["missing_targets"]) == (3, 2)


def test_baselines_fit_and_forecast_series_with_gaps():
    t = np.arange(6000)
    rng = np.random.default_rng(0)
    x = (np.sin(2 * np.pi * t / 50) + 0.1 * rng.normal(size=len(t)))[None]
    x[0, rng.choice(len(t), 300, replace=False)] = np.nan
    x[0, 1000:1100] = np.nan
    split = ProtocolSplit.of(x.shape[1])
    assert SeasonalNaive.fit([x[:, : split.train_end]]).periods == [50]
    model, scores = DirectAR.fit_select([x], [split], horizon=20, orders=[4, 60])
    assert set(scores) == {4, 60} and all(math.isfinite(v) for v in scores.values())
    rows = evaluate_protocol(model, [x], lookback=model.order, horizons=[20], progress=False)
    assert rows[0]["mse"] < 0.1 and rows[0]["missing_targets"] > 0


def test_fill_lookback_carries_the_last_observation_forward():
    context = np.array([[[np.nan, 1.0, np.nan, np.nan, 4.0]], [[np.nan, np.nan, np.nan, np.nan, np.nan]]], np.float32)
    assert fill_lookback(context).tolist() == [[[0, 1, 1, 1, 4]], [[0, 0, 0, 0, 0]]]


def test_prepare_and_evaluate_a_csv_with_dates_gaps_and_missing_cells(tmp_path, capsys):
    csv = tmp_path / "power.csv"
    times = np.datetime64("2007-01-12T00:00") + np.arange(3000).astype("timedelta64[m]")
    rng = np.random.default_rng(0)
    load = np.sin(np.arange(3000) * 2 * np.pi / 60) + 0.05 * rng.normal(size=3000)
    lines = ["Date;Time;load;note"]
    for i, (stamp, value) in enumerate(zip(times, load)):
        if 1200 <= i < 1210:
            continue  # a gap of 10 minutes
        day, clock = str(stamp).split("T")
        y, m, d = day.split("-")
        lines.append(f"{d}/{m}/{y};{clock}:00;{'?' if i % 97 == 0 else f'{value:.4f}'};x")
    csv.write_text("\n".join(lines) + "\n")
    store = tmp_path / "power.zarr"
    main(
        ["prepare_timeseries", "--inputs", str(csv), "--out", str(store), "--time_column", "[Date,Time]", "--dayfirst"]
    )
    out = capsys.readouterr().out
    assert "gaps: 1 (10 steps, longest 10)" in out and "non-numeric columns left out: ['note']" in out
    info = TimeSeriesStore(store).series[0]
    assert info.length == 3000 and info.missing == [10 + 31] and info.start_time.startswith("2007-01-12T00:00")
    result = tmp_path / "dlinear.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--baseline",
            "dlinear",
            "--horizons",
            "[60]",
            "--dlinear_lookback",
            "120",
            "--out",
            str(result),
        ]
    )
    payload = json.loads(result.read_text())
    row = payload["results"][0]
    assert row["horizon"] == 60 and row["lookback"] == 120 and row["mse"] < 0.1 and row["missing_targets"] > 0
    assert payload["methods"]["dlinear"]["fits"]["60"]["best_step"] > 0
    err = fails(
        capsys,
        ["prepare_timeseries", "--inputs", str(csv), "--out", str(tmp_path / "m.zarr"), "--time_column", "[Date,Time]"],
    )
    # read month first, 12/01 is 1 December and 13/01 no date: the error names its line (1,440 rows on, less the gap)
    assert "power.csv: line 1432, time column 'Date+Time': '13/01/2007 00:00:00' is not a time" in err
    assert "--dayfirst" in err


def test_duplicate_hint_works_as_typed(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("when,v\n2020-01-01 00:00,1\n2020-01-01 01:00,2\n2020-01-01 01:00,3\n2020-01-01 02:00,4\n")
    args = ["prepare_timeseries", "--inputs", str(csv), "--out", str(tmp_path / "d.zarr"), "--time_column", "when"]
    err = fails(capsys, args)
    assert "d.csv: line 4 falls on the same time step" in err and "--duplicates mean" in err
    main(args + ["--duplicates", "mean"])
    assert TimeSeriesStore(tmp_path / "d.zarr").read(0, 0, 3).tolist() == [[1.0, 2.5, 4.0]]


def test_quantile_losses_by_hand():
    values = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 30, 16, np.nan, 4, 8]], dtype=np.float32)
    mean, std = zscore_stats(values[:, :14])
    z = (values[0].astype(np.float64) - mean[0]) / std[0]
    levels = [0.1, 0.9]

    def constant(context_NCP, horizon):
        N, C, _ = context_NCP.shape
        return np.zeros((N, C, horizon)), np.stack([np.full((N, C, horizon), -1.0), np.full((N, C, horizon), 1.0)], -1)

    row = evaluate_protocol(constant, [values], lookback=3, horizons=[1], progress=False, quantile_levels=levels)[0]
    truth = z[[16, 18, 19]]  # step 17 is missing
    pinball = [np.maximum(q * (truth - f), (q - 1) * (truth - f)) for q, f in zip(levels, (-1.0, 1.0))]
    assert row["quantile_loss"] == pytest.approx(np.mean(pinball))
    assert row["wql"] == pytest.approx(np.mean([2 * p.sum() / np.abs(truth).sum() for p in pinball]))


def test_ar_skips_orders_without_a_validation_window_and_fits_one_order_as_it_is():
    t = np.arange(1000)
    x = (np.sin(2 * np.pi * t / 25) + 0.05 * np.random.default_rng(1).normal(size=len(t)))[None]
    for start in (690, 760, 830):  # validation part [700, 900): observed stretches of 60 steps at most
        x[0, start : start + 10] = np.nan
    split = ProtocolSplit(1000, 700, 900)
    model, scores = DirectAR.fit_select([x], [split], horizon=20, orders=[4, 60])
    assert model.order == 4 and list(scores) == [4]  # 60 + 20 steps fit in no validation stretch
    model, scores = DirectAR.fit_select([x], [split], horizon=20, orders=[60])
    assert model.order == 60 and math.isnan(scores[60])  # nothing to choose: fitted as it is
    with pytest.raises(ValueError, match="pass one AR order"):
        DirectAR.fit_select([x], [split], horizon=20, orders=[60, 120])
