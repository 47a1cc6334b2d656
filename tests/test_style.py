"""The tree keeps the house style that pyproject.toml's [tool.ruff] sets: `ruff check` finds
nothing, and `ruff format` would change nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="needs ruff (pip install -e '.[dev]')")


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_is_clean():
    done = ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_changes_nothing():
    done = ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
