"""Time-series forecasters: instance normalisation, patching, the model, the Python API, a short
fit through `genoformer fit` and the forecast/evaluate commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from genoformer.data.splits import SplitSpec
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.data.timeseries.store import prepare_timeseries_store
from genoformer.kernels.layout import SlidingWindow

from genoformer.cli import main
from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.forecaster import Forecaster
from genoformer.timeseries.model import (
    ForecastConfig,
    TimeSeriesTransformer,
    instance_normalize,
    lag_windows,
    patchify,
    pinball_loss,
    token_targets,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def tiny_forecaster(
    seed: int = 0,
    *,
    n_channels: int = 1,
    channel_independent: bool = True,
    quantiles=(0.1, 0.5, 0.9),
    causal: bool = False,
    attention=(None,),
    **forecast,
) -> Forecaster:
    torch.manual_seed(seed)
    values = dict(
        patch_len=8,
        context=100,
        horizon=20,
        n_channels=n_channels,
        channel_independent=channel_independent,
        quantiles=list(quantiles),
    )
    values.update(forecast)
    model = TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64, causal=causal, attention=list(attention)),
        ForecastConfig(**values),
    )
    return Forecaster(model, device="cpu")


def test_instance_normalization_round_trip():
    x_BCL = torch.randn(3, 2, 50, dtype=torch.float64) * torch.tensor([[[5.0], [0.5]]]) + 7
    z_BCL, stats = instance_normalize(x_BCL)
    assert torch.allclose(z_BCL.mean(-1), torch.zeros(3, 2), atol=1e-5)
    assert torch.allclose(z_BCL.std(-1, unbiased=False), torch.ones(3, 2), atol=1e-3)
    assert torch.allclose(stats.undo(z_BCL).double(), x_BCL, atol=1e-4)
    z_BCL, stats = instance_normalize(x_BCL, samples=10)  # the statistics of the first 10 samples
    assert torch.allclose(z_BCL[..., :10].mean(-1), torch.zeros(3, 2), atol=1e-5)
    assert torch.allclose(stats.undo(z_BCL).double(), x_BCL, atol=1e-4)
    constant = torch.full((1, 1, 10), 3.0)
    z_const, stats_const = instance_normalize(constant)
    assert torch.isfinite(z_const).all() and torch.allclose(stats_const.undo(z_const), constant)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 30])
def test_patching_aligns_to_the_end_and_marks_padding(length):
    x_SGL = torch.arange(1, 2 * length + 1, dtype=torch.float32).view(1, 2, length)
    values, observed = patchify(x_SGL, 8)
    n_patches = -(-length // 8)
    pad = n_patches * 8 - length
    assert values.shape == observed.shape == (1, n_patches, 16)
    # the last token holds the last 8 samples of channel 0, then of channel 1
    channel0 = torch.cat([torch.zeros(pad), x_SGL[0, 0]])
    channel1 = torch.cat([torch.zeros(pad), x_SGL[0, 1]])
    assert torch.equal(values[0, :, :8].reshape(-1), channel0)
    assert torch.equal(values[0, :, 8:].reshape(-1), channel1)
    assert observed[0].sum() == 2 * length and observed[0, 0, :pad].sum() == 0


@pytest.mark.parametrize("channel_independent", [True, False])
def test_forecast_shapes_univariate_and_multivariate(channel_independent):
    uni = tiny_forecaster()
    series = np.sin(np.arange(150) / 5).astype(np.float32)
    result = uni.forecast(series)
    assert result.point.shape == (20,) and result.quantiles.shape == (20, 3) and result.levels == [0.1, 0.5, 0.9]
    assert uni.forecast(series[None], horizon=7).point.shape == (1, 7)
    assert uni.forecast(np.stack([series[None]] * 4)).point.shape == (4, 1, 20)
    as_torch = uni.forecast(torch.from_numpy(series))
    assert isinstance(as_torch.point, torch.Tensor) and torch.allclose(as_torch.point, torch.from_numpy(result.point))
    # a list of different lengths (longer ones use their tail) gives one batch of forecasts
    listed = uni.forecast([series, series[: 13 + 8], series[-100:]])
    assert listed.point.shape == (3, 1, 20)
    assert np.allclose(listed.point[2, 0], result.point, atol=1e-5)  # the tail of 150 is the last 100

    multi = tiny_forecaster(n_channels=3, channel_independent=channel_independent, quantiles=())
    block = np.stack([series, 2 * series, -series])
    out = multi.forecast(block)
    assert out.point.shape == (3, 20) and out.quantiles is None
    if channel_independent:  # each channel is its own sequence: scaling one scales its forecast
        assert np.allclose(out.point[1], multi.forecast(np.stack([series, series, -series])).point[1] * 2, atol=1e-4)


def test_forecasts_are_in_the_units_of_the_input():
    forecaster = tiny_forecaster(seed=3)
    series = np.cos(np.arange(100) / 4).astype(np.float32)
    base = forecaster.forecast(series).point
    assert np.allclose(forecaster.forecast(series * 100 + 5).point, base * 100 + 5, rtol=1e-4, atol=1e-3)


def test_bad_inputs_are_clear_errors():
    forecaster = tiny_forecaster()
    good = np.zeros(50, np.float32)
    with pytest.raises(ValueError, match="infinite value.*channel 0, position 7.*NaN"):
        forecaster.forecast(np.where(np.arange(50) == 7, np.inf, good))
    with pytest.raises(ValueError, match=r"horizon must be in \[1, 20\]"):
        forecaster.forecast(good, horizon=21)
    with pytest.raises(ValueError, match="has 2 channel.*trained on 3"):
        tiny_forecaster(n_channels=3, channel_independent=False).forecast(np.zeros((2, 50), np.float32))
    with pytest.raises(ValueError, match="shorter than one patch"):
        forecaster.forecast(np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="shorter than one patch"):
        forecaster.embed([good, good[:3]])
    with pytest.raises(ValueError, match="max_seq_len=15 is too short.*at least 16"):
        TimeSeriesTransformer(
            TransformerConfig(d_model=32, n_heads=4, max_seq_len=15),
            ForecastConfig(patch_len=8, context=100, horizon=20),
        )
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees none; pass device='cpu'"):
            Forecaster(forecaster.model, device="cuda")


def test_an_ensemble_forecasts_the_mean_of_its_members():
    first, second = tiny_forecaster(seed=1), tiny_forecaster(seed=2)
    ensemble = Forecaster([first.model, second.model], device="cpu")
    series = [np.sin(np.arange(n) / 5).astype(np.float32) for n in (100, 60)]
    mean = ensemble.forecast(series, horizon=12)
    one, two = first.forecast(series, horizon=12), second.forecast(series, horizon=12)
    assert not np.allclose(one.point, two.point)
    assert np.allclose(mean.point, (one.point + two.point) / 2, atol=1e-5)
    assert np.allclose(mean.quantiles, (one.quantiles + two.quantiles) / 2, atol=1e-5)
    with pytest.raises(ValueError, match="averages 2 networks, and embeddings come from one"):
        ensemble.embed(series[0])
    with pytest.raises(ValueError, match="must agree on forecast.horizon: model 0 has 20, model 1 has 24"):
        Forecaster([first.model, tiny_forecaster(horizon=24).model], device="cpu")
    with pytest.raises(ValueError, match="must agree on forecast.quantiles"):
        Forecaster([first.model, tiny_forecaster(quantiles=()).model], device="cpu")
    with pytest.raises(ValueError, match="at least one model"):
        Forecaster([], device="cpu")


@pytest.mark.parametrize("causal", [False, True])
def test_causal_and_block_sparse_layouts_run(causal):
    # patches of 2 samples: 50 context tokens and 10 forecast tokens, 4 blocks of 16
    sparse = (SlidingWindow(window=16, block_size=16), None)
    forecaster = tiny_forecaster(causal=causal, attention=sparse, patch_len=2)
    series = np.random.default_rng(0).normal(size=100).astype(np.float32)
    assert forecaster.forecast(series).point.shape == (20,)
    dense = tiny_forecaster(causal=causal, patch_len=2)
    assert not np.allclose(forecaster.forecast(series).point, dense.forecast(series).point)


def test_pinball_loss_by_hand():
    target = torch.tensor([[[1.0, 2.0]]])
    quantiles = torch.tensor([[[[0.0, 2.0], [2.0, 2.0]]]])  # (1, 1, 2, K=2)
    levels = torch.tensor([0.1, 0.9])
    # step 0: y - f = (1, -1): 0.1 * 1 = 0.1 and (0.9 - 1) * -1 = 0.1; step 1: (0, 0): 0, 0
    assert pinball_loss(quantiles, target, levels).item() == pytest.approx(0.05)


def test_embeddings_are_tiled_and_stitched():
    forecaster = tiny_forecaster(quantiles=())
    series = np.random.default_rng(0).normal(size=(1, 300)).astype(np.float32)
    per_patch = forecaster.embed(series, pooling="none", window=96, overlap=32)[0]
    assert per_patch.shape == (1, 38, 32)  # ceil(300 / 8) patches
    pooled = forecaster.embed(series, window=96, overlap=32)[0]
    assert np.allclose(pooled, per_patch.mean(axis=1), atol=1e-5)
    # the last window covers the last 12 patches whole: the stitched tail is that window's output
    direct = forecaster.model.patch_embeddings(torch.from_numpy(series[None, :, -96:]))[0].detach().numpy()
    assert np.allclose(per_patch[:, -4:], direct[:, -4:], atol=1e-5)
    # a series within one window is embedded in one pass
    short = forecaster.embed(series[:, :50], pooling="none")[0]
    whole = forecaster.model.patch_embeddings(torch.from_numpy(series[None, :, :50]))[0].detach().numpy()
    assert np.allclose(short, whole, atol=1e-5)
    assert isinstance(forecaster.embed(torch.from_numpy(series))[0], torch.Tensor)


# ------------------------------------------------------------------------ data, fit and commands
def _sine_store(tmp_path: Path, length: int = 3000) -> Path:
    t = np.arange(length)
    rng = np.random.default_rng(0)
    values = (np.sin(2 * np.pi * t / 50) + 0.05 * rng.normal(size=length)).astype(np.float32)
    np.save(tmp_path / "sine.npy", values)
    return prepare_timeseries_store([tmp_path / "sine.npy"], tmp_path / "sine.zarr", sampling_rate=50.0, progress=False)


def test_empty_validation_or_test_split_is_an_error(tmp_path):
    store = _sine_store(tmp_path)
    module = TimeSeriesDataModule(
        str(store), context=64, horizon=16, num_workers=0, split=SplitSpec(val_fraction=0.1, test_fraction=0.0)
    )
    with pytest.raises(ValueError, match="test split .* is empty: set data.init_args.split.test_fraction"):
        module.setup("test")
    module.setup("fit")
    assert {"train", "val"} <= set(module.datasets)
    missing = TimeSeriesDataModule(str(tmp_path / "none.zarr"), context=64, horizon=16)
    with pytest.raises(FileNotFoundError, match="genoformer prepare_timeseries"):
        missing.prepare_data()


@pytest.mark.slow
def test_fit_tiny_config_then_forecast_embed_and_evaluate(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the config names examples/ecg_mitbih208_360hz.csv
    store = _sine_store(tmp_path, length=8000)
    run = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            "configs/timeseries_tiny_cpu.yaml",
            "--trainer.default_root_dir",
            str(run),
            "--data.init_args.store",
            str(store),
            "--data.init_args.sources",
            f"[{tmp_path / 'sine.npy'}]",
            "--trainer.max_steps",
            "80",
            "--trainer.val_check_interval",
            "40",
            "--model.init_args.warmup_steps",
            "5",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.batch_size",
            "16",
        ]
    )
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()

    forecaster = Forecaster.from_checkpoint(checkpoint, device="cpu")
    t = np.arange(700)
    sine = np.sin(2 * np.pi * t / 50).astype(np.float32)
    result = forecaster.forecast(sine[:600])
    assert result.point.shape == (96,) and result.quantiles.shape == (96, 3)
    # 80 steps on a sine already beat forecasting its mean (the error of zero is 0.5)
    assert np.mean((result.point - sine[600:696]) ** 2) < 0.5
    assert forecaster.embed(sine, pooling="mean")[0].shape == (1, 64)
    assert forecaster.embed(sine, pooling="none")[0].shape == (1, 44, 64)

    out = tmp_path / "model.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--horizons",
            "[16, 96]",
            "--lookback",
            "256",
            "--device",
            "cpu",
            "--baseline",
            "[]",
        ]
    )
    rows = json.loads(out.read_text())["results"]
    assert [(row["horizon"], row["lookback"], row["windows"]) for row in rows] == [(16, 256, 1585), (96, 256, 1505)]
    baseline = tmp_path / "ar.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--baseline",
            "ar",
            "--out",
            str(baseline),
            "--horizons",
            "[96]",
            "--ar_orders",
            "[4, 64]",
        ]
    )
    assert json.loads(baseline.read_text())["results"][0]["mse"] < 0.05  # a noisy sine is linear-predictable
    # an ensemble of the same checkpoint twice scores as the checkpoint alone
    twice = tmp_path / "twice.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--checkpoint",
            f"[{checkpoint}, {checkpoint}]",
            "--out",
            str(twice),
            "--horizons",
            "[16, 96]",
            "--lookback",
            "256",
            "--device",
            "cpu",
            "--baseline",
            "[]",
        ]
    )
    payload = json.loads(twice.read_text())
    assert payload["methods"]["forecaster"]["members"] == 2 and payload["checkpoint"] == [str(checkpoint)] * 2
    assert [row["mse"] for row in payload["results"]] == pytest.approx([row["mse"] for row in rows], rel=1e-5)

    npz = tmp_path / "forecast.npz"
    main(
        [
            "forecast",
            "--checkpoint",
            str(checkpoint),
            "--store",
            str(store),
            "--at",
            "5000",
            "--out",
            str(npz),
            "--device",
            "cpu",
        ]
    )
    with np.load(npz) as saved:
        assert saved["forecast"].shape == (1, 96) and saved["truth"].shape == (1, 96)
        assert saved["quantiles"].shape == (1, 96, 3) and int(saved["at"]) == 5000
    assert npz.with_suffix(".png").stat().st_size > 1000
    main(
        [
            "forecast",
            "--checkpoint",
            f"[{checkpoint}, {checkpoint}]",
            "--store",
            str(store),
            "--at",
            "5000",
            "--out",
            str(tmp_path / "ensemble.npz"),
            "--device",
            "cpu",
        ]
    )
    with np.load(npz) as alone, np.load(tmp_path / "ensemble.npz") as ensemble:
        assert np.allclose(alone["forecast"], ensemble["forecast"], atol=1e-5)
    capsys.readouterr()


def test_command_errors_name_what_to_do(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "evaluate_forecast",
                "--store",
                str(tmp_path / "none.zarr"),
                "--baseline",
                "ar",
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
    assert "genoformer prepare_timeseries" in capsys.readouterr().err
    store = _sine_store(tmp_path)
    with pytest.raises(SystemExit):
        main(["evaluate_forecast", "--store", str(store), "--out", str(tmp_path / "x.json"), "--baseline", "[]"])
    assert (
        "nothing to score: give --checkpoint CKPT, --baseline seasonal_naive,ar,dlinear or both"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("name, patch_len", [("ecg_8k_gpu.yaml", 16), ("ecg_8k_cpu.yaml", 64)])
def test_ecg_8k_configs_take_a_training_step_on_the_cpu(tmp_path, name, patch_len):
    from genoformer.training_cli import training_cli

    cli = training_cli(
        [
            "--config",
            str(REPO_ROOT / "configs" / name),
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.init_args.store",
            str(tmp_path / "ecg.zarr"),
        ],
        run=False,
    )
    module = cli.model
    module.train()
    forecast = module.forecast_config
    assert (forecast.context, forecast.horizon, forecast.patch_len) == (8192, 720, patch_len)
    generator = torch.Generator().manual_seed(0)
    context = torch.randn(2, 1, 8192, generator=generator)
    target = torch.randn(2, 1, 720, generator=generator)
    losses = module.losses(context, target)
    losses["loss"].backward()
    assert torch.isfinite(losses["loss"])
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())


def test_evaluate_forecast_scores_the_horizons_the_model_has_and_names_the_rest(tmp_path, capsys):
    """A model trained for 96 steps, scored under the default protocol (96 to 720): it is scored
    at 96, and the longer horizons are said to be skipped, not an error."""
    import lightning as L

    from genoformer.timeseries.module import TimeSeriesForecaster

    store = _sine_store(tmp_path)
    module = TimeSeriesForecaster(
        TransformerConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64),
        ForecastConfig(patch_len=8, context=128, horizon=96),
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    checkpoint = tmp_path / "h96.ckpt"
    trainer.save_checkpoint(checkpoint)
    out = tmp_path / "h96.json"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--baseline",
            "[]",
        ]
    )
    payload = json.loads(out.read_text())
    assert [row["horizon"] for row in payload["results"]] == [96]
    assert payload["protocol"]["skipped_horizons"] == [192, 336, 720]
    assert "skipped horizons 192, 336, 720: the model forecasts at most 96 steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(
            [
                "evaluate_forecast",
                "--store",
                str(store),
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(tmp_path / "long.json"),
                "--horizons",
                "[192]",
                "--device",
                "cpu",
            ]
        )
    assert "the model forecasts at most 96 steps, shorter than every horizon asked for (192)" in capsys.readouterr().err


def test_commands_refuse_to_replace_a_result(tmp_path, capsys):
    store = _sine_store(tmp_path)
    out = tmp_path / "sn.json"
    out.write_text("{}")
    with pytest.raises(SystemExit):
        main(["evaluate_forecast", "--store", str(store), "--baseline", "seasonal_naive", "--out", str(out)])
    assert f"{out} exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "{}"
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--baseline",
            "seasonal_naive",
            "--out",
            str(out),
            "--horizons",
            "[96]",
            "--overwrite",
        ]
    )
    assert json.loads(out.read_text())["methods"]["seasonal_naive"]["periods"] == [50]  # the sine's period


@pytest.mark.parametrize(
    "model, option",
    [("GenoformerLM", "--model.transformer.d_model"), ("TimeSeriesForecaster", "--model.forecast.patch_len")],
)
def test_fit_help_names_each_model_options(capsys, model, option):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model.help", model])
    assert exit_info.value.code == 0
    assert option in capsys.readouterr().out


def test_time_stretch_slows_a_window_around_the_forecast_origin():
    from genoformer.timeseries.module import TimeSeriesForecaster, stretch_time

    t = torch.arange(-400, 100, dtype=torch.float32)  # the origin at t = 0
    series = torch.sin(2 * torch.pi * t / 50).view(1, 1, -1)
    context_BCL, target_BCH = series[..., :400], series[..., 400:]
    same_context, same_target = stretch_time(context_BCL, target_BCH, 1.0)
    assert torch.allclose(same_context, context_BCL) and torch.allclose(same_target, target_BCH)
    slow_context, slow_target = stretch_time(context_BCL, target_BCH, 2.0)
    assert slow_context.shape == context_BCL.shape and slow_target.shape == target_BCH.shape
    # twice as slow: the period of 50 samples becomes 100, on both sides of the origin
    expected = torch.sin(2 * torch.pi * torch.arange(-400, 100, dtype=torch.float32) / 100)
    assert torch.allclose(slow_context[0, 0], expected[:400], atol=2e-3)
    assert torch.allclose(slow_target[0, 0], expected[400:], atol=2e-3)
    with pytest.raises(ValueError, match="time_stretch"):
        TimeSeriesForecaster(
            TransformerConfig(d_model=32, n_layers=1, n_heads=4, max_seq_len=64),
            ForecastConfig(patch_len=8, context=100, horizon=20),
            time_stretch=-0.1,
        )


@pytest.mark.parametrize("length", [8, 13, 50, 100])
def test_trained_tokens_start_at_the_first_patch_ending_after_the_statistics(length):
    cfg = ForecastConfig(patch_len=8, context=100, horizon=20, stats_fraction=0.25)
    stats, first = cfg.stats_samples(length), cfg.trained_tokens(length)
    assert stats == min(length, max(8, length // 4))
    T = -(-length // 8)
    ends = [length - (T - 1 - t) * 8 for t in range(T)]
    assert ends[first] >= stats and (first == 0 or ends[first - 1] < stats)
    with pytest.raises(ValueError, match="stats_fraction"):
        ForecastConfig(stats_fraction=0.0)


def test_token_targets_are_the_samples_after_each_patch():
    context = torch.arange(10.0).view(1, 1, 10)  # patches of 4 aligned to the end: [-2, 2), [2, 6), [6, 10)
    target = torch.arange(10.0, 13.0).view(1, 1, 3)
    expected = torch.tensor([[2.0, 3, 4], [6, 7, 8], [10, 11, 12]])
    assert torch.equal(token_targets(context, target, 4)[0, 0], expected)


@pytest.mark.parametrize("channel_independent", [True, False])
def test_every_token_forecasts_come_from_the_last_token_and_see_only_the_past(channel_independent):
    with pytest.raises(ValueError, match="causal"):
        tiny_forecaster(every_token=True, stats_fraction=0.25)
    with pytest.raises(ValueError, match="stats_fraction below 1"):
        tiny_forecaster(every_token=True, causal=True)
    model = tiny_forecaster(
        every_token=True, causal=True, stats_fraction=0.25, n_channels=2, channel_independent=channel_independent
    ).model
    model.eval()
    series = torch.randn(3, 2, 96)
    with torch.no_grad():
        tokens = model.token_forecasts(series)  # (B, C, T, H, 1 + K)
        point, quantiles = model(series)
        assert tokens.shape == (3, 2, 12, 20, 4) and point.shape == (3, 2, 20) and quantiles.shape == (3, 2, 20, 3)
        # (the head runs on the last token alone there: the same numbers up to the matmul's rounding)
        assert torch.allclose(point, tokens[:, :, -1, :, 0], atol=1e-5)
        assert torch.allclose(quantiles, tokens[:, :, -1, :, 1:], atol=1e-5)
        # statistics from the first 24 samples: a token trained on what follows it (from token 2 on,
        # the first to end at or after sample 24) must not see any of it
        first = model.forecast_config.trained_tokens(96)
        assert first == 2
        for t in range(first, 11):
            changed = series.clone()
            changed[..., (t + 1) * 8 :] += 5 * torch.randn_like(changed[..., (t + 1) * 8 :])
            again = model.token_forecasts(changed)
            torch.testing.assert_close(again[:, :, : t + 1], tokens[:, :, : t + 1])
            assert not torch.allclose(again[:, :, -1], tokens[:, :, -1])


def test_every_token_training_step_trains_every_token_after_the_statistics():
    from genoformer.timeseries.module import TimeSeriesForecaster

    module = TimeSeriesForecaster(
        TransformerConfig(d_model=32, n_layers=1, n_heads=4, max_seq_len=64, causal=True),
        ForecastConfig(patch_len=8, context=64, horizon=16, every_token=True, stats_fraction=0.25),
    )
    context, target = torch.randn(4, 1, 64), torch.randn(4, 1, 16)
    module.train()
    values = module.losses(context, target)
    # statistics from the first 16 samples; tokens 1..7 end at or after them and are trained
    tokens = module.model.token_forecasts(context)[:, :, 1:, :, 0]
    expected = torch.nn.functional.mse_loss(tokens, token_targets(context, target, 8)[:, :, 1:])
    torch.testing.assert_close(values["loss"], expected)
    values["loss"].backward()
    assert module.model.head.weight.grad.abs().sum() > 0
    module.eval()
    with torch.no_grad():  # validation scores the series' own forecast: the last token's
        point, _ = module.model(context)
        torch.testing.assert_close(module.losses(context, target)["mse"], torch.nn.functional.mse_loss(point, target))


# ------------------------------------------------------------------------ the linear path
def test_lag_windows_hold_the_samples_before_each_patch_end():
    x_BCL = torch.arange(1.0, 11.0).view(1, 1, 10)  # patches of 3 end at samples 1, 4, 7, 10
    lags_BCTP = lag_windows(x_BCL, order=4, patch_len=3)
    assert lags_BCTP.tolist() == [[[[0, 0, 0, 1], [1, 2, 3, 4], [4, 5, 6, 7], [7, 8, 9, 10]]]]
    assert torch.equal(lag_windows(x_BCL, order=4, patch_len=3, first=2), lags_BCTP[:, :, 2:])


def _ar2_windows(n_windows: int, length: int, seed: int = 0) -> torch.Tensor:
    """(n_windows, 1, length) stretches of x[t] = 1.5 x[t-1] - 0.75 x[t-2] + e[t]."""
    rng = np.random.default_rng(seed)
    n = 30_000
    e = rng.normal(size=n)
    x = np.zeros(n)
    for t in range(2, n):
        x[t] = 1.5 * x[t - 1] - 0.75 * x[t - 2] + e[t]
    starts = rng.integers(100, n - length, size=n_windows)
    return torch.tensor(np.stack([x[s : s + length] for s in starts]), dtype=torch.float32)[:, None]


@pytest.mark.parametrize("every_token", [False, True])
def test_linear_path_least_squares_recovers_an_ar2_process(every_token):
    torch.manual_seed(0)
    model = TimeSeriesTransformer(
        TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64, causal=every_token),
        ForecastConfig(
            patch_len=8,
            context=100,
            horizon=20,
            quantiles=[0.1, 0.9],
            linear_order=16,
            every_token=every_token,
            stats_fraction=0.25 if every_token else 1.0,
        ),
    )
    windows_BCN = _ar2_windows(8000 if not every_token else 1000, 100 + 20)
    gram, cross, _, rows = model.linear_normal_equations(windows_BCN[..., :100], windows_BCN[..., 100:])
    tokens = 13 - model.forecast_config.trained_tokens(100) if every_token else 1
    assert int(rows) == len(windows_BCN) * tokens
    model.set_linear(gram, cross)
    assert bool(model.linear_fitted)
    # the one-step filter is the process's
    assert torch.allclose(model.linear_coef_PH[-2:, 0], torch.tensor([-0.75, 1.5]), atol=0.08)
    assert torch.allclose(model.linear_coef_PH[:-2, 0], torch.zeros(14), atol=0.08)
    # with the head silenced the forecast is the linear path's, undone to the input's units
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    context_BCL = windows_BCN[:3, :, :100]
    point_BCH, quantiles_BCHK = model(context_BCL)
    by_hand_BCH = context_BCL[..., -16:] @ model.linear_coef_PH + model.linear_bias_H
    assert torch.allclose(point_BCH, by_hand_BCH, atol=1e-4)
    assert torch.allclose(quantiles_BCHK, by_hand_BCH[..., None].expand_as(quantiles_BCHK), atol=1e-4)


@pytest.mark.parametrize("every_token", [False, True])
def test_a_centered_linear_path_makes_the_model_shift_and_scale_equivariant(every_token):
    """Fitted on zero-mean, unit-scale windows (what window_normalize trains on) and asked about
    the same windows in other units, the centered model answers in those units; the uncentered
    one does not (the general forecaster's failure on z-scored stores)."""
    forecasts = {}
    for centered in (False, True):
        torch.manual_seed(0)
        model = TimeSeriesTransformer(
            TransformerConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64, causal=every_token),
            ForecastConfig(
                patch_len=8,
                context=100,
                horizon=20,
                quantiles=[0.1, 0.9],
                linear_order=16,
                every_token=every_token,
                stats_fraction=0.25 if every_token else 1.0,
                linear_centered=centered,
            ),
        ).eval()
        windows_BCN = _ar2_windows(2000, 120)
        head_BCL = windows_BCN[..., :100]
        mean_BC1, std_BC1 = head_BCL.mean(-1, keepdim=True), head_BCL.std(-1, keepdim=True)
        windows_BCN = (windows_BCN - mean_BC1) / std_BC1  # per-window normalised, as window_normalize does
        gram, cross, _, _ = model.linear_normal_equations(windows_BCN[..., :100], windows_BCN[..., 100:])
        model.set_linear(gram, cross)
        context_BCL = windows_BCN[:4, :, :100]
        with torch.no_grad():
            point_BCH, quantiles_BCHK = model(context_BCL)
            moved_BCH, moved_BCHK = model(3.0 * context_BCL + 50.0)
        forecasts[centered] = (point_BCH, quantiles_BCHK, moved_BCH, moved_BCHK)
    point_BCH, quantiles_BCHK, moved_BCH, moved_BCHK = forecasts[True]
    assert torch.allclose(moved_BCH, 3.0 * point_BCH + 50.0, atol=1e-3)
    assert torch.allclose(moved_BCHK, 3.0 * quantiles_BCHK + 50.0, atol=1e-3)
    point_BCH, _, moved_BCH, _ = forecasts[False]
    assert (moved_BCH - (3.0 * point_BCH + 50.0)).abs().max() > 1.0


