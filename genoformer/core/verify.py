"""`genoformer verify PATH`: check checkpoints and data stores against the checksums written with them.

    genoformer verify runs/quickstart                   # its checkpoints and the stores in it
    genoformer verify runs/quickstart/checkpoints/last.ckpt
    genoformer verify genome.zarr

A checkpoint is checked record by record against the CRC-32 its zip container holds
(`genoformer.core.checkpoints.verify_checkpoint_file`); a genome or time-series store is read
chunk by chunk (each checked against its CRC32C) and every contig or series is compared with the
SHA-256 recorded when the store was built (`GenomeStore.verify`, `TimeSeriesStore.verify`), which
also covers stores of older formats that have no chunk checksums.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from genoformer.core.checkpoints import verify_checkpoint_file
from genoformer.data.genome.store import GENOME_FORMAT, GenomeStore
from genoformer.data.storage import read_metadata
from genoformer.data.timeseries.store import TIMESERIES_FORMAT, TimeSeriesStore

CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth")


def _found(path: Path) -> Iterator[tuple[str, Path]]:
    """(kind, path) of every checkpoint and store at or below `path`, in name order; a store's
    own folders are not searched."""
    if path.is_file():
        yield "checkpoint", path
        return
    meta = read_metadata(path)
    if meta is not None:
        yield str(meta.get("format", "store")), path
        return
    for child in sorted(path.iterdir()):
        if child.is_dir() or child.name.endswith(CHECKPOINT_SUFFIXES):
            yield from _found(child)


def _check(kind: str, path: Path) -> str:
    """What `path` holds, once it checked out; ValueError (or FileNotFoundError) saying what is wrong."""
    if kind == "checkpoint":
        verify_checkpoint_file(path)
        return f"checkpoint, {os.path.getsize(path) / 2**20:.1f} MiB"
    if kind == GENOME_FORMAT:
        store = GenomeStore(path, cache_bytes=0)
        store.verify()
        return f"genome store, {len(store.contigs):,} contigs, {store.total_length:,} bases"
    if kind == TIMESERIES_FORMAT:
        series = TimeSeriesStore(path, cache_bytes=0)
        series.verify()
        return f"time-series store, {len(series.series):,} series"
    raise ValueError(f"{path} is a zarr store of format {kind!r}, which genoformer does not write")


def verify(path: Path) -> int:
    """Check checkpoints and data stores against the checksums written with them.

    PATH is a checkpoint (.ckpt), a genome or time-series store (a .zarr folder from `genoformer
    prepare` or `prepare_timeseries`), or a folder: every checkpoint and store in it and below it
    (a run directory, its checkpoints folder). Every byte of each is checked; one line per file
    says ok and what it holds, or what is damaged and how to rebuild it. Exits with status 1 when
    any is damaged.

    Args:
        path: A checkpoint, a store, or a folder holding them.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; pass a checkpoint (.ckpt), a store (.zarr) or a folder holding them"
        )
    damaged: list[str] = []
    found = list(_found(path))
    if not found:
        raise FileNotFoundError(f"{path} holds no checkpoint (.ckpt) and no genoformer store; pass one of those")
    for kind, item in found:
        try:
            what = _check(kind, item)
        except (ValueError, FileNotFoundError) as error:
            damaged.append(str(error))
            print(f"DAMAGED  {item}: {error}")
        else:
            print(f"ok       {item} ({what})")
    if damaged:
        raise ValueError(f"{len(damaged)} of {len(found)} checked are damaged; the first: {damaged[0]}")
    return len(found)
