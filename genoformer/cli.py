"""The `genoformer` command (also `python cli.py`).

Training verbs come from LightningCLI (`genoformer.training_cli`) and read YAML configs from `configs/`
(a shipped recipe also by its name, from anywhere: `genoformer recipes` lists them):

    genoformer fit --config quickstart
    genoformer fit --config configs/quickstart.yaml
    genoformer fit --config configs/quickstart.yaml --ckpt_path last     # resume that run
    genoformer fit --config configs/quickstart.yaml --init_weights examples/genoformer_dna.ckpt
    genoformer validate | test | predict --config configs/quickstart.yaml --ckpt_path last
    genoformer fit --config configs/genome_8k_gpu.yaml --print_config

One run directory (`trainer.default_root_dir`) holds one run: `fit` into a directory that holds a
run refuses unless resuming it with `--ckpt_path last`; a run that fails before its first step
changes nothing there (and leaves no folder it created). `--ckpt_path` resumes a run;
`--init_weights` starts a new one from a model's weights. `validate`, `test` and `predict` need
trained weights (`--ckpt_path last`, `best` or a path; `--untrained` on purpose) and never replace
an earlier result unless given `--overwrite`.

Configs are parsed in jsonargparse's "omegaconf+" mode: `${...model.init_args.transformer.max_seq_len}`
style interpolation is resolved after the command line is applied, so overriding one value on
the command line updates everything that refers to it.

A config file may build on fragments: its top-level `include:` names one file or a list of them,
each relative to the file that names it or, when it is not there, to the shipped configs/ folder
(so that a copy of a shipped recipe still finds its fragments). configs/base/ holds the trainer
of each device kind and what a family of recipes shares, configs/models/ the shared model sizes.
The fragments are read first, in order, a fragment's own `include:` before it; the file's values
then merge over them: a mapping key by key, anything else (a value, or a list such as
trainer.callbacks) replacing what the fragments set, and a mapping that names another class_path
replacing the fragment's mapping whole. The composed config is parsed as if it were the file
(`--print_config` shows it; `${...}` interpolation sees all of it), and a second `--config`
merges over it as usual. `compose_config(path)` returns it as a dict.

Data and inference verbs are typed functions whose `--help` comes from their docstrings:

    genoformer prepare --fasta genome.fa.gz --out genome.zarr
    genoformer prepare --fasta genomes/*.fa.gz --out genomes.zarr       # or a folder, or "[a.fa,b.fa]"
    genoformer prepare_timeseries --inputs ecg.csv --out ecg.zarr --time_column t_seconds
    genoformer embed --checkpoint last.ckpt --inputs genome.fa.gz --out embeddings.npz
    genoformer finetune --pretrained examples/genoformer_dna.ckpt --task classify \
        --train examples/splice_junctions_statlog.tsv --out runs/splice
    genoformer classify --checkpoint runs/splice --inputs seqs.tsv --out predictions.tsv      # the run's best
    genoformer annotate --checkpoint examples/genoformer_gene_annotator.ckpt --inputs genome.fa.gz --out genes.gff3
    genoformer compare_genes --reference annotated.gbk --predicted genes.gff3 --out comparison.tsv

Options are never abbreviated (`--trainer.max_step` is an error, not `max_steps`). Every parse error
is one line: the nearest valid option to a mistyped one, or what an option takes (`--horizons takes
a whole number (96), comma-separated (96,192) or a list`), then where to see all options, and the
cause last (`got 'x'`), so that the tail of a log says what went wrong.

This module imports only what the usage and the argument handling need: a tool command's options
are read from its function's source (`FunctionIn`, genoformer.signatures), and its module (with
torch, Lightning) is imported when it runs, so that `genoformer --help`, `genoformer COMMAND --help`,
`--version` and an error in a command's options answer in about a second. A training command's
`--help`, and the mistakes in its options that need no class to judge, come from LightningCLI's
parser rebuilt from Lightning's source (genoformer.training_options); everything else runs
LightningCLI itself (`--help --subclasses` too: the full help, with the classes that each
class-typed option knows by name).
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import importlib
import importlib.metadata
import json
import logging
import os
import sys
import traceback
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Optional

from jsonargparse import CLI, ArgumentParser
from tqdm.std import tqdm  # the base class: its _instances holds every open bar, Lightning's too

from genoformer.hints import command_line_hints
from genoformer.parse_errors import ShortErrors
from genoformer.signatures import Unresolved, light_function
from genoformer.training_options import TRAINING_COMMANDS, check_options, light_class_help, light_help

_TRAINING_HELP = {
    "fit": "Train a model (e.g. --config configs/quickstart.yaml); --ckpt_path last resumes the run.",
    "validate": "Evaluate a checkpoint (--ckpt_path last|best|PATH) on the validation split.",
    "test": "Evaluate a checkpoint (--ckpt_path last|best|PATH) on the test split.",
    "predict": "Embed every tile of the genome with a checkpoint (--ckpt_path last|best|PATH).",
}


# ----------------------------------------------------------------------- the tool commands
@dataclasses.dataclass(frozen=True)
class FunctionIn:
    """The function `name` of the module `module`: calling this imports the module and returns it.
    Its signature and docstring are read from the module's source without importing it
    (`genoformer.signatures.light_function`), so that `--help` and option errors answer at once;
    the command-line tests check that every command's module and name exist and that what the
    source says equals the function."""

    module: str
    name: str

    def __call__(self) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), self.name)


@dataclasses.dataclass(frozen=True)
class ToolCommand:
    """A data or inference command: its one-line summary for the usage list (the first line of
    its function's docstring, kept here so that `genoformer --help` reads no command; a test
    holds the two equal) and how to get its function (`FunctionIn`, or any callable that returns
    it: then `--help` imports the function's module)."""

    summary: str
    load: Callable[[], Callable[..., Any]]
    section: str = "Data and inference"
    """The heading the usage lists it under."""
    positional: bool = False
    """Its function's arguments without a default are typed without their flag (`verify PATH`)."""


def parsing_function(command: ToolCommand) -> Callable[..., Any]:
    """What the parser reads a command's options from: the source's stand-in for a `FunctionIn`
    (torch and the rest are imported only when the command runs), else the function itself."""
    if isinstance(command.load, FunctionIn):
        try:
            return light_function(command.load.module, command.load.name)
        except Unresolved:  # a signature that the source alone does not settle: import it
            pass
    return command.load()


TOOL_COMMANDS: dict[str, ToolCommand] = {
    "prepare": ToolCommand(
        "Build a chunked zarr genome store from FASTA or GenBank files (plain, .gz, .xz, .bz2).",
        FunctionIn("genoformer.genome.commands", "prepare"),
    ),
    "prepare_timeseries": ToolCommand(
        "Build a chunked zarr time-series store from CSV or .npy files (one series per file).",
        FunctionIn("genoformer.timeseries.commands", "prepare_timeseries"),
    ),
    "embed": ToolCommand(
        "Embed sequences with a trained checkpoint and write them, with their names, to a file.",
        FunctionIn("genoformer.genome.commands", "embed"),
    ),
    "finetune": ToolCommand(
        "Fine-tune a pretrained DNA model on labels (per sequence, or gene classes per base).",
        FunctionIn("genoformer.training_cli", "finetune"),
    ),
    "classify": ToolCommand(
        "Predict the class (or labels, or values) of every sequence with a fine-tuned model.",
        FunctionIn("genoformer.genome.commands", "classify"),
    ),
    "annotate": ToolCommand(
        "Call genes on whole genomes with a fine-tuned gene annotator; write them as GFF3.",
        FunctionIn("genoformer.genome.commands", "annotate"),
    ),
    "compare_genes": ToolCommand(
        "Compare gene calls (GFF3) with a reference annotation: per-base coding MCC, gene recall and precision.",
        FunctionIn("genoformer.genome.commands", "compare_genes"),
    ),
    "evaluate": ToolCommand(
        "Bits per base of a trained checkpoint on DNA, per record (or region) and in total.",
        FunctionIn("genoformer.genome.evaluate", "evaluate"),
    ),
    "baseline": ToolCommand(
        "Fit an order-k Markov model on training genomes and print its bits per base on others.",
        FunctionIn("genoformer.genome.markov", "baseline"),
    ),
    "export": ToolCommand(
        "Write a checkpoint's weights and configuration without optimizer state: a .ckpt or a Hugging Face directory.",
        FunctionIn("genoformer.core.export", "export"),
    ),
    "score": ToolCommand(
        "Write the per-base log-likelihood (log2 p, in bits) of every record as a bedGraph or bigWig track.",
        FunctionIn("genoformer.genome.evaluate", "score"),
    ),
    "variant_effect": ToolCommand(
        "Score variants (SNVs, MNVs, indels) by the log-likelihood ratio (bits) of alt against ref.",
        FunctionIn("genoformer.genome.variants", "variant_effect"),
    ),
    "mutagenesis": ToolCommand(
        "In-silico saturation mutagenesis: the llr (bits) of every base at every position of regions.",
        FunctionIn("genoformer.genome.mutagenesis", "mutagenesis"),
    ),
    "generate": ToolCommand(
        "Sample DNA continuations of a prompt from a causal language model and write them as FASTA.",
        FunctionIn("genoformer.genome.generate", "generate"),
    ),
    "verify": ToolCommand(
        "Check checkpoints and data stores against the checksums written with them.",
        FunctionIn("genoformer.core.verify", "verify"),
        positional=True,
    ),
    "forecast": ToolCommand(
        "Forecast one series of a store with a checkpoint; write .npz and a PNG beside it.",
        FunctionIn("genoformer.timeseries.commands", "forecast"),
    ),
    "evaluate_forecast": ToolCommand(
        "Score forecasts under the long-horizon protocol (MSE and MAE on z-scored values) and write JSON.",
        FunctionIn("genoformer.timeseries.commands", "evaluate_forecast"),
    ),
    "doctor": ToolCommand(
        "Check this machine: versions, GPU, which attention backends run, and what each recipe would use.",
        FunctionIn("genoformer.doctor", "doctor"),
        "Set-up",
    ),
    "recipes": ToolCommand(
        "List the shipped recipes (configs), one line each; --copy DIR writes them into a folder to edit.",
        FunctionIn("genoformer.shipped", "recipes"),
        "Set-up",
    ),
    "examples": ToolCommand(
        "Write the example data (genomes, variants, labels, an ECG series) into a folder, examples/ by default.",
        FunctionIn("genoformer.shipped", "examples"),
        "Set-up",
    ),
}


class ToolParser(ShortErrors, ArgumentParser):
    """The parser of the tool commands (jsonargparse's, with short errors)."""

    accepts_bare_flags = True


# ----------------------------------------------------------------------- usage and arguments
def _usage() -> str:
    lines = [
        "usage: genoformer COMMAND [options]   (python cli.py COMMAND ... is the same)",
        "       genoformer --version   (genoformer COMMAND --version is the same)",
        "",
        "Training (LightningCLI; every option can come from a YAML file with --config):",
    ]
    for name in TRAINING_COMMANDS:
        lines.append(f"  {name:<20}{_TRAINING_HELP[name]}")
    for section in dict.fromkeys(command.section for command in TOOL_COMMANDS.values()):
        lines += ["", f"{section}:"]
        lines += [
            f"  {name:<20}{command.summary}" for name, command in TOOL_COMMANDS.items() if command.section == section
        ]
    lines += [
        "",
        "Run `genoformer COMMAND --help` for the options of one command. A list option of the data and",
        "inference commands takes one value, comma-separated values (--columns glucose,insulin), several",
        'after the option (--inputs a.csv b.csv) or a list (--columns "[glucose,insulin]").',
    ]
    return "\n".join(lines)


STEP_FUNCTIONS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


def _raised_inside_a_step(error: BaseException) -> bool:
    """Whether `error` came from inside a training/evaluation/prediction step (not the set-up)."""
    return any(frame.name in STEP_FUNCTIONS for frame in traceback.extract_tb(error.__traceback__))


def _list_kind(typehint: Any) -> Optional[str]:
    """ "list" for a list-only option (list[X], Optional[list[X]]), "value or list" for one that
    also takes a single value (Union[str, list[str]]), None for any other."""
    arms = [
        arm
        for arm in (typing.get_args(typehint) if typing.get_origin(typehint) is typing.Union else (typehint,))
        if arm is not type(None)
    ]
    if not any(typing.get_origin(arm) is list for arm in arms):
        return None
    return "list" if all(typing.get_origin(arm) is list for arm in arms) else "value or list"


def _comma_parts(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _list_values(values: list[str], kind: str) -> list[str]:
    """The words after a list option as jsonargparse takes them (see `_tool_arguments`)."""
    if len(values) == 1 and values[0].lstrip().startswith("["):
        return values  # a YAML/JSON list, as typed
    if kind == "list":
        return [json.dumps([part for value in values for part in _comma_parts(value)])]
    if len(values) == 1:
        value = values[0]
        parts = _comma_parts(value)
        if len(parts) > 1 and not os.path.exists(value) and all(os.path.exists(part) for part in parts):
            return [json.dumps(parts)]  # files a,b (a region chr1:1,000-2,000 is no file: kept whole)
        return values
    return [json.dumps(values)]


def _tool_arguments(function: Callable[..., Any], args: Sequence[str]) -> list[str]:
    """`args` for a tool command, made ready for jsonargparse: a bool option given alone is a
    flag (`--overwrite` means `--overwrite true`); a list option takes one value, several after it
    (`--fasta a.fa b.fa`, as a shell glob expands), a list as YAML/JSON (`--columns "[a,b]"`) or,
    where it takes only lists, comma-separated values (`--columns glucose,insulin`,
    `--horizons 96,192`); an option that takes one value or a list splits `a.fa,b.fa` at the
    commas only when each part is an existing file. `--option=value` is `--option value`."""
    types = typing.get_type_hints(function)
    flags = {f"--{name}" for name, kind in types.items() if kind is bool}
    lists = {f"--{name}": _list_kind(kind) for name, kind in types.items() if _list_kind(kind) is not None}
    words = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--") and "=" in arg else [arg])]
    result: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        result.append(word)
        index += 1
        if word in flags:
            if index < len(words) and words[index].lower() in ("true", "false"):
                result.append(words[index])
                index += 1
            else:
                result.append("true")
        elif word in lists:
            values = []
            while index < len(words) and not words[index].startswith("-"):
                values.append(words[index])
                index += 1
            result += _list_values(values, lists[word]) if values else []
    return result


def _end_progress_bars() -> None:
    """Close every open tqdm bar, so that its line ends and it is not redrawn after an error."""
    for bar in list(tqdm._instances):
        bar.close()


# ----------------------------------------------------------------------- third-party notices
class _WithoutLightningTips(logging.Filter):
    """Drops Lightning's advertising tips ("💡 Tip: For seamless cloud logging ..., try installing
    litlogger"), which it logs at INFO on every run; its other messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


_LIGHTNING_TIPS = _WithoutLightningTips()


def _quiet_third_party_notices() -> None:
    """Silence what every run printed that says nothing about it: Lightning's tips (a filter on
    the logger it writes them to, as Lightning documents configuring its console output through
    Python logging), and the deprecation warning Lightning's pytree helper triggers in torch on
    every step. Only those messages: every other warning and log line still shows."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_LIGHTNING_TIPS)
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )


