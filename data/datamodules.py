"""Lightning data modules for genome and time-series stores (LightningCLI builds them from YAML).

Training draws random windows (:class:`ShardSampler` gives each DDP rank its own indices and
Lightning sets its epoch); validation and test tile their splits. Checkpoints carry how far
training got into its epoch, and a run resumed from one skips the samples already
consumed instead of replaying them (:class:`ResumableDataLoader`). Batches:
genome ``{"tokens": torch.uint8 (B, L), "contig": int64 (B,), "start": int64 (B,), ...}``, or with
``pack`` ``{"tokens": torch.uint8 (B, L), "cu_seqlens": int32 (N + 1,), "doc_contig": int64 (N,), ...}``
for N documents (see genoformer.data.packing); time series
``{"context": float32 (B, C, Lc), "target": float32 (B, C, H), ...}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from genoformer.data.genome_datasets import (
    PackedRandomWindowDataset,
    PackedTiledWindowDataset,
    RandomWindowDataset,
    TiledWindowDataset,
)
from genoformer.data.genome_store import GenomeStore, prepare_genome_store
from genoformer.data.hints import hint
from genoformer.data.packing import collate_packed
from genoformer.data.sampling import ShardSampler
from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals
from genoformer.data.timeseries_datasets import TimeSeriesWindowDataset
from genoformer.data.storage import read_metadata, sha256_files
from genoformer.data.timeseries_store import MissingPolicy, TimeSeriesStore, prepare_timeseries_store

log = logging.getLogger(__name__)


def store_built_from(store: Path, files: list[str], records_key: str, option: str) -> bool:
    """Whether ``store`` exists (False: build it), after checking that it was built from exactly
    ``files``, compared by SHA-256 in order; a store built from other files is an error naming
    both lists and the config option, so that a changed config never trains on stale data."""
    for path in files:
        if not Path(path).is_file():
            where = "" if Path(path).is_absolute() else f" (relative to the current directory {Path.cwd()})"
            raise FileNotFoundError(f"{option}: input file not found: {path}{where}")
    if not store.exists():
        return False
    if not files:
        return True
    meta = read_metadata(store)
    if meta is None or meta.get("complete") is not True:
        return True  # opening it says what is wrong: not a store, or an interrupted build
    records = meta.get(records_key, [])
    if list(dict.fromkeys(record["source_sha256"] for record in records)) == sha256_files([Path(p) for p in files]):
        return True
    sources = list(dict.fromkeys(record["source"] for record in records))
    raise FileExistsError(
        f"store {store} was not built from the files that {option} names ({files}); it holds {sources}. "
        f"Point the store option at a new path to build one from these files, or delete {store} to rebuild it"
    )


class ResumableDataLoader(DataLoader):
    """The training DataLoader: Lightning saves its ``state_dict`` in every checkpoint (the epoch,
    and how many samples all ranks together had consumed in it) and hands it back to
    ``load_state_dict`` on resume, so that the next pass starts right after those samples.

    ``position`` returns (epoch, batches this rank consumed in it); the data module reads it from
    its trainer.
    """

    def __init__(self, *args: Any, position: Callable[[], tuple[int, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.position = position

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self.position()
        return {"epoch": epoch, "samples_consumed": batches * self.batch_size * self.sampler.num_replicas}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        epoch, consumed = int(state_dict["epoch"]), int(state_dict["samples_consumed"])
        if consumed >= self.sampler.total:  # saved at the end of an epoch: the next one starts whole
            epoch, consumed = epoch + 1, 0
        log.info("resuming the training data at epoch %d after %d consumed samples", epoch, consumed)
        self.sampler.resume_from(epoch, consumed)


class _ShardedLoaders:
    """DataLoader construction shared by both modules."""

    batch_size: int
    num_workers: int
    multiprocessing_context: str | None
    persistent_workers: bool
    pin_memory: bool = True
    """Page-locked batches on a CUDA machine: the copy to the GPU then starts without waiting for
    the previous step's kernels, so the host can queue the next step while the GPU still runs."""
    rank: int | None
    world_size: int | None

    def _training_position(self) -> tuple[int, int]:
        fit_loop = self.trainer.fit_loop
        return fit_loop.epoch_progress.current.completed, fit_loop.epoch_loop.batch_progress.current.processed

    def _loader(self, dataset: Dataset, train: bool, collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
        """The DataLoader of one split; collate_fn None: the default collate."""
        sampler = ShardSampler(len(dataset), rank=self.rank, world_size=self.world_size, equal_shares=train)
        kind, extra = (ResumableDataLoader, {"position": self._training_position}) if train else (DataLoader, {})
        return kind(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            multiprocessing_context=self.multiprocessing_context if self.num_workers > 0 else None,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            drop_last=train,
            collate_fn=collate_fn,
            **extra,
        )


class GenomeDataModule(_ShardedLoaders, L.LightningDataModule):
    """Windows of a genome store for pre-training and evaluation.

    Args:
        store: Path of the genome store (a zarr directory).
        fasta: FASTA/GenBank files to build ``store`` from when it does not exist yet
            (in ``prepare_data``); an existing store must have been built from exactly these
            files (checked by SHA-256), else training stops with a message saying what to do.
        window: Tokens per window (L).
        batch_size: Windows per batch (per device).
        num_workers: DataLoader worker processes; each opens the store itself.
        samples_per_epoch: Random training windows per epoch (over all ranks).
        split: How validation/test data are held out (region of every contig, contigs or files).
        eval_stride: Step between validation/test tiles (default: ``window``, no overlap).
        max_n_fraction: Training windows with more N than this fraction are redrawn.
        reverse_complement: Reverse-complement training windows with probability 1/2.
        max_shift: Random shift (bases) applied to training window starts (0 with ``pack``,
            whose pieces start anywhere already).
        pack: Fill every training, validation and test window end to end with several records or
            record pieces instead of one, so that records shorter than the window (plasmids,
            contigs) train without padding: training windows draw whole short records and pieces
            of long ones, evaluation packs the usual tiles (same losses as unpacked). Batches then
            carry ``cu_seqlens`` (the documents' cumulative lengths over the flattened batch), with
            which the model keeps documents apart: attention within a document only, positions
            from 0 at each document start, no prediction of a document's first token. Prediction
            (embeddings) stays one tile per row.
        seed: Seed of the sampling; sample i of epoch e depends only on (seed, e, i).
        cache_mb: Decoded-chunk cache per process, in MiB.
        multiprocessing_context: "fork", "spawn" or "forkserver" for workers (None: platform default).
        persistent_workers: Keep workers alive between epochs.
        rank: This process's rank for sharding (default: from torch.distributed, else 0).
        world_size: Number of ranks (default: from torch.distributed, else 1).
    """

    def __init__(
        self,
        store: str,
        fasta: list[str] | None = None,
        window: int = 8192,
        batch_size: int = 8,
        num_workers: int = 2,
        samples_per_epoch: int = 100_000,
        split: SplitSpec | None = None,
        eval_stride: int | None = None,
        max_n_fraction: float = 0.1,
        reverse_complement: bool = True,
        max_shift: int = 0,
        pack: bool = False,
        seed: int = 0,
        cache_mb: int = 64,
        multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None,
        persistent_workers: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if pack and max_shift:
            raise ValueError(f"max_shift={max_shift} does nothing with pack=True (packed pieces start anywhere "
                             "already); set max_shift to 0 or pack to false")
        self.store_path = Path(store)
        self.fasta = list(fasta) if fasta else []
        self.window = window
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.samples_per_epoch = samples_per_epoch
        self.split = split if split is not None else SplitSpec()
        self.eval_stride = eval_stride
        self.max_n_fraction = max_n_fraction
        self.reverse_complement = reverse_complement
        self.max_shift = max_shift
        self.pack = pack
        self.seed = seed
        self.cache_bytes = cache_mb << 20
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.rank = rank
        self.world_size = world_size
        self.datasets: dict[str, Dataset] = {}

    def prepare_data(self) -> None:
        """Build the store from ``fasta`` when it does not exist; an existing store must have been
        built from exactly these files (same SHA-256), else FileExistsError says what to do."""
        if store_built_from(self.store_path, self.fasta, "contigs", "data.init_args.fasta"):
            return
        if not self.fasta:
            raise FileNotFoundError(f"genome store {self.store_path} does not exist and no `fasta` files were "
                                    "given to build it; run `genoformer prepare` or set data.fasta")
        prepare_genome_store(self.fasta, self.store_path)

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets the stage needs: fit (train + val), validate, test or predict.

        Raises ValueError when `validate` or `test` asks for a split that holds no data, naming
        the option that creates it.
        """
        store = GenomeStore(self.store_path, self.cache_bytes)
        if stage == "predict":
            # Prediction covers every contig whole, whatever the split, one tile per row (packed or not).
            self.datasets["predict"] = TiledWindowDataset(store, self.window, self.eval_stride, cache_bytes=self.cache_bytes)
            return
        intervals = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in store.contigs], self.split)
        if stage in ("fit", None):
            if self.pack:
                self.datasets["train"] = PackedRandomWindowDataset(
                    store, self.window, self.samples_per_epoch, intervals=intervals["train"], seed=self.seed,
                    max_n_fraction=self.max_n_fraction, reverse_complement=self.reverse_complement,
                    cache_bytes=self.cache_bytes,
                )
            else:
                self.datasets["train"] = RandomWindowDataset(
                    store, self.window, self.samples_per_epoch, intervals=intervals["train"], seed=self.seed,
                    max_n_fraction=self.max_n_fraction, reverse_complement=self.reverse_complement,
                    max_shift=self.max_shift, cache_bytes=self.cache_bytes,
                )
        tiled = PackedTiledWindowDataset if self.pack else TiledWindowDataset
        for name, needed_by in (("val", "validate"), ("test", "test")):
            if intervals[name]:
                self.datasets[name] = tiled(store, self.window, self.eval_stride, intervals=intervals[name],
                                            cache_bytes=self.cache_bytes)
            elif stage == needed_by:
                raise ValueError(
                    f"the {name} split of {self.store_path} is empty: hold out a part with "
                    + hint(f"split=SplitSpec({name}_fraction=0.02)", f"--data.init_args.split.{name}_fraction 0.02")
                    + f", or name {name} contigs or files (split.by)"
                )

    def _split_loader(self, name: str) -> DataLoader | list:
        """The loader of split `name` (packed batches with `pack`); [] for a split without data."""
        if name not in self.datasets:
            return []
        collate_fn = collate_packed if self.pack else None
        return self._loader(self.datasets[name], train=name == "train", collate_fn=collate_fn)

    def train_dataloader(self) -> DataLoader:
        return self._split_loader("train")

    def val_dataloader(self) -> DataLoader | list:
        return self._split_loader("val")

    def test_dataloader(self) -> DataLoader | list:
        return self._split_loader("test")

    def predict_dataloader(self) -> DataLoader:
        """Tiles of every contig (``eval_stride`` apart), for `genoformer predict`."""
        return self._loader(self.datasets["predict"], train=False)

    def contig_names(self) -> list[str]:
        """Names of the store's contigs, indexed like the batches' ``contig`` entries."""
        return [contig.name for contig in GenomeStore(self.store_path, 0).contigs]

    def describe_batch(self, batch: dict[str, Any]) -> str:
        """Where a batch's windows come from, for error reports: the store, then per row (per
        document of a packed batch) the contig, the 0-based half-open range and the strand."""
        names = self.contig_names()
        if "cu_seqlens" in batch:
            return f"store {self.store_path}: " + describe_documents(batch, names)
        rows = []
        for row, (contig, start) in enumerate(zip(batch["contig"].tolist(), batch["start"].tolist())):
            length = int(batch["length"][row]) if "length" in batch else batch["tokens"].shape[1]
            strand = " (reverse complement)" if "reverse" in batch and bool(batch["reverse"][row]) else ""
            rows.append(f"{names[contig]}[{start}:{start + length}){strand}")
        return f"store {self.store_path}: " + ", ".join(rows[:8]) + (", ..." if len(rows) > 8 else "")


def describe_documents(batch: dict[str, Any], names: list[str]) -> str:
    """The documents of a packed genome batch: contig[start:end) (strand) per document, rows
    separated by " | ", PAD documents as "PAD x n"."""
    cu_seqlens = batch["cu_seqlens"].tolist()
    row_length = batch["tokens"].shape[1]
    rows: list[list[str]] = []
    for doc, (contig, start, reverse) in enumerate(zip(batch["doc_contig"].tolist(), batch["doc_start"].tolist(),
                                                       batch["doc_reverse"].tolist())):
        length = cu_seqlens[doc + 1] - cu_seqlens[doc]
        if cu_seqlens[doc] % row_length == 0:
            rows.append([])
        strand = " (reverse complement)" if reverse else ""
        rows[-1].append(f"PAD x {length}" if contig < 0 else f"{names[contig]}[{start}:{start + length}){strand}")
    return " | ".join(", ".join(row) for row in rows[:8]) + (" | ..." if len(rows) > 8 else "")


class TimeSeriesDataModule(_ShardedLoaders, L.LightningDataModule):
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
