"""Every piece of config that README.md and the guides (docs/**/*.md) show parses with the real parser.

Three kinds of snippet configure genoformer: a ```yaml block with model, trainer or data keys
(merged over a shipped config as a second --config), an `attention_backend: NAME` line (in a
block or inline), and an inline `model.KEY: VALUE` (or trainer., data.) written in the text,
which is checked as the option --model.KEY VALUE. A snippet passes when it parses over one of
the shipped configs of its kind: the quick start (GenoformerLM) or the tiny time-series config.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from jsonargparse import ArgumentError

from genoformer.cli import TOOL_COMMANDS, TRAINING_COMMANDS, ToolParser, _tool_arguments, parsing_function
from genoformer.training_cli import training_cli, with_recipe_paths

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
BASES = [REPO_ROOT / "configs" / "quickstart.yaml", REPO_ROOT / "configs" / "timeseries_tiny_cpu.yaml"]
CONFIG_KEYS = {"model", "trainer", "data"}

YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
BACKEND_LINE = re.compile(r"^\s*attention_backend:\s*([\w-]+)", re.MULTILINE)
INLINE_SETTING = re.compile(r"`((?:model|trainer|data)\.[\w.]+|attention_backend): ([^`]+)`")

STALE: dict[tuple[str, str], str] = {}
"""Snippets known to be out of date, with why; each must still fail (strict), so that it leaves
this list when its document is fixed."""


class Snippet(NamedTuple):
    doc: str
    line: int
    block: str | None  # a YAML block given as a second --config, or
    options: tuple[str, ...]  # command-line options


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text, doc = path.read_text(), str(path.relative_to(REPO_ROOT))
        for match in YAML_BLOCK.finditer(text):
            block, at = match.group(1), _line(text, match.start())
            content = yaml.safe_load(block)
            if isinstance(content, dict) and CONFIG_KEYS & set(content):
                found.append(Snippet(doc, at, block, ()))
            else:
                for line in BACKEND_LINE.finditer(block):
                    found.append(Snippet(doc, at, None, ("--model.runtime.attention_backend", line.group(1))))
        for match in INLINE_SETTING.finditer(text):
            key, value = match.groups()
            key = "model.runtime.attention_backend" if key == "attention_backend" else key
            found.append(Snippet(doc, _line(text, match.start()), None, (f"--{key}", value.strip())))
    return found


SNIPPETS = snippets()


def _cases() -> list:
    cases = []
    for snippet in SNIPPETS:
        reason = STALE.get((snippet.doc, " ".join(snippet.options)))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        cases.append(pytest.param(snippet, marks=marks, id=f"{snippet.doc}:{snippet.line}"))
    return cases


@pytest.fixture(scope="module")
def quickstart_cli():
    return training_cli(["--config", str(BASES[0]), "--trainer.accelerator", "cpu"], run=False)


@pytest.fixture(scope="module")
def parser(quickstart_cli):
    """The parser of the training options (model, data, trainer), without a subcommand."""
    return quickstart_cli.parser


def test_the_docs_show_config_snippets():
    docs = {snippet.doc for snippet in SNIPPETS}
    assert {
        "docs/multi_gpu.md",
        "docs/flash_attn.md",
        "docs/attention.md",
        "docs/design/training.md",
    } <= docs  # guides, and design notes
    assert any(snippet.block for snippet in SNIPPETS)
    assert any("--model.runtime.attention_backend" in snippet.options for snippet in SNIPPETS)
    assert set(STALE) <= {(snippet.doc, " ".join(snippet.options)) for snippet in SNIPPETS}


@pytest.mark.parametrize("snippet", _cases())
def test_snippet_parses(snippet, parser, tmp_path):
    extra = list(snippet.options)
    if snippet.block is not None:
        block = tmp_path / "snippet.yaml"
        block.write_text(snippet.block)
        extra = ["--config", str(block)]
    errors = []
    for base in BASES:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(["--config", str(base), *extra])
            return
        except SystemExit:
            errors.append(f"over {base.name}: {stderr.getvalue().strip().splitlines()[-1]}")
    pytest.fail(f"{snippet.doc} line {snippet.line} does not parse:\n" + "\n".join(errors))


# ----------------------------------------------------------------------- commands
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
INLINE_COMMAND = re.compile(r"`(genoformer [a-z_]+(?: [^`]*)?)`")
SHELL_OPERATORS = {"&", ";", "|", "&&", "||", "do", "done", "done;"}


class Command(NamedTuple):
    doc: str
    line: int
    words: tuple[str, ...]  # after `genoformer`
    inline: bool  # written in the text, where it may show some options only


def _shell_blocks(text: str) -> tuple[list[tuple[int, str]], str]:
    """The shell code of a document (fenced blocks tagged as shell, and indented blocks), each with
    its first line; and the prose outside fenced blocks."""
    blocks, prose, language, start, lines = [], [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, lines = line[3:].strip(), number + 1, []
            else:
                if language in SHELL_LANGUAGES:
                    blocks.append((start, "\n".join(lines)))
                language = None
            prose.append("")
        elif language is not None:
            lines.append(line)
            prose.append("")
        else:
            prose.append(line)
    previous = ""
    for number, line in enumerate(prose, 1):  # an indented block starts after a blank line
        if line.startswith("    ") and line.strip() and not previous.strip():
            indented = []
            for following in prose[number - 1 :]:
                if following.strip() and not following.startswith("    "):
                    break
                indented.append(following[4:])
            blocks.append((number, "\n".join(indented)))
        previous = line if not line.startswith("    ") or not line.strip() else "x"
    return blocks, "\n".join(prose)


def _logical_lines(block: str) -> list[tuple[int, str]]:
    """The lines of shell code with their continuations (a line ending in a backslash) joined,
    each with its first line's offset in the block."""
    result, pending, first = [], "", 0
    for offset, line in enumerate(block.split("\n")):
        if not pending:
            first = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        result.append((first, pending + line))
        pending = ""
    return result


