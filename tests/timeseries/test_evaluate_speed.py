"""The batched evaluator (windows cut from one tensor, errors of every horizon summed at once on
the forecasts' device) against a window-by-window float64 reference of the protocol.

Shape legend: N windows, C channels, T time steps, P look-back, H horizon, K quantile levels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from genoformer.data.timeseries.store import TimeSeriesStore, prepare_timeseries_store

from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.baselines import fill_lookback
from genoformer.timeseries.commands import protocol_results
from genoformer.timeseries.forecaster import Forecaster
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer
from genoformer.timeseries.protocol import ProtocolSplit, evaluate_protocol, zscore_stats

LEVELS = (0.1, 0.5, 0.9)


def reference_rows(forecast, series, *, lookback, horizons, levels=LEVELS):
    """The protocol's rows computed one window and one horizon at a time, in float64."""
    rows = []
    for h in horizons:
        sq_H, count_H, pinball_K = np.zeros(h), np.zeros(h, dtype=np.int64), np.zeros(len(levels))
        abs_sum = abs_truth = 0.0
        windows = empty = missing = 0
        for values_CT in series:
            split = ProtocolSplit.of(values_CT.shape[1])
            mean_C, std_C = zscore_stats(values_CT[:, : split.train_end])
            z_CT = ((values_CT - mean_C[:, None]) / std_C[:, None]).astype(np.float32)
            for t in range(split.test_start, split.length - h + 1):
                point_NCH, quant_NCHK = forecast(z_CT[None, :, t - lookback : t], max(horizons))
                point_CH, quant_CHK = np.float64(point_NCH[0, :, :h]), np.float64(quant_NCHK[0, :, :h])
                truth_CH = np.float64(z_CT[:, t : t + h])
                observed_CH = ~np.isnan(truth_CH)
                missing += int((~observed_CH).sum())
                if not observed_CH.any():
                    empty += 1
                    continue
                windows += 1
                err_CH = np.where(observed_CH, point_CH - truth_CH, 0.0)
                sq_H += np.square(err_CH).sum(0)
                count_H += observed_CH.sum(0)
                abs_sum += np.abs(err_CH).sum()
                for k, q in enumerate(levels):
                    d_CH = truth_CH - quant_CHK[..., k]
                    pinball_K[k] += np.where(observed_CH, np.maximum(q * d_CH, (q - 1) * d_CH), 0.0).sum()
                abs_truth += np.abs(truth_CH[observed_CH]).sum()
        n = count_H.sum()
        rows.append(
            {
                "horizon": h,
                "mse": sq_H.sum() / n,
                "mae": abs_sum / n,
                "lookback": lookback,
                "windows": windows,
                "mse_by_step": list(sq_H / count_H),
                "missing_targets": missing,
                "windows_without_targets": empty,
                "quantile_loss": pinball_K.sum() / (n * len(levels)),
                "wql": np.mean(2 * pinball_K / abs_truth),
            }
        )
    return rows


def assert_rows_match(rows, expected, rel):
    assert [row.keys() for row in rows] == [row.keys() for row in expected]
    for row, want in zip(rows, expected):
        row, want = dict(row), dict(want)
        assert row.pop("mse_by_step") == pytest.approx(want.pop("mse_by_step"), rel=rel)
        assert row == pytest.approx(want, rel=rel)


def persistence(context_NCP, horizon):
    """The last observed value, with quantiles spread around it that widen with the step."""
    last_NC1 = fill_lookback(np.asarray(context_NCP))[:, :, -1:]
    point_NCH = np.repeat(last_NC1, horizon, axis=2) * 0.9
    spread_HK = np.outer(1 + np.arange(horizon) / horizon, np.array(LEVELS) - 0.5)
    return point_NCH, (point_NCH[..., None] + spread_HK).astype(np.float32)


