"""What the genome and time-series data modules share: resumable, sharded loaders and a check
that a store was built from the configured files.

The data modules themselves live with their stores: genoformer.data.genome.datamodule
(GenomeDataModule) and genoformer.data.timeseries.datamodule (TimeSeriesDataModule);
LightningCLI builds them from YAML.

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
from typing import Any

import torch
from genoformer.data.sampling import ShardSampler
from genoformer.data.storage import read_metadata, sha256_files
from torch.utils.data import DataLoader, Dataset

from genoformer import hints

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
        f"store {store} was built from {sources}, not from the files that {option} names ({files}). To use "
        f"{store} as it is, give it no files to build from: {hints.option(option.rpartition('.')[2], [])}; to build "
        f"a store from {files} instead, point {hints.option('store', metavar='NEW.zarr')} at a new path"
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


class ShardedLoaders:
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

    def _sampler_replica(self) -> tuple[int | None, int | None]:
        """(rank, world_size) the samples are sharded over; (None, None): torch.distributed's."""
        return self.rank, self.world_size

    def _loader(self, dataset: Dataset, train: bool, collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
        """The DataLoader of one split; collate_fn None: the default collate."""
        rank, world_size = self._sampler_replica()
        sampler = ShardSampler(len(dataset), rank=rank, world_size=world_size, equal_shares=train)
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