# ----------------------------------------------------------------------- entry point
def main(args: Optional[Sequence[str]] = None) -> None:
    """Entry point of `genoformer` and `python cli.py`."""
    argv = list(sys.argv[1:] if args is None else args)
    from_command_line = args is None
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    command = argv[0]
    if command not in TOOL_COMMANDS and command not in TRAINING_COMMANDS and command not in ("-V", "--version"):
        near = difflib.get_close_matches(command, [*TRAINING_COMMANDS, *TOOL_COMMANDS], n=1)
        guess = f"; did you mean {near[0]!r}?" if near else ""
        print(f"genoformer: unknown command {command!r}{guess}\n\n{_usage()}", file=sys.stderr)
        raise SystemExit(2)
    if command in ("-V", "--version") or argv[1:] in (["-V"], ["--version"]):  # genoformer [COMMAND] --version
        print(f"genoformer {importlib.metadata.version('genoformer')}")  # as stores record it (storage.tool_version)
        return
    _quiet_third_party_notices()
    try:
        if command in TOOL_COMMANDS:
            tool = TOOL_COMMANDS[command]
            function = parsing_function(tool)
            with command_line_hints():
                CLI(
                    function,
                    args=_tool_arguments(function, argv[1:]),
                    as_positional=tool.positional,
                    parser_class=ToolParser,
                    prog=f"genoformer {command}",
                    allow_abbrev=False,
                )
        elif argv[1:] in (["--help"], ["-h"]):  # read from source: no Lightning to import (training_options)
            print(light_help(command), end="")
            raise SystemExit(0)
        else:
            light_class_help(command, argv[1:])  # --model.help GenoformerLM: read from source too
            check_options(command, argv[1:])
            from genoformer.training_cli import training_cli

            if argv[1:] == ["--help", "--subclasses"]:  # the help with the known subclasses: imports them all
                argv, from_command_line = [command, "--help"], False
            # the data code runs inside the data module, whose options take a value even for a flag
            with command_line_hints(prefix="data.init_args.", bare_flags=False), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
                training_cli(None if from_command_line else argv)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        # Bad input (a missing or malformed file, a wrong option value): its message says what to
        # do, so show that rather than a traceback, unless asked for the traceback. An error from
        # inside a training, evaluation or prediction step keeps its traceback.
        _end_progress_bars()
        if os.environ.get("GENOFORMER_TRACEBACK") or _raised_inside_a_step(error):
            raise
        print(
            f"genoformer {command}: error: {error}\n(set GENOFORMER_TRACEBACK=1 to see the traceback)", file=sys.stderr
        )
        raise SystemExit(1) from error
    except OSError as error:
        # A full disk is not a bug: say which file and what to do (DiskFullError says both).
        if error.errno not in (errno.ENOSPC, errno.EDQUOT) or os.environ.get("GENOFORMER_TRACEBACK"):
            raise
        _end_progress_bars()
        from genoformer.data.storage import DiskFullError

        message = (
            str(error)
            if isinstance(error, DiskFullError)
            else (
                f"no space left on the device while writing {error.filename}; free some space or write elsewhere, then "
                f"run the command again ({error.strerror})"
            )
        )
        print(
            f"genoformer {command}: error: {message}\n(set GENOFORMER_TRACEBACK=1 to see the traceback)",
            file=sys.stderr,
        )
        raise SystemExit(1) from error
