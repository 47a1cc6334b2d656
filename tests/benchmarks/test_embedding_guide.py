"""The embedding guide's measures (docs/embed.md) on vectors whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.embedding_guide import kmer_frequencies, pooled, scores


def test_centring_separates_what_a_common_component_hides():
    rng = np.random.default_rng(0)
    common = np.full(16, 10.0)
    centres = rng.normal(size=(2, 16))
    vectors = np.concatenate([common + centre + 0.1 * rng.normal(size=(5, 16)) for centre in centres])
    labels = [0] * 5 + [1] * 5
    raw, centred = scores(vectors, labels), scores(vectors - vectors.mean(0), labels)
    assert raw["cosine_between"] > 0.9 and raw["nearest_neighbour_accuracy"] == 1.0
    assert centred["cosine_between"] < 0 < centred["cosine_within"]


def test_kmers_and_pooling():
    codes = [np.array([0, 1, 2, 3, 0], dtype=np.uint8)]
    frequencies = kmer_frequencies(codes, k=4)
    assert frequencies.shape == (1, 256) and frequencies.sum() == pytest.approx(1.0)
    assert frequencies[0, 0 * 64 + 1 * 16 + 2 * 4 + 3] == 0.5  # ACGT, and CGTA
    tokens = [np.arange(6, dtype=float).reshape(3, 2)]
    assert pooled(tokens, "mean").tolist() == [[2.0, 3.0]] and pooled(tokens, "last").tolist() == [[4.0, 5.0]]
