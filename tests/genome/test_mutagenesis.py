"""`genoformer mutagenesis`: every base at every position of regions, scored exactly as
`genoformer variant_effect` scores that SNV; the TSV in genome coordinates, the PNG, the regions
checked against the genome, and no output replaced without --overwrite."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest
from cli_helpers import fails
from genoformer.data.genome.alphabet import decode, encode
from genoformer.data.genome.regions import Region
from model_helpers import random_tokens

from genoformer.cli import main
from genoformer.genome.mutagenesis import region_alleles, saturation_mutagenesis
from genoformer.genome.scoring import Scorer
from genoformer.genome.variants import variant_effect

RECORD = "plasmid|p1"  # a record name as NCBI writes them


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mutagenesis")
    sequence = decode(random_tokens(1, 90, seed=5)[0].numpy())
    path = folder / "genome.fa"
    path.write_text(f">chr1 first record\n{sequence}\n>{RECORD}\nACGTNACGTAGG\n")
    return path, sequence


def run(checkpoint, genome_path, out, *extra: str) -> list[list[str]]:
    main(
        [
            "mutagenesis",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            str(genome_path),
            "--out",
            str(out),
            "--device",
            "cpu",
            *extra,
        ]
    )
    return [line.split("\t") for line in out.read_text().splitlines()]


@pytest.mark.parametrize(
    "which, both_strands", [("causal_checkpoint", False), ("causal_checkpoint", True), ("mlm_checkpoint", False)]
)
def test_mutagenesis_equals_variant_effect_for_every_snv(which, both_strands, genome, tmp_path, request):
    checkpoint = request.getfixturevalue(which)
    path, _ = genome
    strands = ["--both_strands"] if both_strands else []
    # the contig's first bases, its middle and its last bases: windows clipped at both ends
    rows = run(
        checkpoint,
        path,
        tmp_path / "m.tsv",
        "--regions",
        "chr1:1-6",
        "chr1:40-44",
        "chr1:86-90",
        "--window",
        "32",
        *strands,
    )
    effects = variant_effect(
        checkpoint=checkpoint,
        reference=[str(path)],
        variants=tmp_path / "m.tsv",
        out=tmp_path / "e.tsv",
        window=32,
        both_strands=both_strands,
        device="cpu",
    )
    expected = [line.split("\t") for line in effects.read_text().splitlines()[1:]]
    assert len(rows) - 1 == len(expected) == 3 * 16
    for row, effect in zip(rows[1:], expected):
        assert effect[:4] == row[:4] and effect[-1] == ""
        assert float(row[4]) == pytest.approx(float(effect[-2]), abs=1e-5)
    assert len({row[4] for row in rows[1:]}) > 40  # real, different scores


@pytest.mark.parametrize("both_strands", [False, True])
def test_continued_prefixes_give_the_scores_of_whole_windows(both_strands, causal_checkpoint, genome, monkeypatch):
    """A causal model scores each position's four windows as one prefill of their shared prefix and
    four continuations (a key/value cache): the llr of every SNV equals that of the four whole
    windows (float32 rounding, under 1e-4 bits), at the contig's ends too (short or no prefix)."""
    path, sequence = genome
    scorer = Scorer.from_checkpoint(causal_checkpoint, device="cpu")
    reference = {"chr1": encode(sequence)}
    regions = [Region("chr1", 0, 3, "start"), Region("chr1", 43, 46, "middle"), Region("chr1", 87, 90, "end")]
    continued = saturation_mutagenesis(
        scorer, reference, regions, window=32, both_strands=both_strands, batch_size=4, progress=False
    )
    monkeypatch.setattr(Scorer, "can_continue", property(lambda self: False))
    whole = saturation_mutagenesis(
        scorer, reference, regions, window=32, both_strands=both_strands, batch_size=4, progress=False
    )
    for got, expected in zip(continued, whole):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4, equal_nan=True)
    assert np.nanstd(np.concatenate(whole)) > 0.01  # real, different scores


