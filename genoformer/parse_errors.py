"""One-line parse errors for every `genoformer` command, the tool commands' and LightningCLI's alike.

A parse error is one line (`ShortErrors`, `one_line_error`): the nearest valid option to a
mistyped one, or what an option takes (`accepted_forms`: `--horizons takes a whole number (96),
comma-separated (96,192) or a list`), then where to see all options, and the cause last. The
command-line helpers beside it (`options_given`, `command_with`) let an error print the command
that mends it.
"""

from __future__ import annotations

import difflib
import enum
import importlib
import os
import re
import shlex
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, Optional

from jsonargparse import ArgumentParser


def option_groups(args: Sequence[str]) -> list[list[str]]:
    """`args` as groups of [option, value] ([option] for a flag, [word] for a leading word such
    as the subcommand); a value is the word after an option that does not start with "--"."""
    groups: list[list[str]] = []
    for arg in args:
        is_option = arg.startswith("--") or arg == "-c"
        if not is_option and groups and len(groups[-1]) == 1 and _is_option(groups[-1][0]) and "=" not in groups[-1][0]:
            groups[-1].append(arg)
        else:
            groups.append([arg])
    return groups


def _is_option(word: str) -> bool:
    return word.startswith("--") or word == "-c"


def _option_name(word: str) -> str:
    return word.split("=", 1)[0]


def options_given(args: Sequence[str]) -> set[str]:
    """The names of the options a command line gives (`--trainer.max_steps`, without values)."""
    return {_option_name(group[0]) for group in option_groups(args) if _is_option(group[0])}


def command_with(args: Sequence[str], *extra: str, drop: Sequence[str] = ()) -> str:
    """`genoformer ARGS` as a shell command, with the options of `extra` set (each replacing the
    same option where `args` gives it, rather than repeating it) and the options in `drop` left out."""
    added = option_groups(extra)
    replaced = {_option_name(group[0]) for group in added if _is_option(group[0])} | set(drop)
    kept = [group for group in option_groups(args) if _option_name(group[0]) not in replaced]
    return shlex.join(["genoformer", *(word for group in kept + added for word in group)])


# ----------------------------------------------------------------------- short parse errors
_CLASS_PATH = re.compile(r"Problem with given class_path '([\w.]+)'")
_PARSER_KEY = re.compile(r'Parser key "([\w.]+)"')
_UNKNOWN = [
    re.compile(r"unrecognized arguments: --(?P<key>[\w.-]+)"),
    re.compile(r"Option '(?P<key>[\w.]+)' is not accepted"),
    re.compile(r"(?:Group '(?P<group>[\w.]+)'|Subcommand '[\w.]+') does not accept option '(?P<key>[\w.]+)'"),
    re.compile(r'Key "(?P<key>[\w.]+)" is not expected'),
]


def _option_names(parser: ArgumentParser) -> list[str]:
    """The dotted names of a parser's options (`trainer.max_steps`), without the leading `--`, and
    those of its subcommands' parsers."""
    names = [name[2:] for name in parser._option_string_actions if name.startswith("--")]
    subcommands = parser._subcommands_action
    for subparser in subcommands._name_parser_map.values() if subcommands is not None else ():
        names += _option_names(subparser)
    return list(dict.fromkeys(names))


def _class_parser(class_path: str) -> ArgumentParser:
    """A parser of the options of the class at `class_path`."""
    module, _, name = class_path.rpartition(".")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
    return parser


def _class_option_names(class_path: str) -> list[str]:
    """The dotted names of the options of the class at `class_path` (`transformer.d_model`)."""
    return [option for option in _option_names(_class_parser(class_path)) if option not in ("help", "print_config")]


def _unknown_option(parser: ArgumentParser, message: str, prog: str) -> Optional[str]:
    """For a parse error about an option or config key that does not exist: one line naming the
    nearest valid one and where to see them all, the unknown one last; None for other errors."""
    for pattern in _UNKNOWN:
        found = pattern.search(message)
        if found:
            break
    else:
        return None
    key = ".".join(part for part in (found.groupdict().get("group"), found.group("key")) if part)
    typed = "--" if "unrecognized arguments" in found.group(0) or "NestedArg(" in message else ""
    classes = [match for match in _CLASS_PATH.finditer(message) if match.start() < found.start()]
    if classes:
        class_path = classes[-1].group(1)
        class_name = class_path.rpartition(".")[2]
        parser_key = _PARSER_KEY.search(message)
        where = f"{parser_key.group(1)}." if parser_key else ""
        names = _class_option_names(class_path)
        cause = f"unknown option {typed}{where}{key} ({class_name} has no {key})"
        listing = f"(the options of {class_name}: {prog} --{where}help {class_name})"
    else:
        where = ""
        names = _option_names(parser)
        cause = f"unknown option {typed}{key}"
        listing = f"(all options: {prog} --help)"
    near = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    head, _, rest = key.partition(".")
    if not near and rest:  # a mistyped group (`modle.transformer.d_model`): mend its first part
        heads = difflib.get_close_matches(head, {name.partition(".")[0] for name in names}, n=1, cutoff=0.6)
        near = [f"{heads[0]}.{rest}"] if heads else []
    advice = f"did you mean {typed}{where}{near[0]}? " if near else ""
    return f"{advice}{listing}; {cause}"


