"""Every shipped config parses against the code's signatures and instantiates: each recipe in
configs/, and with them the fragments they include (test_composed_configs.py checks that every
fragment is included).

GPU configs are instantiated with the accelerator switched to the CPU (CI has no GPU); all
paths the configs write to are redirected to a temporary folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from genoformer.data.genome.datamodule import GenomeDataModule
from genoformer.data.genome.labelled import LabelledDataModule
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule

from genoformer.core.checkpoints import resolve_checkpoint
from genoformer.genome.finetune import FineTuner
from genoformer.genome.lm import GenoformerLM
from genoformer.timeseries.module import TimeSeriesForecaster
from genoformer.training_cli import training_cli
from genoformer.training_options import check_options

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
FETCHED = "../shared-extra/"
"""Where ../shared/data/fetch-more.sh puts the genomes it fetches (beside the project, out of git)."""


def test_configs_are_shipped():
    names = {path.name for path in CONFIGS}
    assert "quickstart.yaml" in names
    assert {"genome_8k_cpu.yaml", "genome_8k_gpu.yaml"} <= names
    assert {"ecg_8k_gpu.yaml", "ecg_8k_cpu.yaml", "timeseries_tiny_cpu.yaml"} <= names
    assert {"finetune_cpu.yaml", "finetune_gpu.yaml"} <= names


def _is_finetune(config: Path) -> bool:
    return config.name.startswith("finetune_")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_config_instantiates(config, tmp_path):
    # the fine-tuning recipes read labelled files, the others build a store
    data = [] if _is_finetune(config) else ["--data.init_args.store", str(tmp_path / "store.zarr")]
    cli = training_cli(
        [
            "--config",
            str(config),
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path),
            *data,
        ],
        run=False,
    )
    for callback in cli.trainer.callbacks:
        dirpath = getattr(callback, "dirpath", None)
        if dirpath is not None:
            assert str(dirpath).startswith(str(tmp_path)), "a config writes outside its run directory"
    if isinstance(cli.model, TimeSeriesForecaster):
        assert isinstance(cli.datamodule, TimeSeriesDataModule)
        # omegaconf interpolation ties the data windows to the model's context and horizon
        forecast = cli.model.forecast_config
        assert (cli.datamodule.context, cli.datamodule.horizon) == (forecast.context, forecast.horizon)
        for source in cli.datamodule.sources:
            assert Path(source).is_file(), f"{config.name} names a series file that is not shipped: {source}"
        return
    if isinstance(cli.model, FineTuner):
        assert isinstance(cli.datamodule, LabelledDataModule)
        fetched = [path for path in cli.datamodule.train_files if str(path).startswith(FETCHED)]
        if fetched:  # real annotated genomes, fetched by the script its header names
            assert "fetch-more.sh" in config.read_text(), (
                f"{config.name} names {fetched} without saying how to fetch it"
            )
        for path in [
            resolve_checkpoint(cli.model.hparams["pretrained"]),
            *(p for p in cli.datamodule.train_files if p not in fetched),
        ]:
            assert Path(path).is_file(), f"{config.name} names a file that is not shipped: {path}"
        if not fetched:
            cli.datamodule.setup("fit")  # the shipped labels read, with their classes
            assert cli.datamodule.target_space.names == ("acceptor", "donor", "neither")
        return
    assert isinstance(cli.model, GenoformerLM)
    assert isinstance(cli.datamodule, GenomeDataModule)
    transformer = cli.model.model.config
    # omegaconf interpolation ties the data window to the model context
    assert cli.datamodule.window == transformer.max_seq_len
    assert sum(p.numel() for p in cli.model.parameters()) > 0
    if config.name == "genome_8k_window_alibi_cpu.yaml":  # the recipe that shows exact windows and ALiBi
        layout = cli.model.model.layout(0, 1024)
        assert transformer.alibi and not transformer.rope and layout.window == (512, 512)
        assert layout.covers_window(causal=True)
    for fasta in cli.datamodule.fasta:
        if fasta.startswith(FETCHED):  # real data a recipe may train on, fetched by the script its header names
            assert "fetch-more.sh" in config.read_text(), f"{config.name} names {fasta} without saying how to fetch it"
            continue
        assert Path(fasta).is_file(), f"{config.name} names a FASTA file that is not shipped: {fasta}"


def test_command_line_override_propagates_through_interpolation(tmp_path):
    cli = training_cli(
        [
            "--config",
            str(CONFIGS[0].parent / "quickstart.yaml"),
            "--model.transformer.max_seq_len",
            "1024",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        run=False,
    )
    assert cli.datamodule.window == 1024


def test_every_config_passes_the_check_from_source_read_whole():
    """The quick check of a training command line (genoformer.training_options.check_options, read
    from source before Lightning is imported) reads every shipped config whole and finds nothing
    wrong: it never refuses what the real parser (test_config_instantiates) takes."""
    for config in CONFIGS:
        assert check_options("fit", ["--config", str(config)]) is True, config.name
