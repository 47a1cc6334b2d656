"""The linear path's least-squares fit on series with missing values, its look-back filling, and
a trunk that starts at it.

Shape legend: B batch, C channels, L context samples, H horizon samples, N samples.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries import baselines
from genoformer.timeseries.model import (
    ForecastConfig,
    TimeSeriesTransformer,
    fill_short_gaps,
    fill_unobserved,
    instance_normalize,
)


def ar2_windows(n_windows: int, length: int, seed: int = 0) -> torch.Tensor:
    """(n_windows, 1, length) stretches of x[t] = 1.5 x[t-1] - 0.75 x[t-2] + e[t]."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=20_000)
    x = np.zeros(len(e))
    for t in range(2, len(e)):
        x[t] = 1.5 * x[t - 1] - 0.75 * x[t - 2] + e[t]
    starts = rng.integers(100, len(e) - length, size=n_windows)
    return torch.tensor(np.stack([x[s : s + length] for s in starts]), dtype=torch.float32)[:, None]


def linear_model(every_token: bool, seed: int = 0) -> TimeSeriesTransformer:
    torch.manual_seed(seed)
    return TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64, causal=every_token),
        ForecastConfig(
            patch_len=8,
            context=96,
            horizon=16,
            quantiles=[0.1, 0.9],
            linear_order=16,
            every_token=every_token,
            stats_fraction=0.25 if every_token else 1.0,
        ),
    )


@pytest.mark.parametrize("every_token", [False, True])
def test_scattered_missing_values_leave_the_fit_its_windows(every_token):
    """A missing sample in every window (as in traffic_volume, where no training window is whole)
    must not leave the least squares with no rows: short gaps are filled, so every forecast counts."""
    model = linear_model(every_token)
    windows_BCN = ar2_windows(3000 if every_token else 12000, 96 + 16)
    rng = np.random.default_rng(1)
    for row, offset in enumerate(rng.integers(1, 12, size=len(windows_BCN))):
        windows_BCN[row, 0, offset:110:12] = float("nan")  # one missing sample in 12, none at the ends
    context_BCL, target_BCH = windows_BCN[..., :96], windows_BCN[..., 96:]
    _, _, _, rows = model.linear_normal_equations(context_BCL, target_BCH, fill_limit=0)
    assert int(rows) == 0  # 16 lags and 16 targets always hold a hole: unfilled, nothing is left
    _, _, _, rows = model.linear_normal_equations(context_BCL, target_BCH)
    tokens = 12 - model.forecast_config.trained_tokens(96) if every_token else 1
    assert int(rows) == len(windows_BCN) * tokens


def test_rows_whose_lags_reach_a_long_gap_or_the_window_start_are_left_out():
    model = linear_model(every_token=True)
    cfg = model.forecast_config
    first = cfg.trained_tokens(96)  # trained tokens end at samples 24, 32, ..., 96
    context_BCL = torch.randn(1, 1, 96)
    target_BCH = torch.randn(1, 1, 16)
    ends = [96 - (11 - t) * 8 for t in range(first, 12)]
    _, _, _, rows = model.linear_normal_equations(context_BCL, target_BCH)
    assert int(rows) == sum(end >= 16 for end in ends)  # 16 lags must lie inside the window
    context_BCL[..., 40:80] = float("nan")  # 40 samples: longer than FIT_FILL_LIMIT, stays a gap
    _, _, _, rows = model.linear_normal_equations(context_BCL, target_BCH)
    # kept: lags [end - 16, end) and targets [end, end + 16) both clear of [40, 80)
    assert int(rows) == sum(end >= 16 and (end <= 40 - 16 or end - 16 >= 80) for end in ends)


def test_short_gaps_are_filled_as_the_baselines_fill_them():
    rng = np.random.default_rng(0)
    x_N = rng.normal(size=200)
    for start, length in [(10, 1), (30, 5), (60, 32), (120, 33)]:
        x_N[start : start + length] = np.nan
    expected_N = baselines.fill_short_gaps(x_N[None], limit=32)[0]
    filled_N = fill_short_gaps(torch.tensor(x_N, dtype=torch.float32)[None, None], limit=32)[0, 0].numpy()
    assert np.array_equal(np.isnan(filled_N), np.isnan(expected_N))  # the 33-sample gap stays
    assert np.allclose(filled_N[~np.isnan(filled_N)], expected_N[~np.isnan(expected_N)])
    x_N[:3] = np.nan  # at the window's start the gap's length is unknown: left missing
    assert torch.isnan(fill_short_gaps(torch.tensor(x_N)[None, None], limit=32)[0, 0, :3]).all()


def test_unobserved_lags_read_as_the_last_observed_value():
    x_BCL = torch.tensor([[[float("nan"), 2.0, 4.0, float("nan"), float("nan"), 7.0, float("nan")]]])
    _, stats = instance_normalize(x_BCL, observed_BCL=torch.isfinite(x_BCL))
    assert torch.equal(fill_unobserved(x_BCL, stats), torch.tensor([[[13 / 3, 2.0, 4.0, 4.0, 4.0, 7.0, 7.0]]]))
    context_NCP = x_BCL.numpy()[..., 1:]  # after the first observed value: what the AR baseline reads
    assert np.allclose(fill_unobserved(x_BCL[..., 1:], stats).numpy(), baselines.fill_lookback(context_NCP))


def test_an_untrained_every_token_model_forecasts_its_linear_path():
    """The trunk's head starts at zero, so training starts from the fitted linear path instead of
    adding the head's initial noise to it."""
    model = linear_model(every_token=True).eval()
    windows_BCN = ar2_windows(2000, 96 + 16)
    model.set_linear(*model.linear_normal_equations(windows_BCN[..., :96], windows_BCN[..., 96:])[:2])
    context_BCL = windows_BCN[:4, :, :96]
    with torch.no_grad():
        point_BCH, quantiles_BCHK = model(context_BCL)
    by_hand_BCH = context_BCL[..., -16:] @ model.linear_coef_PH + model.linear_bias_H
    assert torch.allclose(point_BCH, by_hand_BCH, atol=1e-4)
    assert torch.allclose(quantiles_BCHK, by_hand_BCH[..., None].expand_as(quantiles_BCHK), atol=1e-4)
