"""Per-base likelihood and `genoformer evaluate`: equal to a hand computation with the model,
tiling that changes nothing when the record fits the context, N never scored, clear errors."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
from genoformer.data.genome.alphabet import MASK, N, decode, encode, reverse_complement
from model_helpers import WINDOW, random_tokens

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
    np.testing.assert_allclose(
        scores[64:88], [by_hand[p - 24 - 1, codes[p]] for p in range(64, 88)], rtol=1e-5, atol=1e-6
    )
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


def test_a_context_shorter_than_two_tokens_is_an_error(causal):
    with pytest.raises(ValueError, match=r"context 1 is too short: .*; pass context=96 "):
        causal.log2_likelihood(np.zeros(10, dtype=np.uint8), context=1)


def test_a_record_longer_than_max_seq_len_is_scored_in_one_window_in_chunks(causal_checkpoint):
    # the whole record in one window past the model's max_seq_len (512), the head in chunks of 64
    scorer = Scorer.from_checkpoint(causal_checkpoint, device="cpu")
    codes = random_tokens(1, 700, seed=9)[0].numpy()
    scorer.model.runtime.sequence_chunk = 64
    scores = scorer.log2_likelihood(codes, context=len(codes))
    assert scorer.model.config.max_seq_len == 700 and np.isfinite(scores[1:]).all()
    scorer.model.runtime.sequence_chunk = None  # the whole window at once, the reference
    by_hand = log2_softmax(scorer.model, codes)
    np.testing.assert_allclose(scores[1:], [by_hand[p - 1, codes[p]] for p in range(1, 700)], rtol=1e-5, atol=1e-6)


def write_fasta(path, records):
    with gzip.open(path, "wt") as handle:
        for name, sequence in records:
            handle.write(f">{name}\n{sequence}\n")
    return path


def test_evaluate_command_writes_the_report(causal_checkpoint, tmp_path, capsys):
    records = [("chrA", decode(random_tokens(1, 250, seed=8)[0].numpy())), ("plasmid", "ACGTNNACGT" * 3)]
    fasta = write_fasta(tmp_path / "genome.fa.gz", records)
    report = evaluate(
        checkpoint=causal_checkpoint, inputs=[str(fasta)], context=64, out=tmp_path / "eval.json", device="cpu"
    )
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


def test_the_cpu_default_window_is_the_fast_path():
    """Given neither window nor overlap, a CPU reads a long-context model at 2,048 tokens with
    overlap 512 (3x faster, about 0.002 bits per base); anything given, or a GPU, keeps the
    trained context with overlap None (the command's default: `Scorer.check_context` fills in
    context // 2); a window given longer than 2,048 on a CPU gets a note that it is slow."""
    from genoformer.genome.scoring import CPU_WINDOW, ScoringWindow, scoring_window

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    window = scoring_window(8192, cpu, name="context")
    assert (window.length, window.overlap) == (CPU_WINDOW, CPU_WINDOW // 4)
    assert "pass context=8192 for the trained window" in window.note
    assert scoring_window(8192, cuda) == ScoringWindow(8192, None, "")
    assert scoring_window(8192, cuda, 32768) == ScoringWindow(32768, None, "")  # no CPU, no note
    slow = scoring_window(32768, cpu, 32768)
    assert (slow.length, slow.overlap) == (32768, None)
    assert "a 32,768-base window is slow" in slow.note and "16 times" in slow.note and "window=2048" in slow.note
    assert scoring_window(8192, cpu, None, 100).length == 8192
    assert scoring_window(1024, cpu) == ScoringWindow(1024, None, "")
    assert scoring_window(8192, cpu, 2048) == ScoringWindow(2048, None, "")


def test_evaluate_errors_name_the_problem(causal_checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(tmp_path / "missing.fa")], device="cpu")
    empty = tmp_path / "empty.fa"
    empty.write_text(">chr1\nACGT\n>chr2\n\n")
    with pytest.raises(ValueError, match="empty"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(empty)], device="cpu")
    good = write_fasta(tmp_path / "g.fa.gz", [("a", "ACGT" * 10)])
    with pytest.raises(ValueError, match="context"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(good)], context=1, device="cpu")


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