def test_linear_order_is_checked_and_an_unfitted_path_refused():
    with pytest.raises(ValueError, match="linear_order must be in"):
        ForecastConfig(patch_len=8, context=100, horizon=20, linear_order=101)
    with pytest.raises(ValueError, match="linear path .* was never fitted.*train it with `genoformer fit`"):
        tiny_forecaster(linear_order=16)


def test_linear_path_needs_a_data_module(tmp_path):
    import lightning.pytorch as pl

    from genoformer.timeseries.module import TimeSeriesForecaster

    module = TimeSeriesForecaster(
        TransformerConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16),
        ForecastConfig(patch_len=8, context=64, horizon=16, linear_order=32),
    )
    windows_BCN = _ar2_windows(8, 80)
    loader = torch.utils.data.DataLoader(
        [{"context": w[:, :64], "target": w[:, 64:]} for w in windows_BCN], batch_size=4
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(ValueError, match="TimeSeriesDataModule under `data:`"):
        trainer.fit(module, train_dataloaders=loader)


@pytest.mark.slow
def test_linear_path_is_fitted_when_training_starts_and_kept_on_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    store = _sine_store(tmp_path, length=6000)
    run = tmp_path / "run"
    args = [
        "fit",
        "--config",
        "configs/timeseries_tiny_cpu.yaml",
        "--trainer.default_root_dir",
        str(run),
        "--data.init_args.store",
        str(store),
        "--data.init_args.sources",
        f"[{tmp_path / 'sine.npy'}]",
        "--model.init_args.forecast.linear_order",
        "128",
        "--model.init_args.linear_fit_batches",
        "4",
        "--trainer.val_check_interval",
        "4",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--data.init_args.batch_size",
        "8",
    ]
    main([*args, "--trainer.max_steps", "4"])
    first = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert bool(first["model.linear_fitted"])
    # a noisy sine of period 50 is linear-predictable: the fitted path alone forecasts it closely
    forecaster = Forecaster.from_checkpoint(run / "checkpoints" / "last.ckpt", device="cpu")
    with torch.no_grad():
        forecaster.model.head.weight.zero_()
        forecaster.model.head.bias.zero_()
    sine = np.sin(2 * np.pi * np.arange(700) / 50).astype(np.float32)
    assert np.mean((forecaster.forecast(sine[:600]).point - sine[600:696]) ** 2) < 0.05
    from genoformer.timeseries.module import TimeSeriesForecaster

    def refit(self):
        raise AssertionError("a resumed run fitted the linear path again")

    monkeypatch.setattr(TimeSeriesForecaster, "fit_linear_path", refit)
    main([*args, "--trainer.max_steps", "8", "--ckpt_path", "last"])  # resumed: the checkpoint's path is kept
    second = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert torch.equal(first["model.linear_coef_PH"], second["model.linear_coef_PH"])
