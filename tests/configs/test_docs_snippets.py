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
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from genoformer.cli import training_cli

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
def parser():
    return training_cli(["--config", str(BASES[0]), "--trainer.accelerator", "cpu"], run=False).parser


def test_the_docs_show_config_snippets():
    docs = {snippet.doc for snippet in SNIPPETS}
    assert {"docs/multi_gpu.md", "docs/flash_attn.md", "docs/attention.md", "docs/design/training.md"} <= docs  # guides, and design notes
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
