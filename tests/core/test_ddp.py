"""Multi-process training goes through Lightning's DDP strategy: two CPU processes (gloo) fit a few
steps of the quickstart config and end with identical weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).with_name("ddp_fit_script.py")


def test_two_process_ddp_fit_keeps_the_ranks_identical(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["global_step"] for r in ranks] == [3, 3]
    for name, weight in ranks[0]["final"].items():
        assert torch.equal(weight, ranks[1]["final"][name]), f"{name} differs between the ranks"
    trained = [name for name, weight in ranks[0]["final"].items() if not torch.equal(weight, ranks[0]["initial"][name])]
    assert len(trained) == len(ranks[0]["final"])  # every parameter moved: the ranks really trained
