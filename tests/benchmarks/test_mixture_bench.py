"""benchmarks/mixture.py end to end on small slices of the shipped genomes (lambda as the
"strain", H. pylori as the "genus", a Markov model of lambda), and its skip without the genomes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from benchmarks.mixture import main, read_genome
from genoformer.data.genome.inputs import read_sequences

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def test_mix_on_small_slices_writes_the_table_and_the_targets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["mix", "--strain", str(EXAMPLES / "lambda_phage.fasta.gz"), "--genus", str(EXAMPLES / "hpylori_els37.fasta.gz"),
            "--train", str(EXAMPLES / "lambda_phage.fasta.gz"), "--max_order", "4", "--slice", "600", "--validation",
            "300", "--offset", "5000", "--context", "64", "--switch_rates", "0.001", "--work", str(work), "--out", str(out)]
    main(args)
    results = json.loads((out / "mixture.json").read_text())
    assert set(results["results"]) == {"selected strain", "selected genus", "memory strain", "memory genus"}
    rows = results["results"]["memory strain"]
    assert [row["method"] for row in rows][:2] == ["network", "Markov model"]
    assert sum(row.get("default", False) for row in rows) == 1
    assert results["slices"]["strain"]["test"]["bases"] == 600 and len(results["targets"]) == 4
    assert "(the default)" in (out / "mixture.md").read_text()
    assert (out / "mixture.png").stat().st_size > 10_000
    cached = sorted(work.glob("network_*.npy"))
    assert len(cached) == 4 and "strain test:" in capsys.readouterr().out
    main(args)  # a second run scores nothing again: the network scores and the Markov model are cached
    assert sorted(work.glob("network_*.npy")) == cached and "strain test:" not in capsys.readouterr().out


def test_mix_skips_without_the_genomes(tmp_path, capsys):
    main(["mix", "--strain", str(tmp_path / "absent.gff3.gz"), "--out", str(tmp_path / "out")])
    assert "skipped:" in capsys.readouterr().out and not (tmp_path / "out").exists()


def test_a_gff3_with_its_sequences_reads_as_records(tmp_path):
    gff = tmp_path / "genome.gff3.gz"
    with gzip.open(gff, "wt") as handle:
        handle.write("##gff-version 3\nc1\tProkka\tCDS\t1\t6\t.\t+\t0\tID=g1\n##FASTA\n>c1 a contig\nACGT\nNNAC\n>c2\nGG\n")
    records = read_genome(gff)
    assert [name for name, _ in records] == ["c1", "c2"]
    np.testing.assert_array_equal(records[0][1], np.array([0, 1, 2, 3, 4, 4, 0, 1], dtype=np.uint8))
    fasta = EXAMPLES / "lambda_phage.fasta.gz"
    assert read_genome(fasta)[0][1].size == next(read_sequences([fasta])).codes.size
