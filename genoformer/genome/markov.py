"""The classical baseline: an order-k Markov model of DNA with interpolated smoothing.

Every neural bits-per-base figure is printed against this model. It predicts each base from the
k bases before it, blending the counts of every order j = 0..k down to a uniform order -1::

    p_-1(x)      = 1/4
    p_j(x | c_j) = (max(n(c_j, x) - d, 0) + (d * u(c_j) + a) * p_{j-1}(x | c_{j-1})) / (n(c_j) + a)

where c_j is the j bases before x, n(c_j, x) the training count of x after c_j, n(c_j) the
count of c_j, u(c_j) the number of distinct bases seen after c_j, d in [0, 1) a discount and
a > 0 a concentration (an interpolated Pitman-Yor / PPM-style blend; d = 0 is Dirichlet
interpolation). An unseen context has n(c_j) = 0 and so p_j = p_{j-1}. The result is never 0
and sums to 1 over the four bases. Counts cover both strands of the training data; a k-mer that
spans an N (code 4) is not counted. In scoring, a position whose base is not A/C/G/T is skipped
(and counted as skipped); a context that holds an N, or the start of a record, limits the usable
order to the N-free bases just before the position.

Counting. Each position is packed into one uint64 key: its target base in bits 0-1 and the m-th
base before it in bits 2 + 2(k - m), so the nearest base sits highest. The order-j context of a
key is ``key >> (2 + 2(k - j))``, and the order-j context is the order-(j+1) context shifted
right by 2 (its farthest base dropped). One in-place sort of all keys therefore sorts every
order at once: the order-k table comes from run lengths of the sorted keys, and each lower
order from the one above by adding the (at most four) adjacent rows of each parent, with no
further sort.
Positions with fewer than k usable bases before them (record starts, bases after an N: a few
per record) are sorted with the rest, taken out of the order-k counts and put back at their own
usable order on the way down; the contexts only they reached stay in the tables with zero counts,
where they act as unseen contexts. Per order the model keeps the sorted context keys (C_j,)
uint64 and the counts (C_j, 4) uint32 (1.8 GB at k = 16 for 9 Mbp counted on both strands). Lookups are
``np.searchsorted`` of the scored positions' contexts, sorted by their order-k key first so that
every order's queries arrive in increasing order; a position whose order-j context was never
seen is not looked up at higher orders.

Choosing k, d and a (:func:`fit_markov_model`): hold out the last 10% of every training
record, count the rest (both strands), score the held-out parts (forward strand) at every
order 0..max_order and every (d, a) of a small grid (one pass over the orders gives all k at
once per (d, a)), take the lowest bits per base, then count all the training data again.
Each order's table is looked up as soon as it is counted and then dropped, so the selection
holds about two tables at a time.

Shape letters in names: ``L`` bases of one record, ``P`` positions scored or counted (those
whose base is A/C/G/T), ``C`` contexts of one order seen in training, ``K1`` = k + 1 orders,
``Q`` queries of one table and ``F`` those found, ``A`` positions still looked up, ``G`` parent
contexts, ``D`` distinct keys, ``S`` short positions (fewer than k usable bases before them),
``U`` usable positions.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np

from genoformer.data.genome.alphabet import N, encode, reverse_complement
from genoformer.data.genome.inputs import NamedSequence, check_sequence_inputs, read_sequences
from genoformer.data.genome.regions import record_regions
from genoformer.data.splits import SplitName, SplitSpec, read_split_spec
from genoformer.data.storage import atomic_open, refuse_existing, write_json
from genoformer.genome.reports import comparison_rows, is_table, write_comparison
from genoformer.progress import tqdm

#: 2-bit codes of a 31-base context and a target fill the 64 bits of one key.
MAX_ORDER = 31
DEFAULT_MAX_ORDER = 16
MODEL_FORMAT_VERSION = 1
"""Version of the .npz layout that `MarkovModel.save` writes."""
#: Smoothing values tried in model selection (d = 0 is plain Dirichlet interpolation). On bacterial
#: genomes the best concentration is large (about 256 at k = 8..16, where d hardly matters); on
#: sequences with exact structure (repeats, periodic tests) it is small.
DISCOUNTS = (0.0, 0.5, 0.75, 0.9)
CONCENTRATIONS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0)
#: The last tenth of every training record is held out to choose k, d and a.
HELD_OUT_FRACTION = 0.1
#: Positions looked up at once (memory: about 12 * (k + 1) bytes per position).
_CHUNK = 1 << 19
_TWO = np.uint64(2)
_THREE = np.uint64(3)


def _check_order(order: int, name: str = "order") -> None:
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 0 <= order <= MAX_ORDER:
        raise ValueError(
            f"{name}={order!r} is not a usable Markov order: give an integer from 0 to {MAX_ORDER} "
            f"(the context and the base must fit 2 bits each in 64 bits)"
        )


def _check_smoothing(discount: float, concentration: float) -> None:
    if not 0.0 <= discount < 1.0:
        raise ValueError(f"discount={discount} must be in [0, 1)")
    if not concentration > 0.0:
        raise ValueError(f"concentration={concentration} must be > 0 (it keeps every probability above zero)")


def pack_positions(codes_L: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys and usable orders of the positions of one strand whose base is A/C/G/T.

    Returns ``keys_P`` (P,) uint64 (the base in bits 0-1, the m-th base before it in bits
    2 + 2(order - m); bits of bases that are not usable are arbitrary), ``usable_P`` (P,) uint8
    (how many bases before the position are A/C/G/T without a break, at most ``order``) and
    ``valid_L`` (L,) bool, True where the base is A/C/G/T (the positions kept, in order).
    """
    codes_L = np.asarray(codes_L, dtype=np.uint8)
    length = codes_L.size
    valid_L = codes_L < N
    bases_L = (codes_L & 3).astype(np.uint64)  # N reads as A here; `usable` keeps it out of every context
    keys_L = bases_L.copy()
    for back in range(1, min(order, length - 1) + 1):
        keys_L[back:] |= bases_L[:-back] << np.uint64(2 + 2 * (order - back))
    position_L = np.arange(length)
    last_invalid_L = np.maximum.accumulate(np.where(valid_L, -1, position_L)) if length else position_L
    usable_L = np.zeros(length, dtype=np.uint8)
    usable_L[1:] = np.minimum(position_L[:-1] - last_invalid_L[:-1], order)  # run of A/C/G/T ending just before
    return keys_L[valid_L], usable_L[valid_L], valid_L


