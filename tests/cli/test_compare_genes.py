"""`genoformer compare_genes`: gene calls (GFF3) against a reference annotation, one row per
file of calls, with figures worked out by hand on a small contig."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import fails
from genoformer.data.genome.alphabet import decode

from genoformer.cli import main

LENGTH = 1000


def gff3(path: Path, genes: list[tuple[int, int, str]], *, contig: str = "ctg1", sequence: str | None = None) -> Path:
    """A GFF3 of CDS genes given as (1-based start, inclusive end, strand), with a ##FASTA section
    when `sequence` is given."""
    lines = ["##gff-version 3", f"##sequence-region {contig} 1 {LENGTH}"]
    lines += [f"{contig}\ttest\tCDS\t{s}\t{e}\t.\t{strand}\t0\tID=g{i}" for i, (s, e, strand) in enumerate(genes)]
    if sequence is not None:
        lines += ["##FASTA", f">{contig}", sequence]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    sequence = decode(np.random.default_rng(0).integers(0, 4, LENGTH).astype(np.uint8))
    return {
        "reference": gff3(tmp_path / "reference.gff3", [(101, 400, "+"), (501, 800, "-")], sequence=sequence),
        "same": gff3(tmp_path / "same.gff3", [(101, 400, "+"), (501, 800, "-")]),
        # one gene right; the other on the wrong strand with another stop, and 100 bases short
        "half": gff3(tmp_path / "half.gff3", [(101, 400, "+"), (601, 800, "+")]),
    }


def test_compare_genes_one_row_per_file(files, tmp_path, capsys):
    out = tmp_path / "comparison.tsv"
    capsys.readouterr()
    main(
        [
            "compare_genes",
            "--reference",
            str(files["reference"]),
            "--predicted",
            str(files["same"]),
            str(files["half"]),
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "same.gff3" in printed and "half.gff3" in printed and "coding MCC" in printed
    header, *rows = [line.split("\t") for line in out.read_text().splitlines()]
    table = {Path(row[0]).name: dict(zip(header, row)) for row in rows}
    same, half = table["same.gff3"], table["half.gff3"]
    assert (
        float(same["coding_mcc"]) == 1.0 and float(same["recall_stop"]) == 1.0 and float(same["precision_stop"]) == 1.0
    )
    # per base: 500 of the 600 coding bases called, nothing else: MCC 500*400 / sqrt(500*600*400*500)
    assert float(half["coding_mcc"]) == pytest.approx(500 * 400 / np.sqrt(500 * 600 * 400 * 500), abs=1e-4)
    assert float(half["recall_stop"]) == 0.5 and float(half["precision_stop"]) == 0.5
    assert float(half["recall_start_stop"]) == 0.5 and half["predicted_genes"] == "2" and half["reference_genes"] == "2"


def test_compare_genes_in_regions_and_errors(files, tmp_path, capsys):
    """In ctg1:1-450 only the + gene (its stop ends at 400) and those bases count: both files
    match it; calls on a contig the reference lacks are refused, naming the file."""
    out = tmp_path / "c.json"
    main(
        [
            "compare_genes",
            "--reference",
            str(files["reference"]),
            "--predicted",
            str(files["half"]),
            "--regions",
            "ctg1:1-450",
            "--out",
            str(out),
        ]
    )
    [row] = json.loads(out.read_text())["rows"]
    assert row["bases"] == 450 and row["reference_genes"] == 1 and row["predicted_genes"] == 1
    assert row["coding_mcc"] == 1.0 and row["recall_stop"] == 1.0
    other = gff3(tmp_path / "other.gff3", [(101, 400, "+")], contig="chrX")
    err = fails(capsys, ["compare_genes", "--reference", str(files["reference"]), "--predicted", str(other)])
    assert f"{other}: 1 contig(s) are not in the reference: 'chrX'" in err and "'ctg1'" in err
    err = fails(
        capsys,
        [
            "compare_genes",
            "--reference",
            str(files["reference"]),
            "--predicted",
            str(files["same"]),
            "--out",
            str(tmp_path / "c.csv"),
        ],
    )
    assert ".tsv or .json" in err
