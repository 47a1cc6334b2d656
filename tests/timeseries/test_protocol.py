"""The long-horizon protocol and the classical baselines, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from genoformer.timeseries.baselines import DirectAR, SeasonalNaive, autocorrelation_period
from genoformer.timeseries.protocol import (
    ProtocolSplit,
    evaluate_protocol,
    window_starts,
    zscore_stats,
)


def test_protocol_split_fractions():
    split = ProtocolSplit.of(108_000)
    assert (split.train_end, split.test_start, split.n_test) == (75_600, 86_400, 21_600)
    odd = ProtocolSplit.of(17)  # int(11.9) = 11 train, int(3.4) = 3 test, 3 validation
    assert (odd.train_end, odd.test_start, odd.n_test) == (11, 14, 3)
    with pytest.raises(ValueError, match="validation would be empty|one of train, validation, test"):
        ProtocolSplit.of(3)
    with pytest.raises(ValueError, match="sum to less than 1"):
        ProtocolSplit.of(100, 0.8, 0.3)


def test_evaluator_matches_a_hand_computation():
    # 20 steps: train [0, 14), validation [14, 16), test [16, 20); z-score with train mean/std.
    values = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 30, 16, 10, 4, 8]], dtype=np.float32)
    split = ProtocolSplit.of(20)
    assert (split.train_end, split.test_start) == (14, 16)
    mean, std = values[0, :14].mean(), values[0, :14].std()
    z = (values[0].astype(np.float64) - mean) / std

    def last_value(context_NCP, horizon):  # persistence: repeat the last look-back value
        return np.repeat(context_NCP[:, :, -1:], horizon, axis=2)

    rows = evaluate_protocol(last_value, [values], lookback=3, horizons=[1, 2], progress=False, batch_size=2)
    # horizon 1: starts 16..19, each predicts z[t - 1] for z[t]
    errors1 = [z[t - 1] - z[t] for t in (16, 17, 18, 19)]
    # horizon 2: starts 16..18, predicts z[t - 1] for z[t] and z[t + 1]
    errors2 = [z[t - 1] - z[t + h] for t in (16, 17, 18) for h in (0, 1)]
    by_step2 = [np.mean([np.square(z[t - 1] - z[t + h]) for t in (16, 17, 18)]) for h in (0, 1)]
    steps = [row.pop("mse_by_step") for row in rows]
    assert rows[0] == pytest.approx(
        {
            "horizon": 1,
            "mse": np.mean(np.square(errors1)),
            "mae": np.mean(np.abs(errors1)),
            "lookback": 3,
            "windows": 4,
            "missing_targets": 0,
            "windows_without_targets": 0,
        }
    )
    assert rows[1] == pytest.approx(
        {
            "horizon": 2,
            "mse": np.mean(np.square(errors2)),
            "mae": np.mean(np.abs(errors2)),
            "lookback": 3,
            "windows": 3,
            "missing_targets": 0,
            "windows_without_targets": 0,
        }
    )
    assert steps == [pytest.approx([np.mean(np.square(errors1))]), pytest.approx(by_step2)]


def test_evaluator_look_back_reaches_into_earlier_parts_and_sees_no_future():
    values = np.arange(100, dtype=np.float32)[None]
    seen = []

    def record(context_NCP, horizon):
        seen.extend(context_NCP[:, 0, -1].tolist())
        return np.zeros((len(context_NCP), 1, horizon), np.float32)

    evaluate_protocol(record, [values], lookback=50, horizons=[5], progress=False)
    mean, std = zscore_stats(values[:, :70])
    last_seen = np.array(seen) * std[0] + mean[0]
    assert np.allclose(last_seen, np.arange(79, 95))  # starts 80..95, each sees up to t - 1
    with pytest.raises(ValueError, match="look-back of at most 80"):
        window_starts(ProtocolSplit.of(100), 5, 81)
    with pytest.raises(ValueError, match="longer than the test part"):
        evaluate_protocol(record, [values], lookback=10, horizons=[21], progress=False)


def test_seasonal_naive_forecasts_a_sine_exactly():
    t = np.arange(5000)
    sine = np.sin(2 * np.pi * t / 48)[None]
    assert autocorrelation_period([sine[0]]) == 48
    model = SeasonalNaive.fit([sine[:, :3500]])
    assert model.periods == [48]
    rows = evaluate_protocol(model, [sine], lookback=model.lookback, horizons=[96, 200], progress=False)
    assert all(row["mse"] < 1e-20 and row["mae"] < 1e-9 for row in rows)


def test_seasonal_naive_without_a_period_is_an_error():
    with pytest.raises(ValueError, match="use the ar baseline"):
        SeasonalNaive.fit([np.ones((1, 100))])


def test_ar_recovers_the_coefficients_of_an_ar2_process():
    rng = np.random.default_rng(0)
    phi1, phi2 = 0.6, -0.3
    x = np.zeros(60_000)
    noise = rng.normal(size=len(x))
    for i in range(2, len(x)):
        x[i] = phi1 * x[i - 1] + phi2 * x[i - 2] + noise[i]
    model = DirectAR.fit([x[None]], order=2, horizon=3)
    # one step ahead: x[t] = phi2 x[t-2] + phi1 x[t-1] (lags in time order)
    assert model.coef_PH[:, 0] == pytest.approx([phi2, phi1], abs=0.01)
    # two steps ahead (direct form): x[t+1] = (phi1^2 + phi2) x[t-1] + phi1 phi2 x[t-2]
    assert model.coef_PH[:, 1] == pytest.approx([phi1 * phi2, phi1**2 + phi2], abs=0.02)
    assert abs(model.intercept_H[0]) < 0.02


def test_ar_order_is_chosen_on_validation():
    rng = np.random.default_rng(1)
    x = np.zeros(20_000)
    noise = rng.normal(size=len(x))
    for i in range(3, len(x)):
        x[i] = 0.5 * x[i - 1] - 0.2 * x[i - 2] + 0.25 * x[i - 3] + noise[i]
    series = [x[None]]
    split = ProtocolSplit.of(len(x))
    model, scores = DirectAR.fit_select(series, [split], horizon=1, orders=[1, 3, 40])
    assert set(scores) == {1, 3, 40}
    assert scores[3] < scores[1]
    assert model.order in (3, 40) and scores[model.order] == min(scores.values())
    assert model(np.zeros((2, 1, 50), np.float32), 1).shape == (2, 1, 1)
    with pytest.raises(ValueError, match="horizons up to 1"):
        model(np.zeros((2, 1, 50), np.float32), 2)
