"""Portable checkpoints: a checkpoint rebuilds its model from itself alone, loads on a CPU without
Triton, and keeps loading when how the model runs changes (activation checkpointing, precision,
attention backend, torch.compile, number of ranks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from genoformer.data.genome.alphabet import TOKEN_CODES
from genoformer.data.loaders import ResumableDataLoader
from genoformer.data.sampling import ShardSampler
from genoformer.kernels.dispatch import Backend
from lightning.pytorch.callbacks import ModelCheckpoint
from model_helpers import WINDOW, random_tokens, split_runtime, tiny_config, token_loader

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig
from genoformer.genome.embeddings import Embedder
from genoformer.genome.lm import GenoformerLM, Objective
from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[2]


def _train(root: Path, precision: str = "32-true", **config) -> Path:
    L.seed_everything(0, verbose=False)
    architecture, runtime = split_runtime(config)
    module = GenoformerLM(tiny_config(**architecture), objective=Objective.MASKED_LM, warmup_steps=1, runtime=runtime)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        precision=precision,
        logger=False,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)],
    )
    trainer.fit(module, token_loader(8, WINDOW, 4, seed=1))
    path = root / "trained.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def runtime_heavy_checkpoint(tmp_path_factory) -> Path:
    """Trained with activation checkpointing and the torch backend."""
    return _train(tmp_path_factory.mktemp("ac_torch"), activation_checkpointing=True, attention_backend=Backend.TORCH)


def _hidden(module: GenoformerLM) -> torch.Tensor:
    return module.eval().model.hidden_state(random_tokens(2, 64, seed=5).long(), layer=-1)


def test_checkpoint_rebuilds_its_model_alone(runtime_heavy_checkpoint):
    checkpoint = torch.load(runtime_heavy_checkpoint, map_location="cpu", weights_only=True)
    assert checkpoint["alphabet"] == TOKEN_CODES and checkpoint["trained_seq_len"] == WINDOW
    assert not {"attention_backend", "activation_checkpointing"} & set(checkpoint["hyper_parameters"]["transformer"])
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])
    module = GenoformerLM.load_from_checkpoint(runtime_heavy_checkpoint, map_location="cpu")
    assert module.objective is Objective.MASKED_LM and module.model.config.d_model == 32
    # the runtime settings are the loader's choice: the defaults here
    assert module.model.runtime == RuntimeSettings()
    assert checkpoint["genoformer"]["kind"] == "genome_lm"
    trained = torch.load(runtime_heavy_checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    for key, value in module.state_dict().items():
        assert torch.equal(value, trained[key])


@pytest.mark.parametrize("backend", [Backend.SDPA, Backend.REFERENCE])
def test_another_backend_and_no_activation_checkpointing_give_the_same_model(runtime_heavy_checkpoint, backend):
    original = GenoformerLM.load_from_checkpoint(runtime_heavy_checkpoint, map_location="cpu")
    original.model.apply_runtime(RuntimeSettings(attention_backend=Backend.TORCH))
    changed = GenoformerLM(
        tiny_config(), objective=Objective.MASKED_LM, runtime=RuntimeSettings(attention_backend=backend)
    )
    checkpoint = torch.load(runtime_heavy_checkpoint, map_location="cpu", weights_only=True)
    changed.on_load_checkpoint(checkpoint)
    changed.load_state_dict(checkpoint["state_dict"])
    torch.testing.assert_close(_hidden(changed), _hidden(original), rtol=1e-4, atol=1e-5)


def test_bf16_trained_checkpoint_loads_in_float32(tmp_path):
    path = _train(tmp_path, precision="bf16-true")
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    assert state["model.embed.weight"].dtype == torch.bfloat16
    module = GenoformerLM.load_from_checkpoint(path, map_location="cpu")
    assert module.model.embed.weight.dtype == torch.float32
    assert torch.equal(module.model.embed.weight, state["model.embed.weight"].float())


def test_compiled_and_plain_models_load_each_others_checkpoints(runtime_heavy_checkpoint):
    plain = GenoformerLM.load_from_checkpoint(runtime_heavy_checkpoint, map_location="cpu")
    compiled = GenoformerLM(tiny_config(), objective=Objective.MASKED_LM)
    compiled.model = torch.compile(compiled.model)  # wrapping only; nothing is compiled on this CPU
    assert any("_orig_mod" in key for key in compiled.state_dict())
    checkpoint = torch.load(runtime_heavy_checkpoint, map_location="cpu", weights_only=True)
    compiled.on_load_checkpoint(checkpoint)
    compiled.load_state_dict(checkpoint["state_dict"])  # plain -> compiled
    saved = {"state_dict": compiled.state_dict()}
    compiled.on_save_checkpoint(saved)
    assert not any("_orig_mod" in key for key in saved["state_dict"])
    assert saved["state_dict"].keys() == plain.state_dict().keys()  # compiled -> plain


def test_a_checkpoint_of_another_alphabet_is_refused(runtime_heavy_checkpoint, tmp_path):
    checkpoint = torch.load(runtime_heavy_checkpoint, map_location="cpu", weights_only=True)
    checkpoint["alphabet"] = {**TOKEN_CODES, "A": 3, "T": 0}
    path = tmp_path / "other.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="token codes"):
        GenoformerLM.load_from_checkpoint(path, map_location="cpu")
    with pytest.raises(ValueError, match="token codes"):
        Embedder.from_checkpoint(path, device="cpu")


def test_loads_embeds_and_evaluates_without_triton(runtime_heavy_checkpoint):
    """In a fresh interpreter where `import triton` fails."""
    script = f"""
