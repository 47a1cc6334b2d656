"""Packing: several documents (whole records or record pieces) end to end in one window, so that
records shorter than the window (plasmids, contigs, short recordings) train without padding.

Legend: L = window length (tokens), P = documents in one window, N = documents in a batch,
B = windows in a batch. A packed sample is
``{"tokens": (L,), "doc_lens": int64 (P,), "doc_<name>": (P,) per-document metadata, ...}`` with
``doc_lens`` summing to L. :func:`collate_packed` stacks the per-window entries as the default
collate does, concatenates the per-document ones over the batch (row after row) and adds
``cu_seqlens``: int32 (N + 1,), the cumulative document lengths over the flattened B * L token
axis, flash-attn's varlen convention that ``genoformer.kernels.attention`` takes (every row
boundary is one of its entries, because every row's documents fill it exactly).

What fills the windows is up to the dataset (random pieces for training, every tile in a fixed
order for evaluation); :func:`pack_lengths` is the deterministic packer of the latter.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

DOC_PREFIX = "doc_"
"""Sample keys with this prefix hold one entry per document; they are concatenated, not stacked."""


def pack_lengths(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins whose lengths sum to at most ``capacity``:
    best-fit decreasing (each item, longest first, into the fullest bin that still has room),
    deterministic, every index in exactly one bin. Items of exactly ``capacity`` get a bin each,
    in their order, before the packed ones; inside a bin items keep their original order."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    too_long = [n for n in lengths if not 0 < n <= capacity]
    if too_long:
        raise ValueError(f"items must have lengths in [1, {capacity}] to be packed, got {too_long[:5]}")
    bins = [[i] for i, n in enumerate(lengths) if n == capacity]
    partial: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin number) of the partial bins, sorted
    for i in sorted((i for i, n in enumerate(lengths) if n < capacity), key=lambda i: (-lengths[i], i)):
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            partial.append([i])
            room, number = capacity - lengths[i], len(partial) - 1
        else:
            room, number = free.pop(at)
            partial[number].append(i)
            room -= lengths[i]
        if room:
            bisect.insort(free, (room, number))
    return bins + [sorted(b) for b in partial]


def cu_seqlens_of(doc_lens_N: torch.Tensor) -> torch.Tensor:
    """int32 (N + 1,): 0, then the running sum of the document lengths."""
    return torch.cat([doc_lens_N.new_zeros(1), doc_lens_N.cumsum(0)]).to(torch.int32)


def collate_packed(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of packed samples: per-window entries stacked (as the default collate does),
    per-document entries (``doc_*``) concatenated row after row, plus ``cu_seqlens``."""
    for sample in samples:
        if int(sample["doc_lens"].sum()) != sample["tokens"].shape[-1]:
            raise ValueError(
                f"a packed sample's doc_lens ({sample['doc_lens'].tolist()}) must sum to its "
                f"window length {sample['tokens'].shape[-1]}"
            )
    batch = default_collate([{k: v for k, v in s.items() if not k.startswith(DOC_PREFIX)} for s in samples])
    for key in samples[0]:
        if key.startswith(DOC_PREFIX):
            batch[key] = torch.cat([torch.as_tensor(s[key]) for s in samples])
    batch["cu_seqlens"] = cu_seqlens_of(batch["doc_lens"])
    return batch
