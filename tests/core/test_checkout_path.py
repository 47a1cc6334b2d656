"""A source checkout on sys.path must not shadow installed packages: its kernels/ folder (installed
as genoformer.kernels) has the name of Hugging Face's `kernels` package, which transformers imports
whenever it is installed (genoformer/__init__.py keeps the checkout's root behind site-packages)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_in_checkout(code: str) -> subprocess.CompletedProcess:
    # python -c puts the working directory first on sys.path, as python -m and python cli.py do
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_importing_genoformer_keeps_the_checkout_behind_installed_packages():
    done = run_in_checkout("import sys, pathlib, genoformer, benchmarks; "
                           "print([pathlib.Path(p or '.').resolve() == pathlib.Path.cwd() for p in sys.path])")
    assert done.returncode == 0, done.stderr[-2000:]  # benchmarks/ still imports from the root
    at_root = ast.literal_eval(done.stdout.strip())
    assert at_root[-1] and sum(at_root) == 1, "the root must be on sys.path once, last"
    done = run_in_checkout("import genoformer, importlib.util; spec = importlib.util.find_spec('kernels'); "
                           "print(spec.origin if spec else 'none')")
    assert done.returncode == 0, done.stderr[-2000:]
    assert not done.stdout.strip().startswith(str(REPO_ROOT / "kernels")), done.stdout


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("kernels") is None,
                    reason="needs transformers with Hugging Face's kernels package installed (transformers 5.25+ requires it)")
def test_transformers_models_import_from_the_checkout():
    done = run_in_checkout("import genoformer.core.hf, transformers.modeling_utils; print('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
