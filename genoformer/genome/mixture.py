"""The mixture of the network and a Markov model: each base's probability is a blend of what the
two models give it, with a weight fixed before the base is seen.

    markov = read_markov_model("markov.npz")            # `genoformer baseline ... --save markov.npz`
    log2p_L = Mixture().mix(log2p_network_L, markov_log2p(markov, codes_L))

The inputs are the log2 probability of each observed base under each model, (L,) float64, NaN
where that model has no score. At base t the mixture gives

    p(x_t) = w_t p_network(x_t) + (1 - w_t) p_markov(x_t)

with w_t computed from the bases before t only. Each model's prediction at t is a distribution
over the four bases, so the blend is one too, and the bits are the exact log-loss of a proper
sequential model (their sum over a record is -log2 of its probability), not a score tuned after
seeing the base. Two ways to choose w_t (`MixMode`):

- FIXED: w_t = w at every base, given by hand or fitted on validation data by `fit_weight` (the
  log-loss is convex in w, so bisection on its derivative finds the best w).
- SWITCHING (fixed share over blends): K candidate blends g_k = k / (K - 1), k = 0..K-1 (the
  Markov model alone, ..., the network alone), each predicting q_k = g_k p_network + (1 - g_k)
  p_markov; the posterior v over which blend predicts the next base, in a hidden Markov chain that
  starts uniform and moves to one of the other blends with probability alpha (`switch_rate`)
  before each base:

      v_k <- v_k q_k(x_t) / sum_l v_l q_l(x_t)                       Bayes' rule once x_t is seen
      v_k <- (1 - alpha) v_k + alpha / (K - 1) (1 - v_k)              a switch may come next

  and w_t = sum_k v_k g_k, the posterior mean blend (the chain's prediction sum_k v_k q_k is the
  blend with that weight). The weight follows whichever blend has predicted the recent bases
  best: near the Markov model where it knows the sequence (a strain's genes shared with a
  trained genome), near the network where it does not (an island, a new genus), and in between
  where both are uninformed but different (two models are better than one).

The bound. The chain's prediction is the Bayes mixture over every way of handing the bases to
the blends, under the chain's prior, so over T bases scored by both models it loses to any one
hand-over with m switches by at most -log2 of that hand-over's prior:

    bits(mixture) <= bits(the hand-over) + log2 K + m log2((K - 1) / alpha)
                     + (T - 1 - m) log2(1 / (1 - alpha)).

With m = 0 and the blend that is one model alone: never worse than the better model by more than
log2 K + (T - 1) log2(1 / (1 - alpha)) bits, so the excess per base falls to log2(1 / (1 - alpha))
(about 1.44 alpha: 0.0014 bits at the default) as T grows; each switch the data call for costs
log2((K - 1) / alpha) bits once (12 at the default). A fixed weight w costs at most log2(1 / w)
bits per base against the network and log2(1 / (1 - w)) against the Markov model.

Missing scores: where one model has no score and the other has (a record's first base has no
context for the network but an order-0 one for the Markov model), the mixture takes the score it
has, and the switching weight does not move; where neither has one (N), the result is NaN. The
commands score exactly the network's bases (`network_bases_only`: the first base is left out for
both), so their network, Markov and mixture figures count the same bases, as `genoformer
baseline` does; every stream (record, strand, region, variant window) starts from the uniform v.

Fast path. `switching_weights_reference` is the recursion as a plain loop in float64, the judge
of `switching_weights`, which computes the same with whole-array operations: the recursion is the
forward pass f_{t+1} = S diag(q(x_t)) f_t of the chain (S the K x K switching matrix, v_t = f_t /
sum f_t), a product of matrices, which is associative. Each block of the stream is cut into rows
of consecutive bases: one pass over the columns multiplies every row's matrices at once
(vectorised over the rows), a loop over the rows carries f from each row's start to the next, and
a second pass over the columns carries f through every row at once. Products and vectors are
scaled to sum 1 at each step (v is a ratio), which keeps them inside float64.

Shape letters in names: ``L`` bases of one stream, ``K`` blends, ``C`` columns and ``R`` rows of a
block of the stream (base (r, j) of a block is its base r C + j).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

import numpy as np

if TYPE_CHECKING:
    from genoformer.genome.markov import MarkovModel

DEFAULT_SWITCH_RATE = 1e-3
"""alpha of the switching mixture, chosen on a strain of a trained species and on a new genus
(docs/design/mixture.md has the measurement)."""
DEFAULT_BLENDS = 5
"""K, the blends of the switching mixture: weights 0, 0.25, 0.5, 0.75 and 1 on the network."""
_SIDE = 1024  # at most this many rows, and columns, of bases per block of `switching_weights`
_BISECTIONS = 60  # halvings of [0, 1] in fit_weight: below float64 resolution
_WRITE_ONE = (
    "write one with `genoformer baseline --train GENOMES --inputs VALIDATION_GENOMES --out baseline.json "
    "--save markov.npz` (the genomes the network was trained on)"
)


class MixMode(str, enum.Enum):
    """How the weight of the network is chosen at each base (see the module docstring)."""

    SWITCHING = "switching"
    FIXED = "fixed"


MixModeName = Literal[tuple(member.value for member in MixMode)]
"""The commands' --mix_mode: a MixMode's value."""


# ----------------------------------------------------------------------- the Markov model
def read_markov_model(path: Union[str, Path]) -> MarkovModel:
    """The Markov model saved by `genoformer baseline --save`, checked to be whole.

    Raises FileNotFoundError for a missing file and ValueError, saying what to do, for a file that
    is not such a model (a checkpoint given by mistake, an embeddings .npz) or whose count tables
    do not match their orders (a damaged file).
    """
    from genoformer.genome.markov import MarkovModel  # markov imports evaluate, which imports this module

    path = check_markov_path(path)
    model = MarkovModel.load(path)
    for j, (keys_C, counts_C4) in enumerate(zip(model.keys, model.counts)):
        if (
            keys_C.ndim != 1
            or counts_C4.shape != (keys_C.size, 4)
            or keys_C.dtype != np.uint64
            or counts_C4.dtype != np.uint32
        ):
            raise ValueError(
                f"{path}: the order-{j} table should be (C,) uint64 contexts and (C, 4) uint32 counts of "
                f"A, C, G, T, not {keys_C.dtype}{keys_C.shape} and {counts_C4.dtype}{counts_C4.shape}; the "
                f"file is damaged or was not written by genoformer: {_WRITE_ONE}"
            )
        if keys_C.size and int(keys_C[-1]) >= 4**j:  # sorted: the last is the largest
            raise ValueError(
                f"{path}: the order-{j} table holds contexts longer than {j} bases (its orders do not "
                f"match); the file is damaged or was not written by genoformer: {_WRITE_ONE}"
            )
    return model


def check_markov_path(path: Union[str, Path]) -> Path:
    """`path` if it names an existing .npz; FileNotFoundError or ValueError saying what to do."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Markov model not found: {path}; {_WRITE_ONE}")
    if path.suffix != ".npz":
        what = " but a network checkpoint (that is --checkpoint)" if path.suffix == ".ckpt" else ""
        raise ValueError(
            f"{path} is not a Markov model{what}: --mix takes the .npz that `genoformer baseline --save` "
            f"writes; {_WRITE_ONE}"
        )
    return path


