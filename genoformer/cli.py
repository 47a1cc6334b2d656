"""The `genoformer` command (also `python cli.py`).

Training verbs come from LightningCLI and read YAML configs from `configs/`:

    genoformer fit --config configs/quickstart.yaml
    genoformer fit --config configs/quickstart.yaml --ckpt_path last     # resume that run
    genoformer validate | test | predict --config configs/quickstart.yaml --ckpt_path last
    genoformer fit --config configs/genome_8k_gpu.yaml --print_config

One run directory (`trainer.default_root_dir`) holds one run: `fit` into a directory that holds a
run refuses unless resuming it with `--ckpt_path last`; a run that fails before its first step
changes nothing there. `validate`, `test` and `predict` need trained weights (`--ckpt_path last`,
`best` or a path; `--untrained` on purpose) and never replace an earlier result unless given
`--overwrite`.

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
    genoformer finetune --pretrained examples/genoformer_bacteria_8k.ckpt --task classify \
        --train examples/splice_junctions_statlog.tsv --out runs/splice
    genoformer classify --checkpoint runs/splice/checkpoints/last.ckpt --inputs seqs.tsv --out predictions.tsv
    genoformer annotate --checkpoint examples/genoformer_gene_annotator.ckpt --inputs genome.fa.gz --out genes.gff3
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import sys
import traceback
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import yaml
from jsonargparse import CLI, ActionYesNo, get_loader
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from tqdm.std import tqdm  # the base class: its _instances holds every open bar, Lightning's too

# The shipped data modules and training modules, imported so that `--data.help GenomeDataModule`
# and `--model.help TimeSeriesForecaster` find them.
import genoformer.data.genome.datamodule  # noqa: F401
import genoformer.data.genome.labelled  # noqa: F401
import genoformer.data.timeseries.datamodule  # noqa: F401
import genoformer.genome.finetune  # noqa: F401
import genoformer.timeseries.module  # noqa: F401
from genoformer.core.callbacks import PredictionWriter
from genoformer.core.checkpoints import check_checkpoint_file, read_checkpoint
from genoformer.core.export import export
from genoformer.data.storage import tool_version
from genoformer.genome.commands import annotate, classify, embed, finetune, prepare
from genoformer.genome.evaluate import evaluate, score
from genoformer.genome.lm import GenoformerLM
from genoformer.genome.markov import baseline
from genoformer.genome.variants import variant_effect
from genoformer.hints import command_line_hints
from genoformer.timeseries.commands import evaluate_forecast, forecast, prepare_timeseries

TRAINING_COMMANDS = ("fit", "validate", "test", "predict")
EVALUATION_COMMANDS = ("validate", "test", "predict")

TOOL_COMMANDS = {
    "prepare": prepare,
    "prepare_timeseries": prepare_timeseries,
    "embed": embed,
    "finetune": finetune,
    "classify": classify,
    "annotate": annotate,
    "evaluate": evaluate,
    "baseline": baseline,
    "export": export,
    "score": score,
    "variant_effect": variant_effect,
    "forecast": forecast,
    "evaluate_forecast": evaluate_forecast,
}


_FIT_CKPT_HELP = (
    "Resume the run in trainer.default_root_dir: last (its newest checkpoint, "
    "<checkpoints dir>/last.ckpt), best (its best checkpoint by the ModelCheckpoint's monitor) or a "
    ".ckpt path. Without it, fit starts a new run and refuses a directory that already holds one."
)
_EVAL_CKPT_HELP = (
    "The weights to evaluate: last or best (of the run in trainer.default_root_dir, as for fit) or "
    "a .ckpt path. Required, unless --untrained."
)
_MODEL_TITLE = (
    "Model (--model CLASS_NAME, then --model.OPTION VALUE); a config without model.class_path trains "
    "GenoformerLM, the time-series configs TimeSeriesForecaster, the fine-tuning configs FineTuner. "
    "Their options: genoformer fit --model.help GenoformerLM (or TimeSeriesForecaster, FineTuner)"
)
_DATA_TITLE = (
    "Data module (--data CLASS_NAME, then --data.OPTION VALUE); the shipped ones are GenomeDataModule, "
    "TimeSeriesDataModule and LabelledDataModule. Their options: genoformer fit --data.help "
    "GenomeDataModule (or TimeSeriesDataModule, LabelledDataModule)"
)


class RunConfigSaver(SaveConfigCallback):
    """Writes config.yaml as LightningCLI does, except that `fit` writes it after its first
    training batch: a run that fails before then leaves the run directory as it was."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            super().setup(trainer, pl_module, stage)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().setup(trainer, pl_module, "fit")  # a no-op once saved