import sys
sys.modules["triton"] = None
import lightning as L, torch
from genoformer.genome.embeddings import Embedder
from genoformer.genome.lm import GenoformerLM
path = {str(runtime_heavy_checkpoint)!r}
result = Embedder.from_checkpoint(path, device="cpu").embed(["ACGTACGTTTGACCA" * 9], progress=False)
assert result.stack().shape == (1, 32)
module = GenoformerLM.load_from_checkpoint(path, map_location="cpu")
tokens = torch.randint(0, 4, (2, 64), dtype=torch.uint8)
loss, _ = module.loss(tokens)
assert torch.isfinite(loss)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_command_line_runtime_settings_win_over_the_checkpoint(tmp_path):
    """`genoformer validate --ckpt_path FILE` re-reads the checkpoint's hyperparameters; settings of
    how to run (backend, activation checkpointing) still come from the command line."""
    L.seed_everything(0, verbose=False)
    config = tiny_config(d_model=128, n_layers=2, n_heads=4, max_seq_len=512)
    module = GenoformerLM(
        config, runtime=RuntimeSettings(activation_checkpointing=True, attention_backend=Backend.TORCH)
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    cli = _validate_cli(path, tmp_path)
    assert cli.model.runtime.attention_backend is Backend.SDPA
    assert cli.model.model.runtime.attention_backend is Backend.SDPA
    assert not cli.model.model.runtime.activation_checkpointing


def _validate_cli(path: Path, root: Path):
    from unittest import mock

    from genoformer.training_cli import GenoformerCLI

    with mock.patch.object(GenoformerCLI, "_run_subcommand"):
        return training_cli(
            [
                "validate",
                "--config",
                str(REPO_ROOT / "configs" / "quickstart.yaml"),
                "--ckpt_path",
                str(path),
                "--trainer.default_root_dir",
                str(root),
                "--data.init_args.store",
                str(root / "s.zarr"),
                "--model.transformer.max_seq_len",
                "512",
                "--model.runtime.attention_backend",
                "SDPA",
                "--model.runtime.activation_checkpointing",
                "false",
            ]
        )


class _Indices(torch.utils.data.Dataset):
    """Sample `index` of any epoch is `index`."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, key: tuple[int, int]) -> int:
        return key[1]


@pytest.mark.parametrize("saved_world_size, loaded_world_size", [(1, 2), (2, 1), (2, 3)])
def test_training_position_carries_over_another_number_of_ranks(saved_world_size, loaded_world_size):
    """Samples consumed before the checkpoint are skipped once, whatever the number of ranks now."""
    dataset = _Indices()
    consumed_batches = 3
    saved = ResumableDataLoader(
        dataset,
        batch_size=2,
        sampler=ShardSampler(24, rank=0, world_size=saved_world_size),
        position=lambda: (1, consumed_batches),
    )
    state = saved.state_dict()
    assert state == {"epoch": 1, "samples_consumed": consumed_batches * 2 * saved_world_size}
    rest = []
    for rank in range(loaded_world_size):
        loader = ResumableDataLoader(
            dataset,
            batch_size=2,
            sampler=ShardSampler(24, rank=rank, world_size=loaded_world_size),
            position=lambda: (0, 0),
        )
        loader.load_state_dict(state)
        rest += [int(i) for batch in loader for i in batch]
    assert sorted(rest)[: 24 - state["samples_consumed"]] == list(range(state["samples_consumed"], 24))


# ------------------------------------------------------------------- kinds and runtime settings
def _forecaster_checkpoint(root: Path, runtime: RuntimeSettings) -> Path:
    """A tiny TimeSeriesForecaster saved as `genoformer fit` saves it (no training needed)."""
    from genoformer.timeseries.model import ForecastConfig
    from genoformer.timeseries.module import TimeSeriesForecaster

    module = TimeSeriesForecaster(
        TransformerConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=16),
        runtime=runtime,
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    path = root / "forecaster.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_checkpoints_say_what_they_hold(tmp_path, causal_checkpoint, capsys):
    """A time-series checkpoint given to a genome command (and the other way round) is a clear
    error naming the commands that read it, not a load_state_dict traceback; export takes both."""
    from genoformer.cli import main
    from genoformer.core.checkpoints import FORMAT_VERSION, ModelKind, checkpoint_kind, read_checkpoint
    from genoformer.timeseries.forecaster import Forecaster

    forecaster = _forecaster_checkpoint(tmp_path, RuntimeSettings())
    saved = read_checkpoint(forecaster)
    assert saved["genoformer"] == {"kind": "forecaster", "format_version": FORMAT_VERSION}
    assert checkpoint_kind(read_checkpoint(causal_checkpoint)) is ModelKind.GENOME_LM
    with pytest.raises(
        ValueError, match="holds a time-series forecaster, not a DNA language model; it is read by genoformer forecast"
    ):
        Embedder.from_checkpoint(forecaster, device="cpu")
    with pytest.raises(
        ValueError, match="holds a DNA language model, not a time-series forecaster; it is read by genoformer embed"
    ):
        Forecaster.from_checkpoint(causal_checkpoint, device="cpu")
    with pytest.raises(SystemExit):
        main(["embed", "--checkpoint", str(forecaster), "--inputs", "ACGT", "--out", str(tmp_path / "e.npz")])
    assert "holds a time-series forecaster" in capsys.readouterr().err
    exported = tmp_path / "small.ckpt"
    main(["export", "--checkpoint", str(forecaster), "--out", str(exported)])
    assert checkpoint_kind(read_checkpoint(exported)) is ModelKind.FORECASTER
    assert Forecaster.from_checkpoint(exported, device="cpu").config.horizon == 16


def test_untagged_checkpoints_are_recognised_and_export_tags_them(tmp_path, causal_checkpoint):
    """Checkpoints written before the kind tag (the shipped model is one) still load; an export
    of one carries the tag."""
    from genoformer.core.checkpoints import ModelKind, checkpoint_kind, read_checkpoint

    legacy = read_checkpoint(causal_checkpoint)
    del legacy["genoformer"]
    legacy["hyper_parameters"]["transformer"]["attention_backend"] = "TRITON"  # stored by older versions
    path = tmp_path / "legacy.ckpt"
    torch.save(legacy, path)
    assert checkpoint_kind(read_checkpoint(path)) is ModelKind.GENOME_LM
    assert Embedder.from_checkpoint(path, device="cpu").model.runtime.attention_backend is Backend.AUTO
    from genoformer.core.export import export

    export(checkpoint=path, out=tmp_path / "tagged.ckpt")
    assert read_checkpoint(tmp_path / "tagged.ckpt")["genoformer"]["kind"] == "genome_lm"


def test_time_series_validate_runs_with_the_command_line_backend(tmp_path):
    """The time-series module saves no runtime settings either: `validate --ckpt_path FILE
    --model.init_args.runtime.attention_backend sdpa` runs on SDPA whatever trained it."""
    from unittest import mock

    from genoformer.training_cli import GenoformerCLI

    path = _forecaster_checkpoint(
        tmp_path, RuntimeSettings(attention_backend=Backend.TORCH, activation_checkpointing=True)
    )
    hparams = torch.load(path, weights_only=True)["hyper_parameters"]
    assert "runtime" not in hparams and "attention_backend" not in hparams["transformer"]
    with mock.patch.object(GenoformerCLI, "_run_subcommand"):
        cli = training_cli(
            [
                "validate",
                "--config",
                str(REPO_ROOT / "configs" / "timeseries_tiny_cpu.yaml"),
                "--ckpt_path",
                str(path),
                "--trainer.default_root_dir",
                str(tmp_path),
                "--data.init_args.store",
                str(tmp_path / "s.zarr"),
                "--model.init_args.runtime.attention_backend",
                "SDPA",
            ]
        )
    assert cli.model.model.runtime.attention_backend is Backend.SDPA
    assert not cli.model.model.runtime.activation_checkpointing
    assert cli.model.forecast_config.horizon == 16  # the architecture came from the checkpoint


def test_hyperparameters_of_an_older_layout_are_regrouped_on_read(tmp_path):
    """A fine-tuned model's flat head and strand hyperparameters move into their groups when the
    file is read; today's layout and other kinds read as saved."""
    from genoformer.core.checkpoints import TAG_KEY, read_checkpoint, regroup_hyperparameters

    flat = {"pooling": "LAST", "layer": -1, "both_strands": True, "head_dropout": 0.0, "test_time_strands": False}
    old = {TAG_KEY: {"kind": "genome_finetuned", "format_version": 1}, "state_dict": {}, "hyper_parameters": flat}
    torch.save(old, tmp_path / "old.ckpt")
    hparams = read_checkpoint(tmp_path / "old.ckpt")["hyper_parameters"]
    assert hparams == {
        "head": {"pooling": "LAST", "layer": -1, "both_strands": True, "dropout": 0.0},
        "strands": {"test_time": False},
    }
    today = {**old, "hyper_parameters": dict(hparams)}
    assert regroup_hyperparameters(today)["hyper_parameters"] == hparams
    language_model = {TAG_KEY: {"kind": "genome_lm", "format_version": 1}, "hyper_parameters": {"layer": 3}}
    assert regroup_hyperparameters(language_model)["hyper_parameters"] == {"layer": 3}
