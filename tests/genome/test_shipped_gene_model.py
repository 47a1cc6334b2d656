"""The gene annotator shipped in examples/: its size, kind and name, that it calls genes that are
open reading frames on a genome it never saw (the first 12 kb of phage lambda), that its
hyperparameters (saved flat, before the head and strand settings were grouped) read in today's
groups, and that the network inference builds from it predicts exactly what the training module
that wrote it does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from genoformer.data.genome.alphabet import PAD, decode, encode, reverse_complement
from genoformer.data.genome.inputs import read_sequences

from genoformer.core.checkpoints import REGROUPED, ModelKind, checkpoint_kind, read_checkpoint
from genoformer.genome.finetune import FineTuner
from genoformer.genome.heads import FineTunedNetwork, HeadPooling, HeadSettings, StrandSettings
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


def test_its_flat_hyperparameters_read_as_todays_groups():
    """Every hyperparameter REGROUPED moves lands on a field of the group FineTuner takes, and the
    shipped file, saved in the flat layout, reads with the values it was trained with."""
    groups = {"head": HeadSettings, "strands": StrandSettings}
    for group, field in REGROUPED[ModelKind.GENOME_FINETUNED].values():
        assert field in {f.name for f in dataclasses.fields(groups[group])}, (group, field)
    on_disk = torch.load(MODEL, map_location="cpu", weights_only=True)["hyper_parameters"]
    assert {"pooling", "both_strands", "test_time_strands"} <= set(on_disk) and "head" not in on_disk
    hparams = read_checkpoint(MODEL)["hyper_parameters"]
    assert hparams["head"] == {"pooling": "MEAN", "layer": -1, "both_strands": True, "dropout": 0.1}
    assert hparams["strands"] == {"reverse_complement": True, "test_time": True}
    assert not set(REGROUPED[ModelKind.GENOME_FINETUNED]) & set(hparams)
    module = FineTuner(**hparams)
    assert module.pooling is HeadPooling.MEAN and module.both_strands and module.test_time_strands
    assert module.hparams["head"] == hparams["head"] and module.hparams["strands"] == hparams["strands"]


def test_inference_builds_the_network_only_and_predicts_what_the_training_module_does():
    """GeneAnnotator runs a FineTunedNetwork, not the FineTuner that trained it, and its predictions
    are the FineTuner's to the bit (on the CPU, float32, both strands averaged)."""
    annotator = GeneAnnotator.from_checkpoint(MODEL, device="cpu")
    assert type(annotator.network) is FineTunedNetwork
    checkpoint = read_checkpoint(MODEL)
    trainer_side = FineTuner(**checkpoint["hyper_parameters"]).eval()
    trainer_side.load_state_dict(checkpoint["state_dict"])
    (record,) = read_sequences(EXAMPLES / "lambda_phage.fasta.gz")
    padded = np.concatenate([encode("ACGTTGCA" * 12), np.full(32, PAD, dtype=np.uint8)])
    tokens_BL = torch.from_numpy(np.stack([record.codes[:128], padded]))
    lengths_B = torch.tensor([128, 96])
    with torch.inference_mode():
        expected = trainer_side.predict_outputs(tokens_BL, lengths_B)
        assert torch.equal(annotator.network.predict_outputs(tokens_BL, lengths_B), expected)
