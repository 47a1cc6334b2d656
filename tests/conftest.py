"""Fixtures shared by the whole test suite.

Real data lives in ``../shared/data`` beside a development checkout; a user's clone has no such
folder, so every test that needs it asks for the ``shared_data`` fixture, which skips with the
reason when the folder is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
