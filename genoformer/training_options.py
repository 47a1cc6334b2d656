"""The options of the training commands (fit, validate, test, predict), built without Lightning or
torch, so that `genoformer fit --help` and an error in a training command's options answer at once.

A training command's parser is LightningCLI's subcommand parser: the trainer's options from
`Trainer.__init__`, `--model` and `--data` (any LightningModule, LightningDataModule), the
subcommand's own from `Trainer.fit` (or validate, test, predict), and ours (`genoformer_options`).
`light_parser` builds the same parser from Lightning's source (`genoformer.signatures.light_class`:
the Trainer's signatures and docstrings as written, every Lightning class they name a stand-in of
the same name), in the order LightningCLI adds them; `GenoformerCLI` adds ours to the real one
through the same functions. What the stand-ins cannot tell is which classes subclass them (the
"known subclasses" of the full help: only the imported classes say it): the light help names where
to see them. The command-line tests hold the light help equal to the full one, but for those lists.
"""

from __future__ import annotations

import ast
import os
import re
import typing
from collections.abc import Sequence
from typing import Any, NoReturn, Optional, Union

import docstring_parser
import yaml
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, Namespace

from genoformer.parse_errors import ShortErrors, one_line_error, option_groups
from genoformer.shipped import QuotedStrings, compose_config, recipe_path
from genoformer.signatures import LightModules, Unresolved, is_stand_in, light_class, module_tree, resolve

TRAINING_COMMANDS = ("fit", "validate", "test", "predict")
EVALUATION_COMMANDS = ("validate", "test", "predict")

DEFAULT_MODEL = "genoformer.genome.lm.GenoformerLM"
"""The model of a config without model.class_path."""

TRAINER_SOURCE = ("lightning.pytorch.trainer.trainer", "Trainer")
CLI_SOURCE = ("lightning.pytorch.cli", "LightningCLI")
SHIPPED_CLASSES = (
    "genoformer.genome.lm.GenoformerLM",
    "genoformer.timeseries.module.TimeSeriesForecaster",
    "genoformer.genome.finetune.FineTuner",
    "genoformer.data.genome.datamodule.GenomeDataModule",
    "genoformer.data.timeseries.datamodule.TimeSeriesDataModule",
    "genoformer.data.genome.labelled.LabelledDataModule",
)
"""The shipped training modules and data modules, which `--model.help TimeSeriesForecaster` and
`--data.help GenomeDataModule` name by their short names (genoformer.training_cli imports them)."""


_FIT_CKPT_HELP = (
    "Resume the run in trainer.default_root_dir: last (its newest checkpoint, "
    "<checkpoints dir>/last.ckpt), best (its best checkpoint by the ModelCheckpoint's monitor) or a "
    ".ckpt path of a training run. Without it, fit starts a new run and refuses a directory that "
    "already holds one. To start a new run from a model's weights, use --init_weights."
)
_INIT_WEIGHTS_HELP = (
    "Start a new run from the weights of this checkpoint (a .ckpt of `genoformer fit` or `export`, "
    "such as examples/genoformer_dna.ckpt): what the model is (its transformer) is the "
    "checkpoint's, with your --model options where the weights still fit (a longer or shorter "
    "max_seq_len); how to train it (learning rate, warm-up, weight decay) is your config's; the "
    "optimizer, schedule and step count start anew. Not read when --ckpt_path resumes a run."
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
SUBCLASSES_NOTE = (
    "The classes each class-typed option (--trainer.callbacks, --trainer.logger, --model, --data, ...) "
    "knows by name are listed by `genoformer {command} --help --subclasses` (which imports them: seconds)."
)


# ----------------------------------------------------------------------- ours, on either parser
def genoformer_core_options(parser: ArgumentParser, import_default: bool = True) -> None:
    """What genoformer changes in the options LightningCLI adds (the real parser's
    `add_arguments_to_parser`): the model and data group titles (their docstrings read as cut
    off: a sentence fragment, and LightningDataModule's up to "The main advantage is"), and
    GenoformerLM as the model of a config without model.class_path (`import_default`: checked by
    importing it, as jsonargparse does; else set as written, for the parser from source)."""
    parser.groups["model"].title = _MODEL_TITLE
    parser.groups["data"].title = _DATA_TITLE
    if import_default:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}})
    else:
        parser._defaults["model"] = parser._option_string_actions["--model"].default = Namespace(
            class_path=DEFAULT_MODEL
        )


