"""Cutting a long sequence into overlapping windows, and deciding which window owns each position.

One tiler serves every reader of long sequences (embeddings, likelihood scoring, evaluation):
windows of ``window`` positions overlap by at least ``overlap``; all have the same length (the last
one ends at the sequence end), except a single shorter window for a sequence shorter than
``window``. The kept ranges ``[keep_start, keep_end)`` of the windows partition ``[0, length)``:
every position takes its result from exactly one window, chosen by a :class:`Keep` rule.

- ``Keep.CENTRE``: the window in which the position is farthest from either edge (bidirectional
  models, embeddings): each position keeps about ``overlap // 2`` positions of context on both
  sides, except at the sequence ends.
- ``Keep.LEFT``: the window in which the position has the most preceding context (causal models,
  likelihood scoring): every position after the first window sees at least
  ``window - stride`` = ``overlap`` preceding positions.

Shapes: positions are plain ints; nothing here touches tensors.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key")


class Keep(str, enum.Enum):
    """Which of the windows covering a position supplies its result."""

    CENTRE = "centre"
    """The window whose centre is nearest (ties: the earlier window)."""
    LEFT = "left"
    """The earliest window that covers it: the most preceding context."""


@dataclass(frozen=True)
class Tile:
    """One window [start, end) of a sequence; it supplies positions [keep_start, keep_end)."""

    start: int
    end: int
    keep_start: int
    keep_end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def tile_windows(length: int, window: int, overlap: int, keep: Keep = Keep.CENTRE) -> list[Tile]:
    """Cover [0, length) with windows of `window` positions (one shorter window if
    length < window) that overlap by at least `overlap`; the kept ranges partition [0, length)
    by the `keep` rule. Empty for length 0."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}.")
    if not 0 <= overlap < window:
        raise ValueError(f"overlap must be in [0, window={window}), got {overlap}.")
    if length <= 0:
        return []
    if length <= window:
        return [Tile(0, length, 0, length)]
    stride = window - overlap
    starts = list(range(0, length - window, stride)) + [length - window]
    if Keep(keep) is Keep.CENTRE:
        # Window i keeps positions p with 2p <= s_i + s_{i+1} + window - 1 (nearer its centre).
        inner = [(a + b + window - 1) // 2 + 1 for a, b in zip(starts, starts[1:])]
    else:
        # Window i + 1 keeps what window i does not cover: everything from s_i + window on.
        inner = [a + window for a in starts[:-1]]
    cuts = [0, *inner, length]
    return [Tile(s, s + window, lo, hi) for s, lo, hi in zip(starts, cuts, cuts[1:])]


def same_length_batches(tiles: Sequence[tuple[Key, Tile]], batch_size: int) -> Iterator[list[tuple[Key, Tile]]]:
    """Consecutive runs of at most `batch_size` (key, tile) pairs whose tiles have one length, so
    a batch needs no padding and a result never depends on what else was in its batch. Sort the
    tiles by length first to get few, full batches."""
    batch: list[tuple[Key, Tile]] = []
    for item in tiles:
        if batch and (len(batch) == batch_size or batch[0][1].length != item[1].length):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch
