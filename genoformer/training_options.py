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
from typing import Any, Optional, Union

import docstring_parser
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, Namespace

from genoformer.parse_errors import ShortErrors, option_groups
from genoformer.shipped import recipe_path
from genoformer.signatures import Unresolved, is_stand_in, light_class, module_tree, stand_in_class

TRAINING_COMMANDS = ("fit", "validate", "test", "predict")
EVALUATION_COMMANDS = ("validate", "test", "predict")

DEFAULT_MODEL = "genoformer.genome.lm.GenoformerLM"
"""The model of a config without model.class_path."""

TRAINER_SOURCE = ("lightning.pytorch.trainer.trainer", "Trainer")
CLI_SOURCE = ("lightning.pytorch.cli", "LightningCLI")


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
class LightTrainingParser(ShortErrors, ArgumentParser):
    """A training command's parser built from source (jsonargparse's, with short errors, and
    LightningArgumentParser's settings)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("env_prefix", "PL")
        kwargs.setdefault("default_env", False)
        super().__init__(*args, **kwargs)


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
        parser.add_subclass_arguments(
            stand_in_class("lightning.pytorch.core", base), key, fail_untyped=False, required=True
        )
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
    parser would: not a config file (read by the real parser, with its includes), not --model or
    --data and their options (their classes are imported), not an option that takes a class."""
    name = option.split("=", 1)[0]
    if not name.startswith("-"):
        return True  # a stray word: an error in either parser
    if name in ("-c", "--config", "--trainer") or name.endswith(".help"):
        return False
    if any(name == f"--{key}" or name.startswith(f"--{key}.") for key in ("model", "data")):
        return False
    action = parser._option_string_actions.get(name.rstrip("+"))
    return action is None or not _takes_a_class(getattr(action, "_typehint", None))


def _takes_a_class(typehint: Any) -> bool:
    return is_stand_in(typehint) or any(_takes_a_class(arm) for arm in typing.get_args(typehint))


def check_options(subcommand: str, args: Sequence[str]) -> None:
    """Exit with the one-line error of the real parser (status 2) for a mistake in `args` (what
    follows `genoformer SUBCOMMAND`) that the parser from source can judge: a config that is
    neither a file nor a shipped recipe, an unknown option, a value of the wrong type for an
    option of the trainer or of the subcommand. Returns when it finds none (the real parser then
    reads everything). Leaves out command lines it could misjudge: help, --print_config, and
    `${...}` interpolation, which may refer to what it does not read."""
    if any(arg in ("-h", "--help") or arg.startswith("--print_config") or "${" in arg for arg in args):
        return
    try:
        with_recipe_paths(args)
    except FileNotFoundError as error:  # as the real parser reports it, from the top-level parser
        LightTrainingParser(prog="genoformer").error(f"--config: {error}")
    parser = light_parser(subcommand)
    judged = [word for group in option_groups(args) if _judged(parser, group[0]) for word in group]
    parser.parse_args(judged, defaults=False, _skip_validation=True)