def genoformer_options(parser: ArgumentParser, subcommand: str) -> None:
    """The options genoformer adds to a training command's parser, and its help of --ckpt_path."""
    for action in parser._actions:
        if action.dest == "ckpt_path":
            action.help = _FIT_CKPT_HELP if subcommand == "fit" else _EVAL_CKPT_HELP
    if subcommand == "fit":
        parser.add_argument("--init_weights", type=Optional[str], default=None, help=_INIT_WEIGHTS_HELP)
    if subcommand in EVALUATION_COMMANDS:
        parser.add_argument(
            "--untrained",
            action=ActionYesNo(no_prefix=None),
            default=False,
            help="Evaluate the model as initialised, without trained weights (instead of --ckpt_path).",
        )
        parser.add_argument(
            "--overwrite",
            action=ActionYesNo(no_prefix=None),
            default=False,
            help=f"Replace the result of an earlier `genoformer {subcommand}` into the same run directory.",
        )


# ----------------------------------------------------------------------- the parser from source
def light_class_help(subcommand: str, args: Sequence[str]) -> None:
    """Answer `genoformer SUBCOMMAND --model.help CLASS` (or --data.help) as the real parser does,
    for one of genoformer's classes read from source (`genoformer.signatures.LightModules`): the
    help and exit status 0, or its one-line error and status 2. Returns, printing nothing, for any
    other command line or class (the real parser answers it)."""
    if len(args) != 2 or args[0] not in ("--model.help", "--data.help"):
        return
    short = {path.rpartition(".")[2] for path in SHIPPED_CLASSES}
    if args[1] not in short and not args[1].startswith("genoformer."):
        return
    with LightModules() as modules:
        try:
            for class_path in SHIPPED_CLASSES:
                resolve(*class_path.rsplit(".", 1), True)
            modules.build_every_class()
            parser = light_parser(subcommand)
            parser.cannot_judge = True
            parser.parse_args(list(args))  # prints the help, or the error, and exits
        except (_CannotJudge, Unresolved, RecursionError):
            return


class _CannotJudge(Exception):
    """The parser from source met what only the real classes settle: the real parser decides."""


class LightTrainingParser(ShortErrors, ArgumentParser):
    """A training command's parser built from source (jsonargparse's, with short errors, and
    LightningArgumentParser's settings)."""

    cannot_judge = False
    """Whether an error that names a stand-in (a class that only the real parser knows) leaves
    the command line to the real parser (`check_options`) instead of exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("env_prefix", "PL")
        kwargs.setdefault("default_env", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
        if self.cannot_judge and self.exit_on_error:
            prog = self.prog.replace(" [options]", "")
            line = one_line_error(self, message, prog, self.accepts_bare_flags)
            if "_StandIn" in line or "genoformer.signatures" in line:
                raise _CannotJudge(line)
        super().error(message, ex)


def _cli_method(name: str) -> ast.FunctionDef:
    """The method `name` of LightningCLI, from its source."""
    tree, _ = module_tree(CLI_SOURCE[0])
    cli = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == CLI_SOURCE[1])
    found = [node for node in cli.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if not found:
        raise Unresolved(f"{CLI_SOURCE[0]}.{CLI_SOURCE[1]} defines no {name}")
    return found[0]


def subcommand_skips() -> dict[str, set[str]]:
    """For each subcommand, the arguments of its Trainer method that the command does not take, as
    LightningCLI.subcommands() returns them (from its source)."""
    returned = next(node for node in ast.walk(_cli_method("subcommands")) if isinstance(node, ast.Return))
    return ast.literal_eval(returned.value)


def _cli_help(method: str, option: str) -> str:
    """The help LightningCLI's `method` gives `option` (from its source)."""
    for node in ast.walk(_cli_method(method)):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == option for a in node.args):
            return next(ast.literal_eval(k.value) for k in node.keywords if k.arg == "help")
    raise Unresolved(f"LightningCLI.{method} adds no {option}")


