"""The mixture of the network and a Markov model: the vectorised weights against the plain loop,
a model mixed with itself, the regret bound where one model is perfect, weights that see only the
past, the fitted fixed weight, and `--mix` on `evaluate`, `score` and `variant_effect` with the
shipped model and a small Markov model of lambda."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import fails
from genoformer.data.genome.inputs import read_sequences

from genoformer.cli import main
from genoformer.genome import mixture as mixture_module
from genoformer.genome.evaluate import evaluate
from genoformer.genome.markov import MarkovModel, score_region
from genoformer.genome.mixture import (
    DEFAULT_BLENDS,
    DEFAULT_SWITCH_RATE,
    MixMode,
    Mixture,
    fit_weight,
    mix_with_weights,
    mixture_settings,
    read_markov_model,
    switching_weights,
    switching_weights_reference,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHIPPED = EXAMPLES / "genoformer_dna.ckpt"
LAMBDA = EXAMPLES / "lambda_phage.fasta.gz"
CHROM = "gi|9626243|ref|NC_001416.1|"


def random_scores(rng: np.random.Generator, length: int, missing: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Two models' log2 p of observed bases (probabilities 0.02 to 1), NaN at a `missing` fraction."""
    a_L = np.log2(rng.uniform(0.02, 1.0, length))
    b_L = np.log2(rng.uniform(0.02, 1.0, length))
    a_L[rng.random(length) < missing] = np.nan
    b_L[rng.random(length) < missing] = np.nan
    return a_L, b_L


def bits(log2p_L: np.ndarray) -> float:
    return -float(np.nansum(log2p_L))


# ----------------------------------------------------------------------- the fast weights
@pytest.mark.parametrize("length", [0, 1, 2, 97, 1025, 5003])
@pytest.mark.parametrize("blends", [2, 5])
@pytest.mark.parametrize("switch_rate", [1e-6, DEFAULT_SWITCH_RATE, 0.3])
def test_fast_weights_equal_the_plain_loop(length, blends, switch_rate):
    rng = np.random.default_rng(length + blends)
    a_L, b_L = random_scores(rng, length, missing=0.02)
    reference_L = switching_weights_reference(a_L, b_L, switch_rate=switch_rate, blends=blends)
    fast_L = switching_weights(a_L, b_L, switch_rate=switch_rate, blends=blends)
    np.testing.assert_allclose(fast_L, reference_L, rtol=0, atol=1e-12)
    assert abs(bits(mix_with_weights(a_L, b_L, fast_L)) - bits(mix_with_weights(a_L, b_L, reference_L))) < 1e-9


def test_fast_weights_carry_across_blocks(monkeypatch):
    """Blocks of 4 rows: the carry from one block to the next is exercised on a short stream."""
    monkeypatch.setattr(mixture_module, "_SIDE", 4)
    rng = np.random.default_rng(3)
    a_L, b_L = random_scores(rng, 203, missing=0.05)
    np.testing.assert_allclose(switching_weights(a_L, b_L), switching_weights_reference(a_L, b_L), rtol=0, atol=1e-12)


def test_extreme_probabilities_stay_finite():
    """A model that is sure and wrong for thousands of bases: the weights stay inside (0, 1) and the
    scaled products never underflow."""
    a_L = np.full(5000, -60.0)  # p = 2^-60 of every observed base
    b_L = np.zeros(5000)
    weights_L = switching_weights(a_L, b_L)
    assert np.all(np.isfinite(weights_L)) and weights_L[-1] < 1e-3
    np.testing.assert_allclose(weights_L, switching_weights_reference(a_L, b_L), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------- properties
@pytest.mark.parametrize(
    "mixture", [Mixture(), Mixture(MixMode.FIXED, 0.3), Mixture(MixMode.FIXED, 1.0), Mixture(switch_rate=0.2, blends=2)]
)
def test_a_model_mixed_with_itself_is_the_model(mixture):
    rng = np.random.default_rng(0)
    a_L, _ = random_scores(rng, 4001, missing=0.01)
    mixed_L = mixture.mix(a_L, a_L)
    np.testing.assert_array_equal(np.isnan(mixed_L), np.isnan(a_L))
    np.testing.assert_allclose(mixed_L, a_L, rtol=0, atol=1e-12)
    assert abs(bits(mixed_L) - bits(a_L)) < 1e-9


def switching_bound(
    bases: int, switches: int, blends: int = DEFAULT_BLENDS, rate: float = DEFAULT_SWITCH_RATE
) -> float:
    """The module docstring's regret bound in bits: log2 K + m log2((K - 1) / alpha) + (T - 1 - m) log2(1 / (1 - alpha))."""
    return (
        math.log2(blends)
        + switches * math.log2((blends - 1) / rate)
        + (bases - 1 - switches) * math.log2(1 / (1 - rate))
    )


@pytest.mark.parametrize("perfect", ["network", "markov"])
def test_never_worse_than_a_perfect_model_by_more_than_the_bound(perfect):
    """Where one model gives every observed base probability 1, the mixture's total excess over it
    is at most log2 K + (T - 1) log2(1 / (1 - alpha)), so the excess per base falls towards
    log2(1 / (1 - alpha)) (0.0014 bits at the default) as T grows."""
    rng = np.random.default_rng(1)
    bases = 100_000
    other_L = np.log2(rng.uniform(0.05, 0.9, bases))
    a_L, b_L = (np.zeros(bases), other_L) if perfect == "network" else (other_L, np.zeros(bases))
    excess = bits(Mixture().mix(a_L, b_L))  # the perfect model scores 0 bits
    assert 0 < excess <= switching_bound(bases, 0)
    assert excess / bases < 1.5e-3
    fixed = bits(Mixture(MixMode.FIXED, 0.9).mix(a_L, b_L))  # a fixed weight pays log2(1 / share) per base
    assert fixed > excess and fixed <= bases * math.log2(1 / (0.9 if perfect == "network" else 0.1)) + 1e-6


def test_switches_cost_what_the_bound_says():
    """The network perfect on the first half, the Markov model on the second: one switch."""
    rng = np.random.default_rng(2)
    half = 20_000
    noise_L = np.log2(rng.uniform(0.05, 0.9, 2 * half))
    a_L = np.r_[np.zeros(half), noise_L[half:]]
    b_L = np.r_[noise_L[:half], np.zeros(half)]
    excess = bits(Mixture().mix(a_L, b_L))
    assert excess <= switching_bound(2 * half, 1)
    assert excess < min(bits(a_L), bits(b_L)) / 100


def test_the_bound_holds_against_either_model_on_any_data():
    rng = np.random.default_rng(4)
    a_L, b_L = random_scores(rng, 30_000)
    assert bits(Mixture().mix(a_L, b_L)) <= min(bits(a_L), bits(b_L)) + switching_bound(a_L.size, 0)


def test_weights_depend_only_on_the_bases_before():
    """Changing the scores at base t (another observed base) changes no weight up to t: the
    mixture's prediction at t is fixed before x_t is seen, so it is a distribution over the bases."""
    rng = np.random.default_rng(5)
    a_L, b_L = random_scores(rng, 3000)
    weights_L = switching_weights(a_L, b_L)
    changed_a, changed_b = a_L.copy(), b_L.copy()
    changed_a[1500:], changed_b[1500:] = random_scores(rng, 1500)
    np.testing.assert_array_equal(switching_weights(changed_a, changed_b)[:1501], weights_L[:1501])
    # with the weight fixed before x_t, the four bases' mixed probabilities sum to 1
    network_4, markov_4 = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    mixed_4 = np.exp2(mix_with_weights(np.log2(network_4), np.log2(markov_4), weights_L[1500]))
    assert abs(mixed_4.sum() - 1.0) < 1e-12


def test_a_missing_score_takes_the_other_models_and_keeps_the_weight():
    a_L = np.log2(np.array([0.5, 0.9, 0.9, 0.9, 0.1, 0.9]))
    b_L = np.log2(np.array([0.3, 0.2, 0.2, 0.2, 0.8, 0.2]))
    a_L[0], b_L[3], a_L[5], b_L[5] = np.nan, np.nan, np.nan, np.nan
    mixed_L = Mixture().mix(a_L, b_L)
    weights_L = switching_weights(a_L, b_L)
    assert mixed_L[0] == b_L[0] and mixed_L[3] == a_L[3] and np.isnan(mixed_L[5])
    assert weights_L[0] == weights_L[1] == 0.5 and weights_L[3] == weights_L[4]
    assert weights_L[3] > weights_L[2] > weights_L[1]  # the network predicted bases 1 and 2 better


def test_fit_weight_is_the_minimum_of_the_bits():
    rng = np.random.default_rng(6)
    a_L, b_L = random_scores(rng, 5000)
    b_L = np.log2(0.6 * np.exp2(b_L) + 0.4 * np.exp2(a_L))  # correlated models: an inner optimum
    grid = np.linspace(0, 1, 2001)
    best = grid[np.argmin([bits(mix_with_weights(a_L, b_L, w)) for w in grid])]
    weight = fit_weight(a_L, b_L)
    assert 0 < weight < 1 and abs(weight - best) <= 1e-3
    assert fit_weight(np.zeros(10), np.full(10, -1.0)) == 1.0  # the network is better everywhere
    assert fit_weight(np.full(10, -1.0), np.zeros(10)) == 0.0


# ----------------------------------------------------------------------- settings and bad inputs
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "fixed"}, "needs its weight: pass --mix_weight"),
        ({"weight": 0.5}, "pass --mix_mode fixed"),
        ({"mode": "fixed", "weight": 1.5}, r"must be in \[0, 1\]"),
        ({"switch_rate": 0.0}, r"must be in \(0, 0.5\)"),
        ({"switch_rate": 0.7}, r"must be in \(0, 0.5\)"),
        ({"blends": 1}, "integer >= 2"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Mixture(**kwargs)


def test_scores_that_are_not_log_probabilities_are_refused():
    with pytest.raises(ValueError, match="log2 probabilities"):
        Mixture().mix(np.array([0.5]), np.array([-1.0]))
    with pytest.raises(ValueError, match="one length"):
        Mixture().mix(np.zeros(3), np.zeros(4))


@pytest.fixture(scope="module")
def lambda_markov(tmp_path_factory) -> Path:
    """An order-4 Markov model of the lambda genome, saved as `genoformer baseline --save` saves it."""
    codes = next(read_sequences([LAMBDA])).codes
    path = tmp_path_factory.mktemp("mix") / "lambda4.npz"
    MarkovModel.fit([codes], 4, 0.5, 4.0).save(path)
    return path


def test_mixture_settings_and_model_files(tmp_path, lambda_markov):
    assert mixture_settings(None, None, None, None) is None
    assert mixture_settings(lambda_markov, None, 0.25, None) == Mixture(MixMode.FIXED, 0.25)
    assert mixture_settings(lambda_markov, None, None, 0.01) == Mixture(switch_rate=0.01)
    with pytest.raises(ValueError, match="give the model too, --mix markov.npz"):
        mixture_settings(None, None, 0.5, None)
    with pytest.raises(ValueError, match="leave it out with --mix_mode fixed"):
        mixture_settings(lambda_markov, MixMode.FIXED, 0.5, 0.01)
    with pytest.raises(FileNotFoundError, match="genoformer baseline --train"):
        mixture_settings(tmp_path / "missing.npz", None, None, None)
    with pytest.raises(ValueError, match="a network checkpoint"):
        read_markov_model(SHIPPED)
    (tmp_path / "embeddings.npz").write_bytes(b"")
    np.savez(tmp_path / "embeddings.npz", embeddings=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="not a Markov model written by `genoformer baseline --save`"):
        read_markov_model(tmp_path / "embeddings.npz")

    def damaged(name: str, **tables: str) -> Path:
        """The lambda model with some tables replaced by others (name: the table taking its place)."""
        with np.load(lambda_markov) as data:
            arrays = {key: data[tables.get(key, key)] for key in data.files}
        np.savez(tmp_path / name, **arrays)
        return tmp_path / name

    with pytest.raises(ValueError, match="the order-2 table should be"):
        read_markov_model(damaged("short.npz", counts_2="counts_1"))
    with pytest.raises(ValueError, match="the order-2 table holds contexts longer than 2 bases"):
        read_markov_model(damaged("swapped.npz", keys_2="keys_3", counts_2="counts_3"))
    assert read_markov_model(lambda_markov).order == 4


# ----------------------------------------------------------------------- the commands
REGION = f"{CHROM}:2001-2400"


@pytest.fixture(scope="module")
def mixed_report(tmp_path_factory, lambda_markov) -> dict:
    """`genoformer evaluate --mix` of 400 bases of lambda (at the CPU's default window), as JSON."""
    out = tmp_path_factory.mktemp("evaluate") / "eval.json"
    main(
        [
            "evaluate",
            "--checkpoint",
            str(SHIPPED),
            "--inputs",
            str(LAMBDA),
            "--regions",
            REGION,
            "--device",
            "cpu",
            "--mix",
            str(lambda_markov),
            "--out",
            str(out),
        ]
    )
    return json.loads(out.read_text())


def test_evaluate_reports_network_markov_and_mixture_side_by_side(mixed_report, lambda_markov, capsys):
    total, mixed = mixed_report["total"], mixed_report["mixture"]
    assert (mixed_report["context"], mixed_report["overlap"]) == (2048, 512)  # the CPU's fast default window
    assert mixed["mode"] == "switching" and mixed["order"] == 4 and mixed["markov"] == str(lambda_markov)
    assert mixed["blends"] == DEFAULT_BLENDS and mixed["switch_rate"] == DEFAULT_SWITCH_RATE
    # the Markov column is `genoformer baseline`'s figure for the same bases
    codes = next(read_sequences([LAMBDA])).codes
    markov = score_region(MarkovModel.load(lambda_markov), codes, 2000, 2400)
    assert total["bases"] == markov.bases == 400
    assert abs(total["markov_bits_per_base"] - markov.bits_per_base) < 1e-12
    bound = switching_bound(total["bases"], 0) / total["bases"]
    assert total["mixture_bits_per_base"] <= min(total["bits_per_base"], total["markov_bits_per_base"]) + bound
    assert 0 <= mixed["best_fixed_weight"] <= 1 and 0 < mixed["mean_network_weight"] < 1
    # a fixed weight of 0 is the Markov model alone (1, the network alone: test_variant_effect_with_the_mixture)
    fixed = evaluate(
        checkpoint=SHIPPED, inputs=[str(LAMBDA)], regions=[REGION], device="cpu", mix=lambda_markov, mix_weight=0.0
    )
    stdout = capsys.readouterr().out
    assert "on a CPU: context 2,048 (trained at 32,768) and overlap 512, the fast default" in stdout
    assert "model     markov    mixture" in stdout and "mixture: fixed weight 0 on the network" in stdout
    assert fixed["mixture"]["mode"] == "fixed" and fixed["mixture"]["weight"] == 0.0
    assert abs(fixed["total"]["mixture_bits_per_base"] - total["markov_bits_per_base"]) < 1e-9
    assert abs(fixed["total"]["bits_per_base"] - total["bits_per_base"]) < 1e-12


def test_score_writes_the_mixture_track(tmp_path, mixed_report, lambda_markov, capsys):
    track = tmp_path / "mixed.bedgraph"
    main(
        [
            "score",
            "--checkpoint",
            str(SHIPPED),
            "--inputs",
            str(LAMBDA),
            "--regions",
            REGION,
            "--device",
            "cpu",
            "--mix",
            str(lambda_markov),
            "--out",
            str(track),
        ]
    )
    assert "mixture: switching" in capsys.readouterr().out
    lines = track.read_text().splitlines()
    assert "mixed with lambda4.npz" in lines[0]
    rows = [line.split("\t") for line in lines[1:]]
    bases = sum(int(end) - int(start) for _, start, end, _ in rows)
    mean = sum((int(end) - int(start)) * float(value) for _, start, end, value in rows) / bases
    assert bases == 400 and abs(-mean - mixed_report["total"]["mixture_bits_per_base"]) < 1e-4  # 5 significant digits


def test_variant_effect_with_the_mixture(tmp_path, lambda_markov, capsys):
    def llr(*extra: str) -> list[float]:
        out = tmp_path / "effects.tsv"
        main(
            [
                "variant_effect",
                "--checkpoint",
                str(SHIPPED),
                "--reference",
                str(LAMBDA),
                "--variants",
                str(EXAMPLES / "lambda_variants.tsv"),
                "--window",
                "128",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--overwrite",
                *extra,
            ]
        )
        return [float(line.split("\t")[5]) for line in out.read_text().splitlines()[1:]]

    network = llr()
    mixed = llr("--mix", str(lambda_markov))
    assert "with the mixture: switching" in capsys.readouterr().out
    np.testing.assert_allclose(llr("--mix", str(lambda_markov), "--mix_weight", "1"), network, rtol=1e-5, atol=1e-6)
    assert len(mixed) == 3 and np.all(np.isfinite(mixed)) and not np.allclose(mixed, network)


def test_mix_errors_name_the_fix(tmp_path, lambda_markov, mlm_checkpoint, capsys):
    base = ["evaluate", "--checkpoint", str(SHIPPED), "--inputs", str(LAMBDA), "--device", "cpu"]
    assert "give the model too, --mix markov.npz" in fails(capsys, [*base, "--mix_weight", "0.5"])
    assert "Markov model not found" in fails(capsys, [*base, "--mix", str(tmp_path / "none.npz")])
    assert "a network checkpoint" in fails(capsys, [*base, "--mix", str(SHIPPED)])
    assert "must be in [0, 1]" in fails(capsys, [*base, "--mix", str(lambda_markov), "--mix_weight", "2"])
    masked = [
        "evaluate",
        "--checkpoint",
        str(mlm_checkpoint),
        "--inputs",
        str(LAMBDA),
        "--device",
        "cpu",
        "--mix",
        str(lambda_markov),
    ]
    assert "is a masked language model" in fails(capsys, masked)
