"""Gene calls from per-base probabilities: planted genes recovered exactly on both strands, partial
genes at the contig edges, overlapping neighbours, strand symmetry, rRNA/tRNA runs; the per-base
MCCs against scikit-learn; gene agreement counts; GFF3 round trip; bedGraph text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from genoformer.data.genome.alphabet import encode, reverse_complement
from genoformer.data.genome.annotations import (
    CDS_MINUS,
    CDS_PLUS,
    OTHER,
    RRNA,
    STRAND_SWAP,
    TRNA,
    Gene,
    read_genes,
    write_gff3,
)
from sklearn.metrics import matthews_corrcoef

from genoformer.genome.genecalls import (
    call_genes,
    coding_mask,
    decode_labels,
    gene_agreement,
    per_base_coding_mcc,
    strand_coding_mcc,
    write_tracks_bedgraph,
)

LENGTH = 30_000
_SENSE = [
    a + b + c
    for a in "ACGT"
    for b in "ACGT"
    for c in "ACGT"
    if a + b + c not in {"TAA", "TAG", "TGA", "ATG", "GTG", "TTG"}
]


def body(rng: np.random.Generator, codons: int) -> str:
    """Random codons that are neither stops nor starts, so the planted start is the only one."""
    return "".join(rng.choice(_SENSE, size=codons))


@dataclasses.dataclass
class Genome:
    codes: np.ndarray
    probabilities: np.ndarray  # (L, 5)
    genes: list[tuple[int, int, int]]  # (start, end, strand) of the planted CDSs
    partial: dict[tuple[int, int, int], str]


def planted_genome(seed: int = 0) -> Genome:
    """A random contig with CDSs planted on both strands, two + genes overlapping by 4 nt (ATGA),
    a 5' partial gene at the left edge and a 3' partial gene at the right edge; the coding
    probability of a gene's strand is 0.65-0.95 over it and 0-0.2 elsewhere."""
    rng = np.random.default_rng(seed)
    sequence = bytearray(rng.choice(np.frombuffer(b"ACGT", dtype=np.uint8), size=LENGTH).tobytes())
    genes, partial = [], {}

    def plant(start: int, dna: str, strand: int) -> tuple[int, int, int]:
        piece = dna if strand == 1 else "".join({"A": "T", "C": "G", "G": "C", "T": "A"}[b] for b in reversed(dna))
        sequence[start : start + len(piece)] = piece.encode()
        genes.append((start, start + len(piece), strand))
        return genes[-1]

    first = "ATG" + body(rng, 119) + "GCA" + "TGA"  # ends ...GC ATGA
    second = "ATG" + "ACC" + body(rng, 89) + "TAA"  # its ATGA is the last 4 nt of `first`

    partial[plant(0, "GCT" + body(rng, 120) + "TAA", 1)] = "10"  # no start: runs off the left edge
    plant(1_000, "ATG" + body(rng, 300) + "TAA", 1)
    plant(3_000, "GTG" + body(rng, 200) + "TAG", -1)
    plant(6_000, "ATG" + body(rng, 150) + "TGA", 1)
    plant(9_000, first + second[4:], 1)
    genes[-1:] = [(9_000, 9_000 + len(first), 1), (9_000 + len(first) - 4, 9_000 + len(first) - 4 + len(second), 1)]
    plant(13_000, "TTG" + body(rng, 400) + "TAG", -1)
    partial[plant(LENGTH - 300, "ATG" + body(rng, 99), 1)] = "01"  # no stop: runs off the right edge
    probabilities = np.zeros((LENGTH, 5), dtype=np.float32)
    probabilities[:, CDS_PLUS] = rng.uniform(0.0, 0.1, LENGTH)
    probabilities[:, CDS_MINUS] = rng.uniform(0.0, 0.1, LENGTH)
    for start, end, strand in genes:
        column = CDS_PLUS if strand == 1 else CDS_MINUS
        probabilities[start:end, column] = rng.uniform(0.65, 0.95, end - start)
        probabilities[start:end, CDS_PLUS + CDS_MINUS - column] = rng.uniform(0.0, 0.05, end - start)
    probabilities[:, OTHER] = 1.0 - probabilities[:, CDS_PLUS] - probabilities[:, CDS_MINUS]
    return Genome(encode(bytes(sequence)), probabilities, genes, partial)


@pytest.fixture(scope="module")
def genome() -> Genome:
    return planted_genome()


def cds_calls(genes: list[Gene]) -> set[tuple[int, int, int]]:
    return {(g.start, g.end, g.strand) for g in genes if g.kind == "CDS"}


