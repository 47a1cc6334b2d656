"""A command's `--help`, an error in its options and `--version` answer without importing torch,
Lightning or the rest: each command's options are read from its function's source
(genoformer.signatures), and what the source says is held equal to the function here (the
training commands' parser read from Lightning's source: tests/cli/test_training_help.py).

Wall time is measured by `python -m benchmarks.command_speed`; these tests assert what makes it
short (no heavy module imported) rather than seconds, which depend on the machine.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from genoformer.cli import TOOL_COMMANDS, TRAINING_COMMANDS, FunctionIn, parsing_function
from genoformer.signatures import Unresolved, light_function

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "lightning", "transformers", "zarr", "pandas", "matplotlib", "pyBigWig", "vcfpy")


def imported_after(*commands: list[str]) -> dict[str, object]:
    """Run each command line in one fresh interpreter, in turn, and return {"exit": [codes],
    "heavy": [heavy modules imported by the end]}."""
    script = (
        "import json, sys\n"
        "from genoformer.cli import main\n"
        "codes = []\n"
        f"for args in {[list(c) for c in commands]!r}:\n"
        "    try:\n"
        "        main(args)\n"
        "        codes.append(0)\n"
        "    except SystemExit as exit:\n"
        "        codes.append(exit.code)\n"
        f"print(json.dumps({{'exit': codes, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_command_help_imports_no_heavy_module():
    commands = [*TOOL_COMMANDS, *TRAINING_COMMANDS]
    outcome = imported_after(*([name, "--help"] for name in commands), ["--version"], ["fit", "--version"], ["--help"])
    assert outcome["exit"] == [0] * (len(commands) + 3)
    assert outcome["heavy"] == []


def test_an_option_error_imports_no_heavy_module():
    outcome = imported_after(
        ["prepare_timeseries", "--inputs", "a.csv", "--out", "a.zarr", "--skip_rows", "many"],
        ["evaluate", "--checkpoint", "x.ckpt", "--inputs", "a.fa", "--contxt", "5"],
        ["forecast", "--checkpoint", "x.ckpt", "--store", "s.zarr", "--out", "f.npz", "--backend", "cuda"],
        ["fit", "--config", "quickstart", "--trainer.max_step", "10"],
        ["validate", "--config", "quickstart", "--ckpt_path", "last", "--trainer.devices", "--untrained"],
        ["fit", "--config", "no_such_recipe"],
        ["fit", "--config", "quickstart", "--model.transformer.d_modle", "64"],
        ["fit", "--config", "timeseries_tiny_cpu", "--data.batch_sise", "4"],
        ["test", "--config", "finetune_cpu", "--model.head.pooling", "max", "--ckpt_path", "last"],
    )
    assert outcome["exit"] == [2] * 9
    assert outcome["heavy"] == []


def test_version_is_the_installed_version(capsys):
    from importlib.metadata import version

    from genoformer.cli import main

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"genoformer {version('genoformer')}"


@pytest.mark.parametrize("name", list(TOOL_COMMANDS))
def test_what_the_source_says_is_the_function(name):
    command = TOOL_COMMANDS[name]
    assert isinstance(command.load, FunctionIn), f"{name}: register it with FunctionIn(module, name)"
    stand_in, real = parsing_function(command), command.load()
    assert stand_in is not real, f"{name}: its signature needs the module to run (genoformer.signatures.Unresolved)"
    hints = typing.get_type_hints(real)
    hints.pop("return", None)
    expected = inspect.signature(real).replace(return_annotation=inspect.Signature.empty)
    expected = expected.replace(
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in expected.parameters.values()]
    )
    assert inspect.signature(stand_in) == expected
    assert typing.get_type_hints(stand_in) == hints
    assert stand_in.__doc__ == real.__doc__


def test_the_stand_in_runs_the_function(tmp_path):
    stand_in = light_function("genoformer.genome.commands", "prepare")
    out = stand_in(fasta=str(REPO_ROOT / "examples" / "lambda_phage.fasta.gz"), out=tmp_path / "lambda.zarr")
    assert out == tmp_path / "lambda.zarr" and (out / "zarr.json").is_file()


def test_a_signature_the_source_does_not_settle_is_unresolved(tmp_path, monkeypatch):
    package = tmp_path / "lightsig_example"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "commands.py").write_text(
        "from __future__ import annotations\n"
        "import os\n"
        "from typing import Literal\n"
        "CHOICES = ('a', 'b')\n"
        "Choice = Literal[tuple(c for c in CHOICES)]\n"
        "LIMIT = 1 << 4\n"
        "if os.sep:\n"
        "    HIDDEN = 3\n"
        "def settled(*, choice: Choice = 'a', limit: int = LIMIT) -> None:\n"
        "    '''Settled by the source.'''\n"
        "def unsettled(*, depth: int = HIDDEN) -> None:\n"
        "    '''HIDDEN is bound inside an if.'''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settled = light_function("lightsig_example.commands", "settled")
    assert typing.get_type_hints(settled) == {"choice": typing.Literal["a", "b"], "limit": int}
    assert inspect.signature(settled).parameters["limit"].default == 16
    assert "lightsig_example.commands" not in sys.modules
    with pytest.raises(Unresolved, match="HIDDEN"):
        light_function("lightsig_example.commands", "unsettled")
