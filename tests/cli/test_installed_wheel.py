"""The wheel on its own: built from this checkout and installed into a fresh environment in a
temporary folder outside the repository, it runs the quick start's steps there (examples,
prepare, fit a few steps, embed) with the recipes and example data it carries.

The fresh environment reuses this one's dependencies (torch, Lightning, ...) through a .pth file
and installs the wheel alone (--no-deps), so that the install takes seconds. This environment's
editable install of the checkout cannot answer instead: a path in a .pth file joins sys.path
without the .pth files inside that folder being run (the editable install's finder is one), the
commands run outside the repository without PYTHONPATH, and the test checks which genoformer runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "genoformer", "kernels", "data", "configs", "examples")
"""What the wheel is built from (pyproject.toml's package-dir folders, and the README it names)."""
WHEEL_LIMIT = 8 * 2**20
"""Recipes and small data only: the models (.ckpt, 36 MiB) stay out."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:  # built from a copy: a build writes build/ and *.egg-info beside its sources
        origin = REPO_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.ckpt", "*.egg-info"))
        else:
            shutil.copy(origin, source / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = dist.glob("genoformer-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh environment holding the wheel, with this environment's packages behind it; its bin/."""
    env = tmp_path_factory.mktemp("env")
    assert REPO_ROOT not in env.parents
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "outer_environment.pth").write_text("".join(f"{path}\n" for path in outer))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    return env / "bin"


def _run(bin_dir: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        GENOFORMER_HOME=str(work / "model_cache"),
    )
    result = subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def test_the_wheel_holds_the_recipes_and_example_data_and_no_model(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "genoformer/configs/quickstart.yaml" in names and "genoformer/configs/base/trainer_cpu.yaml" in names
    assert "genoformer/examples/ecoli_k12_mg1655.fasta.gz" in names
    assert not [name for name in names if name.endswith(".ckpt")]
    assert wheel.stat().st_size < WHEEL_LIMIT


@pytest.mark.slow
def test_the_quick_start_runs_from_the_installed_wheel_outside_the_clone(installed, tmp_path):
    assert REPO_ROOT not in tmp_path.parents
    where = _run(
        installed, tmp_path, "python", "-c", "import genoformer.shipped as s; print(s.PACKAGE, s.configs_dir())"
    )
    package, configs = where.stdout.split()
    assert Path(package).parent.parent.parent.parent == installed.parent  # env/lib/pythonX.Y/site-packages/genoformer
    assert Path(configs) == Path(package) / "configs"
    assert "quickstart" in _run(installed, tmp_path, "genoformer", "recipes").stdout

    _run(installed, tmp_path, "genoformer", "examples")
    _run(
        installed,
        tmp_path,
        "genoformer",
        "prepare",
        "--fasta",
        "examples/ecoli_k12_mg1655.fasta.gz",
        "--out",
        "runs/quickstart/ecoli.zarr",
    )
    _run(
        installed,
        tmp_path,
        "genoformer",
        "fit",
        "--config",
        "quickstart",
        "--trainer.max_steps",
        "2",
        "--model.transformer.max_seq_len",
        "1024",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    )
    assert (tmp_path / "runs/quickstart/checkpoints/last.ckpt").is_file()
    embedded = _run(
        installed,
        tmp_path,
        "genoformer",
        "embed",
        "--checkpoint",
        "runs/quickstart",
        "--inputs",
        "examples/lambda_phage.fasta.gz",
        "--regions",
        "gi|9626243|ref|NC_001416.1|:1-2000",
        "--out",
        "lambda.npz",
    )
    assert "runs/quickstart/checkpoints/last.ckpt" in embedded.stderr  # a run directory names its checkpoint
    with np.load(tmp_path / "lambda.npz") as result:
        assert result["embeddings"].shape == (1, 128)