def commands() -> list[Command]:
    """Every `genoformer ...` command that README.md and docs/**/*.md write, in shell blocks and in
    inline code."""
    found = []
    for path in DOCS:
        text, doc = path.read_text(), str(path.relative_to(REPO_ROOT))
        blocks, prose = _shell_blocks(text)
        for start, block in blocks:
            for offset, line in _logical_lines(block):
                words = shlex.split(line, comments=True)
                for index, word in enumerate(words):
                    if word == "genoformer" or word.endswith("which genoformer)"):
                        rest = []
                        for following in words[index + 1 :]:
                            if following in SHELL_OPERATORS:
                                break
                            rest.append(following)
                        found.append(Command(doc, start + offset, tuple(rest), inline=False))
        for match in INLINE_COMMAND.finditer(prose):
            found.append(Command(doc, _line(prose, match.start()), tuple(shlex.split(match.group(1))[1:]), inline=True))
    return found


COMMANDS = commands()

SHELL_VARIABLE = re.compile(r"^\$\w+$")
"""A word that is a shell variable (`$seed` in a loop), read as 1."""
PLACEHOLDERS = re.compile(r"\.\.\.|^[A-Z][A-Z_]*$")
"""A word that stands for what the reader fills in (`...same options...`, `X`, `N`): its command is
a template, not checked."""


@pytest.fixture(scope="module")
def training_parser(quickstart_cli, parser):
    """The parser of `genoformer fit|validate|test|predict`, built as the command builds it (the
    CLI's own parser, which `parser` is, is put back)."""
    quickstart_cli.setup_parser(True, *quickstart_cli._setup_parser_kwargs(quickstart_cli.parser_kwargs))
    with_subcommands, quickstart_cli.parser = quickstart_cli.parser, parser
    return with_subcommands


def _tool_parser(command: str):
    function = parsing_function(TOOL_COMMANDS[command])
    parser = ToolParser(prog=f"genoformer {command}", exit_on_error=False, allow_abbrev=False)
    parser.add_function_arguments(function, as_positional=False)
    return function, parser


def test_the_docs_show_commands():
    verbs = {command.words[0] for command in COMMANDS if command.words}
    assert {"prepare", "fit", "embed", "score", "variant_effect", "finetune", "forecast", "export"} <= verbs
    assert {"docs/training.md", "docs/multi_gpu.md", "README.md"} <= {command.doc for command in COMMANDS}


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(command, id=f"{command.doc}:{command.line}")
        for command in COMMANDS
        if not any(PLACEHOLDERS.search(word) for word in command.words)
    ],
)
def test_command_parses(command, training_parser, monkeypatch):
    """Each command names a genoformer command and only its options, with values of their types
    (relative paths are read from the repository root, as the guides' commands run from a clone)."""
    monkeypatch.chdir(REPO_ROOT)
    verb, *args = (SHELL_VARIABLE.sub("1", word) for word in command.words)
    where = f"{command.doc} line {command.line}: genoformer {' '.join(command.words)}"
    assert verb in TOOL_COMMANDS or verb in TRAINING_COMMANDS, f"{where}: no command {verb!r}"
    if not args or "--help" in args or any(arg.endswith(".help") for arg in args):
        return  # a command named in the text (`genoformer prepare`), or its help
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            if verb in TOOL_COMMANDS:
                function, parser = _tool_parser(verb)
                parser.parse_args(_tool_arguments(function, args))
            else:
                training_parser.parse_args([verb, *with_recipe_paths(args)])
    except SystemExit as exit:
        if exit.code == 0:
            return  # --print_config printed the config
        message = stderr.getvalue().strip()
    except ArgumentError as error:
        message = str(error)
    else:
        return
    if command.inline and ("arguments are required" in message or "expected one argument" in message):
        return  # the text names the options it talks about, some without their values
    pytest.fail(f"{where}\ndoes not parse: {message}")
