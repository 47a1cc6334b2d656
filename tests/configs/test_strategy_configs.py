"""The multi-GPU strategy files in configs/strategies/ combine with the GPU configs.

They are fragments (a `trainer.strategy`, nothing else), added after a full config with a second
`--config`. DDP instantiates on the CPU here; Lightning refuses FSDP without a GPU, so the FSDP
file is parsed and its strategy instantiated on its own, as LightningCLI would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, Strategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from genoformer.core.transformer import Block
from genoformer.training_cli import training_cli

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STRATEGIES = sorted((CONFIGS / "strategies").glob("*.yaml"))


def test_strategy_files_are_shipped():
    assert {path.name for path in STRATEGIES} == {"ddp.yaml", "fsdp.yaml", "context_parallel.yaml"}


def _strategy(path: Path) -> Strategy:
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    section = yaml.safe_load(path.read_text())["trainer"]["strategy"]
    return parser.instantiate_classes(parser.parse_object({"strategy": section})).strategy


def test_ddp_file_makes_a_ddp_trainer(tmp_path):
    cli = training_cli(
        [
            "--config",
            str(CONFIGS / "genome_8k_gpu.yaml"),
            "--config",
            str(CONFIGS / "strategies" / "ddp.yaml"),
            "--trainer.accelerator",
            "cpu",
            "--trainer.devices",
            "1",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.init_args.store",
            str(tmp_path / "store.zarr"),
        ],
        run=False,
    )
    assert isinstance(cli.trainer.strategy, DDPStrategy)
    assert cli.model.runtime.compile  # the GPU config's compile switch survives the second file


def test_fsdp_file_shards_per_block():
    strategy = _strategy(CONFIGS / "strategies" / "fsdp.yaml")
    assert isinstance(strategy, FSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and Block in policy._module_classes
    assert strategy.kwargs["use_orig_params"]  # torch.compile needs the original parameters


@pytest.mark.parametrize("path", STRATEGIES, ids=lambda path: path.name)
def test_strategy_files_set_only_the_trainer(path):
    assert set(yaml.safe_load(path.read_text())) == {"trainer"}
    assert isinstance(_strategy(path), Strategy)
