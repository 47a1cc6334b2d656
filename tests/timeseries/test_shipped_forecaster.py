"""The general forecaster shipped in examples/ (trained across seven datasets on a GPU by
benchmarks/gpu_timeseries.sh; its protocol table is in docs/timeseries.md and BENCHMARKS.md): it
loads on a CPU, forecasts in the series' own units, and beats the naive forecasts on the shipped
ECG's last fifth (the protocol's test part, which no training saw).

Shape legend: N windows, C channels, L look-back, H horizon, K quantile levels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from genoformer.timeseries.forecaster import Forecaster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHIPPED = EXAMPLES / "genoformer_forecaster.ckpt"


@pytest.fixture(scope="module")
def forecaster() -> Forecaster:
    return Forecaster.from_checkpoint(SHIPPED, device="cpu")


@pytest.fixture(scope="module")
def ecg_windows() -> tuple[np.ndarray, np.ndarray]:
    """24 look-backs of 1,024 samples ending in the ECG's last fifth, and the 96 samples after each."""
    values = np.loadtxt(EXAMPLES / "ecg_mitbih208_360hz.csv", delimiter=",", skiprows=1, usecols=1)
    test_start = int(0.8 * len(values))
    starts = np.linspace(test_start, len(values) - 96, 24).astype(int)
    return (np.stack([values[s - 1024 : s] for s in starts])[:, None], np.stack([values[s : s + 96] for s in starts]))


def test_the_shipped_forecaster_is_small_and_named_for_what_it_is(forecaster):
    assert "forecast" in SHIPPED.name and SHIPPED.stat().st_size <= 20 * 2**20
    assert (forecaster.config.context, forecaster.config.horizon) == (1024, 720)
    assert forecaster.config.quantiles == [0.1, 0.5, 0.9]


def test_it_beats_the_naive_forecasts_on_unseen_ecg(forecaster, ecg_windows):
    context_NCL, truth_NH = ecg_windows
    result = forecaster.forecast(context_NCL, horizon=96)
    assert result.point.shape == (24, 1, 96) and result.quantiles.shape == (24, 1, 96, 3)
    model = np.mean((result.point[:, 0] - truth_NH) ** 2)
    last_value = np.mean((context_NCL[:, 0, -1:] - truth_NH) ** 2)
    repeat_last_96 = np.mean((context_NCL[:, 0, -96:] - truth_NH) ** 2)
    assert model < 0.75 * min(last_value, repeat_last_96), (model, last_value, repeat_last_96)
    lower, median, upper = np.moveaxis(result.quantiles[:, 0], -1, 0)
    assert (lower <= median + 1e-4).mean() > 0.99 and (median <= upper + 1e-4).mean() > 0.99


def test_it_forecasts_in_any_units(forecaster, ecg_windows):
    """Window normalisation and the centered linear path: forecasting 3 x + 50 gives 3 f(x) + 50."""
    context_NCL, _ = ecg_windows
    plain = forecaster.forecast(context_NCL[:4], horizon=96).point
    moved = forecaster.forecast(3 * context_NCL[:4] + 50, horizon=96).point
    assert np.allclose(moved, 3 * plain + 50, atol=1e-3)