def markov_log2p(model: MarkovModel, codes_L: np.ndarray, start: int = 0, end: Optional[int] = None) -> np.ndarray:
    """(end - start,) float64 log2 p of bases [start, end) of one strand under the Markov model,
    each from the `order` bases before it in the whole sequence (across `start`, as `genoformer
    baseline` scores a region); NaN where the base is not A/C/G/T."""
    end = codes_L.size if end is None else end
    lo = max(0, start - model.order)
    return model.log2_probabilities(codes_L[lo:end])[start - lo :]


def network_bases_only(log2p_markov_L: np.ndarray, log2p_network_L: np.ndarray) -> np.ndarray:
    """The Markov model's scores with NaN wherever the network has none: what the commands mix,
    so that both models and the mixture count the same bases."""
    return np.where(np.isnan(log2p_network_L), np.nan, log2p_markov_L)


def _check_pair(log2p_network_L: np.ndarray, log2p_markov_L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a_L = np.asarray(log2p_network_L, dtype=np.float64)
    b_L = np.asarray(log2p_markov_L, dtype=np.float64)
    if a_L.ndim != 1 or a_L.shape != b_L.shape:
        raise ValueError(f"the two models' scores must be 1-D arrays of one length, got {a_L.shape} and {b_L.shape}")
    for name, values_L in (("network", a_L), ("Markov model", b_L)):
        if np.any(values_L > 1e-6):  # a rounding error above 0 is harmless
            raise ValueError(
                f"the {name}'s scores must be log2 probabilities (<= 0); the largest is {np.nanmax(values_L)}"
            )
    return a_L, b_L


def _check_weight(weight: float, name: str) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
        raise ValueError(
            f"{name}={weight!r} must be in [0, 1]: the network's share of each base's probability "
            "(0: the Markov model alone, 1: the network alone)"
        )


def _check_switching(switch_rate: float, blends: int) -> None:
    if isinstance(switch_rate, bool) or not isinstance(switch_rate, (int, float)) or not 0.0 < switch_rate < 0.5:
        raise ValueError(
            f"mix_switch_rate={switch_rate!r} must be in (0, 0.5): the chance of a switch of blend before "
            f"each base (default {DEFAULT_SWITCH_RATE:g}; smaller settles on one blend for longer)"
        )
    if isinstance(blends, bool) or not isinstance(blends, int) or blends < 2:
        raise ValueError(f"blends={blends!r} must be an integer >= 2 (weights k / (blends - 1) on the network)")


def mix_with_weights(log2p_network_L: np.ndarray, log2p_markov_L: np.ndarray, weights_L: np.ndarray) -> np.ndarray:
    """(L,) float64 log2 (w_t p_network + (1 - w_t) p_markov) of each base for weights w (L,) or
    one number; where one model has no score, the other's; NaN where neither has."""
    a_L, b_L = _check_pair(log2p_network_L, log2p_markov_L)
    with np.errstate(divide="ignore", invalid="ignore"):  # log2(0): one model alone; NaN: filled below
        mixed_L = np.logaddexp2(np.log2(weights_L) + a_L, np.log2(1.0 - np.asarray(weights_L)) + b_L)
    mixed_L = np.where(np.isnan(a_L), b_L, mixed_L)
    return np.where(np.isnan(b_L), a_L, mixed_L)


# ----------------------------------------------------------------------- fixed weight
def fit_weight(log2p_network_L: np.ndarray, log2p_markov_L: np.ndarray) -> float:
    """The fixed weight w in [0, 1] of the network with the fewest bits on the bases both models
    score: the bits sum -log2(w a_t + (1 - w) b_t) (a, b the probabilities) are convex in w, so
    their slope, proportional to sum (b_t - a_t) / (w a_t + (1 - w) b_t), increases with w and
    bisection finds where it is 0 (0 or 1 when it never is). Fit it on validation data, not on the
    bases it will score."""
    a_L, b_L = _check_pair(log2p_network_L, log2p_markov_L)
    both_L = ~(np.isnan(a_L) | np.isnan(b_L))
    if not np.any(both_L):
        raise ValueError("no base is scored by both models: there is nothing to fit a weight on")
    a_L, b_L = np.exp2(a_L[both_L]), np.exp2(b_L[both_L])

    def slope(w: float) -> float:
        return float(np.sum((b_L - a_L) / (w * a_L + (1.0 - w) * b_L)))

    if slope(0.0) >= 0.0:
        return 0.0
    if slope(1.0) <= 0.0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if slope(middle) < 0.0 else (low, middle)
    return 0.5 * (low + high)


# ----------------------------------------------------------------------- switching weights
def _blend_probabilities(a_L: np.ndarray, b_L: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both models' probabilities divided by the larger of the two (v depends on their ratio
    only, and so they stay inside float64), 1 where a score is missing, and where that is."""
    missing_L = np.isnan(a_L) | np.isnan(b_L)
    top_L = np.where(missing_L, 0.0, np.fmax(a_L, b_L))
    return (
        np.where(missing_L, 1.0, np.exp2(np.where(missing_L, 0.0, a_L - top_L))),
        np.where(missing_L, 1.0, np.exp2(np.where(missing_L, 0.0, b_L - top_L))),
        missing_L,
    )


def switching_weights_reference(
    log2p_network_L: np.ndarray,
    log2p_markov_L: np.ndarray,
    *,
    switch_rate: float = DEFAULT_SWITCH_RATE,
    blends: int = DEFAULT_BLENDS,
) -> np.ndarray:
    """(L,) float64 weight w_t of the network at each base, by the recursion of the module
    docstring, one base at a time."""
    _check_switching(switch_rate, blends)
    a_L, b_L, missing_L = _blend_probabilities(*_check_pair(log2p_network_L, log2p_markov_L))
    g_K = np.linspace(0.0, 1.0, blends)
    v_K = np.full(blends, 1.0 / blends)
    weights_L = np.empty(a_L.size)
    for t in range(a_L.size):
        weights_L[t] = v_K @ g_K
        if missing_L[t]:
            continue  # one model alone scores this base: nothing to learn about the blends
        q_K = g_K * a_L[t] + (1.0 - g_K) * b_L[t]
        v_K = v_K * q_K / (v_K @ q_K)
        v_K = (1.0 - switch_rate) * v_K + switch_rate / (blends - 1) * (1.0 - v_K)
    return weights_L


def switching_weights(
    log2p_network_L: np.ndarray,
    log2p_markov_L: np.ndarray,
    *,
    switch_rate: float = DEFAULT_SWITCH_RATE,
    blends: int = DEFAULT_BLENDS,
) -> np.ndarray:
    """(L,) float64 weight w_t of the network at each base: `switching_weights_reference` by
    products of the chain's matrices M_t = S diag(q(x_t)) (the identity where a model has no
    score), in blocks of R rows of C consecutive bases (R, C <= 1024; see the module docstring).

    S v = (1 - alpha - beta) v + beta sum(v), beta = alpha / (K - 1), so M P is two
    element-wise products and a sum over the blends for a whole column of rows at once.
    """
    _check_switching(switch_rate, blends)
    a_L, b_L, missing_L = _blend_probabilities(*_check_pair(log2p_network_L, log2p_markov_L))
    g_K1 = np.linspace(0.0, 1.0, blends)[:, None]
    beta = switch_rate / (blends - 1)
    keep = 1.0 - switch_rate - beta

    def step(q_KR: np.ndarray, x: np.ndarray, missing_R: np.ndarray) -> np.ndarray:
        """M x for the matrices of one column (q (K, R)) and x (K, R) vectors or (K, K, R)
        products, scaled to sum 1 per row; x unchanged where a score is missing."""
        scaled = q_KR.reshape(q_KR.shape[:1] + (1,) * (x.ndim - 2) + q_KR.shape[1:]) * x
        moved = keep * scaled + beta * scaled.sum(axis=0)
        moved /= moved.sum(axis=tuple(range(x.ndim - 1)))
        return np.where(missing_R, x, moved)

    columns = min(_SIDE, math.isqrt(max(a_L.size - 1, 0)) + 1)
    block = columns * _SIDE
    weights_L = np.empty(a_L.size)
    f_K = np.full(blends, 1.0 / blends)  # f before the block, scaled to sum 1
    for start in range(0, a_L.size, block):
        size = min(block, a_L.size - start)
        rows = -(-size // columns)
        # stored (C, R), so that a column is contiguous; the padding is missing: identities
        a_CR, b_CR, missing_CR = (
            np.pad(x_L[start : start + size], (0, rows * columns - size), constant_values=fill)
            .reshape(rows, columns)
            .T.copy()
            for x_L, fill in ((a_L, 1.0), (b_L, 1.0), (missing_L, True))
        )
        # pass 1: P_R = M_{r, C-1} ... M_{r, 0}, every row at once
        product_KKR = np.broadcast_to(np.eye(blends)[:, :, None], (blends, blends, rows)).copy()
        for j in range(columns):
            product_KKR = step(g_K1 * a_CR[j] + (1.0 - g_K1) * b_CR[j], product_KKR, missing_CR[j])
        # f at each row's start, carried row to row
        start_KR = np.empty((blends, rows))
        for r in range(rows):
            start_KR[:, r] = f_K
            f_K = product_KKR[:, :, r] @ f_K
            f_K /= f_K.sum()
        # pass 2: f through every row at once; the weight at a base comes from f before it
        v_KR = start_KR
        w_CR = np.empty((columns, rows))
        for j in range(columns):
            w_CR[j] = (g_K1 * v_KR).sum(axis=0)
            v_KR = step(g_K1 * a_CR[j] + (1.0 - g_K1) * b_CR[j], v_KR, missing_CR[j])
        weights_L[start : start + size] = w_CR.T.reshape(-1)[:size]
    return weights_L


# ----------------------------------------------------------------------- the mixture
@dataclass(frozen=True)
class Mixture:
    """How to blend the network with a Markov model (see the module docstring).

    ``weight``: FIXED only, the network's share of every base's probability. ``switch_rate``
    (alpha) and ``blends`` (K): SWITCHING only.
    """

    mode: MixMode = MixMode.SWITCHING
    weight: Optional[float] = None
    switch_rate: float = DEFAULT_SWITCH_RATE
    blends: int = DEFAULT_BLENDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", MixMode(self.mode))
        if self.mode is MixMode.FIXED:
            if self.weight is None:
                raise ValueError(
                    "a fixed mixture needs its weight: pass --mix_weight W, the network's share from 0 to 1 "
                    "(`genoformer evaluate --mix MODEL` on validation data reports the best one as "
                    "mixture.best_fixed_weight)"
                )
            _check_weight(self.weight, "mix_weight")
        elif self.weight is not None:
            raise ValueError(
                f"mix_weight={self.weight} is the weight of a fixed mixture: pass --mix_mode fixed with it, "
                "or leave it out (the switching mixture chooses its weight base by base)"
            )
        _check_switching(self.switch_rate, self.blends)

    def weights(self, log2p_network_L: np.ndarray, log2p_markov_L: np.ndarray) -> np.ndarray:
        """(L,) the network's weight at each base."""
        if self.mode is MixMode.FIXED:
            return np.full(np.shape(log2p_network_L), float(self.weight))
        return switching_weights(log2p_network_L, log2p_markov_L, switch_rate=self.switch_rate, blends=self.blends)

    def mix(self, log2p_network_L: np.ndarray, log2p_markov_L: np.ndarray) -> np.ndarray:
        """(L,) float64 log2 p of each base under the mixture; NaN where neither model scores it."""
        return mix_with_weights(log2p_network_L, log2p_markov_L, self.weights(log2p_network_L, log2p_markov_L))

    def describe(self) -> dict[str, Any]:
        """The settings, as a report records them."""
        if self.mode is MixMode.FIXED:
            return {"mode": self.mode.value, "weight": self.weight}
        return {"mode": self.mode.value, "switch_rate": self.switch_rate, "blends": self.blends}

    def label(self) -> str:
        """Which mixture, in a few words."""
        if self.mode is MixMode.FIXED:
            return f"fixed weight {self.weight:g} on the network"
        return f"switching between {self.blends} blends, switch rate {self.switch_rate:g}"


