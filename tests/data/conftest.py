"""Fixtures for the data tests: a small synthetic genome store shared by the session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_helpers import random_bases, write_fasta


@pytest.fixture(scope="session")
def small_records() -> list[tuple[str, str]]:
    """Three contigs of different lengths, one with lowercase, one with an N run."""
    rng = np.random.default_rng(7)
    a = random_bases(rng, 50_000)
    b = random_bases(rng, 20_000).lower() + random_bases(rng, 13_000)
    c = random_bases(rng, 9_000) + "N" * 3_000 + random_bases(rng, 9_000)
    return [("chrA", a), ("chrB", b), ("chrC", c)]


@pytest.fixture(scope="session")
def small_store(tmp_path_factory, small_records) -> Path:
    from genoformer.data import prepare_genome_store

    root = tmp_path_factory.mktemp("small_store")
    fasta = write_fasta(root / "small.fa.gz", small_records)
    return prepare_genome_store([fasta], root / "small.zarr", chunk_size=4096, shard_chunks=4, progress=False)
