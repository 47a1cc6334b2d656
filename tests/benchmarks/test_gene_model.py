"""The gene model pipeline of benchmarks/gpu_genome.sh gene_model (fit with the genes recipe, export the
best checkpoint, annotate the held-out genome, pyrodigal, compare_genes) at tiny size on the CPU:
the tiny causal test model, two small annotated genomes, two steps."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from genoformer.data.genome.alphabet import decode

from benchmarks import gene_model

pytest.importorskip("pyrodigal")


def annotated_genome(path: Path, seed: int, genes: list[tuple[int, int, str]], length: int = 4000) -> Path:
    sequence = decode(np.random.default_rng(seed).integers(0, 4, length).astype(np.uint8))
    lines = ["##gff-version 3", f"##sequence-region ctg{seed} 1 {length}"]
    lines += [f"ctg{seed}\ttest\tCDS\t{s}\t{e}\t.\t{strand}\t0\tID=g{i}" for i, (s, e, strand) in enumerate(genes)]
    path.write_text(
        "\n".join(lines + ["##FASTA", f">ctg{seed}"] + [sequence[i : i + 60] for i in range(0, length, 60)]) + "\n"
    )
    return path


@pytest.mark.slow  # a fit, an export, an annotation and a comparison, each through the command line
def test_gene_model_pipeline_at_tiny_size(causal_checkpoint, tmp_path):
    train = annotated_genome(tmp_path / "train.gff3", 1, [(101, 400, "+"), (1501, 1800, "-"), (2301, 2610, "+")])
    test = annotated_genome(tmp_path / "test.gff3", 2, [(201, 500, "-"), (1001, 1600, "+")])
    out = tmp_path / "out"
    result = gene_model.BENCHMARK.main(
        [
            "--train",
            str(train),
            "--test",
            str(test),
            "--out",
            str(out),
            "--run",
            str(tmp_path / "run"),
            "--pretrained",
            str(causal_checkpoint),
            "--baseline",
            "",
            "--max_steps",
            "2",
            "--annotate_option=--window",
            "--annotate_option=256",
            "--annotate_option=--device",
            "--annotate_option=cpu",
            "--fit_option",
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--data.init_args.window",
            "256",
            "--data.init_args.batch_size",
            "2",
            "--trainer.val_check_interval",
            "2",
        ]
    )
    assert {p.name for p in out.iterdir()} == {
        "genes_table.tsv",
        "gene_model.json",
        "genoformer_gene_annotator.ckpt",
        "metrics.csv",
        "test_genoformer.gff3",
        "test_pyrodigal.gff3",
    }
    with open(out / "genes_table.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert [Path(row["predicted"]).name for row in rows] == ["test_genoformer.gff3", "test_pyrodigal.gff3"]
    assert all(row["reference_genes"] == "2" and -1.0 <= float(row["coding_mcc"]) <= 1.0 for row in rows)
    assert result["data"]["rows"] == rows and result["data"]["train_seconds"] > 0 and result["data"]["steps"] == 2
    [mcc, genes] = result["summary"]["targets"]  # coding MCC against pyrodigal's, genes with strand and stop
    assert mcc["status"] in ("MET", "NOT MET") and genes["status"] in ("MET", "NOT MET")
