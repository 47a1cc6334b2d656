"""The Markov baseline: agreement with a plain dictionary-counting reference, sequences with a known
answer, smoothing, strands, N handling, model selection, and `genoformer baseline` end to end."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from genoformer.data.genome.alphabet import decode, encode, reverse_complement
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.store import prepare_genome_store

from genoformer.cli import main
from genoformer.genome.markov import (
    CONCENTRATIONS,
    DISCOUNTS,
    MarkovModel,
    fit_markov_model,
    pack_positions,
    score_region,
    select_markov_model,
)


def reference_log2_probabilities(
    train: list[np.ndarray], test: np.ndarray, order: int, discount: float, concentration: float, both_strands: bool
) -> np.ndarray:
    """The model written out plainly: dictionaries of counts per context tuple, one position at a time."""
    counts = [defaultdict(lambda: np.zeros(4)) for _ in range(order + 1)]
    for codes in train:
        for strand in (codes, reverse_complement(codes)) if both_strands else (codes,):
            strand = [int(code) for code in strand]
            for i, base in enumerate(strand):
                for j in range(min(order, i) + 1):
                    context = tuple(strand[i - j : i])
                    if base == 4 or 4 in context:
                        break
                    counts[j][context][base] += 1
    out = []
    test = [int(code) for code in test]
    for i, base in enumerate(test):
        if base == 4:
            out.append(math.nan)
            continue
        p = 0.25
        for j in range(min(order, i) + 1):
            context = tuple(test[i - j : i])
            if 4 in context:
                break
            if context in counts[j]:
                seen = counts[j][context]
                p = (max(seen[base] - discount, 0) + (discount * np.count_nonzero(seen) + concentration) * p) / (
                    seen.sum() + concentration
                )
        out.append(math.log2(p))
    return np.array(out)


def random_codes(rng: np.random.Generator, length: int, n_fraction: float = 0.0) -> np.ndarray:
    weights = np.array([0.3, 0.2, 0.2, 0.3]) * (1 - n_fraction)
    return rng.choice(5, size=length, p=[*weights, n_fraction]).astype(np.uint8)


def markov_chain(rng: np.random.Generator, order: int, length: int, peak: float = 0.3) -> np.ndarray:
    """A sample of a random order-`order` chain whose next-base distributions are Dirichlet(peak)."""
    transitions = rng.dirichlet([peak] * 4, size=4**order)
    cumulative = np.cumsum(transitions, axis=1)
    codes = np.empty(length, dtype=np.uint8)
    codes[:order] = rng.integers(0, 4, order)
    context = 0
    for i in range(order):
        context = (context * 4 + int(codes[i])) % 4**order
    draws = rng.random(length)
    for i in range(order, length):
        base = min(int(np.searchsorted(cumulative[context], draws[i])), 3)
        codes[i] = base
        context = (context * 4 + base) % 4**order
    return codes


@pytest.mark.parametrize("order", [0, 1, 3, 6])
@pytest.mark.parametrize("discount, concentration", [(0.0, 1.0), (0.75, 0.1), (0.5, 8.0)])
@pytest.mark.parametrize("both_strands", [True, False])
def test_matches_the_reference(order, discount, concentration, both_strands):
    rng = np.random.default_rng(order * 7 + int(discount * 4))
    # records of awkward lengths, some shorter than the order, with Ns inside and at the ends
    train = [random_codes(rng, length, n_fraction=0.05) for length in (1, 4, 97, 1025)]
    train[2][0] = train[3][-1] = 4
    test = random_codes(rng, 500, n_fraction=0.05)
    model = MarkovModel.fit(train, order, discount, concentration, both_strands=both_strands)
    expected = reference_log2_probabilities(train, test, order, discount, concentration, both_strands)
    got = model.log2_probabilities(test)
    np.testing.assert_array_equal(np.isnan(got), test == 4)
    np.testing.assert_allclose(got, expected, rtol=1e-12, equal_nan=True)
    score = model.score(test)
    assert score.bases == int(np.count_nonzero(test < 4)) and score.skipped == int(np.count_nonzero(test == 4))
    assert score.bits == pytest.approx(-np.nansum(expected), rel=1e-12)


def test_pack_positions_layout():
    keys, usable, valid = pack_positions(encode("ACGNTGA"), order=2)
    np.testing.assert_array_equal(valid, [True, True, True, False, True, True, True])
    np.testing.assert_array_equal(usable, [0, 1, 2, 0, 1, 2])
    # key = base | (previous base << 4) | (the one before << 2): the nearest base sits highest
    assert int(keys[2]) == 2 | (1 << 4) | (0 << 2)  # G after A C
    assert int(keys[5]) == 0 | (2 << 4) | (3 << 2)  # A after T G


@pytest.mark.parametrize("period", [1, 3, 7])
def test_periodic_sequence_is_predicted_perfectly_once_k_reaches_the_period(period):
    motif = "ACGGTAC"[:period] if period > 1 else "G"
    train = encode(motif * (6000 // period))
    test = encode((motif * (4000 // period))[2:])  # another phase
    for order in (period, period + 4):
        model = MarkovModel.fit([train], order, discount=0.5, concentration=1.0)
        assert model.score(test).bits_per_base < 0.01
    if period > 1:
        assert MarkovModel.fit([train], 0, 0.5, 1.0).score(test).bits_per_base > 1.0


def test_uniform_random_sequence_costs_two_bits_per_base():
    rng = np.random.default_rng(1)
    train, test = rng.integers(0, 4, 200_000).astype(np.uint8), rng.integers(0, 4, 100_000).astype(np.uint8)
    model, selection = fit_markov_model([train], max_order=6)
    assert selection.order <= 2
    assert model.score(test).bits_per_base == pytest.approx(2.0, abs=0.005)
    # a high order with light smoothing overfits the noise: above 2 bits, never far below
    assert MarkovModel.fit([train], 8, discount=0.0, concentration=0.25).score(test).bits_per_base > 2.01


@pytest.mark.parametrize("order", [0, 4, 31])
@pytest.mark.parametrize("discount, concentration", [(0.0, 1e-3), (0.9, 1e-3), (0.5, 100.0)])
def test_smoothing_never_gives_zero_probability(order, discount, concentration):
    model = MarkovModel.fit([encode("A" * 200)], order, discount, concentration, both_strands=False)
    for context in ("", "A" * 40, "CCCC", "GATTACA" * 6, "AAAN"):
        p = model.next_base_probabilities(context)
        assert np.all(p > 0) and p.sum() == pytest.approx(1.0, abs=1e-12)
    lp = model.log2_probabilities(encode("ACGTTGCA" * 10))
    assert np.all(np.isfinite(lp))
    assert np.argmax(model.next_base_probabilities("A" * 40)) == 0  # the one thing it saw still wins


def test_probabilities_sum_to_one_on_real_counts():
    rng = np.random.default_rng(2)
    model = MarkovModel.fit([markov_chain(rng, 2, 5000)], 5, discount=0.75, concentration=0.5)
    for _ in range(20):
        context = decode(rng.integers(0, 4, int(rng.integers(0, 9))).astype(np.uint8))
        assert model.next_base_probabilities(context).sum() == pytest.approx(1.0, abs=1e-12)


def test_both_strands_counting_is_strand_symmetric():
    rng = np.random.default_rng(3)
    codes = random_codes(rng, 3000, n_fraction=0.02)
    forward = MarkovModel.fit([codes], 5, 0.5, 1.0)
    reverse = MarkovModel.fit([reverse_complement(codes)], 5, 0.5, 1.0)
    assert forward.positions == reverse.positions == 2 * int(np.count_nonzero(codes < 4))
    for j in range(6):
        np.testing.assert_array_equal(forward.keys[j], reverse.keys[j])
        np.testing.assert_array_equal(forward.counts[j], reverse.counts[j])
    one_strand = MarkovModel.fit([codes], 5, 0.5, 1.0, both_strands=False)
    assert one_strand.positions == forward.positions // 2
    assert not np.array_equal(one_strand.counts[1], forward.counts[1])


def test_kmers_spanning_n_are_not_counted():
    model = MarkovModel.fit([encode("AAAANCCCC")], 1, 0.5, 1.0, both_strands=False)
    np.testing.assert_array_equal(model.keys[0], [0])
    np.testing.assert_array_equal(model.counts[0], [[4, 4, 0, 0]])
    np.testing.assert_array_equal(model.keys[1], [0, 1])  # contexts A and C; nothing after or before the N
    np.testing.assert_array_equal(model.counts[1], [[3, 0, 0, 0], [0, 3, 0, 0]])


def test_n_targets_are_skipped_and_n_contexts_back_off():
    rng = np.random.default_rng(4)
    model = MarkovModel.fit([markov_chain(rng, 3, 20_000)], 4, discount=0.5, concentration=2.0)
    codes = encode("GATTACANNGCATTAGNCAT")
    lp = model.log2_probabilities(codes)
    np.testing.assert_array_equal(np.isnan(lp), codes == 4)
    assert model.score(codes).skipped == 3 and model.score(codes).bases == codes.size - 3
    for i in np.flatnonzero(codes < 4):
        context = decode(codes[max(0, i - 4) : i]).split("N")[-1]  # the N-free bases just before
        assert lp[i] == pytest.approx(math.log2(model.next_base_probabilities(context)[codes[i]]), rel=1e-12)
    # the first base after an N is scored with the order-0 probabilities, as at a record start
    assert lp[9] == pytest.approx(math.log2(model.next_base_probabilities("")[2]))
    assert lp[9] == pytest.approx(model.log2_probabilities(encode("G"))[0])


def test_selection_finds_the_order_of_a_simulated_chain():
    rng = np.random.default_rng(5)
    codes = markov_chain(rng, 3, 150_000)
    selection = select_markov_model([codes], orders=range(7), both_strands=False)
    assert selection.order == 3
    best = {row["order"]: row["bits_per_base"] for row in selection.best_per_order()}
    assert best[3] < best[2] - 0.05 and best[3] < best[6]
    assert len(selection.table) == 7 * len(DISCOUNTS) * len(CONCENTRATIONS) and selection.held_out_bases == 15_000


def test_fixed_values_skip_the_selection():
    rng = np.random.default_rng(6)
    model, selection = fit_markov_model([random_codes(rng, 1000)], order=2, discount=0.5, concentration=1.0)
    assert selection is None and (model.order, model.discount, model.concentration) == (2, 0.5, 1.0)
    model, selection = fit_markov_model([random_codes(rng, 1000)], order=2)
    assert selection.order == 2 and {row["order"] for row in selection.table} == {2}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"order": 32}, "order=32"),
        ({"order": -1}, "order=-1"),
        ({"order": 2, "discount": 1.0, "concentration": 1.0}, "discount=1.0"),
        ({"order": 2, "discount": 0.5, "concentration": 0.0}, "concentration=0.0"),
        ({"max_order": 40}, "max_order=40"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fit_markov_model([encode("ACGT" * 100)], **kwargs)


def test_nothing_to_count_is_a_clear_error():
    with pytest.raises(ValueError, match="no A/C/G/T bases to train on"):
        MarkovModel.fit([encode("NNNN")], 2, 0.5, 1.0)
    with pytest.raises(ValueError, match="--order"):
        fit_markov_model([encode("ACGTACG")])  # too short to hold anything out


# --- genoformer baseline ------------------------------------------------------------------------------


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    text = "".join(f">{name} test record\n{sequence}\n" for name, sequence in records.items())
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture(scope="module")
def chain_files(tmp_path_factory) -> dict[str, Path]:
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("markov")
    chain = decode(markov_chain(rng, 2, 60_000))
    return {
        "train_a": write_fasta(root / "train_a.fa.gz", {"a1": chain[:30_000]}),
        "train_b": write_fasta(root / "train_b.fa", {"b1": chain[30_000:45_000], "b2": chain[45_000:50_000]}),
        "test": write_fasta(
            root / "test.fa",
            {"t1": chain[50_000:56_000], "t2": "NN" + chain[56_000:58_000] + "NNN" + chain[58_000:60_000]},
        ),
    }


def run_baseline(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(["baseline", *args])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_baseline_command_writes_the_json_shape(tmp_path, chain_files, capsys):
    out = tmp_path / "results" / "baseline.json"
    code, stdout, _ = run_baseline(
        [
            "--train",
            f"[{chain_files['train_a']},{chain_files['train_b']}]",
            "--inputs",
            str(chain_files["test"]),
            "--out",
            str(out),
            "--max_order",
            "5",
        ],
        capsys,
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"total", "records", "model", "skipped_bases"}
    assert set(result["total"]) >= {"bits_per_base", "bases"}
    assert [row["name"] for row in result["records"]] == ["t1", "t2"]
    # a record's first base has no context and is not scored, as for a causal model in `evaluate`
    # (t2 starts with N, which is skipped)
    assert [row["bases"] for row in result["records"]] == [5999, 4000]
    assert [row["skipped"] for row in result["records"]] == [0, 5] and result["skipped_bases"] == 5
    assert result["total"]["bases"] == 9999 and result["first_bases_unscored"] == 1
    weighted = sum(row["bits_per_base"] * row["bases"] for row in result["records"]) / 9999
    assert result["total"]["bits_per_base"] == pytest.approx(weighted)
    model = result["model"]
    # an order-2 chain; counted on both strands (as genomes are), higher orders also tell the strands apart
    assert model["order"] >= 2
    assert {"discount", "concentration", "selection", "train_files", "train_bases"} <= set(model)
    assert model["train_bases"] == 50_000 and len(model["train_files"]) == 2
    assert len(model["selection"]) == 6 * len(DISCOUNTS) * len(CONCENTRATIONS)
    assert 1.0 < result["total"]["bits_per_base"] < 1.9
    assert "t2" in stdout and "total" in stdout and "skipped" in stdout
    assert not list(out.parent.glob(".*tmp*"))


def test_baseline_saves_the_model_and_it_loads_back(tmp_path, chain_files, capsys):
    """`--save` writes the fitted model as .npz (no pickle); loaded back it scores the same, and the
    file is refused as every output is without --overwrite."""
    saved = tmp_path / "markov.npz"
    args = [
        "--train",
        str(chain_files["train_a"]),
        "--inputs",
        str(chain_files["test"]),
        "--out",
        str(tmp_path / "b.json"),
        "--order",
        "3",
        "--discount",
        "0.5",
        "--concentration",
        "4",
        "--save",
        str(saved),
    ]
    code, stdout, _ = run_baseline(args, capsys)
    assert code == 0 and f"wrote {saved} (the order-3 model" in stdout
    model = MarkovModel.load(saved)
    assert (model.order, model.discount, model.concentration) == (3, 0.5, 4.0)
    fitted = MarkovModel.fit([next(iter(read_sequences([str(chain_files["train_a"])]))).codes], 3, 0.5, 4.0)
    codes = next(iter(read_sequences([str(chain_files["test"])]))).codes
    np.testing.assert_array_equal(model.log2_probabilities(codes), fitted.log2_probabilities(codes))
    total = json.loads((tmp_path / "b.json").read_text())["total"]
    code, _, err = run_baseline([*args[:5], str(tmp_path / "c.json"), *args[6:]], capsys)
    assert code == 1 and f"{saved} exists; pass --overwrite" in err
    assert json.loads((tmp_path / "b.json").read_text())["total"] == total
    code, _, err = run_baseline(
        [*args[:5], str(tmp_path / "d.json"), *args[6:-1], str(tmp_path / "markov.pkl")], capsys
    )
    assert code == 1 and "saved as .npz" in err
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a Markov model written by `genoformer baseline --save`"):
        MarkovModel.load(tmp_path / "broken.npz")
    with pytest.raises(FileNotFoundError, match="genoformer baseline ... --save"):
        MarkovModel.load(tmp_path / "missing.npz")


def test_baseline_refuses_to_replace_an_existing_out(tmp_path, chain_files, capsys):
    """As every other command does: an existing --out stays unless --overwrite, and the refusal
    comes before the counting."""
    out = tmp_path / "baseline.json"
    out.write_text("{}")
    args = [
        "--train",
        str(chain_files["train_b"]),
        "--inputs",
        str(chain_files["test"]),
        "--out",
        str(out),
        "--order",
        "2",
        "--discount",
        "0.5",
        "--concentration",
        "2",
    ]
    code, stdout, err = run_baseline(args, capsys)
    assert code == 1 and f"{out} exists; pass --overwrite" in err and "order-2" not in stdout
    assert out.read_text() == "{}"
    code, _, _ = run_baseline([*args, "--overwrite"], capsys)
    assert code == 0 and json.loads(out.read_text())["model"]["order"] == 2


def test_baseline_reads_stores_and_scores_both_strands(tmp_path, chain_files, capsys):
    store = prepare_genome_store([chain_files["test"]], tmp_path / "test.zarr", progress=False)
    results = {}
    for name, inputs in (("fasta", str(chain_files["test"])), ("store", str(store))):
        for strands in ("false", "true"):
            out = tmp_path / f"{name}_{strands}.json"
            code, _, _ = run_baseline(
                [
                    "--train",
                    str(chain_files["train_b"]),
                    "--inputs",
                    inputs,
                    "--out",
                    str(out),
                    "--order",
                    "3",
                    "--discount",
                    "0.5",
                    "--concentration",
                    "2",
                    "--both_strands",
                    strands,
                ],
                capsys,
            )
            assert code == 0
            results[name, strands] = json.loads(out.read_text())
    assert results["fasta", "false"]["total"] == results["store", "false"]["total"]
    assert results["fasta", "true"]["total"] == results["store", "true"]["total"]
    one, both = results["fasta", "false"], results["fasta", "true"]
    assert both["strands"] == 2 and both["total"]["bases"] == one["total"]["bases"]
    assert both["model"]["selection"] == [] and both["model"]["order"] == 3
    # the same model through the Python API: one strand, and the mean of both strands
    model = MarkovModel.fit([record.codes for record in read_sequences([chain_files["train_b"]])], 3, 0.5, 2.0)
    for record, row_one, row_both in zip(read_sequences([chain_files["test"]]), one["records"], both["records"]):
        # every scored base but each strand's first, which has no context
        forward = model.log2_probabilities(record.codes)[1:]
        reverse = model.log2_probabilities(reverse_complement(record.codes))[1:]
        bases = int(np.isfinite(forward).sum())
        assert row_one["bases"] == row_both["bases"] == bases
        assert row_one["bits_per_base"] == pytest.approx(-np.nansum(forward) / bases, rel=1e-12)
        both_bits = -(np.nansum(forward) + np.nansum(reverse)) / (bases + np.isfinite(reverse).sum())
        assert row_both["bits_per_base"] == pytest.approx(both_bits, rel=1e-12)
    assert both["total"]["bits_per_base"] != pytest.approx(one["total"]["bits_per_base"], rel=1e-6)


def test_baseline_help_comes_from_the_docstring(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["baseline", "--help"])
    assert exit_info.value.code == 0
    assert "Concentration a > 0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "input not found"),
        ("empty_record", "record 'empty' is empty"),
        ("all_n_input", "no A/C/G/T base to score"),
        ("all_n_train", "no A/C/G/T bases to train on"),
        ("bad_order", "order=32"),
        ("bad_character", "invalid character 'X'"),
    ],
)
def test_baseline_errors_are_clear(tmp_path, chain_files, capsys, case, message):
    good = chain_files["train_b"]
    train, inputs, extra = good, good, ["--order", "2"]
    if case == "missing":
        inputs = tmp_path / "nope.fa"
    elif case == "empty_record":
        inputs = write_fasta(tmp_path / "empty.fa", {"fine": "ACGT", "empty": ""})
    elif case == "all_n_input":
        inputs = write_fasta(tmp_path / "n.fa", {"gap": "NNNNNN"})
    elif case == "all_n_train":
        train = write_fasta(tmp_path / "n.fa", {"gap": "NNNNNN"})
    elif case == "bad_order":
        extra = ["--order", "32"]
    elif case == "bad_character":
        inputs = write_fasta(tmp_path / "x.fa", {"bad": "ACGXT"})
    out = tmp_path / "out.json"
    code, _, err = run_baseline(["--train", str(train), "--inputs", str(inputs), "--out", str(out), *extra], capsys)
    assert code == 1
    assert message in err
    assert not out.exists()


def test_a_region_is_scored_as_in_the_whole_record():
    """Its first bases use the k bases before it; the record's first base has no context and is
    left out, as a causal language model leaves it out."""
    rng = np.random.default_rng(3)
    model = MarkovModel.fit([markov_chain(rng, 2, 5_000)], 4, 0.5, 4.0)
    codes = random_codes(rng, 400, n_fraction=0.05)
    whole = model.log2_probabilities(codes)
    for start, end in ((0, 400), (2, 50), (100, 250), (399, 400)):
        part = score_region(model, codes, start, end)
        scored = whole[max(start, 1) : end]
        assert part.bases == int(np.isfinite(scored).sum())
        assert part.bits == pytest.approx(-np.nansum(scored), rel=1e-12, abs=1e-12)
        assert part.skipped == int((codes[start:end] == 4).sum())


def count_bases(codes: np.ndarray) -> int:
    return int(np.count_nonzero(codes < 4))


def test_baseline_trains_and_scores_exactly_the_store_splits(tmp_path, chain_files, capsys):
    from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals

    store = prepare_genome_store([chain_files["train_b"], chain_files["test"]], tmp_path / "g.zarr", progress=False)
    config = tmp_path / "fit.yaml"
    config.write_text("data:\n  init_args:\n    split: {by: region, val_fraction: 0.1, test_fraction: 0.2}\n")
    out = tmp_path / "split.json"
    code, stdout, _ = run_baseline(
        [
            "--train",
            str(store),
            "--split",
            "train",
            "--inputs",
            str(store),
            "--inputs_split",
            "test",
            "--split_config",
            str(config),
            "--out",
            str(out),
            "--order",
            "3",
            "--discount",
            "0.5",
            "--concentration",
            "2",
        ],
        capsys,
    )
    assert code == 0 and "of the train split" in stdout
    result = json.loads(out.read_text())
    records = list(read_sequences([store]))
    intervals = split_intervals(
        [SequenceSource(r.name, r.codes.size, "x") for r in records], SplitSpec(val_fraction=0.1, test_fraction=0.2)
    )
    train = [records[i].codes[start:end] for i, start, end in intervals["train"]]
    assert result["model"]["train_bases"] == sum(map(count_bases, train))
    assert result["model"]["counted_positions"] == 2 * sum(map(count_bases, train))  # both strands
    assert result["model"]["train_split"]["spec"]["test_fraction"] == 0.2
    test = [(records[i], start, end) for i, start, end in intervals["test"]]
    assert [row["region"] for row in result["records"]] == [f"{r.name}:{start + 1}-{end}" for r, start, end in test]
    assert [row["bases"] for row in result["records"]] == [count_bases(r.codes[start:end]) for r, start, end in test]
    model = MarkovModel.fit(train, 3, 0.5, 2.0)
    for row, (record, start, end) in zip(result["records"], test):
        expected = model.log2_probabilities(record.codes)[start:end]
        assert row["bits_per_base"] == pytest.approx(-np.nanmean(expected), rel=1e-12)


def test_baseline_regions_are_rows_in_genome_coordinates(tmp_path, chain_files, capsys):
    out = tmp_path / "regions.json"
    code, stdout, _ = run_baseline(
        [
            "--train",
            str(chain_files["train_b"]),
            "--inputs",
            str(chain_files["test"]),
            "--regions",
            "t1:1-1,000",
            "t2",
            "--out",
            str(out),
            "--order",
            "2",
            "--discount",
            "0.5",
            "--concentration",
            "2",
        ],
        capsys,
    )
    assert code == 0 and "region" in stdout
    rows = json.loads(out.read_text())["records"]
    assert [(row["name"], row["region"], row["bases"], row["skipped"]) for row in rows] == [
        ("t1:1-1000", "t1:1-1000", 999, 0),
        ("t2", "t2:1-4005", 4000, 5),
    ]


def test_baseline_and_evaluate_count_the_same_bases(tmp_path, causal_checkpoint, capsys):
    """Neither scores a record's first base (it has no context); both score the rest of A/C/G/T."""
    from genoformer.genome.evaluate import evaluate

    rng = np.random.default_rng(5)
    fasta = write_fasta(
        tmp_path / "g.fa", {"a": decode(random_codes(rng, 500, 0.02)), "b": "N" + decode(random_codes(rng, 99))}
    )
    out = tmp_path / "b.json"
    code, _, _ = run_baseline(
        [
            "--train",
            str(fasta),
            "--inputs",
            str(fasta),
            "--out",
            str(out),
            "--order",
            "2",
            "--discount",
            "0.5",
            "--concentration",
            "2",
        ],
        capsys,
    )
    assert code == 0
    markov = json.loads(out.read_text())
    neural = evaluate(checkpoint=causal_checkpoint, inputs=[str(fasta)], context=64, device="cpu")
    assert [row["bases"] for row in markov["records"]] == [row["bases"] for row in neural["records"]]
    assert markov["first_bases_unscored"] == neural["unscored"]["first_base"] == 1  # b starts with N: skipped