def light_trainer() -> type:
    """Lightning's Trainer read from its source: `__init__` and the subcommands' methods."""
    skips = {name: frozenset(skipped) for name, skipped in subcommand_skips().items()}
    return light_class(
        *TRAINER_SOURCE, {"__init__": frozenset(), **skips}, keeps_signature=("_defaults_from_env_vars",)
    )


def light_parser(subcommand: str) -> ArgumentParser:
    """`genoformer SUBCOMMAND`'s parser from source: the options, types, defaults and help of the
    real one (`genoformer.training_cli.training_cli`), but that its class-typed options accept
    no class (their classes are stand-ins): for `--help` and for checking options that take no
    class."""
    trainer = light_trainer()
    method = getattr(trainer, subcommand)
    parser = LightTrainingParser(
        prog=f"genoformer [options] {subcommand}",
        description=docstring_parser.parse(method.__doc__).short_description,  # as LightningCLI describes it
        parser_mode="omegaconf+",
        allow_abbrev=False,
    )
    parser.add_argument("-c", "--config", action=ActionConfigFile, help=_cli_help("init_parser", "--config"))
    parser.add_argument(
        "--seed_everything",
        type=Union[bool, int],
        default=True,
        help=_cli_help("add_default_arguments_to_parser", "--seed_everything"),
    )
    parser.add_class_arguments(trainer, "trainer", fail_untyped=False, instantiate=False, sub_configs=True)
    for key, base in (("model", "LightningModule"), ("data", "LightningDataModule")):
        parser.add_subclass_arguments(resolve("lightning.pytorch.core", base), key, fail_untyped=False, required=True)
    genoformer_core_options(parser, import_default=False)
    parser.add_method_arguments(trainer, subcommand, skip=subcommand_skips()[subcommand])
    genoformer_options(parser, subcommand)
    return parser


# ----------------------------------------------------------------------- the command line
def with_recipe_paths(args: Sequence[str]) -> list[str]:
    """`args` with each config (--config, -c) that names a shipped recipe rather than a file
    (`--config quickstart`) replaced by the recipe's file; FileNotFoundError, listing the recipes,
    for a config that is neither a file nor a recipe (a YAML text given inline stays as it is)."""
    result = list(args)
    for index, arg in enumerate(result):
        if arg in ("--config", "-c") and index + 1 < len(result):
            result[index + 1] = _config_file(result[index + 1])
        elif arg.startswith("--config="):
            result[index] = "--config=" + _config_file(arg.split("=", 1)[1])
    return result


def _config_file(value: str) -> str:
    if os.path.exists(value) or not re.fullmatch(r"[\w./~+-]+", value):
        return value
    return str(recipe_path(value))


def light_help(subcommand: str) -> str:
    """`genoformer SUBCOMMAND --help` from source: the full help (`--help --subclasses`) but for
    the classes each class-typed option knows by name, which it says where to see."""
    parser = light_parser(subcommand)
    parser.epilog = SUBCLASSES_NOTE.format(command=subcommand)
    return parser.format_help()


def _judged(parser: ArgumentParser, option: str) -> bool:
    """Whether the parser from source judges `option` (a word of the command line) as the real
    parser would: not help, not an option of the trainer that takes a class of Lightning (a
    stand-in here). The model and data module are judged (`check_options` has made sure that
    their classes are genoformer's, read from source)."""
    name = option.split("=", 1)[0]
    if not name.startswith("-"):
        return True  # a stray word: an error in either parser
    if name == "--trainer" or name.endswith(".help"):
        return False
    if any(name == f"--{key}" or name.startswith(f"--{key}.") for key in ("model", "data")):
        return True
    action = parser._option_string_actions.get(name.rstrip("+"))
    return action is None or not _takes_a_class(getattr(action, "_typehint", None))


def _takes_a_class(typehint: Any) -> bool:
    return is_stand_in(typehint) or any(_takes_a_class(arm) for arm in typing.get_args(typehint))


def _light_config(parser: ArgumentParser, path: str) -> str:
    """Config file `path` composed (its `include:` fragments merged in) as YAML text, without the
    trainer's options that take a class (callbacks, logger, ...: stand-ins here); the path as it
    is when it is not a file or not a mapping (the parser reports it)."""
    if not os.path.isfile(path):
        return path
    content = compose_config(path)
    if not isinstance(content, dict):
        return path
    if any(_names_a_file(content.get(key)) for key in ("trainer", "model", "data")):
        raise _CannotJudge(f"{path} names another config file, read relative to it")
    trainer = content.get("trainer")
    if isinstance(trainer, dict):
        for key in list(trainer):
            action = parser._option_string_actions.get(f"--trainer.{key}")
            if action is not None and _takes_a_class(getattr(action, "_typehint", None)):
                del trainer[key]
    return yaml.dump(content, Dumper=QuotedStrings, sort_keys=False)


