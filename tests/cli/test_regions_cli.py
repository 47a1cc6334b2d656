"""`--regions`, `--split`, tracks and `--both_strands` through `genoformer ...` as typed: regions
in genome coordinates under the records' names, bigWig and binned tracks, exact store splits, and
hints that work as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pyBigWig
from cli_helpers import fails
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.store import prepare_genome_store

from genoformer.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
RECORD = "gi|9626243|ref|NC_001416.1|"  # lambda's one record


def hinted(message: str, pattern: str) -> list[str]:
    found = re.search(pattern, message)
    assert found, f"no {pattern!r} in: {message}"
    return shlex.split(found.group(0))


def test_evaluate_regions_are_rows_named_by_region(causal_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval.json"
    main(
        [
            "evaluate",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(LAMBDA),
            "--context",
            "64",
            "--regions",
            f"{RECORD}:1-200",
            f"{RECORD}:40,001-40,100",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    printed = capsys.readouterr().out
    assert f"{RECORD}:40001-40100" in printed and "region" in printed
    rows = json.loads(out.read_text())["records"]
    assert [(row["name"], row["bases"]) for row in rows] == [(f"{RECORD}:1-200", 199), (f"{RECORD}:40001-40100", 100)]


def test_evaluate_split_follows_the_training_config(causal_checkpoint, tmp_path, capsys):
    store = prepare_genome_store([LAMBDA], tmp_path / "lambda.zarr", progress=False)
    config = tmp_path / "fit.yaml"
    config.write_text(
        "data:\n  init_args:\n    split:\n      by: region\n      val_fraction: 0.01\n      test_fraction: 0.002\n"
    )
    out = tmp_path / "test.json"
    main(
        [
            "evaluate",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(store),
            "--split",
            "test",
            "--split_config",
            str(config),
            "--context",
            "64",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    rows = json.loads(out.read_text())["records"]
    length = 48_502
    start = length - round(length * 0.002)
    assert [(row["name"], row["bases"]) for row in rows] == [(f"{RECORD}:{start + 1}-{length}", length - start)]
    err = fails(
        capsys,
        [
            "evaluate",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(store),
            "--split",
            "test",
            "--regions",
            RECORD,
            "--device",
            "cpu",
        ],
    )
    assert "give --regions REGIONS or --split SPLIT, not both" in err


def test_score_bigwig_with_regions_and_bins(causal_checkpoint, tmp_path, capsys):
    out = tmp_path / "lambda.bw"
    args = [
        "score",
        "--checkpoint",
        str(causal_checkpoint),
        "--inputs",
        str(LAMBDA),
        "--context",
        "64",
        "--regions",
        f"{RECORD}:1,001-1,500",
        "--out",
        str(out),
        "--device",
        "cpu",
    ]
    err = fails(capsys, [*args, "--bin", "0"])
    assert "--bin 0: a bin holds at least 1 base" in err and not out.exists()
    main([*args, *hinted(err, r"--bin 1")])
    per_base = pyBigWig.open(str(out))
    values = np.array(per_base.values(RECORD, 1000, 1500))
    per_base.close()
    assert np.isfinite(values).all() and (values <= 0).all()
    err = fails(capsys, [*args, "--bin", "100"])
    assert f"{out} exists; pass --overwrite" in err
    main([*args, "--bin", "100", *hinted(err, r"--overwrite")])
    binned = pyBigWig.open(str(out))
    intervals = binned.intervals(RECORD)
    binned.close()
    assert [(start, end) for start, end, _ in intervals] == [(s, s + 100) for s in range(1000, 1500, 100)]
    np.testing.assert_allclose([value for _, _, value in intervals], values.reshape(5, 100).mean(1), rtol=1e-5)


def test_score_bedgraph_rows_are_in_record_coordinates(causal_checkpoint, tmp_path, capsys):
    bed = tmp_path / "one.bed"
    bed.write_text(f"{RECORD}\t2000\t2050\tsite\n")
    out = tmp_path / "site.bedgraph"
    main(
        [
            "score",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(LAMBDA),
            "--context",
            "64",
            "--regions",
            str(bed),
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    rows = [line.split("\t") for line in out.read_text().splitlines()[1:]]
    assert {row[0] for row in rows} == {RECORD}
    assert int(rows[0][1]) == 2000 and int(rows[-1][2]) == 2050
    err = fails(
        capsys,
        [
            "score",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(LAMBDA),
            "--regions",
            "lambda:1-10",
            "--out",
            str(tmp_path / "x.bedgraph"),
            "--device",
            "cpu",
        ],
    )
    assert f"record 'lambda' is not in the genome, which holds 1 record(s): '{RECORD}'" in err


def test_baseline_split_and_regions(tmp_path, capsys):
    store = prepare_genome_store([LAMBDA], tmp_path / "lambda.zarr", progress=False)
    out = tmp_path / "baseline.json"
    main(
        [
            "baseline",
            "--train",
            str(store),
            "--split",
            "train",
            "--inputs",
            str(store),
            "--inputs_split",
            "val",
            "--out",
            str(out),
            "--order",
            "4",
            "--discount",
            "0.5",
            "--concentration",
            "16",
        ]
    )
    result = json.loads(out.read_text())
    codes = next(read_sequences([LAMBDA])).codes
    cut = len(codes) - round(len(codes) * 0.05)  # the data module's default: the last 5% is val
    assert result["model"]["train_bases"] == int((codes[:cut] < 4).sum())
    assert [(row["region"], row["bases"]) for row in result["records"]] == [
        (f"{RECORD}:{cut + 1}-{len(codes)}", int((codes[cut:] < 4).sum()))
    ]
    out = tmp_path / "regions.json"
    main(
        [
            "baseline",
            "--train",
            str(LAMBDA),
            "--inputs",
            str(LAMBDA),
            "--regions",
            f"{RECORD}:101-200",
            "--out",
            str(out),
            "--order",
            "4",
            "--discount",
            "0.5",
            "--concentration",
            "16",
        ]
    )
    assert [(row["name"], row["bases"]) for row in json.loads(out.read_text())["records"]] == [
        (f"{RECORD}:101-200", 100)
    ]
    err = fails(
        capsys,
        [
            "baseline",
            "--train",
            str(LAMBDA),
            "--inputs",
            str(LAMBDA),
            "--regions",
            RECORD,
            "--inputs_split",
            "test",
            "--out",
            str(tmp_path / "both.json"),
        ],
    )
    assert "give --regions REGIONS or --inputs_split SPLIT, not both" in err


def test_embed_regions_and_both_strands(mlm_checkpoint, tmp_path, capsys):
    out = tmp_path / "regions.npz"
    main(
        [
            "embed",
            "--checkpoint",
            str(mlm_checkpoint),
            "--inputs",
            str(LAMBDA),
            "--regions",
            f"{RECORD}:1-300",
            f"{RECORD}:1001-1300",
            "--out",
            str(out),
            "--both_strands",
        ]
    )
    saved = np.load(out)
    assert list(saved["names"]) == [f"{RECORD}:1-300", f"{RECORD}:1001-1300"] and saved["embeddings"].shape == (2, 32)
    forward, backward = tmp_path / "f.npz", tmp_path / "b.npz"
    main(
        [
            "embed",
            "--checkpoint",
            str(mlm_checkpoint),
            "--inputs",
            "ACGTTGCAAGGT",
            "--out",
            str(forward),
            "--both_strands",
            "--pooling",
            "none",
        ]
    )
    main(
        [
            "embed",
            "--checkpoint",
            str(mlm_checkpoint),
            "--inputs",
            "ACCTTGCAACGT",
            "--out",
            str(backward),
            "--both_strands",
            "--pooling",
            "none",
        ]
    )
    np.testing.assert_allclose(
        np.load(forward)["embeddings"], np.load(backward)["embeddings"][::-1], rtol=1e-5, atol=1e-6
    )
    err = fails(
        capsys,
        [
            "embed",
            "--checkpoint",
            str(mlm_checkpoint),
            "--inputs",
            "ACGTACGTAC" * 36 + "ACGX",
            "--out",
            str(tmp_path / "bad.npz"),
        ],
    )
    assert "sequence 'seq0', base 364 (1-based): invalid character 'X'" in err
