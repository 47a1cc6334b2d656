"""The pretrained model shipped in examples/ loads and evaluates on a CPU, and is a trained model:
it predicts real DNA it never saw (lambda phage) better than base composition alone does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from genoformer.data.genome.inputs import read_sequences

from genoformer.genome.embeddings import Embedder
from genoformer.genome.scoring import Scorer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHIPPED = EXAMPLES / "genoformer_dna.ckpt"


def test_shipped_model_is_small_and_scores_unseen_dna_on_a_cpu():
    assert SHIPPED.stat().st_size <= 20 * 2**20
    scorer = Scorer.from_checkpoint(SHIPPED, device="cpu")
    assert scorer.causal and scorer.context == 32768
    lam = next(read_sequences([EXAMPLES / "lambda_phage.fasta.gz"])).codes[:6000]
    log2p = scorer.log2_likelihood(lam, context=2048)
    bits = -np.nanmean(log2p)
    counts = np.bincount(lam[lam < 4], minlength=4) / (lam < 4).sum()
    composition = -(counts * np.log2(counts)).sum()  # about 2.0 bits per base for lambda
    assert bits < composition - 0.05, (bits, composition)


def test_shipped_model_embeds():
    embedder = Embedder.from_checkpoint(SHIPPED, device="cpu")
    result = embedder.embed("ACGT" * 300, pooling="mean", progress=False)
    assert result.stack().shape == (1, 256) and np.isfinite(result.stack()).all()
