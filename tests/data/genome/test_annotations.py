"""Gene annotation labels: GenBank and GFF3 against a hand-made record base by base, GFF3 round
trips, held-out regions with their gap, signal tracks, bad inputs and the real annotated genomes."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from Bio import SeqIO
from Bio.Seq import Seq
from Bio.SeqFeature import CompoundLocation, SeqFeature, SimpleLocation
from Bio.SeqRecord import SeqRecord
from data_helpers import random_bases, require_shared, write_fasta
from genoformer.data.genome.alphabet import encode
from genoformer.data.genome.annotations import (
    ANNOTATION_CLASSES,
    CDS_MINUS,
    CDS_PLUS,
    OTHER,
    STRAND_SWAP,
    TRNA,
    AnnotatedContig,
    Gene,
    label_track,
    read_annotated_genomes,
    read_genes,
    read_signal_tracks,
    region_holdout,
    write_gff3,
)

SHARED_EXTRA = Path(__file__).resolve().parents[3] / ".." / "shared-extra"
GENOMES = SHARED_EXTRA / "genomes"

LENGTH = 80
SEQUENCE = random_bases(np.random.default_rng(11), LENGTH)


def expected_labels() -> np.ndarray:
    """The hand-made contig: g1 CDS+ [2,14), g2 CDS- [10,22) (starts later, wins [10,14)), g3 CDS+
    join [30,36)+[40,46), g4 tRNA- [44,56) (wins over g3), g5 CDS- join [60,66)+[70,76), and a
    pseudo CDS [76,79) that is no gene."""
    labels = np.full(LENGTH, OTHER, dtype=np.uint8)
    labels[2:10] = CDS_PLUS
    labels[10:22] = CDS_MINUS
    labels[30:36] = CDS_PLUS
    labels[40:44] = CDS_PLUS
    labels[44:56] = TRNA
    labels[60:66] = CDS_MINUS
    labels[70:76] = CDS_MINUS
    return labels


def write_genbank(path: Path) -> Path:
    record = SeqRecord(
        Seq(SEQUENCE), id="ctg1", name="ctg1", description="hand-made", annotations={"molecule_type": "DNA"}
    )

    def feature(location, kind: str, **qualifiers) -> SeqFeature:
        return SeqFeature(location, type=kind, qualifiers={k: [v] for k, v in qualifiers.items()})

    record.features = [
        feature(SimpleLocation(2, 14, strand=1), "CDS", locus_tag="g1", product="first"),
        feature(SimpleLocation(10, 22, strand=-1), "CDS", locus_tag="g2"),
        feature(
            CompoundLocation([SimpleLocation(30, 36, strand=1), SimpleLocation(40, 46, strand=1)]),
            "CDS",
            locus_tag="g3",
            codon_start="2",
        ),
        feature(SimpleLocation(44, 56, strand=-1), "tRNA", locus_tag="g4", product="tRNA-Ala"),
        feature(
            CompoundLocation([SimpleLocation(70, 76, strand=-1), SimpleLocation(60, 66, strand=-1)]),
            "CDS",
            locus_tag="g5",
        ),
        feature(SimpleLocation(76, 79, strand=1), "CDS", locus_tag="g6", pseudo=""),
        feature(SimpleLocation(0, 30, strand=1), "gene", locus_tag="g1"),
    ]
    SeqIO.write(record, path, "genbank")
    return path


GFF_LINES = [
    "##gff-version 3",
    "##sequence-region ctg1 1 80",
    "ctg1\tx\tgene\t3\t14\t.\t+\t.\tID=gene1",
    "ctg1\tx\tCDS\t3\t14\t0.5\t+\t0\tID=g1;Parent=gene1;product=a%3Bb",
    "ctg1\tx\tCDS\t11\t22\t.\t-\t0\tID=g2",
    "ctg1\tx\tCDS\t31\t36\t.\t+\t1\tID=g3",
    "ctg1\tx\tCDS\t41\t46\t.\t+\t1\tID=g3",
    "ctg1\tx\ttRNA\t45\t56\t.\t-\t.\tID=g4",
    "ctg1\tx\tmRNA\t61\t76\t.\t-\t.\tID=m5",
    "ctg1\tx\tCDS\t61\t66\t.\t-\t0\tParent=m5",
    "ctg1\tx\tCDS\t71\t76\t.\t-\t0\tParent=m5",
]


def write_gff(path: Path, lines: list[str], fasta: bool = True) -> Path:
    text = "\n".join(lines) + "\n" + (f"##FASTA\n>ctg1 hand-made\n{SEQUENCE[:50]}\n{SEQUENCE[50:]}\n" if fasta else "")
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    return path


def test_genbank_to_labels_base_by_base(tmp_path):
    [contig] = read_annotated_genomes(write_genbank(tmp_path / "tiny.gbk"), progress=False)
    assert contig.name == "ctg1" and contig.source.endswith("tiny.gbk")
    np.testing.assert_array_equal(contig.codes, encode(SEQUENCE))
    np.testing.assert_array_equal(contig.labels, expected_labels())
    genes = {g.attribute("ID"): g for g in contig.genes}
    assert sorted(genes) == ["g1", "g2", "g3", "g4", "g5"]  # the pseudo CDS g6 and the gene feature are left out
    assert genes["g3"] == Gene("ctg1", 30, 46, 1, "CDS", ((30, 36), (40, 46)), 1, None, (("ID", "g3"),))
    assert genes["g5"].segments == ((60, 66), (70, 76)) and genes["g5"].strand == -1
    assert genes["g4"].kind == "tRNA" and genes["g1"].attributes == (("ID", "g1"), ("product", "first"))


def test_gff3_to_labels_base_by_base(tmp_path):
    [contig] = read_annotated_genomes(write_gff(tmp_path / "tiny.gff3.gz", GFF_LINES), progress=False)
    np.testing.assert_array_equal(contig.codes, encode(SEQUENCE))
    np.testing.assert_array_equal(contig.labels, expected_labels())
    g1, g2, g3, g4, g5 = contig.genes
    assert g1 == Gene("ctg1", 2, 14, 1, "CDS", (), 0, 0.5, (("ID", "g1"), ("Parent", "gene1"), ("product", "a;b")))
    assert g3.segments == ((30, 36), (40, 46)) and g3.phase == 1
    assert g4.kind == "tRNA" and g4.strand == -1
    assert g5.segments == ((60, 66), (70, 76)) and g5.attributes == (("Parent", "m5"),)


def test_gff3_takes_sequences_from_the_genome_by_header_token(tmp_path):
    gff = write_gff(tmp_path / "tiny.gff3", GFF_LINES, fasta=False)
    genome = write_fasta(tmp_path / "genome.fa", [("Org:chrX:1-9", "ACGT"), ("Org:ctg1:1-80", SEQUENCE)])
    [contig] = read_annotated_genomes([gff], genome=genome, progress=False)
    assert contig.name == "ctg1"
    np.testing.assert_array_equal(contig.labels, expected_labels())
    with pytest.raises(ValueError, match="has no ##FASTA section; pass genome="):
        read_annotated_genomes(gff, progress=False)
    other = write_fasta(tmp_path / "other.fa", [("chr1", SEQUENCE)])
    with pytest.raises(
        ValueError,
        match=r"1 seqid\(s\) have no sequence in .*other.fa: 'ctg1'; its sequences are "
        r"named 'chr1'",
    ):
        read_annotated_genomes(gff, genome=other, progress=False)


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "ctg1\tx\tCDS\t70\t81\t.\t+\t0\tID=long",
            r"tiny.gff3 line 12: CDS ends at 81 .* past the end of 'ctg1' \(80 bases\)",
        ),
        ("ctg1\tx\tCDS\t70\t75\t.\t+\t0", r"tiny.gff3 line 12: 8 tab-separated column\(s\)"),
        ("ctg1\tx\tCDS\t70\t75\t.\t.\t0\tID=x", r"tiny.gff3 line 12: CDS with strand '.'"),
        ('ctg1\tx\tCDS\t70\t75\t.\t+\t0\tgene_id "x"', r"tiny.gff3 line 12: attribute .* has no '='"),
    ],
)
def test_bad_gff3_lines_are_clear_errors(tmp_path, line, message):
    with pytest.raises(ValueError, match=message):
        read_annotated_genomes(write_gff(tmp_path / "tiny.gff3", GFF_LINES + [line]), progress=False)


def test_label_track_priorities():
    genes = [Gene("c", 0, 10, 1, "CDS"), Gene("c", 5, 15, -1, "CDS"), Gene("c", 8, 12, 1, "rRNA")]
    assert label_track(16, genes).tolist() == [1] * 5 + [2] * 3 + [3] * 4 + [2] * 3 + [0]
    assert label_track(16, genes[::-1]).tolist() == label_track(16, genes).tolist()
    with pytest.raises(ValueError, match="lies outside the contig of 12 bases"):
        label_track(12, [Gene("c", 5, 15, -1, "CDS")])
    assert [ANNOTATION_CLASSES[STRAND_SWAP[i]] for i in range(5)] == ["other", "CDS-", "CDS+", "rRNA", "tRNA"]


def test_write_gff3_parses_back_identically(tmp_path):
    for source in (write_genbank(tmp_path / "tiny.gbk"), write_gff(tmp_path / "tiny.gff3", GFF_LINES)):
        genes = read_genes(source)
        out = write_gff3(tmp_path / f"{source.name}.out.gff3", genes, contigs=[("ctg1", LENGTH)])
        text = out.read_text()
        assert text.startswith("##gff-version 3\n##sequence-region ctg1 1 80\n")
        assert read_genes(out) == genes
        with pytest.raises(FileExistsError):
            write_gff3(out, genes, contigs=[("ctg1", LENGTH)])
    lines = [line.split("\t") for line in text.splitlines() if not line.startswith("#")]
    g3 = [line for line in lines if line[8].startswith("ID=g3")]
    # after phase 1, the 5 coding bases of the first segment leave a codon 1 base short
    assert [(line[3], line[4], line[7]) for line in g3] == [("31", "36", "1"), ("41", "46", "1")]
    assert "product=a%3Bb" in lines[0][8] and lines[0][5] == "0.5"
    unnamed = write_gff3(
        tmp_path / "unnamed.gff3", [Gene("c 1", 3, 9, -1, "CDS", ((3, 5), (7, 9)))], contigs=[("c 1", 20)]
    )
    [gene] = read_genes(unnamed)
    assert gene.contig == "c 1" and gene.segments == ((3, 5), (7, 9)) and gene.attributes == (("ID", "c 1.CDS.1"),)
    with pytest.raises(ValueError, match="not in contigs="):
        write_gff3(tmp_path / "bad.gff3", [gene], contigs=[("c", 20)])


def contig_of(length: int, name: str, seed: int) -> AnnotatedContig:
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(length - 300, size=length // 1000, replace=False))
    genes = [Gene(name, int(s), int(s) + 300, 1 if i % 2 else -1, "CDS") for i, s in enumerate(starts)]
    codes = rng.integers(0, 4, size=length).astype(np.uint8)
    return AnnotatedContig(name, codes, label_track(length, genes), genes, "test")


def test_region_holdout_leaves_no_overlap_and_the_gap():
    contigs = [contig_of(100_000, "big", 0), contig_of(40_000, "mid", 1)] + [
        contig_of(3_000, f"s{i}", i) for i in range(10)
    ]
    total = sum(c.codes.size for c in contigs)
    train, held = region_holdout(contigs, 0.2, gap=1000, seed=5)
    assert abs(sum(c.codes.size for c in held) / total - 0.2) < 0.03
    by_contig: dict[str, list[tuple[str, int, int]]] = {}
    for side, pieces in (("train", train), ("held", held)):
        for piece in pieces:
            name, _, span = piece.name.partition(":")
            start, end = map(int, span.split("-")) if span else (0, piece.codes.size)
            original = next(c for c in contigs if c.name == name)
            np.testing.assert_array_equal(piece.codes, original.codes[start:end])
            np.testing.assert_array_equal(piece.labels, original.labels[start:end])
            for gene in piece.genes:
                assert gene.contig == piece.name and 0 <= gene.start < gene.end <= piece.codes.size
            by_contig.setdefault(name, []).append((side, start, end))
    assert {"big", "mid"} <= {name for name, pieces in by_contig.items() if len(pieces) > 1}
    for pieces in by_contig.values():
        for side, start, end in pieces:
            for other_side, other_start, other_end in pieces:
                if side != other_side:
                    assert other_start >= end + 1000 or other_end <= start - 1000
    again = region_holdout(contigs, 0.2, gap=1000, seed=5)
    assert [c.name for c in again[1]] == [c.name for c in held]


def test_read_signal_tracks(tmp_path):
    genome = write_fasta(tmp_path / "g.fa", [("chr1", "ACGT" * 5), ("chr2", "GG"), ("chr3", "TTTT")])
    track = tmp_path / "signal.bedgraph"
    track.write_text("track type=bedGraph\nchr3\t0\t2\t1.5\nchr1\t10\t12\t-2\nchr1\t2\t4\t0.5\n")
    (n1, codes1, values1), (n3, _, values3) = read_signal_tracks(track, genome=genome)
    assert (n1, n3) == ("chr1", "chr3") and codes1.size == 20 and values1.dtype == np.float32
    np.testing.assert_array_equal(values1[[2, 3, 10, 11]], [0.5, 0.5, -2, -2])
    assert np.isnan(values1).sum() == 16 and values3.tolist()[:2] == [1.5, 1.5] and np.isnan(values3[2:]).all()
    track.write_text("chr1\t0\t5\t1\nchr1\t4\t8\t2\n")
    with pytest.raises(ValueError, match="lines 1 and 2: intervals on 'chr1' overlap"):
        read_signal_tracks(track, genome=genome)
    track.write_text("chrQ\t0\t5\t1\n")
    with pytest.raises(ValueError, match="'chrQ' are not in .*g.fa, which holds 'chr1', 'chr2', 'chr3'"):
        read_signal_tracks(track, genome=genome)


# --- real files ------------------------------------------------------------------------------------


def test_leptospira_genbank():
    contigs = read_annotated_genomes(require_shared(GENOMES / "leptospira_kirschneri_h1.gbk.gz"), progress=False)
    genes = [g for c in contigs for g in c.genes]
    assert len(contigs) == 75 and sum(g.kind == "CDS" for g in genes) == 3697  # 4,162 CDS, 465 of them /pseudo
    assert sum(g.kind == "tRNA" for g in genes) == 37 and sum(g.kind == "rRNA" for g in genes) == 6
    assert all(c.labels.size == c.codes.size for c in contigs)


def test_prokka_gff3_with_embedded_fasta_round_trips(tmp_path):
    path = require_shared(GENOMES / "ecoli_draft_prokka.gff3.gz")
    contigs = read_annotated_genomes(path, progress=False)
    genes = [g for c in contigs for g in c.genes]
    assert len(contigs) == 226 and sum(g.kind == "CDS" for g in genes) == 4611
    assert sum(g.kind == "tRNA" for g in genes) == 77 and sum(g.kind == "rRNA" for g in genes) == 12
    out = write_gff3(tmp_path / "ecoli.gff3", genes, contigs=[(c.name, c.codes.size) for c in contigs])
    assert read_genes(out) == read_genes(path) == genes


def test_ustilago_gff3_with_a_differently_named_genome():
    contigs = read_annotated_genomes(
        require_shared(GENOMES / "ustilago_maydis.gff3.gz"),
        genome=require_shared(GENOMES / "ustilago_maydis.fasta.gz"),
        progress=False,
    )
    genes = [g for c in contigs for g in c.genes]
    assert len(contigs) == 28 and contigs[0].name == "chr01"
    assert len(genes) == 6787 and sum(1 for g in genes if g.segments) == 1877  # 9,778 CDS lines of 6,787 mRNAs
