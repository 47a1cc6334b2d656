"""Window moments against the windows themselves, DLinear's decomposition and fit, and the
linear baselines on series with a known linear answer."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from genoformer.timeseries.baselines import (
    DirectAR,
    DLinear,
    WindowMoments,
    fill_short_gaps,
    linear_mse,
    linear_problem,
    trend,
    trend_transposed,
)
from genoformer.timeseries.protocol import ProtocolSplit, evaluate_protocol


def direct_moments(parts, span):
    outer, total, count = np.zeros((span, span)), np.zeros(span), 0
    for part in parts:
        if len(part) < span:
            continue
        windows = sliding_window_view(np.asarray(part, dtype=np.float64), span)
        windows = windows[~np.isnan(windows).any(axis=1)]
        outer += windows.T @ windows
        total += windows.sum(axis=0)
        count += len(windows)
    return outer, total, count


@pytest.mark.parametrize("direct_windows", [0, 10_000])  # every run through the FFT, or every run summed directly
def test_window_moments_equal_the_sums_over_the_windows(direct_windows):
    rng = np.random.default_rng(0)
    long = np.cumsum(rng.normal(size=3001)) * 0.1 + rng.normal(size=3001)
    long[[5, 6, 1500, 2999]] = np.nan  # runs of 5, 1493, 1498 and 1 values
    parts = [long, rng.normal(size=61), np.full(10, np.nan)]
    moments = WindowMoments(parts, 47, direct_windows=direct_windows)
    for span in (1, 2, 30, 47):
        outer, total, count = moments.moments(span)
        want_outer, want_total, want_count = direct_moments(parts, span)
        assert count == want_count == moments.count(span)
        assert np.allclose(outer, want_outer, rtol=1e-10, atol=1e-8) and np.allclose(total, want_total, atol=1e-9)
    with pytest.raises(ValueError, match=r"span must be in \[1, 47\]"):
        moments.moments(48)


def test_linear_problem_and_mse_match_the_windows():
    rng = np.random.default_rng(1)
    x = rng.normal(size=500)
    problem = linear_problem(WindowMoments([x], 7).moments(7), 4)  # 4 lags, 3 targets
    weights = rng.normal(size=(5, 3))
    windows = sliding_window_view(x, 7)
    forecasts = windows[:, :4] @ weights[:4] + weights[4]
    assert linear_mse(weights, problem) == pytest.approx(np.mean(np.square(forecasts - windows[:, 4:])))


def test_trend_is_the_papers_moving_average_and_its_transpose():
    x = np.arange(40, dtype=np.float64)
    trend_x = trend(x[:, None])[:, 0]
    padded = np.r_[[0.0] * 12, x, [39.0] * 12]  # the ends repeated (25 - 1) // 2 times
    assert np.allclose(trend_x, [padded[t : t + 25].mean() for t in range(40)])
    A = trend(np.eye(40))
    g = np.random.default_rng(2).normal(size=(40, 3))
    assert np.allclose(trend_transposed(g), A.T @ g) and np.allclose(A.sum(axis=1), 1.0)


def test_dlinear_recovers_a_known_linear_answer():
    """An AR(1) process x[t] = 0.9 x[t-1] + noise: the best forecast of step h is 0.9^h times the
    last value, whatever else the look-back holds; DLinear, trained on the training part, finds it."""
    rng = np.random.default_rng(0)
    x = np.zeros(40_000)
    noise = rng.normal(size=len(x))
    for t in range(1, len(x)):
        x[t] = 0.9 * x[t - 1] + noise[t]
    split = ProtocolSplit.of(len(x))
    model = DLinear.fit([x[None]], [split], horizon=4, lookback=48)
    weights = model.weights_CP1H[0]  # (49, 4): 48 lags (oldest first) and the intercept
    assert weights[47] == pytest.approx([0.9**h for h in (1, 2, 3, 4)], abs=0.03)
    assert np.abs(weights[:47]).max() < 0.05 and np.abs(weights[48]).max() < 0.05
    best = [1.0, 1 + (1 + 0.81) + (1 + 0.81 + 0.9**4) + (1 + 0.81 + 0.9**4 + 0.9**6)]  # error variance, steps 1..4
    assert model.info["best_step"] > 0 and model.info["validation_mse"] == pytest.approx(best[1] / 4, rel=0.1)
    rows = evaluate_protocol(model, [x[None]], lookback=48, horizons=[1, 4], progress=False)
    scale = np.var(x[: split.train_end])  # the evaluator z-scores with the training part's statistics
    assert rows[0]["mse"] == pytest.approx(best[0] / scale, rel=0.08)
    assert rows[1]["mse"] == pytest.approx(best[1] / 4 / scale, rel=0.08)


def test_dlinear_forecasts_a_trend_and_a_season_exactly():
    t = np.arange(6000, dtype=np.float64)
    x = (np.sin(2 * np.pi * t / 24) + 0.0005 * t)[None]
    split = ProtocolSplit.of(x.shape[1])
    mean, std = x[:, : split.train_end].mean(), x[:, : split.train_end].std()
    z = (x - mean) / std
    model = DLinear.fit([z], [split], horizon=24, lookback=96)
    rows = evaluate_protocol(model, [x], lookback=96, horizons=[24], progress=False)
    assert rows[0]["mse"] < 1e-3
    individual = DLinear.fit(
        [np.concatenate([z, -z])], [split], horizon=24, lookback=96, individual=True, max_steps=200
    )
    assert individual.weights_CP1H.shape == (2, 97, 24) and len(individual.info["channels"]) == 2


def test_direct_ar_through_moments_matches_a_plain_least_squares_fit():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3000)).cumsum(axis=1) * 0.05 + rng.normal(size=(2, 3000))
    model = DirectAR.fit([x], order=6, horizon=3)
    windows = np.concatenate([sliding_window_view(channel, 9) for channel in x])
    design = np.concatenate([windows[:, :6], np.ones((len(windows), 1))], axis=1)
    solution = np.linalg.lstsq(design, windows[:, 6:], rcond=None)[0]
    assert np.allclose(model.coef_PH, solution[:6], atol=1e-5) and np.allclose(
        model.intercept_H, solution[6], atol=1e-5
    )


def test_short_gaps_are_filled_for_fitting_and_long_ones_kept():
    x = np.array([[np.nan, 1.0, np.nan, np.nan, 4.0] + [np.nan] * 40 + [7.0]])
    filled = fill_short_gaps(x, limit=32)
    assert filled[0, :5].tolist() == [1.0, 1.0, 1.0, 1.0, 4.0] and np.isnan(filled[0, 5:45]).all()
    assert np.isnan(x[0, 0])  # a copy
