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


@pytest.mark.parametrize(
    "args",
    [
        ["--config", str(QUICKSTART), "--trainer.max_steps", "3"],
        ["--config", "quickstart", "--model.init_args.no_such_option", "1", "--data.batch_sise", "4"],
        ["--trainer.callbacks+", "EarlyStopping", "--trainer.logger", "false", "--print_config"],
        ["--trainer.max_steps", "${oops}"],
        ["--config", str(QUICKSTART), "--help"],
    ],
)
def test_what_the_source_cannot_judge_goes_to_the_full_parser(args):
    assert check_options("fit", args) is None  # the model's and data's options, classes, config files


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