class GenoformerCLI(LightningCLI):
    """LightningCLI that keeps runs apart and evaluates trained weights only.

    - One run directory (`trainer.default_root_dir`) holds one run. `fit` without `--ckpt_path`
      refuses a directory that holds a run (a metrics.csv, or files in a checkpoints folder) and
      says how to resume it or start elsewhere; `--ckpt_path last` (or `best`) resolves to that
      run's checkpoint, so checkpoints, metrics.csv (appended to by AppendingCSVLogger),
      config.yaml and loss.png keep describing one run.
    - `validate`, `test` and `predict` need `--ckpt_path` (`last`, `best` or a path) or
      `--untrained`. The shipped configs log straight into the run directory (a CSVLogger with an
      empty name and version), so these commands' logger version becomes the subcommand:
      `<run dir>/test/metrics.csv`, `<run dir>/predict/predictions.npz`, each with its own
      config.yaml; a result that is already there is replaced only with `--overwrite`.
    - A config that asks for a GPU on a machine without one is refused with the overrides that
      run it on the CPU.

    `command_line` holds the arguments after `genoformer` (the subcommand first): hints repeat
    them as whole commands, and a checkpoint's hyperparameters are applied by parsing them again.
    """

    def __init__(self, *args: Any, command_line: Sequence[str] = (), **kwargs: Any) -> None:
        self.command_line = list(command_line)
        self.ckpt_keyword: Optional[str] = None  # "last" or "best" when --ckpt_path gave one
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------- parsers and help
    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        for action in parser._actions:
            if action.dest == "ckpt_path":
                action.help = _FIT_CKPT_HELP if subcommand == "fit" else _EVAL_CKPT_HELP
        if subcommand in EVALUATION_COMMANDS:
            parser.add_argument(
                "--untrained", action=ActionYesNo(no_prefix=None), default=False,
                help="Evaluate the model as initialised, without trained weights (instead of --ckpt_path).",
            )
            parser.add_argument(
                "--overwrite", action=ActionYesNo(no_prefix=None), default=False,
                help=f"Replace the result of an earlier `genoformer {subcommand}` into the same run directory.",
            )
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Group titles come from docstrings; these two read as cut off (a sentence fragment, and
        # LightningDataModule's docstring up to "The main advantage is").
        parser.groups["model"].title = _MODEL_TITLE
        parser.groups["data"].title = _DATA_TITLE
        # A config without model.class_path trains a GenoformerLM.
        parser.set_defaults({"model": {"class_path": f"{GenoformerLM.__module__}.{GenoformerLM.__qualname__}"}})

    # ------------------------------------------------------------------- checks
    def _parse_ckpt_path(self) -> None:
        # Runs right after parsing, before anything is built (in place of LightningCLI's own).
        # `last` and `best` become the run's file; a broken file gets our message rather than
        # torch's; the checkpoint's model hyperparameters replace the configured ones.
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        self.ckpt_keyword = config.ckpt_path if config.ckpt_path in ("last", "best") else None
        if self.ckpt_keyword is not None:
            resolved = self._find_checkpoint(config.trainer, self.ckpt_keyword)
            if resolved is None and subcommand != "fit":
                folders = ", ".join(str(folder) for folder, _, _ in self._checkpoint_dirs(config.trainer)) or "(none configured)"
                raise FileNotFoundError(
                    f"--ckpt_path {self.ckpt_keyword}: the run in {config.trainer.default_root_dir} has no "
                    f"checkpoint (no last.ckpt in {folders}); train it first with `genoformer fit` and the same "
                    "config, or pass --ckpt_path PATH to a .ckpt file"
                )
            if resolved is None:
                config.ckpt_path = None
                return
            print(f"genoformer {subcommand}: --ckpt_path {self.ckpt_keyword} is {resolved}")
            config.ckpt_path = str(resolved)
        if config.ckpt_path is None or _lightning_keyword(config.ckpt_path):
            return
        hparams = dict(read_checkpoint(config.ckpt_path).get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if hparams:
            # Given after the user's options, as a command-line override would be, so that what
            # the config derives from the model (the data window) follows it.
            self.config = self.parser.parse_args(
                [*self.command_line, "--model", json.dumps(hparams), "--ckpt_path", config.ckpt_path]
            )

    def before_instantiate_classes(self) -> None:
        config = self.config if self.subcommand is None else self.config[self.subcommand]
        self._refuse_missing_gpu(config.trainer)
        if self.subcommand not in EVALUATION_COMMANDS:
            return
        if config.ckpt_path is None and not config.untrained:
            raise ValueError(
                f"genoformer {self.subcommand} evaluates trained weights; say which:\n"
                f"  {self._command_with('--ckpt_path', 'last')}\n"
                "(or --ckpt_path best, or --ckpt_path PATH to a .ckpt file); to evaluate the untrained "
                f"model on purpose:\n  {self._command_with('--untrained')}"
            )
        if config.ckpt_path is not None and config.untrained:
            raise ValueError("--untrained and --ckpt_path contradict each other; pass one of them")
        logger = config.trainer.logger
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and "version" in init_args and not init_args.version:
            init_args.version = self.subcommand

    def _refuse_missing_gpu(self, trainer: Any) -> None:
        accelerator = trainer.accelerator
        if not isinstance(accelerator, str) or accelerator not in ("gpu", "cuda") or torch.cuda.is_available():
            return
        overrides = ["--trainer.accelerator", "cpu"]
        if str(trainer.precision) not in ("32", "32-true"):
            overrides += ["--trainer.precision", "32-true"]
        if str(trainer.devices) not in ("1", "auto"):
            overrides += ["--trainer.devices", "1"]
        raise ValueError(
            f"this configuration asks for a GPU (trainer.accelerator: {accelerator}), but torch "
            f"{torch.__version__} sees no CUDA GPU here. To run it on the CPU anyway (slow: a model "
            f"sized for a GPU trains many times slower on a CPU), add {shlex.join(overrides)}:\n"
            f"  {self._command_with(*overrides)}"
        )

    def before_fit(self) -> None:
        existing = self._run_files()
        run_dir = self.trainer.default_root_dir
        if self.config_init["fit"]["ckpt_path"] is not None or not existing:
            if self.ckpt_keyword is not None and not existing:
                print(f"genoformer fit: no run to resume in {run_dir}; starting a new one")
            return
        if self.ckpt_keyword is not None:
            raise FileNotFoundError(
                f"--ckpt_path {self.ckpt_keyword}: {run_dir} holds a run ({existing[0]}) but no checkpoint of it "
                "to resume from; start a new run in another directory (or delete this one first):\n"
                f"  {self._command_with('--trainer.default_root_dir', 'NEW_DIR')}"
            )
        raise FileExistsError(
            f"{run_dir} already holds a training run ({', '.join(str(path) for path in existing[:3])}). "
            "Resume it (its checkpoints, metrics and plot continue):\n"
            f"  {self._command_with('--ckpt_path', 'last')}\n"
            "or start a new run in another directory (or delete this one first):\n"
            f"  {self._command_with('--trainer.default_root_dir', 'NEW_DIR')}"
        )

    def before_validate(self) -> None:
        self._refuse_to_replace_results("validate")

    def before_test(self) -> None:
        self._refuse_to_replace_results("test")

    def before_predict(self) -> None:
        self._refuse_to_replace_results("predict")

    def _refuse_to_replace_results(self, subcommand: str) -> None:
        results = [path for path in self._result_files(subcommand) if path.exists()]
        if results and not self.config_init[subcommand].overwrite:
            raise FileExistsError(
                f"{', '.join(map(str, results))} already holds the result of an earlier `genoformer "
                f"{subcommand}`; to replace it:\n  {self._command_with('--overwrite')}"
            )
        for path in results:
            if path.name == "metrics.csv":  # the logger appends; a replaced result starts empty
                path.unlink()

    # ------------------------------------------------------------------- the run directory
    @staticmethod
    def _checkpoint_dirs(trainer: Any) -> list[tuple[Path, type[ModelCheckpoint], bool]]:
        """(folder, class, save_last) of every ModelCheckpoint in the parsed trainer config; a
        callback without dirpath saves into `<default_root_dir>/checkpoints`."""
        callbacks = trainer.callbacks or []
        found = []
        for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
            module, _, name = callback.class_path.rpartition(".")
            kind = getattr(importlib.import_module(module), name)
            if isinstance(kind, type) and issubclass(kind, ModelCheckpoint):
                init_args = callback.get("init_args") or {}
                dirpath = init_args.get("dirpath")
                folder = Path(dirpath) if dirpath else Path(trainer.default_root_dir or ".") / "checkpoints"
                found.append((folder, kind, bool(init_args.get("save_last"))))
        return found

    def _run_files(self) -> list[Path]:
        """What marks the configured directory as holding a run: its metrics.csv and the files in
        its checkpoint folders."""
        found = [Path(self.trainer.log_dir or self.trainer.default_root_dir) / "metrics.csv"]
        for folder, _, _ in self._checkpoint_dirs(self.config[self.subcommand].trainer):
            if folder.is_dir():
                found += sorted(folder.iterdir())
        return [path for path in dict.fromkeys(found) if path.exists()]

    def _find_checkpoint(self, trainer: Any, which: str) -> Optional[Path]:
        """The run's newest `last.ckpt` (which="last"), or the best checkpoint recorded in it
        (which="best"); None when the run has no last.ckpt."""
        lasts = {
            folder / f"{kind.CHECKPOINT_NAME_LAST}{kind.FILE_EXTENSION}"
            for folder, kind, save_last in self._checkpoint_dirs(trainer)
            if save_last
        }
        lasts = sorted((path for path in lasts if path.is_file()), key=lambda path: path.stat().st_mtime)
        if not lasts:
            return None
        if which == "last":
            return check_checkpoint_file(lasts[-1])
        states = read_checkpoint(lasts[-1]).get("callbacks", {})
        best = [
            Path(state["best_model_path"])
            for key, state in states.items()
            if str(key).startswith("ModelCheckpoint") and state.get("best_model_path")
        ]
        best = [path for path in best if path.is_file()]
        if not best:
            raise FileNotFoundError(
                f"--ckpt_path best: the run in {trainer.default_root_dir} recorded no best checkpoint "
                "(its ModelCheckpoint has no monitor, or saved none yet); pass --ckpt_path last or --ckpt_path PATH"
            )
        return check_checkpoint_file(best[0])

    def _result_files(self, subcommand: str) -> list[Path]:
        """Files an evaluation command writes that hold its result."""
        paths = []
        if isinstance(self.trainer.logger, CSVLogger) and subcommand != "predict":
            paths.append(Path(self.trainer.log_dir) / "metrics.csv")
        if subcommand == "predict":
            paths += [c.output_path(self.trainer) for c in self.trainer.callbacks if isinstance(c, PredictionWriter)]
        return paths

    def _command_with(self, *extra: str) -> str:
        """The command being run, plus `extra` options (later options win)."""
        subcommand = ["fit"] if self.subcommand is None else []  # run=False parses no subcommand
        return shlex.join(["genoformer", *subcommand, *self.command_line, *extra])


def _lightning_keyword(ckpt_path: str) -> bool:
    """Lightning's other --ckpt_path keywords (hpc, registry[:...]), passed through as they are."""
    return str(ckpt_path) == "hpc" or str(ckpt_path).startswith("registry")


# ----------------------------------------------------------------------- composed config files
INCLUDE_KEY = "include"
"""The top-level key of a config file that names the fragments it builds on (module docstring)."""

SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
"""Where an include that is not next to the including file is looked up."""


def compose_config(path: str | os.PathLike, _included_by: tuple[Path, ...] = ()) -> Any:
    """The YAML content of config file `path` with the fragments it includes merged in, read as
    jsonargparse reads YAML; a file without `include:` is returned as it is."""
    path = Path(path)
    if path.resolve() in _included_by:
        chain = " -> ".join(str(p) for p in (*_included_by, path.resolve()))
        raise ValueError(f"config fragments include each other in a circle: {chain}; remove one of the includes")
    try:
        content = get_loader("yaml")(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(content, dict) or INCLUDE_KEY not in content:
        return content
    names = content.pop(INCLUDE_KEY)
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{path}: `{INCLUDE_KEY}:` takes a fragment's path or a list of paths, not {names!r}")
    composed: dict[str, Any] = {}
    for name in names:
        fragment = path.parent / name
        if not fragment.is_file():
            fragment = SHIPPED_CONFIGS / name
        if not fragment.is_file():
            raise FileNotFoundError(
                f"{path} includes {name}, but there is no {path.parent / name} (an include is relative to the "
                f"file that names it) nor a shipped {fragment}: put the fragment there, or give its path"
            )
        composed = _merged(composed, compose_config(fragment, (*_included_by, path.resolve())))
    return _merged(composed, content)


def _merged(base: Any, override: Any) -> Any:
    """`override` over `base`: mappings key by key, anything else replaced; a mapping that names
    another class_path replaces the other whole (its arguments are another class's)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "class_path" in base and "class_path" in override and base["class_path"] != override["class_path"]:
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merged(base[key], value) if key in base else value
    return merged


def _includes_fragments(path: Any) -> bool:
    """Whether `path` is a YAML file with a top-level `include:`."""
    try:
        content = get_loader("yaml")(Path(path).read_text()) if os.path.isfile(path) else None
    except yaml.YAMLError:
        return False  # jsonargparse reports it
    return isinstance(content, dict) and INCLUDE_KEY in content


class _QuotedStrings(yaml.SafeDumper):
    """Writes every string quoted, so that it reads back as a string (`"1e-3"`, `"00:15:00"`)."""


_QuotedStrings.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"')
)


class ComposingArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, reading a config file that has `include:` as its composed config
    (other files as jsonargparse reads them). Values in a composed config that jsonargparse reads
    as paths are relative to the working directory, as the shipped configs' paths are."""

    def parse_path(self, path: Any, ext_vars: Optional[dict] = None, env: Optional[bool] = None,
                   defaults: bool = True, **kwargs: Any) -> Any:
        if not _includes_fragments(path):
            return super().parse_path(path, ext_vars=ext_vars, env=env, defaults=defaults, **kwargs)
        composed = yaml.dump(compose_config(path), Dumper=_QuotedStrings, sort_keys=False)
        return self.parse_string(composed, path=os.path.basename(path), ext_vars=ext_vars, env=env,
                                 defaults=defaults, **kwargs)


def training_cli(args: Optional[Sequence[str]] = None, run: bool = True) -> LightningCLI:
    """LightningCLI for GenoformerLM or another LightningModule named by model.class_path (such as
    TimeSeriesForecaster); the data module is chosen in the config by class_path.

    `args` None reads the command line (sys.argv), as a console command does. With run=False
    the args take no subcommand: the model, data module and trainer are only instantiated.
    """
    argv = list(sys.argv[1:] if args is None else args)
    return GenoformerCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_kwargs={"parser_mode": "omegaconf+"},
        parser_class=ComposingArgumentParser,
        save_config_callback=RunConfigSaver,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        args=None if args is None else list(args),
        run=run,
        command_line=argv,
    )


def _usage() -> str:
    lines = [
        "usage: genoformer COMMAND [options]   (python cli.py COMMAND ... is the same)",
        "       genoformer --version",
        "",
        "Training (LightningCLI; every option can come from a YAML file with --config):",
    ]
    for name in TRAINING_COMMANDS:
        lines.append(f"  {name:<20}{_TRAINING_HELP[name]}")
    lines += ["", "Data and inference:"]
    for name, function in TOOL_COMMANDS.items():
        lines.append(f"  {name:<20}{function.__doc__.strip().splitlines()[0]}")
    lines += ["", "Run `genoformer COMMAND --help` for the options of one command."]
    return "\n".join(lines)


_TRAINING_HELP = {
    "fit": "Train a model (e.g. --config configs/quickstart.yaml); --ckpt_path last resumes the run.",
    "validate": "Evaluate a checkpoint (--ckpt_path last|best|PATH) on the validation split.",
    "test": "Evaluate a checkpoint (--ckpt_path last|best|PATH) on the test split.",
    "predict": "Embed every tile of the genome with a checkpoint (--ckpt_path last|best|PATH).",
}


STEP_FUNCTIONS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})


