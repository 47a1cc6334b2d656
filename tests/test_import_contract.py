"""The import contract of pyproject.toml's [tool.importlinter] holds: arrows run one way (cli ->
the wings -> core -> kernels, data -> the helpers), no wing imports the other, and no module
imports one that imports it back. import-linter reads the package as it installs (the folders
kernels/ and data/ inside genoformer/), so the check runs on such a copy of the sources; and it
fails when a wing imports the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from source_helpers import installed_layout

pytest.importorskip("tomllib", reason="import-linter reads pyproject.toml with tomllib (Python 3.11+)")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def lint_imports(sources: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1]))"
    return subprocess.run(
        [sys.executable, "-c", code, str(PYPROJECT)],
        cwd=sources,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(sources), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return installed_layout(tmp_path_factory.mktemp("installed"))


def test_the_contract_holds(sources):
    done = lint_imports(sources)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_a_wing_importing_the_cli_breaks_it(sources, tmp_path):
    broken = shutil.copytree(sources, tmp_path / "broken")
    module = broken / "genoformer" / "timeseries" / "baselines.py"
    module.write_text(module.read_text() + "\n\ndef _upward():\n    from genoformer import cli  # an arrow back up\n")
    done = lint_imports(broken)
    assert done.returncode == 1, done.stdout[-4000:]
    assert "genoformer.timeseries is not allowed to import genoformer.cli" in done.stdout, done.stdout[-4000:]
    assert "genoformer.timeseries.baselines -> genoformer.cli" in done.stdout
