"""Fixtures shared by the whole test suite.

Two short training runs give the checkpoints that the Lightning, embedding and checkpoint tests
share (`mlm_checkpoint`, `causal_checkpoint`). Real data lives in ``../shared/data`` beside a development checkout; a user's clone has no such
folder, so every test that needs it asks for the ``shared_data`` fixture, which skips with the
reason when the folder is absent.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Without a CUDA GPU the Triton kernels run in Triton's CPU interpreter. The variable is read when
# a kernel is defined, so it must be set before any test module imports the Triton backend; the
# cross-compile test builds its kernels in a child process without it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (make test) each worker takes its share of the cores for torch's threads, and
# so do the commands its tests run in child processes: threads beyond the cores spin waiting for
# each other (two test files on a busy 2-core machine: 33 CPU-seconds at two threads, 21 at one).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)

# Lightning gives its loggers a console handler on the stderr of the moment it is first imported.
# Imported here, that is the real stderr, not the captured stream of whichever test first runs a
# training command (the `genoformer` command imports Lightning only then).
importlib.import_module("lightning.pytorch")

pytest_plugins = ["cpu_times", "interpreter_calls"]

# HYPOTHESIS_PROFILE=ci (set by .ci/run) draws the same examples in every run: a CI run judges the
# change, not a new draw, and a failure reproduces as it was seen. Elsewhere each run draws anew.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it exists only beside a development checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def hf_cache(tmp_path_factory):
    """Every test runs offline with transformers' and the Hub's caches under a temporary folder.

    transformers copies an export's modeling files into its modules cache and imports that folder
    as the package `transformers_modules` once per process: a test that loads remote code from
    another cache (a benchmark's smoke run, say) would leave that package pointing there, and every
    later export would fail to import. The paths are read when the libraries are imported (Lightning
    imports both, above), so the imported modules' constants are patched with the environment."""
    import huggingface_hub.constants as hub_constants
    import transformers.dynamic_module_utils as dynamic

    root = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(root))
        patch.setenv("HF_HUB_CACHE", str(root / "hub"))
        patch.setenv("HF_MODULES_CACHE", str(root / "modules"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        patch.setattr(dynamic, "HF_MODULES_CACHE", str(root / "modules"))
        patch.setattr(hub_constants, "HF_HUB_CACHE", str(root / "hub"))
        patch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
        yield root


@pytest.fixture(scope="session")
def mlm_checkpoint(tmp_path_factory) -> Path:
    """A masked-LM checkpoint after 3 steps; its layers alternate sliding-window and dense."""
    from genoformer.kernels.layout import SlidingWindow
    from model_helpers import fit_tiny

    from genoformer.genome.lm import Objective

    root = tmp_path_factory.mktemp("mlm_run")
    trainer, _ = fit_tiny(root, Objective.MASKED_LM, attention=[SlidingWindow(window=16, block_size=16), None])
    path = root / "final.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def causal_checkpoint(tmp_path_factory) -> Path:
    """A causal-LM checkpoint after 3 steps (dense attention)."""
    from model_helpers import fit_tiny

    from genoformer.genome.lm import Objective

    root = tmp_path_factory.mktemp("clm_run")
    trainer, _ = fit_tiny(root, Objective.CAUSAL_LM)
    path = root / "final.ckpt"
    trainer.save_checkpoint(path)
    return path
