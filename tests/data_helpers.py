"""Helpers for the data tests: paths of the real data (tests skip when ../shared/data is absent)
and small synthetic FASTA files. A uniquely named module so that it never collides with other
test folders' helpers."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # the shipped genomes
ECG_CSV = SHARED_DATA / "timeseries" / "ecg_mitbih208_360hz.csv"


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real data not found at {path.resolve()} (a checkout without ../shared/data)")
    return path


def random_bases(rng: np.random.Generator, n: int, alphabet: str = "ACGT") -> str:
    return "".join(rng.choice(list(alphabet), size=n))


def write_fasta(path: Path, records: list[tuple[str, str]], width: int = 60, newline: str = "\n") -> Path:
    lines = []
    for name, seq in records:
        lines.append(f">{name}")
        lines.extend(seq[i : i + width] for i in range(0, len(seq), width))
    data = (newline.join(lines) + newline).encode("ascii")
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path
