"""The gene annotator shipped in examples/: its size, kind and name, and that it calls genes that are
open reading frames on a genome it never saw (the first 12 kb of phage lambda)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from genoformer.data.genome.alphabet import decode, reverse_complement
from genoformer.data.genome.inputs import read_sequences

from genoformer.core.checkpoints import ModelKind, checkpoint_kind, read_checkpoint
from genoformer.genome.predict import GeneAnnotator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODEL = EXAMPLES / "genoformer_gene_annotator.ckpt"
STOPS = {"TAA", "TAG", "TGA"}


def test_shipped_gene_model_is_small_and_tagged():
    assert "gene" in MODEL.name
    assert MODEL.stat().st_size <= 20 * 2**20
    assert checkpoint_kind(read_checkpoint(MODEL)) is ModelKind.GENOME_FINETUNED


def test_shipped_gene_model_calls_open_reading_frames_on_lambda():
    (record,) = read_sequences(EXAMPLES / "lambda_phage.fasta.gz")
    codes = record.codes[:12_000]
    annotator = GeneAnnotator.from_checkpoint(MODEL, device="cpu")
    (contig,) = annotator.predict([decode(codes)], window=2048, progress=False)
    genes = [gene for gene in contig.genes if gene.kind == "CDS"]
    assert len(genes) >= 5  # lambda's first 12 kb hold about a dozen genes (the head and tail proteins)
    assert np.allclose(contig.probabilities.sum(1), 1.0, atol=1e-4)
    for gene in genes:
        if dict(gene.attributes).get("partial", "00") != "00":
            continue
        bases = decode(
            codes[gene.start : gene.end] if gene.strand > 0 else reverse_complement(codes[gene.start : gene.end])
        )
        assert len(bases) % 3 == 0 and bases[-3:] in STOPS and bases[:3] in {"ATG", "GTG", "TTG"}