def _plural(typehint: Any) -> tuple[str, str, str]:
    """(what one element is, an example of one, of two) for a list option's element type."""
    if typehint is int:
        return "a whole number", "96", "96,192"
    if typehint is float:
        return "a number", "0.5", "0.5,0.9"
    if typehint is Path or (isinstance(typehint, type) and issubclass(typehint, os.PathLike)):
        return "a path", "a.ckpt", "a.ckpt,b.ckpt"
    return "a value", "a", "a,b"


def accepted_forms(typehint: Any, flag: bool = True) -> str:
    """What an option of type `typehint` takes, in words and examples as typed on the command
    line (`flag`: a bool option may be given alone)."""
    origin, arms = typing.get_origin(typehint), [arm for arm in typing.get_args(typehint) if arm is not type(None)]
    if origin is typing.Union and len(arms) == 1:
        return accepted_forms(arms[0], flag)
    if origin is typing.Union and any(typing.get_origin(arm) is list for arm in arms):
        one, example, _ = _plural(next(arm for arm in arms if typing.get_origin(arm) is not list))
        return f'{one} ({example}), several after the option or a list ("[{example},...]")'
    if origin is typing.Union:
        return " or ".join(accepted_forms(arm, flag) for arm in arms)
    if origin is list:
        one, example, two = _plural(typing.get_args(typehint)[0] if typing.get_args(typehint) else str)
        return f'{one} ({example}), comma-separated ({two}) or a list ("[{two}]")'
    if origin is typing.Literal:
        return "one of " + ", ".join(str(value) for value in typing.get_args(typehint))
    if isinstance(typehint, type) and issubclass(typehint, enum.Enum):
        return "one of " + ", ".join(str(member.value).lower() for member in typehint)
    if typehint is bool:
        return "nothing (a flag) or true|false" if flag else "true or false"
    if typehint in (int, float):
        return _plural(typehint)[0]
    if typehint is Path:
        return "a path"
    if typehint is str:
        return "a text"
    return f"a {getattr(typehint, '__name__', typehint)}"


_GIVEN = re.compile(r"(?:Given value|Got value): (?P<value>.*?)\s*$", re.MULTILINE)
_REQUIRED = re.compile(r"the following arguments are required: (?P<keys>[\w.,\s]+)")
_NO_VALUE = re.compile(r"argument --(?P<key>[\w.]+)(?:/--[\w.+]+)?: expected one argument")
_STRAY = re.compile(r"unrecognized arguments: (?P<words>[^-].*)")


def _option_type(parser: ArgumentParser, key: str) -> Any:
    action = parser._option_string_actions.get(f"--{key}")
    return getattr(action, "_typehint", None) or getattr(action, "type", None) if action is not None else None


def _describe(parser: ArgumentParser, key: str, flags: bool) -> str:
    """`--key takes ...` where the parser knows the option's type, else `--key`."""
    typehint = _option_type(parser, key)
    return f"--{key}" if typehint is None else f"--{key} takes {accepted_forms(typehint, flags)}"


def one_line_error(parser: ArgumentParser, message: str, prog: str, flags: bool = True) -> str:
    """jsonargparse's error `message` as one line: the option, what it takes, where to see every
    option, and the cause last (`flags`: the command takes a bool option alone)."""
    listing = f"(all options: {prog} --help)"
    unknown = _unknown_option(parser, message, prog)
    if unknown is not None:
        return unknown
    keys = list(_PARSER_KEY.finditer(message))
    if keys:
        given = _GIVEN.findall(message)
        classes = list(_CLASS_PATH.finditer(message))
        if len(keys) > 1 and classes and classes[-1].start() < keys[-1].start():  # an option of a class_path
            given = _GIVEN.findall(message[keys[-1].start() :])
            key, inner = f"{keys[0].group(1)}.init_args.{keys[-1].group(1)}", keys[-1].group(1)
            what = _describe(_class_parser(classes[-1].group(1)), inner, flags).replace(f"--{inner}", f"--{key}", 1)
        else:
            what = _describe(parser, keys[0].group(1), flags)
        cause = f"got {given[0]!r}" if given else message.strip().splitlines()[-1].strip()
        return f"{what} {listing}; {cause}"
    required = _REQUIRED.search(message)
    if required is not None:
        keys = [key.strip() for key in required.group("keys").split(",") if key.strip()]
        what = "; ".join(_describe(parser, key, flags) for key in keys)
        return f"{what} {listing}; {' and '.join(f'--{key}' for key in keys)} not given (required)"
    no_value = _NO_VALUE.search(message)
    if no_value is not None:
        return f"{_describe(parser, no_value.group('key'), flags)} {listing}; no value given"
    stray = _STRAY.search(message)
    if stray is not None:
        return (
            f"every word after the command is an option or an option's value (--name value; a flag alone "
            f"or with true|false) {listing}; {stray.group('words').strip()!r} follows no option"
        )
    return f"{listing} {' '.join(line.strip() for line in message.strip().splitlines())}"


class ShortErrors:
    """jsonargparse parser mixin: a parse error exits with status 2 and one line, without the usage
    (`one_line_error`): for an option or config key that does not exist, the nearest valid one
    (difflib); for a value of the wrong type or a missing one, what the option takes; each with
    where to see all options, and the cause last."""

    accepts_bare_flags = False
    """Whether the command takes a bool option alone (`--overwrite`); the tool commands do."""

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # raises, as jsonargparse does inside its own parsing
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {one_line_error(parser, message, prog, self.accepts_bare_flags)}\n")
        self.exit(2)
