"""docs/extending.md's recipes, followed as written: each section's marked code blocks (a new file,
or lines put after a line of an existing file) are applied to a copy of the sources as they install,
and the section's run block runs there in a fresh process and prints ok. A recipe whose files,
anchors or code drift from the tree fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from source_helpers import REPO_ROOT, insert_after, installed_layout, run_python

pytest.importorskip("tomllib", reason="the copy of the sources follows pyproject.toml's package-dir (Python 3.11+)")

GUIDE = REPO_ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"<!-- (?P<marker>[^>]*?) -->\n```python\n(?P<code>.*?)```\n", re.S)
FOLDERS = {"kernels/": "genoformer/kernels/", "data/": "genoformer/data/", "genoformer/": "genoformer/"}
"""Where a path of the clone lies in the installed copy."""


def sections() -> dict[str, list[tuple[str, str]]]:
    """Each `## ` section of the guide: its marked blocks (marker, code) in order."""
    found = {}
    for part in re.split(r"^## ", GUIDE.read_text(), flags=re.M)[1:]:
        title = part.splitlines()[0].strip()
        found[title] = [(m["marker"], m["code"]) for m in BLOCK.finditer(part)]
    return found


def installed(path: str) -> Path:
    return Path(next(dst + path[len(src) :] for src, dst in FOLDERS.items() if path.startswith(src)))


def follow(recipe: list[tuple[str, str]], sources: Path) -> str:
    """Apply the recipe's blocks to `sources`; the code of its run block."""
    run = None
    for marker, code in recipe:
        if marker == "run":
            run = code
        elif marker.startswith("new file: "):
            target = sources / installed(marker.removeprefix("new file: "))
            assert not target.exists(), f"{target} exists: the recipe's new file has the name of another"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
        else:
            into = re.fullmatch(r"in (\S+), after the line: (.*)", marker, re.S)
            assert into is not None, (
                f"{marker!r}: a block is marked run, new file: PATH, or in PATH, after the line: LINE"
            )
            insert_after(sources / installed(into[1]), into[2] + "\n", code)
    assert run is not None, "a recipe ends with a run block"
    return run


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return installed_layout(tmp_path_factory.mktemp("extended"))


@pytest.mark.parametrize("title", list(sections()))
def test_recipe_runs_end_to_end(title, sources):
    done = run_python(follow(sections()[title], sources), sources)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
