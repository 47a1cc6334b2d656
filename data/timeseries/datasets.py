"""Context + horizon windows of a time-series store, for forecasting.

Legend: C = channels, Lc = context length, H = horizon (time steps). A sample is
``{"context": float32 (C, Lc), "target": float32 (C, H), "series": int, "start": int, "index": int}``
where ``context`` covers [start, start + Lc) and ``target`` [start + Lc, start + Lc + H), both in
the same interval (split). With ``normalize`` values are (x - mean) / std with the store's
per-channel statistics. Keys are an index or an (epoch, index) pair, as for genome datasets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from genoformer.data.sampling import sample_rng, split_key
from genoformer.data.splits import Interval
from genoformer.data.timeseries.store import TimeSeriesStore

log = logging.getLogger(__name__)


class TimeSeriesWindowDataset(Dataset):
    """Context + horizon windows: random (``samples_per_epoch`` given) or tiled (``stride``).

    Args:
        store: Time-series store path or an open TimeSeriesStore.
        context: Context length Lc (time steps).
        horizon: Forecast horizon H (time steps).
        intervals: Where windows may lie (a split); default every whole series.
        samples_per_epoch: Random windows per epoch (training). None: tile every interval.
        stride: Step between tiled windows (default: ``horizon``); ignored for random windows.
        seed: Base seed; random sample ``index`` of ``epoch`` depends only on (seed, epoch, index).
        normalize: Standardise each channel with the store's mean and std.
        context_before_interval: Only the target must lie in an interval; the context may reach
            back before the interval's start into earlier steps of the same series (as the
            long-horizon protocol does for validation and test windows).
    """

    def __init__(self, store: str | Path | TimeSeriesStore, context: int, horizon: int, *,
                 intervals: Sequence[Interval] | None = None, samples_per_epoch: int | None = None,
                 stride: int | None = None, seed: int = 0, normalize: bool = True,
                 context_before_interval: bool = False) -> None:
        if context < 1 or horizon < 1:
            raise ValueError(f"context ({context}) and horizon ({horizon}) must be >= 1")
        self._store = store if isinstance(store, TimeSeriesStore) else TimeSeriesStore(store)
        self._pid = os.getpid()
        self.context, self.horizon = context, horizon
        self.span = context + horizon
        self.samples_per_epoch = samples_per_epoch
        self.stride = horizon if stride is None else stride
        self.seed = seed
        self.epoch = 0
        self.normalize = normalize
        ivs = [Interval(s.index, 0, s.length) for s in self._store.series] if intervals is None else list(intervals)
        if context_before_interval:
            ivs = [Interval(iv.index, max(0, iv.start - context), iv.end) for iv in ivs]
        self.intervals = [iv for iv in ivs if iv.length >= self.span]
        short = [iv for iv in ivs if iv.length < self.span]
        if short:
            log.warning("%d interval(s) of %s, %d time steps in total, are shorter than context + horizon (%d) "
                        "and give no windows", len(short), self._store.path, sum(iv.length for iv in short), self.span)
        if not self.intervals:
            raise ValueError(f"no interval of {self._store.path} holds context + horizon = {self.span} steps; "
                             "shorten them or change the split")
        if samples_per_epoch is None:
            counts = [1 + (iv.length - self.span) // self.stride for iv in self.intervals]
        else:
            counts = [iv.length - self.span + 1 for iv in self.intervals]
        self._cum = np.cumsum(np.array(counts, dtype=np.int64))
        std = np.where(self._store.std > 0, self._store.std, 1.0).astype(np.float32)
        self._mean = self._store.mean[:, None]  # (C, 1)
        self._inv_std = (1.0 / std)[:, None]  # (C, 1)

    @property
    def store(self) -> TimeSeriesStore:
        if self._pid != os.getpid():
            self._store = TimeSeriesStore(self._store.path, self._store.cache_bytes)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pid"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch if self.samples_per_epoch is not None else int(self._cum[-1])

    def locate(self, epoch: int, index: int) -> tuple[int, int]:
        """(series index, start) of sample ``index``."""
        if self.samples_per_epoch is None:
            if not 0 <= index < len(self):
                raise IndexError(f"window {index} out of range [0, {len(self)})")
            u, step = index, self.stride
        else:
            u, step = int(sample_rng(self.seed, epoch, index).integers(self._cum[-1])), 1
        j = int(np.searchsorted(self._cum, u, side="right"))
        iv = self.intervals[j]
        return iv.index, iv.start + (u - (int(self._cum[j - 1]) if j else 0)) * step

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        series, start = self.locate(epoch, index)
        values = self.store.read(series, start, start + self.span)  # (C, Lc + H)
        if self.normalize:
            values = (values - self._mean) * self._inv_std
        values = torch.from_numpy(values)
        return {"context": values[:, :self.context], "target": values[:, self.context:], "series": series,
                "start": start, "index": index}