def _raised_inside_a_step(error: BaseException) -> bool:
    """Whether `error` came from inside a training/evaluation/prediction step (not the set-up)."""
    return any(frame.name in STEP_FUNCTIONS for frame in traceback.extract_tb(error.__traceback__))


def _tool_arguments(function: Callable[..., Any], args: Sequence[str]) -> list[str]:
    """`args` for a tool command, made ready for jsonargparse: a bool option given alone is a
    flag (`--overwrite` means `--overwrite true`), and several values after a list option
    (`--fasta a.fa b.fa`, as a shell glob expands) become one list."""
    types = typing.get_type_hints(function)
    flags = {f"--{name}" for name, kind in types.items() if kind is bool}
    lists = {
        f"--{name}"
        for name, kind in types.items()
        if any(typing.get_origin(arm) is list for arm in (kind, *typing.get_args(kind)))
    }
    only_lists = {f"--{name}" for name, kind in types.items() if typing.get_origin(kind) is list}
    result: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        result.append(arg)
        index += 1
        if arg in flags:
            if index < len(args) and args[index].lower() in ("true", "false"):
                result.append(args[index])
                index += 1
            else:
                result.append("true")
        elif arg in lists:
            values = []
            while index < len(args) and not args[index].startswith("-"):
                values.append(args[index])
                index += 1
            single = len(values) == 1 and not values[0].startswith("[")
            if len(values) > 1 or (single and arg in only_lists):  # one plain value of a list-only option too
                values = [json.dumps(values)]
            result += values
    return result


