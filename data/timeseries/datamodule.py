"""The time-series data module: context/horizon windows of a time-series store, built from CSV
or .npy files on first use, or of several stores at once. Batches: ``{"context": float32 (B, C, Lc),
"target": float32 (B, C, H), ...}``, NaN where a value is missing.

Several stores (``store: [a.zarr, b.zarr, ...]``) train one general forecaster: every store is
split the same way, training windows are drawn store by store (``store_weights``, equal by
default, so that a short series counts as much as a long one), and with ``channel_independent``
each window is one channel of one store (C = 1), so stores with different channels mix; add
``window_normalize`` so that every window is scaled by its own context and no dataset dominates
the loss by its units or its noise. Such batches also carry ``"store"`` (int64 (B,), the window's
store: an index into ``store_paths`` and ``store_names``) and ``"channel"``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
from genoformer.data.loaders import ShardedLoaders, store_built_from
from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals
from genoformer.data.timeseries.datasets import MixedWindowDataset, TimeSeriesWindowDataset
from genoformer.data.timeseries.store import MissingPolicy, TimeSeriesStore, prepare_timeseries_store
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)


class TimeSeriesDataModule(ShardedLoaders, L.LightningDataModule):
    """Context + horizon windows of a time-series store, for forecasting.

    Args:
        store: Path of the time-series store (a zarr directory), or a list of several stores
            (built beforehand with `genoformer prepare_timeseries`) to train on together.
        sources: CSV/.npy files to build ``store`` from when it does not exist yet; an existing
            store must have been built from exactly these files. One store only.
        sampling_rate: Samples per second, or the step as a period ("5min"), for building the store (or give ``time_column``).
        time_column: CSV column with the time in seconds, for building the store.
        missing: Missing values when building the store: "keep" (the default: stored as missing,
            masked by the model and the losses), "error", "ffill", "zero", "linear".
        context: Context length Lc (time steps).
        horizon: Forecast horizon H (time steps).
        batch_size: Windows per batch (per device).
        num_workers: DataLoader worker processes.
        samples_per_epoch: Random training windows per epoch (over all ranks).
        split: How validation/test data are held out ("region" = the end of every series in
            time order; "files"/"contigs" = whole series by file name).
        eval_stride: Step between validation/test windows (default: ``horizon``).
        eval_context_before_split: Validation/test windows need only their horizon inside the
            split; their context may reach back into earlier data (the long-horizon protocol).
        normalize: Standardise channels with the store's per-channel mean and std.
        window_normalize: Also shift and scale every window by its context's observed mean and
            std, channel by channel (so that every window weighs alike in the loss).
        window_scale_floor: With window_normalize: the window's scale is at least this fraction
            of the store's std (0: none). Intermittent channels need one: a context of almost no
            spread scales the spike after it to hundreds of standard deviations
            (configs/timeseries_general_gpu.yaml).
        channel_independent: Every window is one channel (C = 1): needed to mix stores with
            different channels (a channel-independent model forecasts any channel count).
        store_weights: With several stores: the relative chance of drawing a training window
            from each (default: equal).
        seed: Seed of the sampling.
        multiprocessing_context: "fork", "spawn" or "forkserver" for workers (None: platform default).
        persistent_workers: Keep workers alive between epochs.
        rank: This process's rank for sharding (default: from torch.distributed, else 0).
        world_size: Number of ranks (default: from torch.distributed, else 1).
    """

    def __init__(
        self,
        store: str | list[str],
        sources: list[str] | None = None,
        sampling_rate: float | str | None = None,
        time_column: str | list[str] | None = None,
        missing: MissingPolicy = "keep",
        context: int = 8192,
        horizon: int = 256,
        batch_size: int = 16,
        num_workers: int = 2,
        samples_per_epoch: int = 10_000,
        split: SplitSpec | None = None,
        eval_stride: int | None = None,
        eval_context_before_split: bool = False,
        normalize: bool = True,
        window_normalize: bool = False,
        window_scale_floor: float = 0.0,
        channel_independent: bool = False,
        store_weights: list[float] | None = None,
        seed: int = 0,
        multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
        persistent_workers: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.store_paths = [Path(path) for path in ([store] if isinstance(store, (str, Path)) else store)]
        if not self.store_paths:
            raise ValueError("data.init_args.store is an empty list; name one store or several")
        self.store_path = self.store_paths[0]
        self.sources = list(sources) if sources else []
        if self.sources and len(self.store_paths) > 1:
            raise ValueError(
                "data.init_args.sources builds one store; with several stores, build each with "
                "`genoformer prepare_timeseries` and leave sources empty"
            )
        if store_weights is not None and len(store_weights) != len(self.store_paths):
            raise ValueError(
                f"data.init_args.store_weights has {len(store_weights)} weights for "
                f"{len(self.store_paths)} stores; give one per store"
            )
        self.window_normalize = window_normalize
        self.window_scale_floor = window_scale_floor
        self.channel_independent = channel_independent
        self.store_weights = store_weights
        self.eval_context_before_split = eval_context_before_split
        self.sampling_rate = sampling_rate
        self.time_column = time_column
        self.missing = missing
        self.context = context
        self.horizon = horizon
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.samples_per_epoch = samples_per_epoch
        self.split = split if split is not None else SplitSpec(val_fraction=0.1)
        self.eval_stride = eval_stride
        self.normalize = normalize
        self.seed = seed
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.rank = rank
        self.world_size = world_size
        self.datasets: dict[str, Dataset] = {}

    def prepare_data(self) -> None:
        """Build the store from ``sources`` when it does not exist; an existing store must have
        been built from exactly these files, else FileExistsError says what to do."""
        if len(self.store_paths) > 1:
            for path in self.store_paths:
                if not path.exists():
                    raise FileNotFoundError(
                        f"time-series store {path} (in data.init_args.store) does not exist; build "
                        "it with `genoformer prepare_timeseries`"
                    )
            return
        if store_built_from(self.store_path, self.sources, "series", "data.init_args.sources"):
            return
        if not self.sources:
            raise FileNotFoundError(
                f"time-series store {self.store_path} does not exist and no `sources` were "
                "given to build it; run `genoformer prepare_timeseries` or set data.init_args.sources"
            )
        prepare_timeseries_store(
            self.sources,
            self.store_path,
            sampling_rate=self.sampling_rate,
            time_column=self.time_column,
            missing=self.missing,
        )

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets the stage needs: fit (train + val), validate or test.

        Raises ValueError when `validate` or `test` asks for a split that holds no data, naming
        the option that creates it.
        """
        for path in self.store_paths:
            if not path.exists():
                raise FileNotFoundError(
                    f"time-series store {path} does not exist; build it with "
                    "`genoformer prepare_timeseries` or set data.init_args.sources"
                )
        stores = [TimeSeriesStore(path) for path in self.store_paths]
        if not self.channel_independent and len({tuple(store.channel_names) for store in stores}) > 1:
            raise ValueError(
                f"the stores {[str(p) for p in self.store_paths]} have different channels "
                f"({[store.channel_names for store in stores]}); set data.init_args.channel_independent "
                "to true to train on one channel at a time"
            )
        options = dict(
            normalize=self.normalize, window_normalize=self.window_normalize, window_scale_floor=self.window_scale_floor
        )
        per_store: dict[str, list[TimeSeriesWindowDataset]] = {"train": [], "val": [], "test": []}
        for store in stores:
            intervals = split_intervals(
                [SequenceSource(s.name, s.length, s.source_name) for s in store.series], self.split
            )
            if stage in ("fit", None):
                per_store["train"].append(
                    TimeSeriesWindowDataset(
                        store,
                        self.context,
                        self.horizon,
                        intervals=intervals["train"],
                        samples_per_epoch=self.samples_per_epoch,
                        seed=self.seed,
                        **options,
                    )
                )
            for name, needed_by in (("val", "validate"), ("test", "test")):
                if intervals[name]:
                    per_store[name].append(
                        TimeSeriesWindowDataset(
                            store,
                            self.context,
                            self.horizon,
                            intervals=intervals[name],
                            stride=self.eval_stride,
                            context_before_interval=self.eval_context_before_split,
                            **options,
                        )
                    )
                elif stage == needed_by:
                    raise ValueError(
                        f"the {name} split of {store.path} is empty: set data.init_args.split."
                        f"{name}_fraction (e.g. 0.1) or name {name} series with split.by"
                    )
        mixed = len(stores) > 1 or self.channel_independent
        for name, parts in per_store.items():
            if not parts:
                continue
            if not mixed:
                self.datasets[name] = parts[0]
            elif name == "train":
                self.datasets[name] = MixedWindowDataset(
                    parts, samples_per_epoch=self.samples_per_epoch, weights=self.store_weights, seed=self.seed
                )
            else:
                self.datasets[name] = MixedWindowDataset(parts)

    def series_with_splits(self) -> list[tuple[np.ndarray, int, int]]:
        """Every series of the stores as the model reads it ((C, T) float64, normalized like the
        windows; NaN where missing), cut at the end of its validation part, with where its
        training part ends and where its validation part ends: (values, train_end, val_end) each.
        What a linear baseline is fitted and validated on (`TimeSeriesForecaster.linear_orders`).

        Raises ValueError for splits that are not regions at the end of every series (each series
        then needs a training and a validation part) and for window-normalized data, whose
        per-window scale no fit over whole series reproduces.
        """
        if self.split.by != "region" or not self.split.val_fraction:
            raise ValueError(
                "a linear path fitted on whole series needs data.init_args.split.by: region with a "
                f"val_fraction above 0 (got by={self.split.by}, val_fraction={self.split.val_fraction}): "
                "its order is chosen on the validation part of every series"
            )
        if self.window_normalize:
            raise ValueError(
                "a linear path fitted on whole series reads the store's values, which window_normalize "
                "rescales window by window: leave model.init_args.linear_orders unset to fit it on "
                "training windows (model.init_args.linear_fit_batches)"
            )
        parts = []
        for path in self.store_paths:
            store = TimeSeriesStore(path)
            intervals = split_intervals(
                [SequenceSource(s.name, s.length, s.source_name) for s in store.series], self.split
            )
            ends = {name: {iv.index: iv.end for iv in intervals[name]} for name in ("train", "val")}
            std_C = np.where(store.std > 0, store.std, 1.0)
            for info in store.series:
                train_end, val_end = ends["train"].get(info.index), ends["val"].get(info.index)
                if train_end is None or val_end is None:
                    raise ValueError(
                        f"series {info.name!r} of {path} ({info.length} steps) is too short to hold both a "
                        "training and a validation part; drop it from the store or lower the fractions"
                    )
                values_CT = store.read(info.index, 0, val_end).astype(np.float64)
                if self.normalize:
                    values_CT = (values_CT - store.mean[:, None]) / std_C[:, None]
                parts.append((values_CT, train_end, val_end))
        return parts

    @property
    def store_names(self) -> list[str]:
        """A short name per store, in the order of ``store`` (what a batch's ``store`` index
        points at): the file name without ``.zarr``, prefixed by its position where two are alike."""
        stems = [path.name.removesuffix(".zarr") for path in self.store_paths]
        return stems if len(set(stems)) == len(stems) else [f"{index}_{stem}" for index, stem in enumerate(stems)]

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["train"], train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.datasets["val"], train=False) if "val" in self.datasets else []

    def test_dataloader(self) -> DataLoader | list:
        return self._loader(self.datasets["test"], train=False) if "test" in self.datasets else []

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must carry to read new data the way the model was trained: the
        channels, the sampling rate and the normalization (per-channel mean and std) of the
        store, or of each store ("stores") when there are several."""
        described = [_describe(TimeSeriesStore(path), self.normalize) for path in self.store_paths]
        if len(described) == 1 and not self.channel_independent and not self.window_normalize:
            return described[0]
        return {
            "stores": described,
            "channel_independent": self.channel_independent,
            "window_normalize": self.window_normalize,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """On resume or evaluation: refuse a store whose channels or statistics differ from the
        ones the checkpoint's model was trained with."""
        current = self.state_dict()
        saved = state_dict.get("stores", [state_dict]) if state_dict else []
        for index, here in enumerate(current.get("stores", [current])):
            then = saved[index] if index < len(saved) else {}
            if (
                not then
                or then["channel_names"] != here["channel_names"]
                or not (np.allclose(then["mean"], here["mean"]) and np.allclose(then["std"], here["std"]))
            ):
                path = self.store_paths[index]
                raise ValueError(
                    f"time-series store {path} does not match the checkpoint: it has channels "
                    f"{here['channel_names']} (mean {here['mean']}, std {here['std']}), the model "
                    f"was trained on {then.get('channel_names')} (mean {then.get('mean')}, std "
                    f"{then.get('std')}); set data.init_args.store to the store(s) it was trained on"
                )

    def describe_batch(self, batch: dict[str, Any]) -> str:
        """Where a batch's windows come from, for error reports: the store, then per row the
        series and the 0-based half-open range of context + horizon (and the channel, for
        single-channel windows)."""
        span = self.context + self.horizon
        names = [[series.name for series in TimeSeriesStore(path).series] for path in self.store_paths]
        stores = batch["store"].tolist() if "store" in batch else [0] * len(batch["series"])
        channels = batch["channel"].tolist() if "channel" in batch else [None] * len(stores)
        prefix = [f"{path.name}:" if len(self.store_paths) > 1 else "" for path in self.store_paths]
        rows = [
            f"{prefix[store]}{names[store][series]}[{start}:{start + span})"
            + ("" if channel is None else f" channel {channel}")
            for store, series, start, channel in zip(
                stores, batch["series"].tolist(), batch["start"].tolist(), channels
            )
        ]
        where = (
            f"store {self.store_path}" if len(self.store_paths) == 1 else f"stores {[str(p) for p in self.store_paths]}"
        )
        return f"{where}: " + ", ".join(rows[:8]) + (", ..." if len(rows) > 8 else "")


def _describe(store: TimeSeriesStore, normalize: bool) -> dict[str, Any]:
    return {
        "channel_names": store.channel_names,
        "sampling_rate": store.sampling_rate,
        "normalize": normalize,
        "mean": store.mean.tolist(),
        "std": store.std.tolist(),
    }
