"""Context + horizon windows of a time-series store, for forecasting.

Legend: C = channels, Lc = context length, H = horizon (time steps). A sample is
``{"context": float32 (C, Lc), "target": float32 (C, H), "series": int, "start": int, "index": int}``
where ``context`` covers [start, start + Lc) and ``target`` [start + Lc, start + Lc + H), both in
the same interval (split). With ``normalize`` values are (x - mean) / std with the store's
per-channel statistics. Keys are an index or an (epoch, index) pair, as for genome datasets.

Missing values (NaN in the store) stay NaN in ``context`` and ``target``: the model reads them
as unobserved (`genoformer.timeseries.model`) and the losses leave missing targets out
(`genoformer.timeseries.module`). A window whose target holds no observed value at all is
skipped. With ``window_normalize`` every window is further shifted and scaled by the observed
mean and standard deviation of its own context, channel by channel, so that a loss weighs
quiet and loud windows, and different datasets, alike. ``window_scale_floor`` bounds that scale
from below by a fraction of the store's standard deviation: an intermittent channel (a sub-meter
at 0 for hours) has contexts of almost no spread before a spike, and scaled by that spread
alone its target reaches hundreds of standard deviations and outweighs every other window.

`MixedWindowDataset` draws single-channel windows from several such datasets (several stores):
the training data of a general, channel-independent forecaster. Its samples are
``{"context": (1, Lc), "target": (1, H), "store": int, "channel": int, "series", "start", "index"}``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from genoformer.data.sampling import sample_rng, split_key
from genoformer.data.splits import Interval
from genoformer.data.timeseries.store import TimeSeriesStore
from torch.utils.data import Dataset

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
        window_normalize: Shift and scale each window by its context's observed mean and
            standard deviation, per channel (after ``normalize``).
        window_scale_floor: With ``window_normalize``: the scale is at least this fraction of
            the store's standard deviation of the channel (0: no floor, a constant context
            keeps the scale 1 of the values ``normalize`` gives).
    """

    def __init__(
        self,
        store: str | Path | TimeSeriesStore,
        context: int,
        horizon: int,
        *,
        intervals: Sequence[Interval] | None = None,
        samples_per_epoch: int | None = None,
        stride: int | None = None,
        seed: int = 0,
        normalize: bool = True,
        context_before_interval: bool = False,
        window_normalize: bool = False,
        window_scale_floor: float = 0.0,
    ) -> None:
        if context < 1 or horizon < 1:
            raise ValueError(f"context ({context}) and horizon ({horizon}) must be >= 1")
        if window_scale_floor < 0:
            raise ValueError(
                f"window_scale_floor must be at least 0 (a fraction of the store's standard "
                f"deviation), got {window_scale_floor}"
            )
        self._store = store if isinstance(store, TimeSeriesStore) else TimeSeriesStore(store)
        self._pid = os.getpid()
        self.context, self.horizon = context, horizon
        self.span = context + horizon
        self.samples_per_epoch = samples_per_epoch
        self.stride = horizon if stride is None else stride
        self.seed = seed
        self.epoch = 0
        self.normalize = normalize
        self.window_normalize = window_normalize
        self.window_scale_floor = window_scale_floor
        ivs = [Interval(s.index, 0, s.length) for s in self._store.series] if intervals is None else list(intervals)
        if context_before_interval:
            ivs = [Interval(iv.index, max(0, iv.start - context), iv.end) for iv in ivs]
        self.intervals = [iv for iv in ivs if iv.length >= self.span]
        short = [iv for iv in ivs if iv.length < self.span]
        if short:
            log.warning(
                "%d interval(s) of %s, %d time steps in total, are shorter than context + horizon (%d) "
                "and give no windows",
                len(short),
                self._store.path,
                sum(iv.length for iv in short),
                self.span,
            )
        if not self.intervals:
            raise ValueError(
                f"no interval of {self._store.path} holds context + horizon = {self.span} steps; "
                "shorten them or change the split"
            )
        step = self.stride if samples_per_epoch is None else 1
        self._step = step
        self._valid: list[np.ndarray | None] = [self._valid_starts(iv, step) for iv in self.intervals]
        counts = [
            1 + (iv.length - self.span) // step if valid is None else len(valid)
            for iv, valid in zip(self.intervals, self._valid)
        ]
        self.skipped_windows = sum(1 + (iv.length - self.span) // step for iv in self.intervals) - sum(counts)
        if self.skipped_windows:
            log.info(
                "%d window(s) of %s skipped: no value of their targets is observed",
                self.skipped_windows,
                self._store.path,
            )
        if not sum(counts):
            raise ValueError(
                f"no window of {self._store.path} in these intervals has an observed target value "
                f"(horizon {horizon}); change the split, or use a store with fewer gaps"
            )
        self._cum = np.cumsum(np.array(counts, dtype=np.int64))
        std = np.where(self._store.std > 0, self._store.std, 1.0).astype(np.float32)
        self._mean = self._store.mean[:, None]  # (C, 1)
        self._inv_std = (1.0 / std)[:, None]  # (C, 1)
        self._scale_floor_C = window_scale_floor * (np.ones_like(std) if normalize else std)  # in the values' units

    def _valid_starts(self, iv: Interval, step: int) -> np.ndarray | None:
        """Window starts of the interval (every `step`-th) whose target holds an observed value,
        or None when the series has no missing value (then every start does)."""
        if not self._store.series[iv.index].has_missing:
            return None
        cache = getattr(self, "_missing_cum", None)
        if cache is None or cache[0] != iv.index:
            missing_T = np.isnan(self._store.read(iv.index, 0, self._store.series[iv.index].length)).all(axis=0)
            cache = self._missing_cum = (iv.index, np.concatenate([[0], np.cumsum(missing_T, dtype=np.int64)]))
        cum = cache[1]
        starts = np.arange(iv.start, iv.end - self.span + 1, step, dtype=np.int64)
        return starts[cum[starts + self.span] - cum[starts + self.context] < self.horizon]

    @property
    def store(self) -> TimeSeriesStore:
        if self._pid != os.getpid():
            self._store = TimeSeriesStore(self._store.path, self._store.cache_bytes)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pid"] = None
        state.pop("_missing_cum", None)
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
            u = index
        else:
            u = int(sample_rng(self.seed, epoch, index).integers(self._cum[-1]))
        j = int(np.searchsorted(self._cum, u, side="right"))
        iv, valid = self.intervals[j], self._valid[j]
        offset = u - (int(self._cum[j - 1]) if j else 0)
        return iv.index, iv.start + offset * self._step if valid is None else int(valid[offset])

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        series, start = self.locate(epoch, index)
        values = self.store.read(series, start, start + self.span)  # (C, Lc + H)
        if self.normalize:
            values = (values - self._mean) * self._inv_std
        if self.window_normalize:
            values = normalize_by_context(values, self.context, self._scale_floor_C)
        values = torch.from_numpy(values)
        return {
            "context": values[:, : self.context],
            "target": values[:, self.context :],
            "series": series,
            "start": start,
            "index": index,
        }


def normalize_by_context(values_CS: np.ndarray, context: int, floor_C: np.ndarray | float = 0.0) -> np.ndarray:
    """(values - m) / s per channel, m and s the observed mean and standard deviation of the first
    `context` steps, float32. With a floor (per channel, or one for all) s is at least it; without
    one (0) s = 1 where the deviation is 0 or nothing is observed."""
    head_CL = values_CS[:, :context]
    observed_C = (~np.isnan(head_CL)).sum(axis=1)
    filled_CL = np.where(np.isnan(head_CL), 0.0, head_CL)
    mean_C = filled_CL.sum(axis=1) / np.maximum(observed_C, 1)
    var_C = (np.where(np.isnan(head_CL), 0.0, np.square(head_CL - mean_C[:, None]))).sum(axis=1) / np.maximum(
        observed_C, 1
    )
    floor_C = np.broadcast_to(np.asarray(floor_C, dtype=np.float64), var_C.shape)
    std_C = np.where(floor_C > 0, np.maximum(np.sqrt(var_C), floor_C), np.where(var_C > 1e-12, np.sqrt(var_C), 1.0))
    return ((values_CS - mean_C[:, None]) / std_C[:, None]).astype(np.float32)


class MixedWindowDataset(Dataset):
    """Single-channel windows drawn from several `TimeSeriesWindowDataset`s (module docstring).

    Args:
        parts: One dataset per store (the same context and horizon); each of its windows gives
            one sample per channel.
        samples_per_epoch: Random windows per epoch: a part is drawn by ``weights``, then one of
            its windows and one channel uniformly. None: every window of every part, channel by
            channel, in order (validation and test).
        weights: Relative chance of each part (default: equal, so that a short store is seen as
            often as a long one).
        seed: Base seed; random sample ``index`` of ``epoch`` depends only on (seed, epoch, index).
    """

    def __init__(
        self,
        parts: Sequence[TimeSeriesWindowDataset],
        *,
        samples_per_epoch: int | None = None,
        weights: Sequence[float] | None = None,
        seed: int = 0,
    ) -> None:
        if not parts:
            raise ValueError("a mixed dataset needs at least one store's windows")
        if len({(part.context, part.horizon) for part in parts}) != 1:
            raise ValueError("every store's windows must have the same context and horizon")
        self.parts = list(parts)
        self.context, self.horizon = parts[0].context, parts[0].horizon
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed
        self.epoch = 0
        weights = [1.0] * len(parts) if weights is None else [float(w) for w in weights]
        if len(weights) != len(parts) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"weights {weights} must be one non-negative number per store ({len(parts)}), not all 0")
        self._weights = np.cumsum(weights) / sum(weights)
        self._channels = [part.store.num_channels for part in parts]
        self._cum = np.cumsum([len(part) * c for part, c in zip(parts, self._channels)])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch if self.samples_per_epoch is not None else int(self._cum[-1])

    def locate(self, epoch: int, index: int) -> tuple[int, int, int]:
        """(part, window index in it, channel) of sample ``index``."""
        if self.samples_per_epoch is None:
            if not 0 <= index < len(self):
                raise IndexError(f"window {index} out of range [0, {len(self)})")
            part = int(np.searchsorted(self._cum, index, side="right"))
            offset = index - (int(self._cum[part - 1]) if part else 0)
            return part, offset // self._channels[part], offset % self._channels[part]
        rng = sample_rng(self.seed, epoch, index)
        part = min(int(np.searchsorted(self._weights, rng.random(), side="right")), len(self.parts) - 1)
        return part, int(rng.integers(1 << 62)), int(rng.integers(self._channels[part]))

    def __getitem__(self, key: int | tuple[int, int]) -> dict:
        epoch, index = split_key(key, self.epoch)
        part, window, channel = self.locate(epoch, index)
        sample = self.parts[part][(epoch, window)]
        return {
            **sample,
            "context": sample["context"][channel : channel + 1],
            "target": sample["target"][channel : channel + 1],
            "store": part,
            "channel": channel,
            "index": index,
        }