def test_planted_genes_are_recovered_exactly(genome: Genome) -> None:
    calls = call_genes(genome.codes, genome.probabilities, contig="chr")
    assert cds_calls(calls) == set(genome.genes)
    assert all(g.kind == "CDS" and g.contig == "chr" and 0.65 <= g.score <= 0.95 for g in calls)
    assert calls == sorted(calls, key=lambda g: (g.start, g.end, g.strand))


def test_partial_genes_run_off_the_edges(genome: Genome) -> None:
    calls = {(g.start, g.end, g.strand): g for g in call_genes(genome.codes, genome.probabilities, contig="chr")}
    for key, gene in calls.items():
        assert gene.attribute("partial") == genome.partial.get(key), key


def test_strands_mirror_under_reverse_complement(genome: Genome) -> None:
    """The reverse complement with CDS+ and CDS- swapped gives the mirrored calls."""
    swapped = genome.probabilities[::-1][:, list(STRAND_SWAP)]
    mirrored = call_genes(reverse_complement(genome.codes), swapped, contig="chr")
    flip = {"10": "01", "01": "10", None: None}
    expected = {
        (LENGTH - e, LENGTH - s, -strand, flip[genome.partial.get((s, e, strand))]) for s, e, strand in genome.genes
    }
    assert {(g.start, g.end, g.strand, g.attribute("partial")) for g in mirrored} == expected


def test_no_coding_probability_gives_no_genes(genome: Genome) -> None:
    probabilities = np.zeros_like(genome.probabilities)
    probabilities[:, OTHER] = 1.0
    assert call_genes(genome.codes, probabilities, contig="chr") == []
    assert call_genes(genome.codes, np.zeros_like(genome.probabilities), contig="chr") == []


def test_weak_or_short_orfs_are_not_called(genome: Genome) -> None:
    weak = genome.probabilities.copy()
    weak[:, CDS_PLUS] = np.minimum(weak[:, CDS_PLUS], 0.45)
    assert {strand for _, _, strand in cds_calls(call_genes(genome.codes, weak, contig="chr"))} == {-1}
    long_only = call_genes(genome.codes, genome.probabilities, contig="chr", min_length=700)
    assert cds_calls(long_only) == {g for g in genome.genes if g[1] - g[0] >= 700}


def test_rna_runs_are_called_on_the_plus_strand() -> None:
    probabilities = np.zeros((5_000, 5), dtype=np.float32)
    probabilities[:, OTHER] = 1.0
    for start, end, column in ((100, 1_600, RRNA), (2_000, 2_076, TRNA), (3_000, 3_040, TRNA)):
        probabilities[start:end] = 0.0
        probabilities[start:end, column] = 0.9
        probabilities[start:end, OTHER] = 0.1
    calls = call_genes(np.zeros(5_000, dtype=np.uint8), probabilities, contig="c")
    assert [(g.kind, g.start, g.end, g.strand) for g in calls] == [("rRNA", 100, 1_600, 1), ("tRNA", 2_000, 2_076, 1)]


def test_inputs_are_checked(genome: Genome) -> None:
    with pytest.raises(ValueError, match=r"\(L, 5\)"):
        call_genes(genome.codes, genome.probabilities[:-1], contig="chr")
    with pytest.raises(ValueError, match="max_overlap < min_length"):
        call_genes(genome.codes, genome.probabilities, contig="chr", min_length=60)
    with pytest.raises(ValueError, match="translation_table 1 is not supported"):
        call_genes(genome.codes, genome.probabilities, contig="chr", translation_table=1)
    with pytest.raises(ValueError, match="min_score"):
        call_genes(genome.codes, genome.probabilities, contig="chr", min_score=0.3)


def test_decode_labels_and_coding_mask() -> None:
    probabilities = np.eye(5, dtype=np.float32)[[0, 1, 2, 3, 4, 1]] * 0.6 + 0.08
    labels = decode_labels(probabilities)
    assert labels.dtype == np.uint8 and labels.tolist() == [0, 1, 2, 3, 4, 1]
    assert coding_mask(labels).tolist() == [False, True, True, False, False, True]