def _end_progress_bars() -> None:
    """Close every open tqdm bar, so that its line ends and it is not redrawn after an error."""
    for bar in list(tqdm._instances):
        bar.close()


def main(args: Optional[Sequence[str]] = None) -> None:
    """Entry point of `genoformer` and `python cli.py`."""
    argv = list(sys.argv[1:] if args is None else args)
    from_command_line = args is None
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    if argv[0] in ("-V", "--version"):
        print(f"genoformer {tool_version()}")
        return
    command = argv[0]
    if command not in TOOL_COMMANDS and command not in TRAINING_COMMANDS:
        print(f"genoformer: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        raise SystemExit(2)
    try:
        if command in TOOL_COMMANDS:
            function = TOOL_COMMANDS[command]
            with command_line_hints():
                CLI(function, args=_tool_arguments(function, argv[1:]), as_positional=False)
        else:
            with command_line_hints(prefix="data.init_args."):  # the data code runs inside the data module
                training_cli(None if from_command_line else argv)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        # Bad input (a missing or malformed file, a wrong option value): its message says what to
        # do, so show that rather than a traceback, unless asked for the traceback. An error from
        # inside a training, evaluation or prediction step keeps its traceback.
        _end_progress_bars()
        if os.environ.get("GENOFORMER_TRACEBACK") or _raised_inside_a_step(error):
            raise
        print(f"genoformer {command}: error: {error}\n(set GENOFORMER_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        raise SystemExit(1) from error
