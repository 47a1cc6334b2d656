"""The package's sources as they install, copied to a folder of their own: what import-linter reads,
and where tests/test_extending.py follows docs/extending.md's recipes without touching the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def installed_layout(into: Path) -> Path:
    """The Python sources and recipes of every package under `into`, laid out as pyproject.toml's
    package-dir installs them: kernels/ and data/ inside genoformer/ (tomllib: Python 3.11+)."""
    import tomllib

    package_dirs = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dirs.items():
        source = REPO_ROOT / folder
        for path in [*source.rglob("*.py"), *source.rglob("*.yaml")]:
            target = into / Path(*package.split(".")) / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return into


def insert_after(path: Path, anchor: str, text: str) -> None:
    """Write `text` into the file at `path` right after the first `anchor` (which must be there)."""
    source = path.read_text()
    assert anchor in source, f"{path} no longer holds {anchor!r}: docs/extending.md needs the same change"
    path.write_text(source.replace(anchor, anchor + text, 1))


def run_python(code: str, sources: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args` with `sources` first on sys.path (ahead of the editable install)."""
    env = {**os.environ, "PYTHONPATH": str(sources)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=sources, capture_output=True, text=True, env=env, timeout=300
    )
