"""The Markov baseline benchmark runs end to end on a small store, for a held-out region and a held-out file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from genoformer.data.alphabet import decode
from genoformer.data.genome_store import prepare_genome_store

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_genomes(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("genomes")
    files = []
    for name, records in (("one.fa", {"one_a": 12_000, "one_b": 3_000}), ("two.fa", {"two_a": 9_000})):
        text = "".join(f">{record}\n{decode(rng.integers(0, 4, length).astype(np.uint8))}\n"
                       for record, length in records.items())
        (root / name).write_text(text)
        files.append(root / name)
    return prepare_genome_store(files, root / "genomes.zarr", progress=False)


@pytest.mark.parametrize("name, split, genomes, bases", [
    ("region", "{by: region, val_fraction: 0.1, test_fraction: 0.1}", ["one.fa", "two.fa"], 1_200 + 300 + 900),
    ("genome", '{"by": "files", "test": ["two.fa"]}', ["two.fa"], 9_000),
])
def test_markov_baseline_benchmark_small_run(tmp_path, two_genomes, name, split, genomes, bases):
    markdown = tmp_path / "BENCHMARKS.md"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.markov_baseline", "--store", str(two_genomes), "--split", split,
         "--name", name, "--max-order", "3", "--out", str(tmp_path), "--markdown", str(markdown)],
        cwd=REPO_ROOT, check=True, capture_output=True, text=True,
    )
    summary = json.loads((tmp_path / f"markov_{name}.json").read_text())
    assert [g["genome"] for g in summary["genomes"]] == genomes
    assert summary["total"]["bases"] == bases
    assert summary["total"]["bits_per_base"] == pytest.approx(2.0, abs=0.05)  # uniform random bases
    assert 0 <= summary["model"]["order"] <= 3
    assert "two.fa" not in summary["model"]["train_files"] or name == "region"
    assert f"<!-- markov-{name}:start -->" in markdown.read_text()
    assert result.stdout.strip().endswith("|")  # the table comes last
