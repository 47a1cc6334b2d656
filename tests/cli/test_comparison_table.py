"""One comparison table (model, Markov baseline, mixture) from `evaluate` and `baseline`: the
same columns in every file, the hint that `evaluate` prints run as printed, and the Markov
column of `evaluate --mix` equal to `baseline`'s."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

import numpy as np
import pytest
from genoformer.data.genome.alphabet import decode

from genoformer.cli import main

HEADER = ["name", "bases", "model_bits_per_base", "markov_bits_per_base", "mixture_bits_per_base"]


def fasta(path: Path, seed: int, records: int = 2) -> Path:
    rng = np.random.default_rng(seed)
    motif = decode(rng.integers(0, 4, 40).astype(np.uint8))  # repeated, so a Markov model learns something
    path.write_text(
        "".join(f">r{i}\n{motif * 8}{decode(rng.integers(0, 4, 300).astype(np.uint8))}\n" for i in range(records))
    )
    return path


def table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert list(rows[0]) == HEADER
    return rows


def test_evaluate_and_baseline_write_one_table(causal_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    train, test = fasta(tmp_path / "train.fa", 1), fasta(tmp_path / "test.fa", 2)
    capsys.readouterr()
    main(["evaluate", "--checkpoint", str(causal_checkpoint), "--inputs", str(test), "--out", "model.tsv"])
    printed = capsys.readouterr().out
    model = table(tmp_path / "model.tsv")
    assert [row["name"] for row in model] == ["r0", "r1", "total"]
    assert all(row["model_bits_per_base"] and not row["markov_bits_per_base"] for row in model)
    hint = next(line.strip() for line in printed.splitlines() if line.strip().startswith("genoformer baseline"))
    main([word.replace("TRAINING_GENOMES", str(train)) for word in shlex.split(hint)[1:]])  # as printed
    markov = table(tmp_path / "markov.tsv")
    assert all(row["markov_bits_per_base"] and not row["model_bits_per_base"] for row in markov)
    main(
        [
            "evaluate",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(test),
            "--out",
            "all.tsv",
            "--mix",
            "markov.npz",
        ]
    )
    both = table(tmp_path / "all.tsv")
    assert all(row[column] for row in both for column in HEADER)
    for mixed, alone, network in zip(both, markov, model):
        assert mixed["bases"] == alone["bases"] == network["bases"]
        assert float(mixed["markov_bits_per_base"]) == pytest.approx(float(alone["markov_bits_per_base"]), abs=1e-4)
        assert float(mixed["model_bits_per_base"]) == pytest.approx(float(network["model_bits_per_base"]), abs=1e-5)