# --- regions and splits --------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["causal", "masked"])
def test_spans_are_scored_exactly_as_in_the_whole_record(which, request):
    """Only the windows that keep a span's bases run, so its first bases see the bases before it
    (and a masked model those after it) as in the whole run; nothing else is scored."""
    scorer = request.getfixturevalue(which)
    codes = random_tokens(1, 300, seed=12)[0].numpy()
    whole = scorer.log2_likelihood(codes, context=64, overlap=40)
    spans = [(100, 180), (250, 300), (0, 5)]
    part = scorer.score_many([codes], context=64, overlap=40, progress=False, spans=[spans])[0]
    inside = np.zeros(300, dtype=bool)
    for start, end in spans:
        inside[start:end] = True
    np.testing.assert_allclose(part[inside], whole[inside], rtol=1e-6, atol=1e-7)
    assert np.isnan(part[~inside]).all() and np.isfinite(part[101:180]).all()


def test_evaluate_regions_count_the_bases_of_the_whole_record_run(causal_checkpoint, tmp_path):
    sequence = decode(random_tokens(1, 250, seed=13)[0].numpy())
    fasta = write_fasta(tmp_path / "genome.fa.gz", [("chrA", sequence), ("plasmid", "ACGTNNACGT" * 3)])
    bed = tmp_path / "regions.bed"
    bed.write_text("chrA\t0\t100\tstart\nchrA\t150\t250\nplasmid\t0\t30\n")
    report = evaluate(checkpoint=causal_checkpoint, inputs=[str(fasta)], context=64, regions=str(bed), device="cpu")
    rows = report["records"]
    assert [r["name"] for r in rows] == ["start", "chrA:151-250", "plasmid:1-30"]
    assert [r["region"] for r in rows] == ["chrA:1-100", "chrA:151-250", "plasmid:1-30"]
    # the first base of a record has no context; a region's first base past it does
    assert [r["bases"] for r in rows] == [99, 100, 23]
    assert report["unscored"] == {"non_acgt": 6, "first_base": 2}
    whole = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(encode(sequence), context=64)
    assert rows[1]["bits_per_base"] == pytest.approx(-np.nanmean(whole[150:250]), rel=1e-6)

    both = evaluate(
        checkpoint=causal_checkpoint,
        inputs=[str(fasta)],
        context=64,
        regions=["chrA:151-250"],
        both_strands=True,
        device="cpu",
    )
    backward = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(
        reverse_complement(encode(sequence)), context=64
    )
    expected = -(np.nansum(whole[150:250]) + np.nansum(backward[0:100])) / 199  # the reverse strand's first base
    assert both["records"][0]["bits_per_base"] == pytest.approx(expected, rel=1e-6)
    assert both["records"][0]["bases"] == 199


def test_evaluate_split_scores_exactly_the_store_split(causal_checkpoint, tmp_path):
    from genoformer.data.genome.store import prepare_genome_store
    from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals

    records = [
        ("chrA", decode(random_tokens(1, 400, seed=14)[0].numpy())),
        ("chrB", "NN" + decode(random_tokens(1, 198, seed=15)[0].numpy())),
    ]
    store = prepare_genome_store([write_fasta(tmp_path / "g.fa.gz", records)], tmp_path / "g.zarr", progress=False)
    config = tmp_path / "fit.yaml"
    config.write_text(
        "data:\n  init_args:\n    store: g.zarr\n    split:\n      by: region\n"
        "      val_fraction: 0.1\n      test_fraction: 0.25\n"
    )
    report = evaluate(
        checkpoint=causal_checkpoint, inputs=[str(store)], context=64, split="test", split_config=config, device="cpu"
    )
    intervals = split_intervals(
        [SequenceSource("chrA", 400, "g.fa.gz"), SequenceSource("chrB", 200, "g.fa.gz")],
        SplitSpec(val_fraction=0.1, test_fraction=0.25),
    )["test"]
    assert [(r["name"], r["bases"]) for r in report["records"]] == [
        (f"{name}:{start + 1}-{end}", end - start) for (name, _), (_, start, end) in zip(records, intervals)
    ]
    assert report["split"]["spec"]["test_fraction"] == 0.25 and report["split"]["name"] == "test"
    # without a config: the data module's default split, which holds no test part
    with pytest.raises(ValueError, match="the test split of these inputs is empty"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(store)], context=64, split="test", device="cpu")
    with pytest.raises(ValueError, match="not both"):
        evaluate(checkpoint=causal_checkpoint, inputs=[str(store)], split="test", regions="chrA", device="cpu")


# --- tracks --------------------------------------------------------------------------------------


