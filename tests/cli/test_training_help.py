"""The training commands' `--help` and option errors come from a parser read from source
(genoformer.training_options: Lightning's Trainer without importing it), held here equal to what
the real parser (LightningCLI over the real classes) prints; and every command family answers
`--help` and a mistyped option within seconds, timed as a user's shell runs it.

The bound in the timing tests is generous (CI is noisy); the figures on a 2-core CPU are in
`python -m benchmarks.command_speed`'s table.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genoformer.training_options import (
    SUBCLASSES_NOTE,
    TRAINER_SOURCE,
    TRAINING_COMMANDS,
    check_options,
    light_class_help,
    light_help,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
SECONDS = 5.0
"""The bound of a timed command here: 1.5 s (help) and 2 s (an error) on an idle 2-core CPU, with room for CI."""


def _full(args: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the real training CLI on `args`, which must stop at parsing."""
    from genoformer.training_cli import training_cli

    with pytest.raises(SystemExit) as exit_info:
        training_cli(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _without_subclasses(help_text: str) -> str:
    """A help text as words, without the known-subclass lists (only the imported classes say them)."""
    words = " ".join(help_text.split())
    return re.sub(r", known subclasses: [^)]*\)", ")", words)


@pytest.mark.parametrize("subcommand", TRAINING_COMMANDS)
def test_the_help_from_source_is_the_full_help(subcommand, capsys):
    code, full, _ = _full([subcommand, "--help"], capsys)
    assert code == 0 and "known subclasses: " in full
    light = " ".join(light_help(subcommand).split())
    note = SUBCLASSES_NOTE.format(command=subcommand)
    assert light.endswith(" " + note) and "known subclasses" not in light
    assert light[: -len(note) - 1] == _without_subclasses(full)


def test_the_help_says_where_the_subclasses_are_and_that_command_lists_them(capsys):
    from genoformer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--help"])
    assert exit_info.value.code == 0
    command = re.search(r"`genoformer (fit --help --subclasses)`", " ".join(capsys.readouterr().out.split())).group(1)
    with pytest.raises(SystemExit) as exit_info:
        main(command.split())
    assert exit_info.value.code == 0
    assert "genoformer.core.callbacks.TrainingProgress" in capsys.readouterr().out  # a known subclass of Callback


def test_a_changed_trainer_signature_changes_the_help(monkeypatch):
    """The help reads the Trainer's source as installed: a parameter renamed there is renamed here."""
    import genoformer.signatures as signatures

    read = signatures.module_tree
    tree, is_package = read(TRAINER_SOURCE[0])
    renamed = ast.parse(re.sub(r"\bmax_steps\b", "most_steps", ast.unparse(tree))), is_package
    monkeypatch.setattr(
        signatures, "module_tree", lambda module: renamed if module == TRAINER_SOURCE[0] else read(module)
    )
    help_text = light_help("fit")
    assert "--trainer.most_steps MOST_STEPS" in help_text and "--trainer.max_steps" not in help_text


ERRORS = [
    ["fit", "--trainer.max_step", "10"],
    ["fit", "--config", str(QUICKSTART), "--trainer.max_stepz", "3"],
    ["fit", "--trainer.max_steps", "many"],
    ["fit", "--seed_everything", "abc"],
    ["fit", "--trainer.precision", "17"],
    ["fit", "--bogus", "1"],
    ["fit", "stray"],
    ["fit", "--ckpt_path"],
    ["fit", "--config", "no_such_recipe"],
    ["validate", "--untrained", "perhaps"],
    ["test", "--overwrite", "x", "--ckpt_path", "last"],
    ["predict", "--init_weights", "a.ckpt"],
]


@pytest.mark.parametrize("args", ERRORS, ids=[" ".join(args[:3]) for args in ERRORS])
def test_an_option_error_from_source_is_the_full_one(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_options(args[0], args[1:])
    light = (exit_info.value.code, capsys.readouterr().err)
    code, _, err = _full(args, capsys)
    assert light == (code, err) and code == 2 and len(err.splitlines()) == 1


MODEL_AND_DATA_ERRORS = {
    "misspelt nested key": ["fit", "--config", "quickstart", "--model.transformer.d_modle", "64"],
    "misspelt group": ["fit", "--config", "quickstart", "--model.transfomer.d_model", "64"],
    "wrong type": ["fit", "--config", "quickstart", "--model.init_args.learning_rate", "fast"],
    "wrong nested type": ["fit", "--config", "quickstart", "--model.transformer.n_layers", "2.5"],
    "bad enum": ["fit", "--config", "quickstart", "--model.objective", "bert"],
    "bad Literal": ["fit", "--config", "quickstart", "--data.multiprocessing_context", "thread"],
    "misspelt data option": ["fit", "--config", "quickstart", "--data.batch_sise", "4"],
    "unknown data class": ["fit", "--config", "quickstart", "--data", "genoformer.data.genome.datamodule.NoSuch"],
    "time series": ["fit", "--config", "timeseries_tiny_cpu", "--model.forecast.horizn", "96"],
    "fine-tuning group": ["fit", "--config", "finetune_cpu", "--model.head.pooling", "max"],
    "other module": [
        "fit",
        "--config",
        "quickstart",
        "--model",
        "TimeSeriesForecaster",
        "--model.forecast.horizon",
        "x",
    ],
    "config= form": ["fit", f"--config={QUICKSTART}", "--data.window", "long"],
    "runtime": ["validate", "--config", "quickstart", "--model.runtime.compile", "maybe", "--ckpt_path", "last"],
}
CONFIG_ERRORS = {  # a recipe with one line changed: (line of quickstart.yaml, its replacement)
    "misspelt key": ("    d_model: 128", "    d_modle: 128"),
    "wrong type": ("  learning_rate: 2.0e-3", "  learning_rate: fast"),
    "bad enum": ("  objective: CAUSAL_LM", "  objective: BERT"),
    "misspelt data key": ("    batch_size: 1", "    batch_sise: 1"),
    "unknown class_path": (
        "  class_path: genoformer.data.genome.datamodule.GenomeDataModule",
        "  class_path: genoformer.data.genome.datamodule.GenomeDataModul",
    ),
}


def _same_error(args: list[str], capsys) -> str:
    """The one-line error of the parser from source, held equal (text and exit status) to the real one's."""
    with pytest.raises(SystemExit) as exit_info:
        check_options(args[0], args[1:])
    light = (exit_info.value.code, capsys.readouterr().err)
    code, _, err = _full(args, capsys)
    assert light == (code, err) and code == 2 and len(err.splitlines()) == 1
    return err


@pytest.mark.parametrize("args", MODEL_AND_DATA_ERRORS.values(), ids=MODEL_AND_DATA_ERRORS.keys())
def test_a_model_or_data_option_error_from_source_is_the_full_one(args, capsys):
    _same_error(args, capsys)


@pytest.mark.parametrize(("line", "mistake"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_a_mistake_in_a_config_file_from_source_is_the_full_one(line, mistake, tmp_path, capsys):
    text = QUICKSTART.read_text()
    assert text.count(line + "\n") == 1
    config = tmp_path / "quickstart.yaml"
    config.write_text(
        text.replace(line + "\n", mistake + "\n").replace("include: base/", f"include: {QUICKSTART.parent}/base/")
    )
    _same_error(["fit", "--config", str(config)], capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["--config", "quickstart", "--model", "my_models.Model", "--model.init_args.width", "8"],
        ["--config", "quickstart", "--model", "model.yaml"],
        ["--config", "quickstart", "--model.transformer.attention", "[{class_path: Strided, init_args: {stride: 2}}]"],
        ["--trainer.callbacks+", "EarlyStopping", "--trainer.logger", "false", "--print_config"],
        ["--trainer.max_steps", "${oops}"],
        ["--config", str(QUICKSTART), "--help"],
    ],
)
def test_what_the_source_cannot_judge_goes_to_the_full_parser(args):
    assert check_options("fit", args) is False  # a class not genoformer's, help, interpolation typed


def _seconds(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "cli.py", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    return time.perf_counter() - began, result


FAMILIES = {
    "training": "fit",
    "fine-tuning": "finetune",
    "genome": "prepare",
    "time series": "prepare_timeseries",
    "set-up": "doctor",
}


@pytest.mark.parametrize("command", FAMILIES.values(), ids=FAMILIES.keys())
def test_help_and_an_option_error_answer_within_seconds(command):
    seconds, result = _seconds([command, "--help"])
    assert result.returncode == 0 and "--" in result.stdout
    assert seconds < SECONDS, f"genoformer {command} --help took {seconds:.1f} s"
    seconds, result = _seconds([command, "--no_such_option", "1"])
    assert result.returncode == 2 and result.stderr.strip().endswith("unknown option --no_such_option")
    assert seconds < SECONDS, f"genoformer {command} --no_such_option took {seconds:.1f} s"


CLASS_HELP = [
    *(["fit", "--model.help", name] for name in ("GenoformerLM", "TimeSeriesForecaster", "FineTuner")),
    *(["fit", "--data.help", name] for name in ("GenomeDataModule", "TimeSeriesDataModule", "LabelledDataModule")),
    ["validate", "--model.help", "genoformer.genome.lm.GenoformerLM"],
    ["fit", "--model.help", "GenomeDataModule"],
]


@pytest.mark.parametrize("args", CLASS_HELP, ids=[" ".join(args) for args in CLASS_HELP])
def test_the_help_of_a_genoformer_class_from_source_is_the_full_one(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        light_class_help(args[0], args[1:])
    captured = capsys.readouterr()
    assert (exit_info.value.code, captured.out, captured.err) == _full(args, capsys)
