"""The time-series data module: context/horizon windows of a time-series store, built from CSV
or .npy files on first use. Batches: ``{"context": float32 (B, C, Lc), "target": float32 (B, C, H), ...}``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset

from genoformer.data.loaders import ShardedLoaders, store_built_from
from genoformer.data.timeseries.datasets import TimeSeriesWindowDataset
from genoformer.data.timeseries.store import MissingPolicy, TimeSeriesStore, prepare_timeseries_store
from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals

log = logging.getLogger(__name__)


class TimeSeriesDataModule(ShardedLoaders, L.LightningDataModule):
    """Context + horizon windows of a time-series store, for forecasting.

    Args:
        store: Path of the time-series store (a zarr directory).
        sources: CSV/.npy files to build ``store`` from when it does not exist yet; an existing
            store must have been built from exactly these files.
        sampling_rate: Samples per second, for building the store (or give ``time_column``).
        time_column: CSV column with the time in seconds, for building the store.
        missing: Missing-value policy for building the store: "error", "ffill", "zero", "linear".
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
        seed: Seed of the sampling.
        multiprocessing_context: "fork", "spawn" or "forkserver" for workers (None: platform default).
        persistent_workers: Keep workers alive between epochs.
        rank: This process's rank for sharding (default: from torch.distributed, else 0).
        world_size: Number of ranks (default: from torch.distributed, else 1).
    """

    def __init__(
        self,
        store: str,
        sources: list[str] | None = None,
        sampling_rate: float | None = None,
        time_column: str | None = None,
        missing: MissingPolicy = "error",
        context: int = 8192,
        horizon: int = 256,
        batch_size: int = 16,
        num_workers: int = 2,
        samples_per_epoch: int = 10_000,
        split: SplitSpec | None = None,
        eval_stride: int | None = None,
        eval_context_before_split: bool = False,
        normalize: bool = True,
        seed: int = 0,
        multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
        persistent_workers: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.store_path = Path(store)
        self.sources = list(sources) if sources else []
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
        if store_built_from(self.store_path, self.sources, "series", "data.init_args.sources"):
            return
        if not self.sources:
            raise FileNotFoundError(f"time-series store {self.store_path} does not exist and no `sources` were "
                                    "given to build it; run `genoformer prepare_timeseries` or set data.init_args.sources")
        prepare_timeseries_store(self.sources, self.store_path, sampling_rate=self.sampling_rate,
                                 time_column=self.time_column, missing=self.missing)

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets the stage needs: fit (train + val), validate or test.

        Raises ValueError when `validate` or `test` asks for a split that holds no data, naming
        the option that creates it.
        """
        if not self.store_path.exists():
            raise FileNotFoundError(f"time-series store {self.store_path} does not exist; build it with "
                                    "`genoformer prepare_timeseries` or set data.init_args.sources")
        store = TimeSeriesStore(self.store_path)
        intervals = split_intervals([SequenceSource(s.name, s.length, s.source_name) for s in store.series], self.split)
        if stage in ("fit", None):
            self.datasets["train"] = TimeSeriesWindowDataset(
                store, self.context, self.horizon, intervals=intervals["train"],
                samples_per_epoch=self.samples_per_epoch, seed=self.seed, normalize=self.normalize,
            )
        for name, needed_by in (("val", "validate"), ("test", "test")):
            if intervals[name]:
                self.datasets[name] = TimeSeriesWindowDataset(
                    store, self.context, self.horizon, intervals=intervals[name], stride=self.eval_stride,
                    normalize=self.normalize, context_before_interval=self.eval_context_before_split,
                )
            elif stage == needed_by:
                raise ValueError(f"the {name} split of {self.store_path} is empty: set data.init_args.split."
                                 f"{name}_fraction (e.g. 0.1) or name {name} series with split.by")

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["train"], train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.datasets["val"], train=False) if "val" in self.datasets else []

    def test_dataloader(self) -> DataLoader | list:
        return self._loader(self.datasets["test"], train=False) if "test" in self.datasets else []

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must carry to read new data the way the model was trained: the
        channels, the sampling rate and the normalization (per-channel mean and std)."""
        store = TimeSeriesStore(self.store_path)
        return {"channel_names": store.channel_names, "sampling_rate": store.sampling_rate,
                "normalize": self.normalize, "mean": store.mean.tolist(), "std": store.std.tolist()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """On resume or evaluation: refuse a store whose channels or statistics differ from the
        ones the checkpoint's model was trained with."""
        current = self.state_dict()
        if not state_dict or state_dict["channel_names"] != current["channel_names"] or not (
                np.allclose(state_dict["mean"], current["mean"]) and np.allclose(state_dict["std"], current["std"])):
            raise ValueError(f"time-series store {self.store_path} does not match the checkpoint: it has channels "
                             f"{current['channel_names']} (mean {current['mean']}, std {current['std']}), the model "
                             f"was trained on {state_dict.get('channel_names')} (mean {state_dict.get('mean')}, std "
                             f"{state_dict.get('std')}); set data.init_args.store to the store it was trained on")

    def describe_batch(self, batch: dict[str, Any]) -> str:
        """Where a batch's windows come from, for error reports: the store, then per row the
        series and the 0-based half-open range of context + horizon."""
        names = [series.name for series in TimeSeriesStore(self.store_path).series]
        span = self.context + self.horizon
        rows = [f"{names[series]}[{start}:{start + span})"
                for series, start in zip(batch["series"].tolist(), batch["start"].tolist())]
        return f"store {self.store_path}: " + ", ".join(rows[:8]) + (", ..." if len(rows) > 8 else "")
