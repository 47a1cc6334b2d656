"""Validation of a forecaster trained on several stores: `val/mse_store_mean`, the mean of the
stores' own MSEs, so that a store with most of the windows does not alone pick the best
checkpoint (configs/timeseries_general_gpu.yaml monitors it).

Shape legend: B batch, C channels, L context samples, H horizon samples, N samples.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from genoformer.data.splits import SplitSpec
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.data.timeseries.store import prepare_timeseries_store

from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.model import ForecastConfig
from genoformer.timeseries.module import TimeSeriesForecaster
from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTEXT, HORIZON = 16, 8


def save_store(folder: Path, name: str, values_N: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{name}.npy", values_N.astype(np.float32)[:, None])
    return prepare_timeseries_store(
        [folder / f"{name}.npy"], folder / f"{name}.zarr", sampling_rate=1.0, progress=False
    )


def two_stores(folder: Path) -> list[Path]:
    """A long smooth store and a short noisy one with gaps in its validation region: 200 and 10
    validation windows (horizon 8, stride 8, the last tenth of each series)."""
    rng = np.random.default_rng(0)
    smooth_N = np.sin(2 * np.pi * np.arange(16_000) / 64) + 0.05 * rng.normal(size=16_000)
    noisy_N = np.cumsum(rng.normal(size=800)) + rng.normal(size=800)
    noisy_N[[730, 745, 746, 790]] = np.nan
    return [save_store(folder, "smooth", smooth_N), save_store(folder, "noisy", noisy_N)]


def data_module(stores: list[Path], **options) -> TimeSeriesDataModule:
    return TimeSeriesDataModule(
        [str(path) for path in stores],
        context=CONTEXT,
        horizon=HORIZON,
        batch_size=7,
        num_workers=0,
        eval_stride=HORIZON,
        eval_context_before_split=True,
        split=SplitSpec(val_fraction=0.1),
        **options,
    )


def forecaster() -> TimeSeriesForecaster:
    torch.manual_seed(0)
    return TimeSeriesForecaster(
        TransformerConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=8),
        ForecastConfig(patch_len=8, context=CONTEXT, horizon=HORIZON),
    )


def validate(module: TimeSeriesForecaster, dm: TimeSeriesDataModule) -> dict[str, float]:
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.validate(module, datamodule=dm)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


def mse_by_hand(module: TimeSeriesForecaster, part) -> float:
    """The MSE of every observed target value of one store's validation windows."""
    windows = [part[index] for index in range(len(part))]
    context_BCL = torch.stack([window["context"] for window in windows])
    target_BCH = torch.stack([window["target"] for window in windows])
    with torch.no_grad():
        point_BCH, _ = module.eval()(context_BCL)
    observed_BCH = torch.isfinite(target_BCH)
    return float(torch.square(point_BCH - target_BCH)[observed_BCH].double().mean())


def test_the_store_mean_weighs_a_small_store_as_much_as_one_with_20_times_its_windows(tmp_path):
    dm = data_module(two_stores(tmp_path))
    module = forecaster()
    metrics = validate(module, dm)
    smooth, noisy = dm.datasets["val"].parts
    assert (len(smooth), len(noisy)) == (200, 10)
    by_hand = [mse_by_hand(module, smooth), mse_by_hand(module, noisy)]
    assert metrics["val/mse/smooth"] == pytest.approx(by_hand[0], rel=1e-5)
    assert metrics["val/mse/noisy"] == pytest.approx(by_hand[1], rel=1e-5)
    assert metrics["val/mse_store_mean"] == pytest.approx(sum(by_hand) / 2, rel=1e-5)
    # val/mse weighs every window alike: close to the big store's MSE, far from the mean of the two
    assert abs(metrics["val/mse"] - by_hand[0]) < abs(metrics["val/mse"] - metrics["val/mse_store_mean"])
    assert metrics["val/mse"] != pytest.approx(metrics["val/mse_store_mean"], rel=0.1)


@pytest.mark.parametrize("channel_independent", [False, True])
def test_one_store_logs_no_store_metric(tmp_path, channel_independent):
    dm = data_module(two_stores(tmp_path)[:1], channel_independent=channel_independent)
    metrics = validate(forecaster(), dm)
    assert "val/mse" in metrics
    assert not [name for name in metrics if name.startswith(("val/mse_store", "val/mse/"))]


def test_a_store_the_validation_limit_cuts_off_is_named(tmp_path):
    dm = data_module(two_stores(tmp_path))  # the big store's 200 windows come first
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=2,
    )
    with pytest.warns(UserWarning, match=r"leaves out the stores \['noisy'\]"):
        trainer.validate(forecaster(), datamodule=dm)
    assert "val/mse/noisy" not in trainer.callback_metrics
    assert float(trainer.callback_metrics["val/mse_store_mean"]) == float(trainer.callback_metrics["val/mse/smooth"])


def test_the_general_config_keeps_its_best_checkpoint_by_the_store_mean(tmp_path):
    stores = two_stores(tmp_path / "stores")
    cli = training_cli(
        [
            "--config",
            str(REPO_ROOT / "configs" / "timeseries_general_gpu.yaml"),
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "2",
            "--trainer.val_check_interval",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.store",
            str([str(path) for path in stores]),
            "--data.init_args.batch_size",
            "8",
            "--data.init_args.num_workers",
            "0",
            "--data.init_args.samples_per_epoch",
            "64",
            "--data.init_args.eval_stride",
            str(HORIZON),
            "--model.init_args.forecast.context",
            "32",
            "--model.init_args.forecast.horizon",
            str(HORIZON),
            "--model.init_args.forecast.patch_len",
            "8",
            "--model.init_args.forecast.linear_order",
            "8",
            "--model.init_args.linear_fit_batches",
            "2",
            "--model.init_args.warmup_steps",
            "1",
            "--model.init_args.transformer.d_model",
            "16",
            "--model.init_args.transformer.n_layers",
            "1",
            "--model.init_args.transformer.n_heads",
            "2",
            "--model.init_args.transformer.max_seq_len",
            "8",
        ],
        run=False,
    )
    best = next(callback for callback in cli.trainer.callbacks if getattr(callback, "monitor", None))
    assert best.monitor == "val/mse_store_mean"
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    metrics = cli.trainer.callback_metrics
    assert {"val/mse/smooth", "val/mse/noisy"} <= set(metrics)
    assert Path(best.best_model_path).is_file()
    assert float(best.best_model_score) == pytest.approx(float(metrics["val/mse_store_mean"]))