def test_per_base_coding_mcc() -> None:
    rng = np.random.default_rng(1)
    reference = rng.integers(0, 5, 1_000).astype(np.uint8)
    assert per_base_coding_mcc(reference, reference) == pytest.approx(1.0)
    assert per_base_coding_mcc(reference, np.full_like(reference, CDS_PLUS)) == 0.0  # undefined
    predicted = np.where(rng.random(1_000) < 0.3, rng.integers(0, 5, 1_000), reference).astype(np.uint8)
    expected = matthews_corrcoef(coding_mask(reference), coding_mask(predicted))
    assert per_base_coding_mcc(reference, predicted) == pytest.approx(expected, abs=1e-12)
    three = np.array([0, 1, 2, 0, 0], dtype=np.uint8)  # other, CDS+, CDS-, rRNA, tRNA -> 3 classes
    expected = matthews_corrcoef(three[reference], three[predicted])
    assert strand_coding_mcc(reference, predicted) == pytest.approx(expected, abs=1e-12)
    # Strand errors cost only the strand-aware score.
    swapped = np.array(STRAND_SWAP, dtype=np.uint8)[reference]
    assert per_base_coding_mcc(reference, swapped) == pytest.approx(1.0)
    assert strand_coding_mcc(reference, swapped) < 0.5


def test_mcc_counts_do_not_overflow() -> None:
    reference = np.zeros(6_000_000, dtype=np.uint8)
    reference[::2] = CDS_PLUS
    predicted = reference.copy()
    predicted[:1_000] = OTHER
    assert 0.999 < per_base_coding_mcc(reference, predicted) < 1.0


def test_gene_agreement_counts() -> None:
    def cds(contig: str, start: int, end: int, strand: int, kind: str = "CDS") -> Gene:
        return Gene(contig=contig, start=start, end=end, strand=strand, kind=kind)

    reference = [
        cds("a", 100, 400, 1),
        cds("a", 500, 800, -1),
        cds("b", 100, 400, 1),
        cds("b", 900, 1_200, 1),
        cds("a", 1_000, 1_100, 1, "tRNA"),
    ]
    predicted = [
        cds("a", 160, 400, 1),  # same stop, other start
        cds("a", 500, 800, -1),  # exact
        cds("b", 100, 400, -1),  # wrong strand
        cds("a", 2_000, 2_300, 1),  # nothing there
        cds("a", 1_000, 1_100, 1, "rRNA"),
    ]  # not a CDS: ignored
    assert gene_agreement(reference, predicted) == {
        "n_reference": 4,
        "n_predicted": 4,
        "stop_and_strand": 0.5,
        "start_and_stop": 0.25,
        "precision_stop": 0.5,
    }
    # The 3' end of a - gene is its start: a - call that shares only the end does not match.
    assert gene_agreement([cds("a", 500, 800, -1)], [cds("a", 560, 800, -1)])["stop_and_strand"] == 0.0
    assert gene_agreement([cds("a", 500, 800, -1)], [cds("a", 500, 740, -1)])["stop_and_strand"] == 1.0
    assert gene_agreement([], [])["stop_and_strand"] == 0.0


def test_called_genes_round_trip_through_gff3(genome: Genome, tmp_path: Path) -> None:
    calls = call_genes(genome.codes, genome.probabilities, contig="chr")
    path = write_gff3(tmp_path / "calls.gff3", calls, contigs=[("chr", LENGTH)])
    back = read_genes(path)
    assert [dataclasses.replace(g, attributes=()) for g in back] == [
        dataclasses.replace(g, attributes=()) for g in calls
    ]
    assert [g.attribute("partial") for g in back] == [g.attribute("partial") for g in calls]


def test_bedgraph_tracks(tmp_path: Path) -> None:
    probabilities = np.zeros((6, 5), dtype=np.float32)
    probabilities[:, CDS_PLUS] = [0.1, 0.104, 0.9, 0.9, 0.896, 0.0]
    probabilities[:, CDS_MINUS] = [0.5, 0.5, 0.5, 0.5, 0.5, 1.0]
    path = write_tracks_bedgraph(tmp_path / "tracks.bedgraph", [("chr1", probabilities), ("chr2", probabilities[:2])])
    track = (
        'track type=bedGraph name="{0}" description="genoformer P({0})" visibility=full autoScale=off viewLimits=0:1'
    )
    assert path.read_text().splitlines() == [
        track.format("CDS+"),
        "chr1\t0\t2\t0.10",
        "chr1\t2\t5\t0.90",
        "chr1\t5\t6\t0.00",
        "chr2\t0\t2\t0.10",
        track.format("CDS-"),
        "chr1\t0\t5\t0.50",
        "chr1\t5\t6\t1.00",
        "chr2\t0\t2\t0.50",
    ]
    with pytest.raises(FileExistsError):
        write_tracks_bedgraph(path, [("chr1", probabilities)])
    write_tracks_bedgraph(path, [("chr1", probabilities)], classes=("tRNA",), overwrite=True)
    assert path.read_text().splitlines()[1:] == ["chr1\t0\t6\t0.00"]
    with pytest.raises(ValueError, match="unknown classes"):
        write_tracks_bedgraph(tmp_path / "x.bedgraph", [("chr1", probabilities)], classes=("CDS",))
