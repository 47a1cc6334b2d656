"""benchmarks/finetune_baselines.py: the k-mer features against hand counts and the strand
symmetry they promise, the logistic regression on a task it must solve, the splice folds that keep
a sequence and its reverse complement together, and pyrodigal's coordinates on planted genes."""

from __future__ import annotations

import numpy as np
import pytest
from genoformer.data.genome.alphabet import decode, encode, reverse_complement

from benchmarks.finetune_baselines import (
    canonical_sequence,
    kmer_features,
    kmer_logistic_regression,
    kmer_names,
    onehot_features,
    pyrodigal_genes,
    splice_folds,
)

STOPS = {"TAA", "TAG", "TGA"}


def revcomp(sequence: str) -> str:
    return decode(reverse_complement(encode(sequence)))


def random_dna(rng: np.random.Generator, length: int, alphabet: str = "ACGT") -> str:
    return "".join(rng.choice(list(alphabet), size=length))


def test_kmer_features_match_a_hand_count():
    # AACGNTT: 1-mers A A C G T T (N skipped) over 7 positions; 2-mers AA AC CG TT (GN, NT broken) over 6
    features = kmer_features(["AACGNTT"], ks=(1, 2), canonical=False)
    counted = dict(zip(kmer_names((1, 2), canonical=False), features[0] * np.array([7] * 4 + [6] * 16)))
    expected = {"A": 2, "C": 1, "G": 1, "T": 2, "AA": 1, "AC": 1, "CG": 1, "TT": 1}
    assert {name: round(float(v)) for name, v in counted.items() if v > 0} == expected
    assert features.shape == (1, 4 + 16) and features.dtype == np.float32


def test_canonical_kmers_merge_reverse_complements():
    # k=2: 10 canonical columns; AACGNTT has AA, AC, CG, TT -> AA twice (TT is AA's reverse complement)
    features = kmer_features(["AACGNTT", "ggg"], ks=(2,), canonical=True)
    names = kmer_names((2,), canonical=True)
    assert len(names) == 10 and "TT" not in names and "GT" not in names
    assert dict(zip(names, np.round(features[0] * 6).astype(int)))["AA"] == 2
    assert dict(zip(names, np.round(features[1] * 2).astype(int)))["CC"] == 2  # lowercase counts
    assert kmer_features(["A"], ks=(1, 2, 3, 4, 5, 6)).shape[1] == 2 + 10 + 32 + 136 + 512 + 2080


def test_canonical_features_are_strand_symmetric():
    rng = np.random.default_rng(0)
    sequences = [random_dna(rng, n, "ACGTN" if n % 2 else "ACGT") for n in (1, 5, 60, 97, 200)]
    forward = kmer_features(sequences)
    assert np.array_equal(forward, kmer_features([revcomp(s) for s in sequences]))
    stranded = kmer_features(sequences, canonical=False)
    assert not np.array_equal(stranded, kmer_features([revcomp(s) for s in sequences], canonical=False))


def test_sequences_do_not_share_kmers_across_their_junction():
    # joined internally, "AC" + "GT" must not count a CG
    together = kmer_features(["AC", "GT"], ks=(2,), canonical=False)
    alone = np.vstack([kmer_features([s], ks=(2,), canonical=False) for s in ("AC", "GT")])
    assert np.array_equal(together, alone)


def test_onehot_features_place_each_base():
    features = onehot_features(["ACGN"])
    assert features.reshape(4, 4).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="one length"):
        onehot_features(["AC", "ACG"])


def test_kmer_logistic_regression_separates_a_separable_task():
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(1)

    # label 1: GC-only, label 0: AT-only sequences; the 1-mer frequencies alone separate them
    def make(n):
        labels = rng.integers(0, 2, n)
        return [random_dna(rng, 50, "GC" if y else "AT") for y in labels], labels.tolist()

    train, test = make(60), make(40)
    result = kmer_logistic_regression(*train, *test, ks=(1, 2, 3))
    assert result["accuracy"] == 1.0 and result["auroc"] == 1.0 and result["mcc"] == 1.0
    assert result["n_features"] == 2 + 10 + 32 and result["n_test"] == 40


def test_splice_folds_keep_reverse_complements_together():
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(2)
    seqs = [random_dna(rng, 20) for _ in range(60)]
    seqs += [seqs[0], revcomp(seqs[1]), seqs[2].lower()]  # duplicates in three spellings
    labels = [i % 3 for i in range(60)] + [0, 1, 2]
    folds = splice_folds(seqs, labels, folds=5, seed=0)
    assert len(folds) == 5
    tests = np.concatenate([te for _, te in folds])
    assert sorted(tests.tolist()) == list(range(len(seqs)))  # every sequence tested exactly once
    for train, test in folds:
        assert not set(train) & set(test)
        keys_train = {canonical_sequence(seqs[i]) for i in train}
        assert not keys_train & {canonical_sequence(seqs[i]) for i in test}
    assert [te.tolist() for _, te in folds] == [te.tolist() for _, te in splice_folds(seqs, labels)]


def plant_genes(rng: np.random.Generator, length: int = 20_000) -> tuple[str, list[tuple[int, int, int]]]:
    """A random sequence with six 1.2 kb ORFs (Shine-Dalgarno box upstream), three on each strand;
    returns it and each gene's (start, end, strand), 0-based half-open on the forward strand."""
    sense = [c for c in (a + b + d for a in "ACGT" for b in "ACGT" for d in "ACGT") if c not in STOPS]
    sequence = list(random_dna(rng, length))
    genes = []
    for number, at in enumerate(range(1_500, length - 2_000, 3_000)):
        orf = "ATG" + "".join(rng.choice(sense, size=398)) + "TAA"
        unit = "AGGAGG" + random_dna(rng, 7) + orf
        strand = 1 if number % 2 == 0 else -1
        if strand == 1:
            sequence[at : at + len(unit)] = unit
            genes.append((at + 13, at + len(unit), 1))
        else:
            sequence[at : at + len(unit)] = revcomp(unit)
            genes.append((at, at + len(orf), -1))
    return "".join(sequence), genes


def test_pyrodigal_finds_planted_genes_on_both_strands():
    pytest.importorskip("pyrodigal")
    sequence, planted = plant_genes(np.random.default_rng(3))
    run = pyrodigal_genes([("synthetic", sequence)], meta=True)
    assert run.mode == "meta" and run.bases == len(sequence) and run.bases_per_second > 0
    for start, end, strand in planted:
        # the stop codon ends the gene; the start may move to another in-frame ATG
        stop_end = [g for g in run.genes if g.strand == strand and (g.end == end if strand == 1 else g.start == start)]
        assert len(stop_end) == 1, (start, end, strand, run.genes)
        gene = stop_end[0]
        assert gene.contig == "synthetic" and not gene.partial_begin and not gene.partial_end
        assert (gene.end - gene.start) % 3 == 0 and gene.end - gene.start >= 600
        stop = sequence[gene.end - 3 : gene.end] if strand == 1 else revcomp(sequence[gene.start : gene.start + 3])
        first = sequence[gene.start : gene.start + 3] if strand == 1 else revcomp(sequence[gene.end - 3 : gene.end])
        assert stop == "TAA" and first in {"ATG", "GTG", "TTG"}
    assert {g.strand for g in run.genes} == {1, -1}
