"""Faults injected into real `genoformer fit` processes of the quick-start configuration.

A run killed with SIGKILL at a step nobody chose, then continued with `--ckpt_path last`, ends
with exactly the weights, optimizer and scheduler state of a run that was never interrupted; a
run sent SIGTERM saves `last.ckpt` at the step it is on, exits with status 143 and continues the
same way; a second `fit` on the directory of a running one fails at once, naming it. The quick
start is shrunk to a 512-token context and 7 windows per epoch so that each run takes seconds and
the interruptions fall mid-epoch, after epochs have already ended.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from genoformer.data import prepare_genome_store

from genoformer.core.run_lock import LOCK_NAME

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 60  # the quick start's own; last.ckpt every 10 steps


@pytest.fixture(scope="module")
def ecoli_store(tmp_path_factory) -> Path:
    fasta = REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"
    return prepare_genome_store([fasta], tmp_path_factory.mktemp("store") / "ecoli.zarr", progress=False)


def _command(run_dir: Path, store: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "cli.py",
        "fit",
        "--config",
        "configs/quickstart.yaml",
        "--trainer.default_root_dir",
        str(run_dir),
        "--data.init_args.store",
        str(store),
        "--model.transformer.max_seq_len",
        "512",
        "--data.init_args.samples_per_epoch",
        "7",
        "--trainer.val_check_interval",
        "25",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _fit(run_dir: Path, store: Path, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        _command(run_dir, store, *extra), cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _start_and_wait_for_checkpoint(run_dir: Path, store: Path) -> subprocess.Popen:
    """Start a run and return once its first periodic last.ckpt exists (the process still runs)."""
    process = subprocess.Popen(
        _command(run_dir, store),
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.exists():
        assert process.poll() is None, f"the run ended before its first checkpoint:\n{process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.01)
    return process


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _assert_identical(resumed: dict, reference: dict) -> None:
    assert resumed["global_step"] == reference["global_step"] == MAX_STEPS
    for key, value in reference["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), f"weights differ after resume: {key}"
    for index, state in reference["optimizer_states"][0]["state"].items():
        for name, value in state.items():
            assert torch.equal(resumed["optimizer_states"][0]["state"][index][name], value), f"optimizer {index}.{name}"
    assert resumed["lr_schedulers"] == reference["lr_schedulers"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ecoli_store) -> dict:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    _fit(run_dir, ecoli_store)
    return _checkpoint(run_dir)


def test_sigkill_then_resume_gives_identical_weights(tmp_path, ecoli_store, reference):
    process = _start_and_wait_for_checkpoint(tmp_path, ecoli_store)
    time.sleep(random.uniform(0.0, 0.5))  # an arbitrary step, possibly in the middle of saving one
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = _checkpoint(tmp_path)["global_step"]
    assert 10 <= killed_at < MAX_STEPS and killed_at % 7, "the interruption should fall mid-epoch"
    _fit(tmp_path, ecoli_store, "--ckpt_path", "last")
    _assert_identical(_checkpoint(tmp_path), reference)


def test_sigterm_saves_at_the_current_step_then_resume_is_identical(tmp_path, ecoli_store, reference):
    process = _start_and_wait_for_checkpoint(tmp_path, ecoli_store)
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM received; saved" in stderr and "--ckpt_path last" in stderr
    saved_at = _checkpoint(tmp_path)["global_step"]
    assert 10 <= saved_at < MAX_STEPS
    _fit(tmp_path, ecoli_store, "--ckpt_path", "last")
    _assert_identical(_checkpoint(tmp_path), reference)


def test_a_second_fit_on_a_running_run_directory_fails_at_once_naming_the_first(tmp_path, ecoli_store):
    """Two `genoformer fit` processes on one run directory would mix two runs; the second must fail
    before it trains, naming the first (its pid, host and start), and leave the first running."""
    first = subprocess.Popen(
        _command(tmp_path, ecoli_store, "--trainer.max_steps", "100000"),
        cwd=REPO_ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (tmp_path / LOCK_NAME).exists():  # the first run holds the directory from here on
        assert first.poll() is None, f"the first run ended early:\n{first.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "the first run took no lock in 300 s"
        time.sleep(0.05)
    try:
        second = subprocess.run(
            _command(tmp_path, ecoli_store, "--ckpt_path", "last"),
            cwd=REPO_ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert first.poll() is None, "the first run must still be training"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert second.returncode == 1, second.stderr[-3000:]
    assert f"process {first.pid} on {socket.gethostname()}, started 20" in second.stderr, second.stderr[-3000:]
    assert "in use by another training run" in second.stderr and "Traceback" not in second.stderr
