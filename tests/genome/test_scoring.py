"""Per-base likelihood and `genoformer evaluate`: equal to a hand computation with the model,
tiling that changes nothing when the record fits the context, N never scored, clear errors."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
from model_helpers import WINDOW, random_tokens

from genoformer.data.genome.alphabet import MASK, N, decode, encode, reverse_complement
from genoformer.genome.evaluate import evaluate
from genoformer.genome.scoring import Scorer


def log2_softmax(model, tokens_L: np.ndarray) -> np.ndarray:
    """(L, V) log2 probabilities of one untiled forward pass, float64."""
    with torch.no_grad():
        logits_LV = model(torch.from_numpy(tokens_L).long()[None])[0]
    return (torch.log_softmax(logits_LV.double(), -1) / math.log(2)).numpy()


@pytest.fixture(scope="module")
def causal(causal_checkpoint) -> Scorer:
    return Scorer.from_checkpoint(causal_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def masked(mlm_checkpoint) -> Scorer:
    return Scorer.from_checkpoint(mlm_checkpoint, device="cpu")


def test_causal_scores_equal_a_hand_computation(causal):
    codes = random_tokens(1, 80, seed=4)[0].numpy()
    codes[[10, 11, 50]] = N
    scores = causal.log2_likelihood(codes, context=WINDOW)
    by_hand = log2_softmax(causal.model, codes)
    expected = np.array([np.nan] + [by_hand[p - 1, codes[p]] for p in range(1, len(codes))])
    expected[[10, 11, 50]] = np.nan  # N is never scored (its successors are, with N in their context)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    assert np.isnan(scores[0]) and np.isfinite(scores[12])


def test_causal_tiling_scores_each_base_from_its_most_preceding_context(causal):
    codes = random_tokens(1, 300, seed=5)[0].numpy()
    context, overlap = 64, 40
    scores = causal.log2_likelihood(codes, context=context, overlap=overlap)
    assert np.isfinite(scores[1:]).all()
    # base 64 is the first one that the window at 0 does not cover; the next window starts at 24
    window = codes[24:88]
    by_hand = log2_softmax(causal.model, window)
    np.testing.assert_allclose(scores[64:88], [by_hand[p - 24 - 1, codes[p]] for p in range(64, 88)], rtol=1e-5, atol=1e-6)
    first = log2_softmax(causal.model, codes[:64])
    np.testing.assert_allclose(scores[1:64], [first[p - 1, codes[p]] for p in range(1, 64)], rtol=1e-5, atol=1e-6)


def test_tiling_changes_nothing_when_the_record_fits_the_context(causal, masked):
    codes = random_tokens(1, 90, seed=6)[0].numpy()
    for scorer in (causal, masked):
        whole = scorer.log2_likelihood(codes, context=90)
        again = scorer.log2_likelihood(codes, context=WINDOW, overlap=10)
        np.testing.assert_array_equal(np.isnan(whole), np.isnan(again))
        np.testing.assert_allclose(whole, again, rtol=1e-6, atol=1e-7)


def test_masked_scores_are_a_pseudo_likelihood_by_hand(masked):
    codes = random_tokens(1, 40, seed=7)[0].numpy()
    scores = masked.log2_likelihood(codes)
    period = masked.mask_period
    for position in (0, 5, 13, 39):
        inputs = codes.copy()
        inputs[np.arange(len(codes)) % period == position % period] = MASK
        expected = log2_softmax(masked.model, inputs)[position, codes[position]]
        assert scores[position] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_batching_does_not_change_scores(causal):
    sequences = [random_tokens(1, n, seed=n)[0].numpy() for n in (200, 97, 97, 31)]
    one = causal.score_many(sequences, context=64, batch_size=1, progress=False)
    many = causal.score_many(sequences, context=64, batch_size=5, progress=False)
    for a, b in zip(one, many):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_context_longer_than_the_model_takes_is_an_error(causal):
    with pytest.raises(ValueError, match="--context"):
        causal.log2_likelihood(np.zeros(10, dtype=np.uint8), context=100_000)


def write_fasta(path, records):
    with gzip.open(path, "wt") as handle:
        for name, sequence in records:
            handle.write(f">{name}\n{sequence}\n")
    return path


def test_evaluate_command_writes_the_report(causal_checkpoint, tmp_path, capsys):
    records = [("chrA", decode(random_tokens(1, 250, seed=8)[0].numpy())), ("plasmid", "ACGTNNACGT" * 3)]
    fasta = write_fasta(tmp_path / "genome.fa.gz", records)
    report = evaluate(checkpoint=causal_checkpoint, inputs=[str(fasta)], context=64, out=tmp_path / "eval.json", device="cpu")
    stored = json.loads((tmp_path / "eval.json").read_text())
    assert stored["total"] == report["total"]
    assert [r["name"] for r in stored["records"]] == ["chrA", "plasmid"]
    assert stored["records"][0]["bases"] == 249 and stored["records"][1]["bases"] == 30 - 6 - 1
    assert stored["total"]["bases"] == 249 + 23 and stored["context"] == 64 and stored["bases_per_second"] > 0
    bits = sum(r["bits_per_base"] * r["bases"] for r in stored["records"]) / stored["total"]["bases"]
    assert stored["total"]["bits_per_base"] == pytest.approx(bits)
    assert "total" in capsys.readouterr().out

    both = evaluate(checkpoint=causal_checkpoint, inputs=[str(fasta)], context=64, both_strands=True, device="cpu")
    scorer = Scorer.from_checkpoint(causal_checkpoint, device="cpu")
    codes = encode(records[0][1])
    forward = scorer.log2_likelihood(codes, context=64)
    backward = scorer.log2_likelihood(reverse_complement(codes), context=64)
    expected = -np.nansum(np.concatenate([forward, backward])) / (2 * 249)
    assert both["records"][0]["bits_per_base"] == pytest.approx(expected, rel=1e-6)
    assert both["records"][0]["bases"] == 2 * 249


def test_evaluate_errors_name_the_problem(causal_checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(tmp_path / "missing.fa")], device="cpu")
    empty = tmp_path / "empty.fa"
    empty.write_text(">chr1\nACGT\n>chr2\n\n")
    with pytest.raises(ValueError, match="empty"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(empty)], device="cpu")
    good = write_fasta(tmp_path / "g.fa.gz", [("a", "ACGT" * 10)])
    with pytest.raises(ValueError, match="context"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(good)], context=10**6, device="cpu")


def test_exported_checkpoint_is_smaller_and_scores_the_same(causal_checkpoint, tmp_path):
    from genoformer.core.export import export

    small = export(checkpoint=causal_checkpoint, out=tmp_path / "small.ckpt")
    assert small.stat().st_size < causal_checkpoint.stat().st_size / 2
    codes = random_tokens(1, 120, seed=9)[0].numpy()
    full = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(codes, context=64)
    again = Scorer.from_checkpoint(small, device="cpu").log2_likelihood(codes, context=64)
    np.testing.assert_array_equal(full, again)
    half = export(checkpoint=causal_checkpoint, out=tmp_path / "half.ckpt", dtype="bfloat16")
    rounded = Scorer.from_checkpoint(half, device="cpu").log2_likelihood(codes, context=64)
    np.testing.assert_allclose(rounded, full, atol=0.05)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export(checkpoint=causal_checkpoint, out=small)
