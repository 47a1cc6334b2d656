"""A general forecaster's training data: windows normalised by their own context, with a floor on
that scale, so that an intermittent channel (a sub-meter at 0 for hours, then a spike) neither
dominates the loss nor the linear path's least-squares fit.

Shape legend: B batch, C channels, L context samples, H horizon samples, N samples.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from genoformer.data.splits import SplitSpec
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.data.timeseries.datasets import TimeSeriesWindowDataset, normalize_by_context
from genoformer.data.timeseries.store import prepare_timeseries_store

from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer, instance_normalize


def save_store(tmp_path, name: str, values_N: np.ndarray):
    tmp_path.mkdir(parents=True, exist_ok=True)
    np.save(tmp_path / f"{name}.npy", values_N.astype(np.float32)[:, None])
    return prepare_timeseries_store(
        [tmp_path / f"{name}.npy"], tmp_path / f"{name}.zarr", sampling_rate=1.0, progress=False
    )


def intermittent(length: int, seed: int = 0) -> np.ndarray:
    """A sub-meter: 0, a one-unit reading now and then, and a spike of 40 units every ~300 steps."""
    rng = np.random.default_rng(seed)
    values_N = np.where(rng.random(length) < 0.003, 1.0, 0.0)
    spikes_N = rng.random(length) < 1 / 300
    return np.where(spikes_N, 40.0, values_N)


def seasonal(length: int, seed: int = 1) -> np.ndarray:
    """A daily cycle of period 24 with AR(1) noise: what a linear path should learn to forecast."""
    rng = np.random.default_rng(seed)
    noise_N = np.zeros(length)
    for t in range(1, length):
        noise_N[t] = 0.8 * noise_N[t - 1] + 0.3 * rng.normal()
    return np.sin(2 * np.pi * np.arange(length) / 24) + noise_N


def test_the_floor_bounds_the_scale_and_zero_keeps_the_old_rule():
    context_CL = np.array([[0.0] * 7 + [0.01], [3.0] * 8, [0.0, 2.0] * 4])
    values_CS = np.concatenate([context_CL, [[40.0], [4.0], [1.0]]], axis=1).astype(np.float32)
    unfloored = normalize_by_context(values_CS, 8)
    assert abs(unfloored[0, -1]) > 10_000  # a blip of 0.01 in the context: the spike after it is huge
    assert unfloored[1].tolist() == pytest.approx([0.0] * 8 + [1.0])  # a constant context keeps scale 1
    floored = normalize_by_context(values_CS, 8, 0.5)
    assert floored[0, -1] == pytest.approx((40.0 - 0.01 / 8) / 0.5, rel=1e-5)
    assert floored[1, -1] == pytest.approx(2.0)  # constant: the floor is the scale
    assert floored[2].tolist() == pytest.approx(unfloored[2].tolist())  # spread 1 > 0.5: untouched
    per_channel = normalize_by_context(values_CS, 8, np.array([0.5, 0.25, 0.0]))
    assert per_channel[1, -1] == pytest.approx(4.0) and per_channel[2].tolist() == pytest.approx(unfloored[2].tolist())


def test_the_floor_is_relative_to_the_store_scale(tmp_path):
    path = save_store(tmp_path, "meter", intermittent(4000))
    raw, zscored = (
        TimeSeriesWindowDataset(
            path, 64, 16, stride=16, normalize=normalize, window_normalize=True, window_scale_floor=0.5
        )
        for normalize in (False, True)
    )
    for index in range(len(raw)):  # the same windows whatever the units the store is read in
        assert torch.allclose(raw[index]["target"], zscored[index]["target"], atol=1e-3)
        assert raw[index]["target"].abs().max() <= 2 * 40.0 / raw.store.std[0] + 1e-3
    with pytest.raises(ValueError, match="window_scale_floor must be at least 0"):
        TimeSeriesWindowDataset(path, 64, 16, window_scale_floor=-1.0)


def linear_model() -> TimeSeriesTransformer:
    torch.manual_seed(0)
    return TimeSeriesTransformer(
        TransformerConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16, causal=True),
        ForecastConfig(
            patch_len=8,
            context=96,
            horizon=24,
            quantiles=[0.1, 0.9],
            every_token=True,
            stats_fraction=0.25,
            linear_order=48,
            linear_centered=True,
        ),
    )


def linear_path_mse_on_seasonal(floor: float, tmp_path) -> tuple[float, float]:
    """The linear path fitted on a mix of a seasonal and an intermittent store, window-normalised
    with `floor`; its MSE on z-scored windows of an unseen seasonal series, and the share of the
    training windows' squared targets that the intermittent store holds."""
    paths = [save_store(tmp_path, "seasonal", seasonal(6000)), save_store(tmp_path, "meter", intermittent(6000))]
    dm = TimeSeriesDataModule(
        [str(p) for p in paths],
        context=96,
        horizon=24,
        batch_size=64,
        num_workers=0,
        samples_per_epoch=2048,
        channel_independent=True,
        window_normalize=True,
        window_scale_floor=floor,
        split=SplitSpec(val_fraction=0.1),
    )
    dm.setup("fit")
    model = linear_model()
    sums, meter_square, all_square = None, 0.0, 0.0
    for batch in itertools.islice(dm.train_dataloader(), 16):
        parts = model.linear_normal_equations(batch["context"], batch["target"])
        sums = list(parts) if sums is None else [a + b for a, b in zip(sums, parts)]
        square_B = batch["target"].square().mean(dim=(1, 2))
        meter_square += float(square_B[batch["store"] == 1].sum())
        all_square += float(square_B.sum())
    model.set_linear(sums[0], sums[1])
    series_N = seasonal(3000, seed=7)
    series_N = (series_N - series_N.mean()) / series_N.std()
    starts = range(0, 3000 - 120, 7)
    context_BCL = torch.tensor(np.stack([series_N[s : s + 96] for s in starts]), dtype=torch.float32)[:, None]
    target_BCH = torch.tensor(np.stack([series_N[s + 96 : s + 120] for s in starts]), dtype=torch.float32)[:, None]
    _, stats = instance_normalize(context_BCL, model.forecast_config.norm_eps, 24)
    with torch.no_grad():
        forecast_BCH = model.linear_forecasts(context_BCL, 96 // 8 - 1, stats)[:, :, 0]
    return float((forecast_BCH - target_BCH).square().mean()), meter_square / all_square


def test_an_intermittent_store_no_longer_dominates_the_linear_fit(tmp_path):
    unfloored_mse, unfloored_share = linear_path_mse_on_seasonal(0.0, tmp_path / "unfloored")
    floored_mse, floored_share = linear_path_mse_on_seasonal(0.5, tmp_path / "floored")
    assert unfloored_share > 0.9 and floored_share < 0.8  # half the windows each; without a floor one store is the loss
    assert floored_mse < 0.92 * unfloored_mse  # 0.43 against 0.48