def test_tsv_rows_are_in_genome_coordinates_with_the_record_names(causal_checkpoint, genome, tmp_path):
    path, sequence = genome
    rows = run(causal_checkpoint, path, tmp_path / "coords.tsv", "--regions", "chr1:11-13", RECORD, "--window", "16")
    assert rows[0] == ["chrom", "pos", "ref", "alt", "llr"]
    chr1 = rows[1:10]
    assert [(r[0], int(r[1])) for r in chr1] == [("chr1", pos) for pos in (11, 12, 13) for _ in range(3)]
    for chrom, pos, ref, alt, llr in chr1:
        assert ref == sequence[int(pos) - 1] and alt != ref and np.isfinite(float(llr))
    assert [r[3] for r in chr1[:3]] == [b for b in "ACGT" if b != sequence[10]]  # alternatives in A C G T order
    plasmid = rows[10:]
    assert {r[0] for r in plasmid} == {RECORD}
    assert sorted({int(r[1]) for r in plasmid}) == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12]  # the N at 5 has no rows
    assert all(r[2] == "ACGTNACGTAGG"[int(r[1]) - 1] for r in plasmid)


def test_alleles_skip_n_and_list_the_three_other_bases():
    codes = np.array([0, 4, 3], dtype=np.uint8)
    alleles = region_alleles(Region("c", 0, 3, "c"), codes)
    assert [(a.start, a.ref, a.alt) for a in alleles] == [
        (0, "A", "C"),
        (0, "A", "G"),
        (0, "A", "T"),
        (2, "T", "A"),
        (2, "T", "C"),
        (2, "T", "G"),
    ]


def test_png_is_written_beside_the_tsv(causal_checkpoint, genome, tmp_path):
    path, _ = genome
    run(causal_checkpoint, path, tmp_path / "plot.tsv", "--regions", "chr1:20-49", "chr1:50-60", "--window", "16")
    png = (tmp_path / "plot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_regions_are_checked_against_the_genome(causal_checkpoint, genome, tmp_path, capsys):
    path, _ = genome
    args = [
        "mutagenesis",
        "--checkpoint",
        str(causal_checkpoint),
        "--inputs",
        str(path),
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "r.tsv"),
    ]
    err = fails(capsys, args + ["--regions", "chr1:80-95"])
    assert "chr1:80-95" in err and "at most 90" in err
    err = fails(capsys, args + ["--regions", "chr3:1-10"])
    assert "'chr3' is not in the genome" in err and "'chr1'" in err
    err = fails(capsys, args + ["--regions", "chr1:1-10", "--window", "1"])
    assert "genoformer mutagenesis --help" in err and "--context" not in err
    main(args + ["--regions", "chr1:1-10", *shlex.split(re.search(r"--window \d+", err).group(0))])  # as typed
    assert not list(tmp_path.glob(".r.*"))  # no temporaries left by the failures


def test_existing_outputs_are_kept_without_overwrite(causal_checkpoint, genome, tmp_path, capsys):
    path, _ = genome
    args = [
        "mutagenesis",
        "--checkpoint",
        str(causal_checkpoint),
        "--inputs",
        str(path),
        "--device",
        "cpu",
        "--regions",
        "chr1:1-4",
        "--window",
        "16",
        "--out",
        str(tmp_path / "kept.tsv"),
    ]
    main(args)
    written = (tmp_path / "kept.tsv").read_text()
    (tmp_path / "kept.tsv").write_text("mine")
    err = fails(capsys, args)
    assert "kept.tsv exists; pass --overwrite" in err and (tmp_path / "kept.tsv").read_text() == "mine"
    (tmp_path / "kept.tsv").unlink()
    err = fails(capsys, args)  # the PNG alone is protected too
    assert "kept.png exists" in err and not (tmp_path / "kept.tsv").exists()
    main(args + ["--overwrite"])
    assert (tmp_path / "kept.tsv").read_text() == written
