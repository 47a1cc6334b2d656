"""The fine-tune -> classify recipe of docs/finetune.md (README's "fine-tune on your labels"), run
as written (shorter: 2 steps instead of 400) on the shipped model and the shipped splice
junctions: `classify` reads the checkpoint that `finetune` kept as the best by validation loss,
and its output keeps the input's columns."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shlex
from pathlib import Path

import pytest

from genoformer.cli import main
from genoformer.core.checkpoints import resolve_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def recipe_commands(text: str) -> list[list[str]]:
    """The `genoformer ...` commands of the first bash block that fine-tunes, as argument lists
    (continued lines joined, comments dropped)."""
    for block in BASH_BLOCK.findall(text):
        if "genoformer finetune" in block:
            joined = block.replace("\\\n", " ")
            return [shlex.split(line, comments=True) for line in joined.splitlines() if line.startswith("genoformer ")]
    raise AssertionError("docs/finetune.md has no bash block with `genoformer finetune`")


@pytest.mark.slow  # the recipe as written: the shipped 6.4M-parameter model, one validation of 318 sequences
def test_the_finetune_recipe_classifies_with_the_best_checkpoint(tmp_path, monkeypatch):
    commands = recipe_commands((REPO_ROOT / "docs" / "finetune.md").read_text())
    finetune, classify = (next(c for c in commands if c[1] == verb) for verb in ("finetune", "classify"))
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    with open(REPO_ROOT / "examples" / "splice_junctions_statlog.tsv") as handle:
        rows = handle.read().splitlines()
    (tmp_path / "my_sequences.tsv").write_text("\n".join([rows[0], *rows[1:6], *rows[-5:]]) + "\n")
    monkeypatch.chdir(tmp_path)
    steps = finetune.index("--max_steps") + 1
    finetune[steps] = "2"  # the recipe trains 400
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main([*finetune[1:], "--val_every", "2", "--device", "cpu"])
    best = re.search(r"best: step \d+ .* (\S+)\n", printed.getvalue()).group(1)
    checkpoint = resolve_checkpoint(classify[classify.index("--checkpoint") + 1])  # a file, or the run's best
    assert checkpoint.resolve() == Path(best).resolve() and checkpoint.name == "best.ckpt"
    main([*classify[1:], "--device", "cpu"])
    out = Path(classify[classify.index("--out") + 1])
    with open(out, newline="") as handle:
        predicted = list(csv.DictReader(handle, delimiter="\t"))
    assert list(predicted[0])[:3] == ["name", "sequence", "label"] and len(predicted) == 10
    assert [row["label"] for row in predicted] == [row.split("\t")[1] for row in [*rows[1:6], *rows[-5:]]]
