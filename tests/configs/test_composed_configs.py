"""Configs compose: a recipe's `include:` names the fragments it builds on (configs/base/,
configs/models/), and its own values merge over them (genoformer.cli, "include:").

The shipped recipes are checked for what the fragments exist to give them; the merge rules are
checked on small fragments written here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from genoformer.cli import main
from genoformer.core.callbacks import NonFiniteGuard, ResumeCheckpoint
from genoformer.shipped import INCLUDE_KEY, compose_config
from genoformer.training_cli import training_cli

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))
FRAGMENTS = sorted([*(CONFIGS / "base").glob("*.yaml"), *(CONFIGS / "models").glob("*.yaml")])
LONG_CONTEXT = {"genome_32k_gpu.yaml": 32768, "genome_64k_gpu.yaml": 65536, "genome_128k_gpu.yaml": 131072}


def _included(path: Path) -> list[Path]:
    names = yaml.safe_load(path.read_text()).get(INCLUDE_KEY, [])
    return [(path.parent / name).resolve() for name in ([names] if isinstance(names, str) else names)]


def _cpu_cli(config: Path, tmp_path: Path, *extra: str):
    # the fine-tuning recipes read labelled files, the others build a store
    store = [] if config.name.startswith("finetune_") else ["--data.init_args.store", str(tmp_path / "store.zarr")]
    return training_cli(
        [
            "--config",
            str(config),
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
            *store,
            *extra,
        ],
        run=False,
    )


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------------------ the shipped configs
def test_every_recipe_builds_on_a_fragment_and_every_fragment_is_used():
    used, todo = set(), [path.resolve() for path in RECIPES]
    for recipe in RECIPES:
        assert _included(recipe), f"{recipe.name} includes no fragment: it repeats a trainer"
    while todo:
        for fragment in _included(todo.pop()):
            assert fragment.is_file(), fragment
            if fragment not in used:
                used.add(fragment)
                todo.append(fragment)
    assert {path.resolve() for path in FRAGMENTS} == used


def test_fragments_are_not_recipes():
    """What `genoformer fit --config configs/*.yaml` finds is a recipe; fragments sit below."""
    assert FRAGMENTS and not {path.name for path in FRAGMENTS} & {path.name for path in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.name)
def test_every_recipe_gets_a_resumable_guarded_run(recipe, tmp_path):
    callbacks = _cpu_cli(recipe, tmp_path).trainer.callbacks
    kinds = {type(callback) for callback in callbacks}
    assert {ResumeCheckpoint, NonFiniteGuard} <= kinds
    last = [c for c in callbacks if isinstance(c, ModelCheckpoint) and c.save_last]
    assert len(last) == 1 and Path(last[0].dirpath) == tmp_path / "run" / "checkpoints"


@pytest.mark.parametrize(("name", "context"), LONG_CONTEXT.items())
def test_long_context_recipes_train_the_reference_model(name, context, tmp_path):
    sizes = compose_config(CONFIGS / "models" / "reference_85m.yaml")["model"]["transformer"]
    cli = _cpu_cli(CONFIGS / name, tmp_path)
    config = cli.model.model.config
    assert {key: getattr(config, key) for key in sizes} == sizes
    assert config.max_seq_len == cli.datamodule.window == context


def test_an_override_reaches_the_data_window_through_the_fragments(tmp_path):
    cli = _cpu_cli(CONFIGS / "genome_32k_gpu.yaml", tmp_path, "--model.init_args.transformer.max_seq_len", "16384")
    assert cli.model.model.config.max_seq_len == cli.datamodule.window == 16384


def test_print_config_shows_the_composed_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "genome_64k_gpu.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert INCLUDE_KEY not in printed
    assert printed["trainer"]["logger"]["init_args"]["save_dir"] == "runs/genome_64k_gpu"
    assert (
        printed["model"]["init_args"]["transformer"]["d_model"]
        == compose_config(CONFIGS / "models" / "reference_85m.yaml")["model"]["transformer"]["d_model"]
    )


# ------------------------------------------------------------------------ the merge rules
def test_mappings_merge_key_by_key_and_lists_replace(tmp_path):
    _write(
        tmp_path,
        "base/a.yaml",
        """\
        trainer:
          max_steps: 10
          log_every_n_steps: 5
          callbacks: [{class_path: x.A}, {class_path: x.B}]
        data:
          class_path: x.Data
          init_args: {batch_size: 2, num_workers: 1}
        """,
    )
    _write(tmp_path, "base/b.yaml", "trainer:\n  max_steps: 20\n")
    recipe = _write(
        tmp_path,
        "recipe.yaml",
        """\
        include: [base/a.yaml, base/b.yaml]
        trainer:
          log_every_n_steps: 1
          callbacks: [{class_path: x.C}]
        data:
          init_args: {batch_size: 8}
        """,
    )
    assert compose_config(recipe) == {
        "trainer": {"max_steps": 20, "log_every_n_steps": 1, "callbacks": [{"class_path": "x.C"}]},
        "data": {"class_path": "x.Data", "init_args": {"batch_size": 8, "num_workers": 1}},
    }


def test_another_class_path_replaces_the_mapping_whole(tmp_path):
    _write(tmp_path, "base.yaml", "data:\n  class_path: x.Genome\n  init_args: {fasta: [a.fa], batch_size: 2}\n")
    recipe = _write(
        tmp_path,
        "recipe.yaml",
        """\
        include: base.yaml
        data:
          class_path: x.Series
          init_args: {batch_size: 4}
        """,
    )
    assert compose_config(recipe)["data"] == {"class_path": "x.Series", "init_args": {"batch_size": 4}}


def test_a_fragment_includes_relative_to_itself(tmp_path):
    _write(tmp_path, "deep/inner.yaml", "seed_everything: 1\ntrainer: {max_steps: 3}\n")
    _write(tmp_path, "deep/outer.yaml", "include: inner.yaml\ntrainer: {max_steps: 4}\n")
    recipe = _write(tmp_path, "recipe.yaml", "include: deep/outer.yaml\n")
    assert compose_config(recipe) == {"seed_everything": 1, "trainer": {"max_steps": 4}}


def test_a_composed_recipe_parses_as_the_whole_file_would(tmp_path):
    """Interpolation sees fragment and recipe together; strings stay strings; a second --config
    merges over the composed recipe."""
    trainer = CONFIGS / "base" / "trainer_cpu.yaml"
    recipe = _write(
        tmp_path,
        "recipe.yaml",
        f"""\
        include: {trainer}
        trainer:
          max_steps: 2
          max_time: "00:00:01:00"
          default_root_dir: {tmp_path / "run"}
        model:
          transformer: {{d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 256}}
        data:
          class_path: genoformer.data.genome.datamodule.GenomeDataModule
          init_args:
            store: {tmp_path / "store.zarr"}
            fasta: [examples/lambda_phage.fasta.gz]
            window: ${{...model.init_args.transformer.max_seq_len}}
        """,
    )
    later = _write(tmp_path, "later.yaml", "trainer:\n  max_steps: 5\n")
    cli = training_cli(["--config", str(recipe), "--config", str(later)], run=False)
    assert cli.datamodule.window == 256 and cli.trainer.max_steps == 5
    assert cli.config.trainer.max_time == "00:00:01:00"
    assert cli.trainer.logger.save_dir == str(tmp_path / "run")  # the fragment's ${...default_root_dir}


def test_a_copy_of_a_recipe_finds_the_shipped_fragments_unless_it_has_its_own(tmp_path):
    copy = _write(tmp_path, "copy.yaml", (CONFIGS / "genome_8k_cpu.yaml").read_text())
    assert compose_config(copy) == compose_config(CONFIGS / "genome_8k_cpu.yaml")
    _write(tmp_path, "base/trainer_cpu.yaml", "trainer: {accelerator: cpu, max_steps: 7}\n")
    assert compose_config(copy)["trainer"] == {
        "accelerator": "cpu",
        "max_steps": 2000,
        "val_check_interval": 250,
        "log_every_n_steps": 10,
        "default_root_dir": "runs/genome_8k_cpu",
    }


def test_a_missing_fragment_is_named_with_what_to_do(tmp_path, capsys):
    recipe = _write(tmp_path, "copy.yaml", "include: base/trainer_tpu.yaml\ntrainer: {max_steps: 1}\n")
    with pytest.raises(FileNotFoundError, match="relative to the file that names it") as error:
        compose_config(recipe)
    assert str(tmp_path / "base" / "trainer_tpu.yaml") in str(error.value)
    assert str(CONFIGS / "base" / "trainer_tpu.yaml") in str(error.value)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(recipe)])
    assert "put the fragment there, or give its path" in capsys.readouterr().err


def test_fragments_that_include_each_other_are_refused(tmp_path):
    _write(tmp_path, "a.yaml", "include: b.yaml\n")
    _write(tmp_path, "b.yaml", "include: a.yaml\n")
    with pytest.raises(ValueError, match="in a circle"):
        compose_config(tmp_path / "a.yaml")


def test_include_takes_paths_only(tmp_path):
    recipe = _write(tmp_path, "recipe.yaml", "include: {trainer: base.yaml}\n")
    with pytest.raises(ValueError, match="takes a fragment's path or a list of paths"):
        compose_config(recipe)


MILLION = {
    "genome_dna_256k_gpu.yaml": 262144,
    "genome_dna_1m_gpu.yaml": 1048576,
    "genome_dna_chromosome_gpu.yaml": 5242880,
    "genome_dna_256k_dense_gpu.yaml": 262144,
}


@pytest.mark.parametrize(("name", "context"), MILLION.items())
def test_one_gpu_long_context_recipes_keep_memory_linear(name, context, tmp_path):
    """The flagship's architecture at 256k to a whole chromosome: blocks recomputed, position-wise work
    in chunks, one window per step; the window + global layout of configs/layouts/window_global.yaml
    (what their headers pass with --init_weights) unless dense."""
    from genoformer.core.transformer import _spec_from_dict

    cli = _cpu_cli(CONFIGS / name, tmp_path)
    config, runtime = cli.model.model.config, cli.model.runtime
    assert (config.d_model, config.n_layers, config.n_heads) == (256, 8, 4)
    assert config.max_seq_len == cli.datamodule.window == context and cli.datamodule.batch_size == 1
    assert runtime.activation_checkpointing and runtime.sequence_chunk == 16384 and runtime.compile
    layout = [
        _spec_from_dict(spec) for spec in yaml.safe_load((CONFIGS / "layouts" / "window_global.yaml").read_text())
    ]
    assert config.attention == ([None] if "dense" in name else layout)
    assert f"--model.init_args.transformer.max_seq_len {context}" in (CONFIGS / name).read_text()
    if name == "genome_dna_chromosome_gpu.yaml":
        assert cli.datamodule.whole_records and cli.datamodule.split.by == "files"