def _context(keys_P: np.ndarray, order: int, j: int) -> np.ndarray:
    """The order-j context of each key packed for ``order`` (nearest base highest)."""
    if j == 0:
        return np.zeros(keys_P.shape, dtype=np.uint64)
    return keys_P >> np.uint64(2 + 2 * (order - j))


def _pack_strands(sequences: Iterable[np.ndarray], order: int, both_strands: bool) -> tuple[np.ndarray, np.ndarray]:
    """Keys and usable orders (:func:`pack_positions`) of every sequence, and of its reverse
    complement too when ``both_strands``, concatenated: (P,) uint64 and (P,) uint8."""
    parts_keys, parts_usable = [np.empty(0, np.uint64)], [np.empty(0, np.uint8)]
    for codes_L in sequences:
        for strand_L in (codes_L, reverse_complement(codes_L)) if both_strands else (codes_L,):
            keys_P, usable_P, _ = pack_positions(strand_L, order)
            parts_keys.append(keys_P)
            parts_usable.append(usable_P)
    return np.concatenate(parts_keys), np.concatenate(parts_usable)


def _parents(keys_C: np.ndarray, counts_C4: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order-(j-1) table from the order-j one: a context's parent drops its farthest base (the
    lowest 2 bits), so the children of a parent are adjacent, and there are at most four."""
    parent_C = keys_C >> _TWO
    first_G = np.flatnonzero(np.r_[True, parent_C[1:] != parent_C[:-1]])
    children_G = np.diff(np.r_[first_G, keys_C.size])
    parent_counts_G4 = counts_C4[first_G]
    for child in range(1, 4):  # cheaper than np.add.reduceat when most parents have one child
        more_G = np.flatnonzero(children_G > child)
        if more_G.size == 0:
            break
        parent_counts_G4[more_G] += counts_C4[first_G[more_G] + child]
    return parent_C[first_G], parent_counts_G4


def iter_count_tables(
    keys_P: np.ndarray, usable_P: np.ndarray, order: int, progress: bool = False
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (j, sorted context keys (C_j,) uint64, counts (C_j, 4) uint32) for j = order..0.

    ``keys_P`` and ``usable_P`` come from :func:`pack_positions` (several strands and records
    concatenated); ``keys_P`` is sorted in place. A position counts at order j when
    ``usable_P >= j``. A table may hold contexts whose counts are all 0 (the far end of a
    position that counts only at lower orders); they act as unseen contexts.
    """
    total = keys_P.size
    if total >= 1 << 32:
        raise ValueError(
            f"{total:,} positions overflow the uint32 counts; train on fewer than 2**32 "
            "positions (2 Gbp on both strands)"
        )
    short_P = usable_P < order  # record starts and bases after an N: their far context bits are not bases
    short_keys, short_usable = keys_P[short_P], usable_P[short_P]
    keys_P.sort()
    with tqdm(total=order + 1, desc="counting", unit="order", disable=not progress) as bar:
        first_P = np.flatnonzero(np.r_[True, keys_P[1:] != keys_P[:-1]])
        distinct_D = keys_P[first_P]
        runs_D = np.diff(np.r_[first_P, total]).astype(np.uint32)
        del first_P
        context_D = distinct_D >> _TWO
        new_D = np.r_[True, context_D[1:] != context_D[:-1]]
        rows_D = np.cumsum(new_D) - 1
        keys_C = context_D[new_D]
        counts_C4 = np.zeros((keys_C.size, 4), dtype=np.uint32)
        counts_C4[rows_D, (distinct_D & _THREE).astype(np.intp)] = runs_D
        del distinct_D, runs_D, context_D, new_D, rows_D
        # The sort counted every position at every order; take the short ones out of the top order
        # and put each back at its own usable order on the way down.
        for j in range(order, -1, -1):
            if j < order:
                keys_C, counts_C4 = _parents(keys_C, counts_C4)
            change_S = short_usable < j if j == order else short_usable == j
            if np.any(change_S):
                changed = short_keys[change_S]
                rows_S = np.searchsorted(keys_C, _context(changed, order, j))
                ufunc = np.subtract if j == order else np.add
                ufunc.at(counts_C4, (rows_S, (changed & _THREE).astype(np.intp)), np.uint32(1))
            yield j, keys_C, counts_C4
            bar.update()