def _names_a_file(value: Any) -> bool:
    """Whether a config section is, or holds, the path of another config file."""
    if isinstance(value, dict):
        return any(_names_a_file(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_a_file(v) for v in value)
    return isinstance(value, str) and value.endswith((".yaml", ".yml", ".json"))


def _class_paths(value: Any) -> list[str]:
    """The class_path values anywhere in a config section."""
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "class_path" and isinstance(v, str)] + [
            path for v in value.values() for path in _class_paths(v)
        ]
    if isinstance(value, list):
        return [path for v in value for path in _class_paths(v)]
    return []


def _genoformer_classes(groups: list[list[str]], configs: list[Any]) -> bool:
    """Whether every class the model and data module name (on the command line and in the config
    files, also inside a value such as `[{class_path: ...}]`) is genoformer's: a genoformer path or
    a shipped class's short name, which the light modules can read; another class is only known
    to the real parser."""
    named = [
        group[1]
        for group in groups
        if len(group) == 2 and (group[0] in ("--model", "--data") or group[0].endswith(".class_path"))
    ]
    named += [
        group[0].split("=", 1)[1]
        for group in groups
        if "=" in group[0]
        and (group[0].split("=")[0] in ("--model", "--data") or group[0].split("=")[0].endswith(".class_path"))
    ]
    named += [path for group in groups for word in group[1:] for path in re.findall(r"class_path\W+([\w.]+)", word)]
    for content in configs:
        if isinstance(content, dict):
            named += [path for key in ("model", "data") for path in _class_paths(content.get(key))]
    short = {path.rpartition(".")[2] for path in SHIPPED_CLASSES}
    return all(path.startswith("genoformer.") or path in short for path in named)


def check_options(subcommand: str, args: Sequence[str]) -> bool:
    """Exit with the one-line error of the real parser (status 2) for a mistake in `args` (what
    follows `genoformer SUBCOMMAND`) that the parser from source can judge: a config that is
    neither a file nor a shipped recipe, an unknown option or config key, a value of the wrong
    type, of the trainer, of the subcommand, or of the model and data module where they are
    genoformer's (read from source through `genoformer.signatures.LightModules`). Returns when it
    finds none: True when it read the whole command line, False when it left some or all of it
    to the real parser, which then reads everything. Leaves out command lines it could
    misjudge: help, --print_config, `${...}` interpolation typed on the command line, a class
    that is not genoformer's, and anything the sources do not settle."""
    if any(arg in ("-h", "--help") or arg.startswith("--print_config") or "${" in arg for arg in args):
        return False
    try:
        typed = with_recipe_paths(args)
    except FileNotFoundError as error:  # as the real parser reports it, from the top-level parser
        LightTrainingParser(prog="genoformer").error(f"--config: {error}")
    try:
        with LightModules():
            for class_path in SHIPPED_CLASSES:  # known by their short names, as once imported
                resolve(*class_path.rsplit(".", 1), True)
            parser = light_parser(subcommand)
            parser.cannot_judge = True
            groups = [  # --config=FILE as --config FILE
                ["--config", group[0].split("=", 1)[1]] if group[0].startswith("--config=") else group
                for group in option_groups(typed)
            ]
            configs = [group[1] for group in groups if group[0] in ("-c", "--config") and len(group) == 2]
            if not _genoformer_classes(groups, [compose_config(path) for path in configs if os.path.isfile(path)]):
                return False
            groups = [
                [group[0], _light_config(parser, group[1])]
                if group[0] in ("-c", "--config") and len(group) == 2
                else group
                for group in groups
            ]
            judged = [word for group in groups if _judged(parser, group[0]) for word in group]
            parser.parse_args(judged, defaults=False, _skip_validation=True)
    except (_CannotJudge, Unresolved, RecursionError):
        return False
    return len(judged) == sum(len(group) for group in groups)