def require_causal(causal: bool, checkpoint: Union[str, Path]) -> None:
    """A mixture blends next-base predictions: ValueError for a masked model, whose score of a
    base sees the bases after it too."""
    if not causal:
        raise ValueError(
            f"--mix blends next-base predictions, and {checkpoint} is a masked language model (its score "
            "of a base is a pseudo-likelihood that sees the bases after it, which a Markov model does "
            "not): use --mix with a causal model, or leave --mix out"
        )


@dataclass(frozen=True, eq=False)
class MarkovMixture:
    """A Markov model (read from `path`) and how the commands mix it with the network."""

    markov: MarkovModel
    mixture: Mixture
    path: Path

    def score(
        self, codes_L: np.ndarray, log2p_network_L: np.ndarray, start: int = 0, end: Optional[int] = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For bases [start, end) of one strand (codes (L,) of the whole strand, the network's
        log2 p (end - start,) of those bases), as one stream: the Markov model's log2 p of the
        bases the network scores (from their context in the whole strand), the mixture's log2 p,
        and the network's weight at each base; three (end - start,) float64."""
        markov_L = network_bases_only(markov_log2p(self.markov, codes_L, start, end), log2p_network_L)
        weights_L = self.mixture.weights(log2p_network_L, markov_L)
        return markov_L, mix_with_weights(log2p_network_L, markov_L, weights_L), weights_L

    def describe(self) -> dict[str, Any]:
        """What a report says about the mixture: the model, its order and smoothing, the settings."""
        return {
            "markov": str(self.path),
            "order": self.markov.order,
            "discount": self.markov.discount,
            "concentration": self.markov.concentration,
            **self.mixture.describe(),
            "label": self.mixture.label(),
        }

    def label(self) -> str:
        return f"{self.mixture.label()}, with the order-{self.markov.order} Markov model {self.path}"


def load_mixture(mix: Union[str, Path], mixture: Mixture) -> MarkovMixture:
    """The `MarkovMixture` of a --mix file and its checked settings (`mixture_settings`)."""
    return MarkovMixture(read_markov_model(mix), mixture, Path(mix))


def mixture_settings(
    mix: Optional[Union[str, Path]],
    mode: Optional[Union[MixMode, str]],
    weight: Optional[float],
    switch_rate: Optional[float],
) -> Optional[Mixture]:
    """The mixture that the commands' --mix, --mix_mode, --mix_weight and --mix_switch_rate ask
    for (None without --mix), checked before anything is read (the Markov model's file too, which
    `read_markov_model` then reads). The mode defaults to fixed when a weight is given, else
    switching."""
    given = [
        name
        for name, value in (("mix_mode", mode), ("mix_weight", weight), ("mix_switch_rate", switch_rate))
        if value is not None
    ]
    if mix is None:
        if given:
            raise ValueError(
                f"--{given[0]} sets how the network is mixed with a Markov model: give the model too, "
                f"--mix markov.npz ({_WRITE_ONE})"
            )
        return None
    mode = MixMode(mode) if mode is not None else MixMode.FIXED if weight is not None else MixMode.SWITCHING
    if mode is MixMode.FIXED and switch_rate is not None:
        raise ValueError("--mix_switch_rate is the switching mixture's: leave it out with --mix_mode fixed")
    mixture = Mixture(mode, weight, DEFAULT_SWITCH_RATE if switch_rate is None else switch_rate)
    check_markov_path(mix)
    return mixture
