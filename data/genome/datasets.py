"""Datasets of genome windows: random windows for training, tiles for evaluation and embedding,
their packed variants (several records or record pieces per window, see
genoformer.data.packing) for records shorter than the window, and whole records as windows
(`WholeRecordDataset`: a bacterial chromosome in one window of millions of tokens).

Legend: L = window length (tokens), P = documents in a packed window. A sample is a dict
``{"tokens": torch.uint8 (L,), "contig": int, "start": int, "index": int, ...}``; the default
collate turns a list of samples into ``{"tokens": torch.uint8 (B, L), "contig": int64 (B,), ...}``.
Packed samples carry per-document entries instead (``doc_lens``, ``doc_contig``, ... (P,)), batched
by ``genoformer.data.packing.collate_packed``.

Both datasets are map-style and take keys that are an index or an ``(epoch, index)`` pair
(see :class:`genoformer.data.sampling.ShardSampler`). They hold the store path and metadata;
the zarr handles and chunk cache are opened lazily in each process (DataLoader worker) that
reads, after fork or spawn.

Window parts (context parallelism, where several processes share every window): the random and
tiled datasets take a ``part``, the window positions this process keeps, as (first, stop) ranges
in the order it holds them (the strategy that splits the windows says which, see
genoformer.data.genome.datamodule.WindowSplit). A sample's ``tokens`` are then those positions
only, read from the store range by range; its metadata still describes the whole window, and
every process that shares a window draws the same one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from genoformer.data.genome.alphabet import PAD, N, reverse_complement
from genoformer.data.genome.store import DEFAULT_CACHE_BYTES, GenomeStore
from genoformer.data.packing import pack_lengths
from genoformer.data.sampling import sample_rng, split_key
from genoformer.data.splits import Interval
from torch.utils.data import Dataset

log = logging.getLogger(__name__)


class _StoreHolder:
    """Opens the GenomeStore once per process; pickles without handles."""

    def __init__(self, store: str | Path | GenomeStore, cache_bytes: int) -> None:
        self._store = store if isinstance(store, GenomeStore) else GenomeStore(store, cache_bytes)
        self._pid = os.getpid()

    @property
    def store(self) -> GenomeStore:
        if self._pid != os.getpid():  # forked: open our own handles and cache
            self._store = GenomeStore(self._store.path, self._store.cache_bytes)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict:
        return {"_store": self._store, "_pid": None}


def whole_contigs(store: GenomeStore) -> list[Interval]:
    return [Interval(c.index, 0, c.length) for c in store.contigs]


WindowPart = Sequence[tuple[int, int]]
"""Window positions one process keeps: (first, stop) ranges, in the order it holds them."""


def read_part(
    store: GenomeStore, contig: int, start: int, end: int, window: int, part: WindowPart | None, reverse: bool = False
) -> np.ndarray:
    """uint8 tokens at the positions ``part`` (None: all of them) of a window of ``window``
    positions over the bases [start, end) of ``contig``; only those bases are read. Positions from
    end - start on are PAD (a tile cut at an interval's end). ``reverse``: the window as the
    reverse strand reads it (position p is the complement of base end - 1 - p; whole windows only,
    end - start == window)."""
    pieces = []
    for first, stop in ((0, window),) if part is None else part:
        if reverse:
            pieces.append(reverse_complement(store.read(contig, end - stop, end - first)))
            continue
        bases = store.read(contig, min(start + first, end), min(start + stop, end))
        if len(bases) < stop - first:
            bases = np.concatenate([bases, np.full(stop - first - len(bases), PAD, dtype=np.uint8)])
        pieces.append(bases)
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def take_part(codes: np.ndarray, part: WindowPart | None) -> np.ndarray:
    """The positions ``part`` (None: all) of a window's tokens already read whole."""
    return codes if part is None else np.concatenate([codes[first:stop] for first, stop in part])


class RandomWindowDataset(Dataset):
    """Random windows of ``window`` bases for training, drawn uniformly over all valid starts
    (so contigs are weighted by length) inside the given intervals.

    Sample ``index`` of ``epoch`` is a pure function of (seed, epoch, index). A window with more
    than ``max_n_fraction`` N bases is redrawn (up to ``max_attempts`` times). Intervals shorter
    than the window and contigs that are all N are left out, with a WARNING that gives their count
    and total length.

    Args:
        store: Genome store path or an open GenomeStore.
        window: Window length L in bases.
        samples_per_epoch: ``len(dataset)``; the number of windows in an epoch.
        intervals: Where windows may lie (a split); default every whole contig.
        seed: Base seed.
        max_n_fraction: Windows with more N than this fraction of L are redrawn.
        reverse_complement: Reverse-complement each window with probability 1/2.
        max_shift: Move the drawn start by a uniform shift in [-max_shift, max_shift] (kept
            inside the interval): jitter for restricted intervals.
        cache_bytes: Decoded-chunk cache per process.
        max_attempts: Draws per sample before giving up with an error.
        part: The window positions this process keeps (see the module docstring); None: all.
            The N check still counts the whole window (every process must agree on the draw),
            so with ``max_n_fraction`` < 1 the whole window is read and the part kept.
        source_weights: Share of the windows drawn from each source file, by file name (as
            the store lists it: ``ContigInfo.source_name``), e.g. ``{"ecoli.fa.gz": 1, "fly.fa.gz":
            1}`` for half and half whatever their lengths; inside a file, windows stay uniform
            over its valid starts. Every file with training intervals must be named. None (the
            default): every valid start equally likely, so files are weighted by length.
    """

    def __init__(
        self,
        store: str | Path | GenomeStore,
        window: int,
        samples_per_epoch: int,
        *,
        intervals: Sequence[Interval] | None = None,
        seed: int = 0,
        max_n_fraction: float = 0.1,
        reverse_complement: bool = False,
        max_shift: int = 0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_attempts: int = 100,
        source_weights: dict[str, float] | None = None,
        part: WindowPart | None = None,
    ) -> None:
        if window < 1 or samples_per_epoch < 1:
            raise ValueError(f"window ({window}) and samples_per_epoch ({samples_per_epoch}) must be >= 1")
        if not 0 <= max_n_fraction <= 1:
            raise ValueError(f"max_n_fraction={max_n_fraction} must be in [0, 1]")
        self._holder = _StoreHolder(store, cache_bytes)
        gs = self._holder.store
        self.window = window
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed
        self.epoch = 0
        self.max_n_fraction = max_n_fraction
        self.reverse_complement = reverse_complement
        self.max_shift = max_shift
        self.max_attempts = max_attempts
        self.part = part
        usable, short = [], []
        for iv in whole_contigs(gs) if intervals is None else intervals:
            contig = gs.contigs[iv.index]
            if iv.length < window:
                short.append(iv)
            elif contig.n_count == contig.length:
                log.warning("contig %s is all N: no random windows from it", contig.name)
            else:
                usable.append(iv)
        if short:
            names = ", ".join(f"{gs.contigs[iv.index].name}[{iv.start}:{iv.end})" for iv in short[:5])
            log.warning(
                "%d interval(s) of %s, %d bases in total, are shorter than the window (%d) and give no "
                "training windows: %s%s",
                len(short),
                gs.path,
                sum(iv.length for iv in short),
                window,
                names,
                ", ..." if len(short) > 5 else "",
            )
        if not usable:
            raise ValueError(
                f"no interval of {gs.path} is at least {window} bases long and not all N; "
                "use a shorter window or another split"
            )
        self.intervals = usable
        # Valid starts per interval; a uniform draw over their total weights contigs by length.
        starts = np.array([iv.length - window + 1 for iv in usable], dtype=np.int64)
        self._cum_starts = np.cumsum(starts)
        # With source weights: the probability of each interval, its file's share split by valid starts.
        self._cum_probability = (
            None if source_weights is None else np.cumsum(interval_probabilities(gs, usable, starts, source_weights))
        )

    @property
    def store(self) -> GenomeStore:
        return self._holder.store

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch

    def locate(self, epoch: int, index: int) -> tuple[int, int, bool]:
        """(contig index, start, reverse) of sample ``index`` in ``epoch``, without N checks:
        the first draw. ``__getitem__`` redraws while the window has too many N."""
        return self._draw(sample_rng(self.seed, epoch, index))

    def _draw(self, rng: np.random.Generator) -> tuple[int, int, bool]:
        if self._cum_probability is None:
            u = int(rng.integers(self._cum_starts[-1]))
            j = int(np.searchsorted(self._cum_starts, u, side="right"))
            offset = u - (int(self._cum_starts[j - 1]) if j else 0)
        else:
            j = min(
                int(np.searchsorted(self._cum_probability, rng.random() * self._cum_probability[-1], side="right")),
                len(self.intervals) - 1,
            )
            offset = int(rng.integers(self._cum_starts[j] - (self._cum_starts[j - 1] if j else 0)))
        iv = self.intervals[j]
        start = iv.start + offset
        if self.max_shift:
            shift = int(rng.integers(-self.max_shift, self.max_shift + 1))
            start = min(max(start + shift, iv.start), iv.end - self.window)
        reverse = bool(rng.random() < 0.5) if self.reverse_complement else False
        return iv.index, start, reverse

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        rng = sample_rng(self.seed, epoch, index)
        store = self.store
        limit = self.max_n_fraction * self.window
        codes = None  # the whole window, once the N check has read it
        for _ in range(self.max_attempts):
            contig, start, reverse = self._draw(rng)
            if limit >= self.window:
                break
            codes = store.read(contig, start, start + self.window)
            if np.count_nonzero(codes == N) <= limit:
                break
        else:
            raise RuntimeError(
                f"no window of {self.window} bases with at most {self.max_n_fraction:.0%} N "
                f"found in {self.max_attempts} draws; raise max_n_fraction or shorten the window"
            )
        if codes is None:
            codes = read_part(store, contig, start, start + self.window, self.window, self.part, reverse)
        else:
            codes = take_part(reverse_complement(codes) if reverse else codes, self.part)
        return {"tokens": torch.from_numpy(codes), "contig": contig, "start": start, "reverse": reverse, "index": index}


class WholeRecordDataset(Dataset):
    """Training windows that are whole intervals: each sample is one interval of the split (a
    whole record with ``split.by`` contigs or files) as one window of its own length, so that a
    model at a context of millions of tokens reads a bacterial chromosome whole. An interval
    longer than ``window`` gives a random window of ``window`` bases inside it.

    Intervals are drawn with probability proportional to their length (every base about equally
    likely to be trained on), reverse-complemented with probability 1/2 with
    ``reverse_complement``; a draw with more than ``max_n_fraction`` N is redrawn. Sample ``index``
    of ``epoch`` is a pure function of (seed, epoch, index). Samples: ``{"tokens": uint8 (l,),
    "contig", "start", "reverse", "index"}`` with l = min(interval length, window): lengths differ
    between samples, so batches hold one window each (the default collate stacks equal lengths
    only). Intervals shorter than ``min_length`` are left out with a WARNING.
    """

    def __init__(
        self,
        store: str | Path | GenomeStore,
        window: int,
        samples_per_epoch: int,
        *,
        intervals: Sequence[Interval] | None = None,
        seed: int = 0,
        max_n_fraction: float = 0.1,
        reverse_complement: bool = False,
        min_length: int = 1,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_attempts: int = 100,
    ) -> None:
        if window < 1 or samples_per_epoch < 1 or min_length < 1:
            raise ValueError(
                f"window ({window}), samples_per_epoch ({samples_per_epoch}) and min_length ({min_length}) must be >= 1"
            )
        if not 0 <= max_n_fraction <= 1:
            raise ValueError(f"max_n_fraction={max_n_fraction} must be in [0, 1]")
        self._holder = _StoreHolder(store, cache_bytes)
        gs = self._holder.store
        self.window = window
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed
        self.epoch = 0
        self.max_n_fraction = max_n_fraction
        self.reverse_complement = reverse_complement
        self.max_attempts = max_attempts
        candidates = whole_contigs(gs) if intervals is None else list(intervals)
        usable = [iv for iv in candidates if iv.length >= min_length and gs.contigs[iv.index].n_count < iv.length]
        if len(usable) < len(candidates):
            kept = set(usable)
            left = [iv for iv in candidates if iv not in kept]
            log.warning(
                "%d interval(s) of %s, %d bases in total, are shorter than min_length (%d) or all N and give "
                "no training windows",
                len(left),
                gs.path,
                sum(iv.length for iv in left),
                min_length,
            )
        if not usable:
            raise ValueError(
                f"no interval of {gs.path} is at least {min_length} bases long and not all N; "
                "lower min_length or use another split"
            )
        self.intervals = usable
        self._cum_lengths = np.cumsum(np.array([iv.length for iv in usable], dtype=np.int64))

    @property
    def store(self) -> GenomeStore:
        return self._holder.store

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch

    def locate(self, epoch: int, index: int) -> tuple[int, int, int, bool]:
        """(contig index, start, end, reverse) of sample ``index`` in ``epoch``, without N checks:
        the first draw."""
        return self._draw(sample_rng(self.seed, epoch, index))

    def _draw(self, rng: np.random.Generator) -> tuple[int, int, int, bool]:
        j = int(np.searchsorted(self._cum_lengths, rng.integers(self._cum_lengths[-1]), side="right"))
        iv = self.intervals[j]
        length = min(iv.length, self.window)
        start = iv.start + int(rng.integers(iv.length - length + 1))
        reverse = bool(rng.random() < 0.5) if self.reverse_complement else False
        return iv.index, start, start + length, reverse

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        rng = sample_rng(self.seed, epoch, index)
        for _ in range(self.max_attempts):
            contig, start, end, reverse = self._draw(rng)
            codes = self.store.read(contig, start, end)
            if np.count_nonzero(codes == N) <= self.max_n_fraction * (end - start):
                break
        else:
            raise RuntimeError(
                f"no record window with at most {self.max_n_fraction:.0%} N found in "
                f"{self.max_attempts} draws; raise max_n_fraction"
            )
        codes = reverse_complement(codes) if reverse else codes
        return {
            "tokens": torch.from_numpy(np.ascontiguousarray(codes)),
            "contig": contig,
            "start": start,
            "reverse": reverse,
            "index": index,
        }


def interval_probabilities(
    store: GenomeStore, intervals: Sequence[Interval], starts_I: np.ndarray, source_weights: dict[str, float]
) -> np.ndarray:
    """(I,) probability of drawing each interval: its source file's normalised weight, shared
    among the file's intervals in proportion to their valid starts ``starts_I``."""
    sources = [store.contigs[iv.index].source_name for iv in intervals]
    missing = sorted(set(sources) - set(source_weights))
    if missing:
        raise ValueError(
            f"source_weights names no weight for {missing}; give every training file a weight "
            f"(files here: {sorted(set(sources))}) or leave source_weights out"
        )
    bad = {name: w for name, w in source_weights.items() if not (np.isfinite(w) and w >= 0)}
    if bad or not any(source_weights[name] > 0 for name in sources):
        raise ValueError(f"source_weights must be finite, >= 0 and not all 0 for the training files: {source_weights}")
    per_file = {name: int(sum(n for s, n in zip(sources, starts_I) if s == name)) for name in set(sources)}
    total = sum(source_weights[name] for name in per_file)
    return np.array([source_weights[s] / total * n / per_file[s] for s, n in zip(sources, starts_I)], dtype=np.float64)


def tile_starts(length: int, window: int, stride: int) -> range:
    """Start positions of the tiles that cover a sequence of ``length``: 0, stride, ...; the
    last tile is the first that reaches the end (it may be shorter than ``window``)."""
    if window < 1 or stride < 1:
        raise ValueError(f"window ({window}) and stride ({stride}) must be >= 1")
    if length <= 0:
        return range(0)
    count = 1 + -(-max(length - window, 0) // stride)
    return range(0, count * stride, stride)


class TiledWindowDataset(Dataset):
    """Every tile of the given intervals, in order, for evaluation and embedding.

    Tiles start every ``stride`` bases from each interval's start; the last tile of an interval
    stops at the interval's end and is padded with PAD (``length`` = real tokens). Samples:
    ``{"tokens": uint8 (L,), "contig", "start", "length", "index"}``. Keys may be an index or an
    (epoch, index) pair; the epoch is ignored. ``part``: the window positions this process keeps
    (see the module docstring); ``length`` still counts the whole tile's bases. ``pad`` False:
    a tile cut short is handed as it is, its tokens only and no ``length``, for batches of one
    window: a whole-record window of millions of tokens is not padded to the longest record's.
    """

    def __init__(
        self,
        store: str | Path | GenomeStore,
        window: int,
        stride: int | None = None,
        *,
        intervals: Sequence[Interval] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        part: WindowPart | None = None,
        pad: bool = True,
    ) -> None:
        if not pad and part is not None:
            raise ValueError(
                "unpadded tiles (pad=False) cannot be cut into parts: every process of a window must "
                "hold positions of one length"
            )
        self._holder = _StoreHolder(store, cache_bytes)
        self.window = window
        self.part = part
        self.pad = pad
        self.stride = window if stride is None else stride
        ivs = whole_contigs(self._holder.store) if intervals is None else list(intervals)
        self.intervals = [iv for iv in ivs if iv.length > 0]
        counts = np.array([len(tile_starts(iv.length, window, self.stride)) for iv in self.intervals], dtype=np.int64)
        self._cum_tiles = np.cumsum(counts)

    @property
    def store(self) -> GenomeStore:
        return self._holder.store

    def set_epoch(self, epoch: int) -> None:
        """Tiles do not depend on the epoch (kept for the sampler protocol)."""

    def __len__(self) -> int:
        return int(self._cum_tiles[-1]) if len(self._cum_tiles) else 0

    def locate(self, index: int) -> tuple[int, int, int]:
        """(contig index, start, end) of tile ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"tile {index} out of range [0, {len(self)})")
        j = int(np.searchsorted(self._cum_tiles, index, side="right"))
        iv = self.intervals[j]
        start = iv.start + (index - (int(self._cum_tiles[j - 1]) if j else 0)) * self.stride
        return iv.index, start, min(start + self.window, iv.end)

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        _, index = split_key(key, 0)
        contig, start, end = self.locate(index)
        if not self.pad:  # no padding: no "length" either (the model would mask nothing)
            return {
                "tokens": torch.from_numpy(self.store.read(contig, start, end)),
                "contig": contig,
                "start": start,
                "index": index,
            }
        codes = read_part(self.store, contig, start, end, self.window, self.part)
        return {
            "tokens": torch.from_numpy(codes),
            "contig": contig,
            "start": start,
            "length": end - start,
            "index": index,
        }


def _packed_sample(pieces: list[tuple[int, int, int, bool]], codes: list[np.ndarray], index: int) -> dict:
    """A packed sample (see genoformer.data.packing) of documents (contig, start, length, reverse)."""
    contig_P, start_P, len_P, reverse_P = (np.array(column) for column in zip(*pieces))
    return {
        "tokens": torch.from_numpy(np.concatenate(codes)),
        "doc_lens": torch.from_numpy(len_P.astype(np.int64)),
        "doc_contig": torch.from_numpy(contig_P.astype(np.int64)),
        "doc_start": torch.from_numpy(start_P.astype(np.int64)),
        "doc_reverse": torch.from_numpy(reverse_P.astype(bool)),
        "index": index,
    }


class PackedRandomWindowDataset(Dataset):
    """Random training windows filled end to end with documents: whole records shorter than the
    window, and pieces of longer ones, so that no record is left out for being short.

    A window is drawn as: while room is left, draw an interval with weight max(length, window)
    (so every base of a short record is about as likely to be trained on as a base of a long
    contig) and append it whole if it fits, else a piece of it, at a uniform position, that fills
    the room. A window on a long contig is therefore usually one piece of it. Each document is
    reverse-complemented on its own with probability 1/2 (``reverse_complement``). A window with
    more than ``max_n_fraction`` N is redrawn whole. Sample ``index`` of ``epoch`` is a pure
    function of (seed, epoch, index).

    Samples (see genoformer.data.packing): ``{"tokens": uint8 (L,), "doc_lens", "doc_contig",
    "doc_start", "doc_reverse": (P,), "index"}``; ``doc_start`` is the document's first base on
    the forward strand, whatever its strand. Arguments as for :class:`RandomWindowDataset`.
    """

    def __init__(
        self,
        store: str | Path | GenomeStore,
        window: int,
        samples_per_epoch: int,
        *,
        intervals: Sequence[Interval] | None = None,
        seed: int = 0,
        max_n_fraction: float = 0.1,
        reverse_complement: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_attempts: int = 100,
    ) -> None:
        if window < 1 or samples_per_epoch < 1:
            raise ValueError(f"window ({window}) and samples_per_epoch ({samples_per_epoch}) must be >= 1")
        if not 0 <= max_n_fraction <= 1:
            raise ValueError(f"max_n_fraction={max_n_fraction} must be in [0, 1]")
        self._holder = _StoreHolder(store, cache_bytes)
        gs = self._holder.store
        self.window = window
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed
        self.epoch = 0
        self.max_n_fraction = max_n_fraction
        self.reverse_complement = reverse_complement
        self.max_attempts = max_attempts
        usable = []
        for iv in whole_contigs(gs) if intervals is None else intervals:
            contig = gs.contigs[iv.index]
            if contig.n_count == contig.length:
                log.warning("contig %s is all N: no training documents from it", contig.name)
            elif iv.length > 0:
                usable.append(iv)
        if not usable:
            raise ValueError(f"no interval of {gs.path} holds a base that is not N; use another split")
        self.intervals = usable
        self._cum_weights = np.cumsum(np.array([max(iv.length, window) for iv in usable], dtype=np.int64))

    @property
    def store(self) -> GenomeStore:
        return self._holder.store

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch

    def locate(self, epoch: int, index: int) -> list[tuple[int, int, int, bool]]:
        """Documents (contig index, start, length, reverse) of sample ``index`` in ``epoch``,
        without N checks: the first draw. ``__getitem__`` redraws while the window has too many N."""
        return self._draw(sample_rng(self.seed, epoch, index))

    def _draw(self, rng: np.random.Generator) -> list[tuple[int, int, int, bool]]:
        pieces, room = [], self.window
        while room:
            j = int(np.searchsorted(self._cum_weights, rng.integers(self._cum_weights[-1]), side="right"))
            iv = self.intervals[j]
            length = min(iv.length, room)
            start = iv.start + int(rng.integers(iv.length - length + 1))
            reverse = bool(rng.random() < 0.5) if self.reverse_complement else False
            pieces.append((iv.index, start, length, reverse))
            room -= length
        return pieces

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        rng = sample_rng(self.seed, epoch, index)
        store = self.store
        limit = self.max_n_fraction * self.window
        for _ in range(self.max_attempts):
            pieces = self._draw(rng)
            codes = [store.read(contig, start, start + length) for contig, start, length, _ in pieces]
            if limit >= self.window or sum(np.count_nonzero(c == N) for c in codes) <= limit:
                break
        else:
            raise RuntimeError(
                f"no window of {self.window} bases with at most {self.max_n_fraction:.0%} N "
                f"found in {self.max_attempts} draws; raise max_n_fraction or shorten the window"
            )
        codes = [reverse_complement(c) if piece[3] else c for c, piece in zip(codes, pieces)]
        return _packed_sample(pieces, codes, index)


class PackedTiledWindowDataset(Dataset):
    """The tiles of :class:`TiledWindowDataset` (same starts, same ends), packed into windows
    with :func:`genoformer.data.packing.pack_lengths` instead of padded one per window: each tile
    is one document, so a model that keeps documents apart scores every tile exactly as unpacked.
    The room a window has left is one PAD document (``doc_contig`` -1). Samples as
    :class:`PackedRandomWindowDataset`'s (``doc_reverse`` all False); keys may be an index or an
    (epoch, index) pair, the epoch is ignored.
    """

    def __init__(
        self,
        store: str | Path | GenomeStore,
        window: int,
        stride: int | None = None,
        *,
        intervals: Sequence[Interval] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        tiles = TiledWindowDataset(store, window, stride, intervals=intervals, cache_bytes=cache_bytes)
        self._holder = tiles._holder
        self.window = window
        self.tiles = [tiles.locate(i) for i in range(len(tiles))]
        self.packs = pack_lengths([end - start for _, start, end in self.tiles], window)

    @property
    def store(self) -> GenomeStore:
        return self._holder.store

    def set_epoch(self, epoch: int) -> None:
        """Packs do not depend on the epoch (kept for the sampler protocol)."""

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        _, index = split_key(key, 0)
        tiles = [self.tiles[i] for i in self.packs[index]]
        pieces = [(contig, start, end - start, False) for contig, start, end in tiles]
        codes = [self.store.read(contig, start, start + length) for contig, start, length, _ in pieces]
        room = self.window - sum(piece[2] for piece in pieces)
        if room:
            pieces.append((-1, 0, room, False))
            codes.append(np.full(room, PAD, dtype=np.uint8))
        return _packed_sample(pieces, codes, index)
