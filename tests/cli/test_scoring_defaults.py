"""One default window for every scoring command: the same SNV gets the same llr from
`variant_effect`, `mutagenesis` and `score` (the alternative sequence's track less the
reference's) at their defaults, and a long window on a CPU gets a hint that runs as printed.

The model is the tiny causal test model read as trained at a 4,096-base context (its weights
do not depend on the context: rotary positions), longer than the CPU default of 2,048, where the
commands' defaults used to differ (the trained context, 1,024 and 2,048)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pyBigWig
import pytest
import torch
from genoformer.data.genome.alphabet import decode

from genoformer.cli import main

POSITIONS = [700, 701, 1900]  # 1-based; each SNV changes the reference base to the next in A C G T


def sequence_of(length: int) -> str:
    return decode(np.random.default_rng(3).integers(0, 4, length).astype(np.uint8))


def snvs_at(positions: list[int], length: int) -> list[tuple[int, str]]:
    reference = sequence_of(length)
    return [(p, "ACGT"["ACGT".index(reference[p - 1]) - 3]) for p in positions if p <= length]


@pytest.fixture(scope="module")
def long_context_checkpoint(causal_checkpoint, tmp_path_factory) -> Path:
    checkpoint = torch.load(causal_checkpoint, map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"]["transformer"]["max_seq_len"] = 4096
    checkpoint["trained_seq_len"] = 4096
    path = tmp_path_factory.mktemp("long_context") / "long.ckpt"
    torch.save(checkpoint, path)
    return path


def genome(folder: Path, length: int, snv: tuple[int, str] | None = None) -> Path:
    sequence = list(sequence_of(length))
    name = "ref"
    if snv is not None:
        position, alt = snv
        sequence[position - 1], name = alt, f"alt{position}"
    path = folder / f"{name}_{length}.fa"
    path.write_text(">chr1\n" + "".join(sequence) + "\n")
    return path


def variant_llrs(checkpoint: Path, reference: Path, snvs: list[tuple[int, str]], folder: Path) -> list[float]:
    codes = reference.read_text().splitlines()[1]
    variants = folder / f"{reference.stem}.tsv"
    variants.write_text("chrom\tpos\tref\talt\n" + "".join(f"chr1\t{p}\t{codes[p - 1]}\t{a}\n" for p, a in snvs))
    out = folder / f"{reference.stem}_effects.tsv"
    main(
        [
            "variant_effect",
            "--checkpoint",
            str(checkpoint),
            "--reference",
            str(reference),
            "--variants",
            str(variants),
            "--out",
            str(out),
        ]
    )
    return [float(line.split("\t")[4]) for line in out.read_text().splitlines()[1:]]


def mutagenesis_llrs(checkpoint: Path, reference: Path, snvs: list[tuple[int, str]], folder: Path) -> list[float]:
    out = folder / f"{reference.stem}_mutagenesis.tsv"
    main(
        [
            "mutagenesis",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            str(reference),
            "--regions",
            *(f"chr1:{p}-{p}" for p, _ in snvs),
            "--out",
            str(out),
        ]
    )
    llr = {(int(f[1]), f[3]): float(f[4]) for f in (line.split("\t") for line in out.read_text().splitlines()[1:])}
    return [llr[snv] for snv in snvs]


def track_sum(checkpoint: Path, fasta: Path) -> float:
    out = fasta.with_suffix(".bw")
    main(["score", "--checkpoint", str(checkpoint), "--inputs", str(fasta), "--out", str(out)])
    with pyBigWig.open(str(out)) as track:
        return float(np.nansum(track.values("chr1", 0, track.chroms("chr1"), numpy=True).astype(np.float64)))


def test_an_snv_scores_the_same_in_every_command(long_context_checkpoint, tmp_path):
    """On a 1,500-base sequence (one window at the default): variant_effect, mutagenesis and the
    difference of score's tracks agree; on 3,000 bases (tiled) variant_effect and mutagenesis do."""
    short = snvs_at(POSITIONS, 1500)
    reference = genome(tmp_path, 1500)
    effects = variant_llrs(long_context_checkpoint, reference, short, tmp_path)
    assert mutagenesis_llrs(long_context_checkpoint, reference, short, tmp_path) == pytest.approx(effects, abs=1e-5)
    ref_sum = track_sum(long_context_checkpoint, reference)
    tracks = [track_sum(long_context_checkpoint, genome(tmp_path, 1500, snv)) - ref_sum for snv in short]
    assert tracks == pytest.approx(effects, abs=2e-3)
    assert min(abs(e) for e in effects) > 0.01  # the variants do change the score
    longer, snvs = genome(tmp_path, 3000), snvs_at(POSITIONS, 3000)
    effects = variant_llrs(long_context_checkpoint, longer, snvs, tmp_path)
    assert mutagenesis_llrs(long_context_checkpoint, longer, snvs, tmp_path) == pytest.approx(effects, abs=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the hint is for a CPU")
def test_a_long_window_on_a_cpu_gets_a_hint_that_runs(long_context_checkpoint, tmp_path, capsys):
    reference = genome(tmp_path, 3000)
    variants = tmp_path / "v.tsv"
    [(position, alt)] = snvs_at([1900], 3000)
    variants.write_text(f"chrom\tpos\tref\talt\nchr1\t{position}\t{sequence_of(3000)[position - 1]}\t{alt}\n")
    args = [
        "variant_effect",
        "--checkpoint",
        str(long_context_checkpoint),
        "--reference",
        str(reference),
        "--variants",
        str(variants),
        "--out",
        str(tmp_path / "slow.tsv"),
        "--window",
        "4096",
    ]
    capsys.readouterr()
    main(args)
    out = capsys.readouterr().out
    assert "on a CPU a 4,096-base window is slow" in out
    typed = shlex.split(re.search(r"pass (--window \d+) for the fast default", out).group(1))
    main([*args[:-4], "--out", str(tmp_path / "fast.tsv"), *typed])  # the hint as printed
    assert "is slow" not in capsys.readouterr().out and (tmp_path / "fast.tsv").is_file()