def gappy_series(length, seed):
    """Two channels with scattered missing values and, in the test part, a gap longer than every
    horizon (windows without targets) and one that reaches the end (the longest horizon's truth
    runs past it)."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    values_CT = np.stack(
        [
            np.sin(2 * np.pi * t / 23) + 0.3 * rng.standard_normal(length),
            5 + 2 * np.cos(2 * np.pi * t / 41) + rng.standard_normal(length),
        ]
    ).astype(np.float32)
    values_CT[rng.random(values_CT.shape) < 0.05] = np.nan
    test_start = ProtocolSplit.of(length).test_start
    values_CT[:, test_start + 20 : test_start + 60] = np.nan
    values_CT[1, length - 7 :] = np.nan
    return values_CT


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_the_evaluator_matches_a_window_by_window_reference(batch_size):
    series = [gappy_series(600, 0), gappy_series(437, 1)]
    horizons = [5, 12, 30]
    expected = reference_rows(persistence, series, lookback=16, horizons=horizons)
    as_numpy = evaluate_protocol(
        persistence,
        series,
        lookback=16,
        horizons=horizons,
        quantile_levels=LEVELS,
        batch_size=batch_size,
        progress=False,
    )

    def on_device(context_NCP, horizon):  # a forecaster on the evaluator's device: tensors in and out
        assert isinstance(context_NCP, torch.Tensor) and context_NCP.is_contiguous()
        return tuple(torch.from_numpy(part) for part in persistence(context_NCP.numpy(), horizon))

    as_tensors = evaluate_protocol(
        on_device,
        series,
        lookback=16,
        horizons=horizons,
        quantile_levels=LEVELS,
        batch_size=batch_size,
        progress=False,
        device="cpu",
    )
    assert expected[0]["windows_without_targets"] > 0 and all(row["missing_targets"] > 0 for row in expected)
    assert_rows_match(as_numpy, expected, rel=1e-10)
    assert_rows_match(as_tensors, expected, rel=1e-10)


def test_forecast_batch_equals_forecast_and_checks_its_input():
    torch.manual_seed(0)
    model = TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=20, quantiles=list(LEVELS)),
    )
    forecaster = Forecaster(model, device="cpu")
    windows_NCL = torch.randn(5, 2, 80)  # longer than the context: the last 64 samples are used
    windows_NCL[1, 0, 70] = torch.nan
    point_NCH, quant_NCHK = forecaster.forecast_batch(windows_NCL, 12)
    result = forecaster.forecast(windows_NCL.numpy(), 12)
    assert point_NCH.shape == (5, 2, 12) and quant_NCHK.shape == (5, 2, 12, 3)
    assert np.allclose(point_NCH.numpy(), result.point, atol=1e-6)
    assert np.allclose(quant_NCHK.numpy(), result.quantiles, atol=1e-6)
    windows_NCL[2, 1, 3] = torch.inf  # before the context: not seen
    assert torch.equal(forecaster.forecast_batch(windows_NCL, 12)[0], point_NCH)
    windows_NCL[2, 1, 70] = torch.inf
    with pytest.raises(ValueError, match="1 infinite value.*mark a value as missing with NaN"):
        forecaster.forecast_batch(windows_NCL)
    with pytest.raises(ValueError, match=r"horizon must be in \[1, 20\]"):
        forecaster.forecast_batch(windows_NCL[:, :, :64], 21)


def test_a_checkpoint_is_scored_as_its_forecasts_window_by_window(tmp_path):
    values_CT = gappy_series(700, 2)
    np.save(tmp_path / "gappy.npy", values_CT.T)
    store = TimeSeriesStore(
        prepare_timeseries_store([tmp_path / "gappy.npy"], tmp_path / "gappy.zarr", sampling_rate=1.0)
    )
    torch.manual_seed(0)
    model = TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=24, quantiles=list(LEVELS)),
    )
    forecaster = Forecaster(model, device="cpu")

    def one_window(context_NCP, horizon):
        result = forecaster.forecast(context_NCP, horizon)
        return result.point, result.quantiles

    expected = reference_rows(one_window, [values_CT], lookback=64, horizons=[6, 24])
    rows = protocol_results(store, forecaster=forecaster, horizons=(6, 24), batch_size=50, progress=False)["results"]
    assert_rows_match(rows, expected, rel=1e-5)  # one window at a time or 50 in a pass: float32 rounding apart
