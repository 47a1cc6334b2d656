"""A source checkout's root on sys.path must not shadow installed packages: its folders kernels/ and
data/ (installed as genoformer.kernels and genoformer.data) have the names of other packages, such
as Hugging Face's `kernels`, which transformers imports whenever it is installed. A script run in
the root (python -c puts the root first on sys.path, as python -m, python cli.py and a notebook
started there do) gets the installed package on `import kernels` without importing genoformer
first, or a clear error when none is installed. Plain transformers loading an export from the root
is tested in test_hf_export.py."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
WITHOUT_SITE_PACKAGES = "import sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p]; "
"""Code that leaves out every installed package, so that only the checkout can answer an import."""


def installed_kernels() -> Path | None:
    """Hugging Face's kernels package as installed (its __init__.py), or None."""
    try:
        return Path(importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")).resolve()
    except importlib.metadata.PackageNotFoundError:
        return None


def run_in_checkout(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    installed_kernels() is None,
    reason="needs Hugging Face's kernels package installed (transformers 5.25+ requires it)",
)
def test_import_kernels_in_the_root_gives_the_installed_package():
    done = run_in_checkout(
        "import sys, kernels; from kernels import get_kernel; print(kernels.__file__, 'genoformer' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    origin, genoformer_imported = done.stdout.split()
    assert Path(origin).resolve() == installed_kernels(), origin
    assert genoformer_imported == "True"  # the folder asked genoformer for the installed package


@pytest.mark.parametrize("name", ["kernels", "data"])
def test_a_folder_without_an_installed_package_says_what_to_import(name):
    done = run_in_checkout(
        WITHOUT_SITE_PACKAGES + f"import {name}; print(getattr({name}, '__file__', None)); from {name} import anything"
    )
    assert done.returncode == 1 and done.stdout.strip() == "None", done.stdout + done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: No module named '{name}': import genoformer.{name} "), last
    assert str(REPO_ROOT / name) in last, last


def test_transformers_sees_no_package_where_only_the_folder_is():
    """transformers (5.17 and newer) checks an optional package by finding its spec, then importing it
    when it has no metadata: a folder of the checkout with no package of its name installed must
    read as not installed, not break `import transformers` (data/ stands for kernels/ here, since
    Hugging Face's kernels may be installed)."""
    pytest.importorskip("transformers")
    done = run_in_checkout(
        "from transformers.utils import import_utils; "
        "print(import_utils._is_package_available('data', return_version=True))"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(False, 'N/A')", done.stdout


def test_the_folders_still_import_under_genoformer_from_the_root():
    done = run_in_checkout(
        "import genoformer.kernels.backend, genoformer.data.splits, sys; "
        "print(sys.modules['genoformer.kernels'].__file__, 'kernels' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    origin, top_level = done.stdout.split()
    assert Path(origin) == REPO_ROOT / "kernels" / "__init__.py" and top_level == "False"
