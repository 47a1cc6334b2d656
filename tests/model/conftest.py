"""Fixtures for the model tests: one short training run whose checkpoint the Lightning and
embedding tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_helpers import fit_tiny

from genoformer.kernels.layout import SlidingWindow
from genoformer.lightning_module import Objective


@pytest.fixture(scope="session")
def mlm_checkpoint(tmp_path_factory) -> Path:
    """A masked-LM checkpoint after 3 steps; its layers alternate sliding-window and dense."""
    root = tmp_path_factory.mktemp("mlm_run")
    trainer, _ = fit_tiny(root, Objective.MASKED_LM, attention=[SlidingWindow(window=16, block_size=16), None])
    path = root / "final.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def causal_checkpoint(tmp_path_factory) -> Path:
    """A causal-LM checkpoint after 3 steps (dense attention)."""
    root = tmp_path_factory.mktemp("clm_run")
    trainer, _ = fit_tiny(root, Objective.CAUSAL_LM)
    path = root / "final.ckpt"
    trainer.save_checkpoint(path)
    return path