def _lookup_order(
    keys_C: np.ndarray, counts_C4: np.ndarray, context_Q: np.ndarray, targets_Q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Look up Q order-j contexts (fastest when sorted) in an order-j table.

    Returns the indices F of the queries whose context is in the table and, for those, n(c, x)
    of their target x, n(c) and u(c): four (F,) arrays.
    """
    if keys_C.size == 0:
        return (np.empty(0, np.intp),) + tuple(np.empty(0, np.uint32) for _ in range(3))
    rows_Q = np.minimum(np.searchsorted(keys_C, context_Q), keys_C.size - 1)
    found_F = np.flatnonzero(keys_C[rows_Q] == context_Q)
    counts_F4 = counts_C4[rows_Q[found_F]]
    columns = counts_F4.T  # four (F,) views: column sums are much faster than reductions along axis 1
    return (
        found_F,
        counts_F4[np.arange(found_F.size), targets_Q[found_F]],
        columns[0] + columns[1] + columns[2] + columns[3],
        (columns[0] > 0).view(np.uint8) + (columns[1] > 0) + (columns[2] > 0) + (columns[3] > 0),
    )


@dataclass(frozen=True)
class RecordScore:
    """Bits (sum of -log2 p), bases scored and bases skipped (not A/C/G/T) of one strand."""

    bits: float
    bases: int
    skipped: int

    @property
    def bits_per_base(self) -> float:
        return self.bits / self.bases if self.bases else float("nan")


@dataclass(frozen=True, eq=False)
class MarkovModel:
    """An order-k interpolated Markov model over A, C, G, T (see the module docstring).

    Build it with :meth:`fit` (fixed order and smoothing) or :func:`fit_markov_model` (chosen on
    held-out data). ``keys[j]`` (C_j,) uint64 are the sorted order-j contexts seen in training,
    ``counts[j]`` (C_j, 4) uint32 the counts of A, C, G, T after each; ``positions`` is the
    number of positions counted (both strands when fitted so).
    """

    order: int
    discount: float
    concentration: float
    keys: list[np.ndarray] = field(repr=False)
    counts: list[np.ndarray] = field(repr=False)
    positions: int

    def __post_init__(self) -> None:
        _check_order(self.order)
        _check_smoothing(self.discount, self.concentration)

    @classmethod
    def fit(
        cls,
        sequences: Iterable[np.ndarray],
        order: int,
        discount: float,
        concentration: float,
        both_strands: bool = True,
        progress: bool = False,
    ) -> MarkovModel:
        """Count the sequences (code arrays (L,) uint8), each also reverse-complemented by default.

        Raises ValueError when there is no A/C/G/T base to count.
        """
        _check_order(order)
        _check_smoothing(discount, concentration)
        keys_P, usable_P = _pack_strands(sequences, order, both_strands)
        if keys_P.size == 0:
            raise ValueError("no A/C/G/T bases to train on: the training sequences are empty or all N")
        keys: list[np.ndarray] = [np.empty(0, np.uint64)] * (order + 1)
        counts: list[np.ndarray] = [np.empty((0, 4), np.uint32)] * (order + 1)
        for j, keys_C, counts_C4 in iter_count_tables(keys_P, usable_P, order, progress=progress):
            keys[j], counts[j] = keys_C, counts_C4
        return cls(order, float(discount), float(concentration), keys, counts, int(keys_P.size))

    def save(self, path: Union[str, Path], *, overwrite: bool = False) -> Path:
        """Write the model as a NumPy .npz file of arrays and numbers only (no pickle): `load`
        reads it back, and `genoformer baseline --save` writes it."""
        path = Path(path)
        if path.suffix != ".npz":
            raise ValueError(
                f"{path}: a Markov model is saved as .npz; name the file e.g. {path.with_suffix('.npz').name}"
            )
        refuse_existing(path, overwrite)
        arrays = {
            "format_version": np.array(MODEL_FORMAT_VERSION),
            "order": np.array(self.order),
            "discount": np.array(self.discount),
            "concentration": np.array(self.concentration),
            "positions": np.array(self.positions),
        }
        for j, (keys_C, counts_C4) in enumerate(zip(self.keys, self.counts)):
            arrays[f"keys_{j}"], arrays[f"counts_{j}"] = keys_C, counts_C4
        with atomic_open(path, "wb", overwrite=overwrite) as handle:
            np.savez(handle, **arrays)
        return path

    @classmethod
    def load(cls, path: Union[str, Path]) -> MarkovModel:
        """A model written by `save` (read with allow_pickle=False: a file cannot run code)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"Markov model not found: {path}; write one with `genoformer baseline ... --save {path}`"
            )
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
            version, order = int(arrays["format_version"]), int(arrays["order"])
            settings = float(arrays["discount"]), float(arrays["concentration"])
            tables = [arrays[f"keys_{j}"] for j in range(order + 1)], [arrays[f"counts_{j}"] for j in range(order + 1)]
            positions = int(arrays["positions"])
        except (KeyError, OSError, ValueError, zipfile.BadZipFile) as error:  # ValueError: not an .npz of arrays
            raise ValueError(
                f"{path} is not a Markov model written by `genoformer baseline --save` ({error}); write it again"
            ) from error
        if version > MODEL_FORMAT_VERSION:
            raise ValueError(
                f"{path} is a Markov model of format {version}; this genoformer reads up to "
                f"{MODEL_FORMAT_VERSION}: upgrade genoformer to read it"
            )
        return cls(order, *settings, *tables, positions)

    @property
    def nbytes(self) -> int:
        """Memory held by the count tables."""
        return sum(k.nbytes + c.nbytes for k, c in zip(self.keys, self.counts))

    def _lookups(self, keys_P: np.ndarray, usable_P: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n(c_j, x), n(c_j) and u(c_j) at every order j for each position: three (K1, P) uint32.

        Zero where the context was not seen or is not usable. ``keys_P`` are packed for this
        model's order; the lookups are fastest when they are sorted.
        """
        count_K1P, total_K1P, distinct_K1P = (
            np.zeros((self.order + 1, keys_P.size), dtype=np.uint32) for _ in range(3)
        )
        alive_A = np.arange(keys_P.size)  # positions whose context was seen at every order so far
        for j, (keys_C, counts_C4) in enumerate(zip(self.keys, self.counts)):
            if j:
                alive_A = alive_A[usable_P[alive_A] >= j]
            keys_A = keys_P[alive_A]
            found_F, count_F, total_F, distinct_F = _lookup_order(
                keys_C, counts_C4, _context(keys_A, self.order, j), (keys_A & _THREE).astype(np.intp)
            )
            alive_A = alive_A[found_F]  # a context never seen has no longer context that was
            count_K1P[j, alive_A], total_K1P[j, alive_A], distinct_K1P[j, alive_A] = count_F, total_F, distinct_F
        return count_K1P, total_K1P, distinct_K1P

    def _log2_probabilities(
        self, keys_P: np.ndarray, usable_P: np.ndarray, on_progress: Optional[Callable[[int], None]] = None
    ) -> np.ndarray:
        """(P,) log2 p of each position's base, in the order given."""
        sort_P = np.argsort(keys_P)
        out_P = np.empty(keys_P.size, dtype=np.float64)
        for start in range(0, keys_P.size, _CHUNK):
            chunk = sort_P[start : start + _CHUNK]
            orders = interpolate(self._lookups(keys_P[chunk], usable_P[chunk]), self.discount, self.concentration)
            out_P[chunk] = np.log2(deque(orders, maxlen=1).pop())  # the last order is the model
            if on_progress is not None:
                on_progress(chunk.size)
        return out_P

    def log2_probabilities(self, codes_L: np.ndarray) -> np.ndarray:
        """(L,) log2 of the probability of each base given the bases before it; NaN where the base is
        not A/C/G/T (skipped)."""
        keys_P, usable_P, valid_L = pack_positions(codes_L, self.order)
        out_L = np.full(valid_L.size, np.nan)
        out_L[valid_L] = self._log2_probabilities(keys_P, usable_P)
        return out_L

    def score(self, codes_L: np.ndarray, on_progress: Optional[Callable[[int], None]] = None) -> RecordScore:
        """Bits, bases scored and bases skipped of one strand; ``on_progress(n)`` after every n positions."""
        keys_P, usable_P, valid_L = pack_positions(codes_L, self.order)
        bits = -float(self._log2_probabilities(keys_P, usable_P, on_progress).sum()) if keys_P.size else 0.0
        return RecordScore(bits, int(keys_P.size), int(valid_L.size - keys_P.size))

    def next_base_probabilities(self, context: Union[str, np.ndarray]) -> np.ndarray:
        """(4,) probabilities of A, C, G, T after ``context`` (a string or codes; only its last
        `order` bases matter, and only those after its last N)."""
        codes_L = encode(context) if isinstance(context, str) else np.asarray(context, dtype=np.uint8)
        keys_P, usable_P, _ = pack_positions(np.r_[codes_L, 0].astype(np.uint8), self.order)
        keys_4 = (keys_P[-1] & ~_THREE) | np.arange(4, dtype=np.uint64)
        return np.exp2(self._log2_probabilities(keys_4, np.repeat(usable_P[-1], 4)))


def interpolate(
    lookups: tuple[np.ndarray, np.ndarray, np.ndarray], discount: float, concentration: float
) -> Iterator[np.ndarray]:
    """Yield p_j (P,) float64 for j = 0..k from the (K1, P) counts of :meth:`MarkovModel._lookups`.

    p_j is the probability of the model truncated at order j, so one pass gives every order.
    """
    count_K1P, total_K1P, distinct_K1P = lookups
    p_P = np.full(count_K1P.shape[1], 0.25)
    for j in range(count_K1P.shape[0]):
        p_P = (np.maximum(count_K1P[j] - discount, 0.0) + (discount * distinct_K1P[j] + concentration) * p_P) / (
            total_K1P[j] + concentration
        )
        yield p_P


@dataclass(frozen=True)
class Selection:
    """The chosen order and smoothing, and held-out bits per base of every candidate."""

    order: int
    discount: float
    concentration: float
    held_out_bases: int
    table: list[dict]  # {"order", "discount", "concentration", "bits_per_base"} per candidate

    def best_per_order(self) -> list[dict]:
        """For each order, the candidate with the lowest held-out bits per base."""
        best: dict[int, dict] = {}
        for row in self.table:
            if row["order"] not in best or row["bits_per_base"] < best[row["order"]]["bits_per_base"]:
                best[row["order"]] = row
        return [best[k] for k in sorted(best)]


def select_markov_model(
    sequences: Sequence[np.ndarray],
    orders: Sequence[int],
    discounts: Sequence[float] = DISCOUNTS,
    concentrations: Sequence[float] = CONCENTRATIONS,
    held_out_fraction: float = HELD_OUT_FRACTION,
    both_strands: bool = True,
    progress: bool = False,
) -> Selection:
    """Choose the order and smoothing by bits per base on the held-out end of every sequence.

    The first ``1 - held_out_fraction`` of every sequence is counted (both strands by default)
    up to the highest order; the held-out rest, each part scored on its own forward strand,
    judges every (order, discount, concentration). Ties go to the first candidate.
    """
    if not (orders and discounts and concentrations):
        raise ValueError("give at least one order, discount and concentration to choose from")
    for order in orders:
        _check_order(order)
    for discount in discounts:
        for concentration in concentrations:
            _check_smoothing(discount, concentration)
    if not 0 < held_out_fraction < 1:
        raise ValueError(f"held_out_fraction={held_out_fraction} must be between 0 and 1")
    cut = [len(codes_L) - int(len(codes_L) * held_out_fraction) for codes_L in sequences]
    top = max(orders)
    packed = [pack_positions(codes_L[c:], top) for codes_L, c in zip(sequences, cut)]
    held_keys_P = np.concatenate([np.empty(0, np.uint64)] + [keys for keys, _, _ in packed])
    held_usable_P = np.concatenate([np.empty(0, np.uint8)] + [usable for _, usable, _ in packed])
    if held_keys_P.size == 0:
        raise ValueError(
            "too little training data to choose the order and smoothing on a held-out part: the "
            f"last {held_out_fraction:.0%} of the training records has no A/C/G/T base; give the "
            "order, discount and concentration (--order, --discount, --concentration)"
        )
    sort_P = np.argsort(held_keys_P)  # sorted queries make every order's lookups sequential
    held_keys_P, held_usable_P = held_keys_P[sort_P], held_usable_P[sort_P]
    targets_P = (held_keys_P & _THREE).astype(np.intp)
    train_keys_P, train_usable_P = _pack_strands((codes_L[:c] for codes_L, c in zip(sequences, cut)), top, both_strands)
    if train_keys_P.size == 0:
        raise ValueError("no A/C/G/T bases to train on: the training sequences are empty or all N")
    # Each order's table is looked up as soon as it is counted and then dropped: memory holds
    # about two tables, not k + 1.
    lookups = tuple(np.zeros((top + 1, held_keys_P.size), dtype=np.uint32) for _ in range(3))
    for j, keys_C, counts_C4 in iter_count_tables(train_keys_P, train_usable_P, top, progress=progress):
        usable_U = np.flatnonzero(held_usable_P >= j)
        found_F, *values = _lookup_order(
            keys_C, counts_C4, _context(held_keys_P[usable_U], top, j), targets_P[usable_U]
        )
        for lookup, value_F in zip(lookups, values):
            lookup[j, usable_U[found_F]] = value_F
    del train_keys_P, train_usable_P
    bits = np.zeros((len(discounts), len(concentrations), top + 1))
    with tqdm(total=bits.shape[0] * bits.shape[1], desc="choosing k", unit="smoothing", disable=not progress) as bar:
        for di, discount in enumerate(discounts):
            for ci, concentration in enumerate(concentrations):
                for j, p_P in enumerate(interpolate(lookups, discount, concentration)):
                    bits[di, ci, j] = -np.log2(p_P).sum()
                bar.update()
    held_out_bases = held_keys_P.size
    table = [
        {
            "order": int(order),
            "discount": float(discount),
            "concentration": float(concentration),
            "bits_per_base": float(bits[di, ci, order] / held_out_bases),
        }
        for order in orders
        for di, discount in enumerate(discounts)
        for ci, concentration in enumerate(concentrations)
    ]
    best = min(table, key=lambda row: row["bits_per_base"])
    return Selection(best["order"], best["discount"], best["concentration"], int(held_out_bases), table)


def _check_settings(
    order: Optional[int], discount: Optional[float], concentration: Optional[float], max_order: int
) -> None:
    _check_order(max_order, "max_order")
    if order is not None:
        _check_order(order)
    if discount is not None or concentration is not None:
        _check_smoothing(0.0 if discount is None else discount, 1.0 if concentration is None else concentration)


def fit_markov_model(
    sequences: Sequence[np.ndarray],
    order: Optional[int] = None,
    discount: Optional[float] = None,
    concentration: Optional[float] = None,
    max_order: int = DEFAULT_MAX_ORDER,
    both_strands: bool = True,
    progress: bool = False,
) -> tuple[MarkovModel, Optional[Selection]]:
    """Fit on all the sequences with whatever of order, discount and concentration is not given
    chosen on a held-out part first (:func:`select_markov_model`; orders 0..max_order and the
    grids DISCOUNTS and CONCENTRATIONS). The selection is None when all three are given."""
    _check_settings(order, discount, concentration, max_order)
    selection = None
    if order is None or discount is None or concentration is None:
        selection = select_markov_model(
            sequences,
            orders=range(max_order + 1) if order is None else [order],
            discounts=DISCOUNTS if discount is None else [discount],
            concentrations=CONCENTRATIONS if concentration is None else [concentration],
            both_strands=both_strands,
            progress=progress,
        )
        order, discount, concentration = selection.order, selection.discount, selection.concentration
    model = MarkovModel.fit(sequences, order, discount, concentration, both_strands=both_strands, progress=progress)
    return model, selection


def _listed(paths: Union[str, list[str]]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def _read_all(paths: Sequence[str], what: str) -> list[NamedSequence]:
    records = []
    with tqdm(desc=f"reading {what}", unit="base", unit_scale=True) as bar:
        for record in read_sequences(paths):
            records.append(record)
            bar.update(record.codes.size)
    return records


def score_region(
    model: MarkovModel, codes_L: np.ndarray, start: int, end: int, on_progress: Optional[Callable[[int], None]] = None
) -> RecordScore:
    """Bits, bases scored and bases skipped (not A/C/G/T) of bases [start, end) of one strand of
    a record, each scored as in the whole record: from the `order` bases before it, across the
    region's start. The record's first base has no context and is not scored (nor skipped), as a
    causal language model leaves it out in `genoformer evaluate`; so both count the same bases."""
    lo = max(0, start - model.order)
    keys_P, usable_P, valid_L = pack_positions(codes_L[lo:end], model.order)
    keep_P = np.arange(lo, end)[valid_L] >= max(start, 1)
    keys_P, usable_P = keys_P[keep_P], usable_P[keep_P]
    bits = -float(model._log2_probabilities(keys_P, usable_P, on_progress).sum()) if keys_P.size else 0.0
    return RecordScore(bits, int(keys_P.size), int(np.count_nonzero(~valid_L[start - lo :])))


def format_scores(records: Sequence[dict], total: dict, what: str = "record") -> str:
    """A text table of per-record (or per-region: `what`) and total bits per base, bases scored
    and bases skipped."""
    width = max([len("total"), len(what)] + [len(row["name"]) for row in records])
    lines = [f"{what:<{width}}  {'bits/base':>9}  {'bases':>13}  {'skipped':>9}"]
    for row in [*records, {"name": "total", **total}]:
        lines.append(f"{row['name']:<{width}}  {row['bits_per_base']:>9.4f}  {row['bases']:>13,}  {row['skipped']:>9,}")
    return "\n".join(lines)


def _split_note(name: str, spec: Optional[SplitSpec], config: Optional[Path]) -> dict:
    return {
        "name": name,
        "spec": dataclasses.asdict(spec or SplitSpec()),
        "config": None if config is None else str(config),
    }


def baseline(
    *,
    train: Union[str, list[str]],
    inputs: Union[str, list[str]],
    out: Path,
    split: Optional[SplitName] = None,
    regions: Optional[Union[str, list[str]]] = None,
    inputs_split: Optional[SplitName] = None,
    split_config: Optional[Path] = None,
    order: Optional[int] = None,
    discount: Optional[float] = None,
    concentration: Optional[float] = None,
    max_order: int = DEFAULT_MAX_ORDER,
    both_strands: bool = False,
    save: Optional[Path] = None,
    overwrite: bool = False,
) -> Path:
    """Fit an order-k Markov model on training genomes and print its bits per base on others.

    The classical baseline for a DNA language model: each base is predicted from the k bases
    before it, with the counts of all orders 0..k blended (interpolated smoothing with a discount
    and a concentration, so no probability is ever zero), counted on both strands of the training
    data. Whatever of the order, discount and concentration is not given is chosen by bits per
    base on the last 10% of every training record (or split interval), counted without it; the
    model is then counted on all the training data. Bases that are not A/C/G/T are skipped and
    reported; an N in the context shortens it to the bases after the N. The first base of a
    record has no context and is not scored, as `genoformer evaluate` leaves it out for a causal
    model, so the two count the same bases; a region's first bases are scored from the bases
    before it, as in the whole record. Writes JSON: {"total": {"bits_per_base", "bases",
    "skipped"}, "records": [{"name", "source", "region", "bits_per_base", "bases", "skipped"}],
    "model": {"order", "discount", "concentration", "selection", "train_files", "train_bases",
    ...}, "skipped_bases", "first_bases_unscored", "strands"}.

    Args:
        train: Training FASTA/GenBank file (plain or gzip/xz/bzip2) or genome store (.zarr folder
            from `genoformer prepare`), or several as a list ("[a.fa.gz,b.zarr]" or --train a.fa --train+ b.fa).
        inputs: Files or stores to score, given like train; every record is scored on its own.
        out: The report to write (never left half written): .json, or .tsv for the comparison
            table that `genoformer evaluate` writes too (its markov column filled;
            genoformer.genome.reports); an existing one is an error without --overwrite.
        split: Train on this split (train, val or test) of the training data only, exactly as
            `genoformer fit` holds it out of a store built from it (see split_config).
        regions: Score only these regions of the inputs: a BED file (0-based, optional name
            column) or regions chrom:start-end (1-based, inclusive; chrom alone is the whole
            record), several after one flag; one row per region.
        inputs_split: Score only this split (train, val or test) of the inputs (see split_config),
            e.g. --split train --inputs_split test on one store.
        split_config: The training config whose data split split and inputs_split follow (a fit
            config, or config.yaml of its run); default the data module's default split (the
            last 5% of every record is val).
        order: Markov order k, 0 to 31 (the context length); default: chosen from 0..max_order.
        discount: Discount d in [0, 1); default: chosen from 0, 0.5, 0.75, 0.9.
        concentration: Concentration a > 0; default: chosen from 1, 4, 16, 64, 256, 1024.
        max_order: The highest order tried when the order is chosen (memory grows with it: at 16,
            1.8 GB of counts and 2.7 GB in all for 9 Mbp of training sequence).
        both_strands: Score each record on both strands (its reverse complement as well) and
            report bits per base over both; bases and skipped are those of the forward strand.
        save: Also write the fitted model here (.npz: count tables and settings, no pickle;
            Python: genoformer.genome.markov.MarkovModel.load).
        overwrite: A flag: replace an existing `out` (and `save`).
    """
    out = Path(out)
    refuse_existing(out, overwrite)  # before the counting, not after
    if save is not None:
        save = Path(save)
        if save.suffix != ".npz":
            raise ValueError(f"--save {save}: a Markov model is saved as .npz; name it e.g. {save.with_suffix('.npz')}")
        refuse_existing(save, overwrite)
    train_paths, input_paths = _listed(train), _listed(inputs)
    check_sequence_inputs(train_paths, flag="--train")
    check_sequence_inputs(input_paths)
    _check_settings(order, discount, concentration, max_order)
    split_spec = read_split_spec(split_config)
    train_records = _read_all(train_paths, "training data")
    train_chosen = record_regions(train_records, split=split, split_spec=split_spec)
    train_sequences = [train_records[index].codes[region.start : region.end] for index, region in train_chosen]
    train_bases = sum(int(np.count_nonzero(codes < N)) for codes in train_sequences)
    if train_bases == 0:
        where = f"the {split} split of {train_paths}" if split else str(train_paths)
        raise ValueError(f"no A/C/G/T bases to train on in {where}: every record is all N")
    input_records = _read_all(input_paths, "inputs")
    chosen = record_regions(
        input_records, regions, split=inputs_split, split_spec=split_spec, split_option="inputs_split"
    )
    for index, region in chosen:
        record = input_records[index]
        if not np.any(record.codes[max(region.start, 1) : region.end] < N):
            what = f"record {record.name!r}" if region.name == record.name else f"region {region.name!r}"
            raise ValueError(
                f"{record.source}: {what} has no A/C/G/T base to score (the {region.length:,} bases are N, "
                "or only the record's first base, which has no context); remove it from the inputs"
            )

    start, start_cpu = time.perf_counter(), time.process_time()
    model, selection = fit_markov_model(
        train_sequences, order, discount, concentration, max_order=max_order, progress=True
    )
    fit_seconds, fit_cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    if save is not None:
        print(
            f"wrote {model.save(save, overwrite=overwrite)} (the order-{model.order} model, {model.nbytes / 2**20:,.0f} MiB of counts)"
        )
    if selection is not None:
        print(f"chosen on {selection.held_out_bases:,} held-out bases (best smoothing per order):")
        for row in selection.best_per_order():
            mark = "  <- chosen" if row["order"] == selection.order else ""
            print(
                f"  k={row['order']:<2}  d={row['discount']:<4}  a={row['concentration']:<5}  "
                f"{row['bits_per_base']:.4f} bits/base{mark}"
            )
    split_note = f" of the {split} split" if split else ""
    print(
        f"order-{model.order} Markov model, discount {model.discount}, concentration {model.concentration}: "
        f"{train_bases:,} training bases{split_note} (both strands counted), {fit_seconds:.1f} s "
        f"({fit_cpu_seconds:.1f} s CPU), {model.nbytes / 2**20:.0f} MiB of counts"
    )

    strands = 2 if both_strands else 1
    rows = []
    total_bits, total_bases = 0.0, 0  # over every strand scored
    first_bases = 0
    start = time.perf_counter()
    with tqdm(
        total=strands * sum(region.length for _, region in chosen), desc="scoring", unit="base", unit_scale=True
    ) as bar:
        for index, region in chosen:
            record = input_records[index]
            length = record.codes.size
            parts = [(record.codes, region.start, region.end)]
            if both_strands:
                parts.append((reverse_complement(record.codes), length - region.end, length - region.start))
            scores = [score_region(model, codes_L, lo, hi, bar.update) for codes_L, lo, hi in parts]
            for score, (_, lo, hi) in zip(scores, parts):
                bar.update(hi - lo - score.bases)
                first_bases += hi - lo - score.bases - score.skipped
            bits, strand_bases = sum(score.bits for score in scores), sum(score.bases for score in scores)
            total_bits += bits
            total_bases += strand_bases
            rows.append(
                {
                    "name": region.name,
                    "source": record.source,
                    "region": region.label,
                    "bits_per_base": bits / strand_bases,
                    "bases": scores[0].bases,
                    "skipped": scores[0].skipped,
                }
            )
    score_seconds = time.perf_counter() - start
    bases = sum(row["bases"] for row in rows)
    skipped = sum(row["skipped"] for row in rows)
    total = {"bits_per_base": total_bits / total_bases, "bases": bases, "skipped": skipped}
    result = {
        "total": total,
        "records": rows,
        "model": {
            "order": model.order,
            "discount": model.discount,
            "concentration": model.concentration,
            "selection": [] if selection is None else selection.table,
            "held_out_bases": 0 if selection is None else selection.held_out_bases,
            "train_files": [str(Path(path).resolve()) for path in train_paths],
            "train_split": None if split is None else _split_note(split, split_spec, split_config),
            "train_bases": train_bases,
            "counted_positions": model.positions,
            "contexts_per_order": [int(keys.size) for keys in model.keys],
            "fit_seconds": fit_seconds,
            "fit_cpu_seconds": fit_cpu_seconds,
            "memory_bytes": model.nbytes,
        },
        "skipped_bases": skipped,
        "first_bases_unscored": first_bases,
        "strands": strands,
        "inputs": [str(Path(path).resolve()) for path in input_paths],
        "inputs_split": None if inputs_split is None else _split_note(inputs_split, split_spec, split_config),
        "score_seconds": score_seconds,
        "command": " ".join(sys.argv),
    }
    print(format_scores(rows, total, "record" if regions is None and inputs_split is None else "region"))
    result["table"] = comparison_rows(rows, total, {"markov": "bits_per_base"})
    if is_table(out):
        write_comparison(out, result["table"], overwrite=overwrite)
    else:
        write_json(out, result, overwrite=overwrite)
    print(f"wrote {out}")
    return out
