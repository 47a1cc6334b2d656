"""A linear path fitted as the AR baseline is (`TimeSeriesForecaster.linear_orders`): before the
trunk learns anything, the per-dataset model's forecasts are those of the AR baseline of the
protocol, band by band of the protocol's horizons, with each band's order chosen on validation.

Shape legend: N windows, C channels, P look-back, H horizon, T samples.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from genoformer.data.splits import SplitSpec
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.data.timeseries.store import TimeSeriesStore, prepare_timeseries_store

from genoformer.timeseries.baselines import DirectAR, fill_short_gaps
from genoformer.timeseries.module import TimeSeriesForecaster
from genoformer.timeseries.protocol import ProtocolSplit, zscore_stats

LENGTH = 6000  # 0.7 and 0.2 of it are whole: the data module's region split is the protocol's
ORDERS = [4, 12, 48]


def series(seed: int = 0) -> np.ndarray:
    """A daily cycle (period 24) under AR(2) noise, around 50 with a spread of ~10 (not z-scored),
    with scattered single missing values and one gap longer than the baselines fill."""
    rng = np.random.default_rng(seed)
    noise_T = np.zeros(LENGTH)
    for t in range(2, LENGTH):
        noise_T[t] = 1.2 * noise_T[t - 1] - 0.4 * noise_T[t - 2] + rng.normal()
    values_T = 50 + 8 * np.sin(2 * np.pi * np.arange(LENGTH) / 24) + 3 * noise_T
    values_T[rng.integers(0, LENGTH, size=40)] = np.nan
    values_T[2000:2050] = np.nan
    return values_T


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ar_path")
    values_T = series()
    np.save(folder / "s.npy", values_T.astype(np.float32)[:, None])
    store = prepare_timeseries_store([folder / "s.npy"], folder / "s.zarr", sampling_rate=1.0, progress=False)
    data = TimeSeriesDataModule(
        store=str(store), context=64, horizon=200, split=SplitSpec(val_fraction=0.1, test_fraction=0.2)
    )
    torch.manual_seed(0)
    module = TimeSeriesForecaster(
        transformer={"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 8, "causal": True},
        forecast={
            "patch_len": 16,
            "context": 64,
            "horizon": 200,
            "every_token": True,
            "stats_fraction": 0.25,
            "linear_order": 32,
            "quantiles": [0.1, 0.9],
        },
        linear_orders=ORDERS,
    )
    chosen = module.fit_linear_path_as_ar(data.series_with_splits())
    opened = TimeSeriesStore(store)
    return values_T.astype(np.float32), module, chosen, (float(opened.mean[0]), float(opened.std[0]))


def test_before_training_the_model_forecasts_what_the_ar_baseline_does_band_by_band(fitted):
    values_T, module, chosen, (store_mean, store_std) = fitted
    assert list(chosen) == [96, 192, 200]  # the protocol's bands up to the model's horizon
    assert all(c["order"] <= 32 for c in chosen.values()) and 48 not in chosen[96]["validation_mse"]
    # the protocol's AR baseline: z-scored with the training part's statistics, short gaps filled
    split = ProtocolSplit.of(LENGTH, 0.7, 0.2)
    mean_C, std_C = zscore_stats(values_T[None, : split.train_end])
    zscored_CT = fill_short_gaps((values_T[None] - mean_C[:, None]) / std_C[:, None])
    starts = np.arange(split.test_start, LENGTH - 200, 37)
    context_NCP = np.stack([values_T[None, s - 64 : s] for s in starts])
    # whole contexts only: a missing value at the start of the AR's look-back reads as the training
    # mean there (fill_lookback), while the model carries the value before it in its longer context
    context_NCP = context_NCP[~np.isnan(context_NCP).any(axis=(1, 2))]
    assert len(context_NCP) > 15
    with torch.no_grad():  # the model reads the store's normalized values, as the data module gives them
        point_NCH, _ = module(torch.from_numpy((context_NCP - store_mean) / store_std))
    model_NCH = point_NCH.double().numpy() * store_std + store_mean
    start = 0
    for end, choice in chosen.items():
        ar = DirectAR.fit([zscored_CT[:, : split.train_end]], choice["order"], end)
        expected_NCH = (
            ar((context_NCP - mean_C[:, None]) / std_C[:, None], end)[..., start:end] * std_C[:, None] + mean_C[:, None]
        )
        assert np.abs(model_NCH[..., start:end] - expected_NCH).max() < 1e-3 * std_C[0], end
        start = end


def test_orders_beyond_the_path_are_refused():
    with pytest.raises(ValueError, match="no order in"):
        TimeSeriesForecaster(
            transformer={"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 8, "causal": True},
            forecast={
                "patch_len": 16,
                "context": 64,
                "horizon": 24,
                "every_token": True,
                "stats_fraction": 0.25,
                "linear_order": 32,
            },
            linear_orders=[64, 128],
        )


def test_window_normalized_data_cannot_be_fitted_as_ar(tmp_path):
    np.save(tmp_path / "s.npy", series()[:, None].astype(np.float32))
    store = prepare_timeseries_store([tmp_path / "s.npy"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    data = TimeSeriesDataModule(
        store=str(store),
        context=64,
        horizon=24,
        window_normalize=True,
        split=SplitSpec(val_fraction=0.1, test_fraction=0.2),
    )
    with pytest.raises(ValueError, match="linear_fit_batches"):
        data.series_with_splits()
    data = TimeSeriesDataModule(store=str(store), context=64, horizon=24, split=SplitSpec(val_fraction=0.0))
    with pytest.raises(ValueError, match="val_fraction"):
        data.series_with_splits()