def test_track_bins_are_aligned_to_the_record_and_average_the_scored_bases():
    from genoformer.genome.evaluate import track_bins

    values = np.arange(20, dtype=np.float64)
    values[[0, 12, 13, 14]] = np.nan
    starts, ends, means = track_bins(values, 3, 17, bin=5)
    # bins [3, 5) [5, 10) [10, 15) [15, 17): clipped at the ends, NaN left out of the means
    assert starts.tolist() == [3, 5, 10, 15] and ends.tolist() == [5, 10, 15, 17]
    np.testing.assert_allclose(means, [3.5, 7.0, 10.5, 15.5])
    assert means.dtype == np.float32
    starts, ends, _ = track_bins(values, 0, 20, bin=1)
    assert starts.tolist() == [p for p in range(20) if p not in (0, 12, 13, 14)] and (ends == starts + 1).all()
    starts, _, _ = track_bins(values, 10, 15, bin=10)
    assert starts.tolist() == [10]
    assert track_bins(values, 12, 15, bin=2)[0].tolist() == []  # no scored base, no bin
    with pytest.raises(ValueError, match="bin=0"):
        track_bins(values, 0, 20, bin=0)


def test_bedgraph_rows_merge_runs_of_equal_written_values():
    from genoformer.genome.evaluate import bedgraph_lines

    starts, ends = np.array([0, 1, 2, 3, 5, 6]), np.array([1, 2, 3, 4, 6, 7])
    values = np.array([-1.0, -1.0, -1.000001, -2.0, -2.0, -2.0])
    # 0..3 print alike (5 significant digits); 3 and 5 are not adjacent (base 4 has no value)
    assert list(bedgraph_lines("c", starts, ends, values)) == ["c\t0\t3\t-1", "c\t3\t4\t-2", "c\t5\t7\t-2"]


def test_score_writes_bigwig_in_record_coordinates(causal_checkpoint, tmp_path):
    import pyBigWig

    from genoformer.genome.evaluate import score

    sequence = decode(random_tokens(1, 300, seed=16)[0].numpy())
    fasta = write_fasta(tmp_path / "genome.fa.gz", [("chrA", "ACGT" * 10), ("chrB", sequence)])
    whole = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(encode(sequence), context=64)
    out = score(checkpoint=causal_checkpoint, inputs=[str(fasta)], out=tmp_path / "t.bw", context=64, device="cpu")
    track = pyBigWig.open(str(out))
    assert track.chroms() == {"chrA": 40, "chrB": 300}
    np.testing.assert_array_equal(np.array(track.values("chrB", 0, 300)), whole.astype(np.float32))
    track.close()

    regions = ["chrB:101-150", "chrB:141-200"]  # overlapping: joined into 100..200
    out = score(
        checkpoint=causal_checkpoint,
        inputs=[str(fasta)],
        out=tmp_path / "r.bw",
        context=64,
        regions=regions,
        device="cpu",
    )
    track = pyBigWig.open(str(out))
    read = np.array(track.values("chrB", 0, 300))
    np.testing.assert_array_equal(read[100:200], whole[100:200].astype(np.float32))
    assert np.isnan(read[:100]).all() and np.isnan(read[200:]).all() and track.intervals("chrA") is None
    track.close()

    out = score(
        checkpoint=causal_checkpoint,
        inputs=[str(fasta)],
        out=tmp_path / "b.bw",
        context=64,
        regions=regions,
        bin=30,
        device="cpu",
    )
    track = pyBigWig.open(str(out))
    bins = ((100, 120), (120, 150), (150, 180), (180, 200))  # 30-base bins from 90, clipped to 100..200
    expected = [(lo, hi, np.float32(np.nanmean(whole[lo:hi]))) for lo, hi in bins]
    assert [(lo, hi, np.float32(value)) for lo, hi, value in track.intervals("chrB")] == expected
    track.close()

    text = (
        score(
            checkpoint=causal_checkpoint,
            inputs=[str(fasta)],
            out=tmp_path / "b.bedgraph",
            context=64,
            regions=regions,
            bin=30,
            device="cpu",
        )
        .read_text()
        .splitlines()
    )
    assert [line.split("\t")[:3] for line in text[1:]] == [["chrB", str(lo), str(hi)] for lo, hi, _ in expected]
    with pytest.raises(ValueError, match=r"name it \*.bedgraph"):
        score(checkpoint=causal_checkpoint, inputs=[str(fasta)], out=tmp_path / "t.wig", device="cpu")
