"""Chunked zarr stores for genomes and time series, datasets and Lightning data modules.

Data flows one way: sequence files -> ``prepare_*_store`` writes a zarr store -> a dataset reads
windows -> a data module batches them.

The names below are imported from their modules on first use (``from genoformer.data import
GenomeStore`` imports genoformer.data.genome.store), so that importing one module of the package
imports no other: DataLoader workers started with spawn (which import this package to unpickle a
dataset) do not pay for Lightning, and a command's ``--help`` or ``--version`` for nothing.
"""

from __future__ import annotations

if __name__ == "data":  # found as a top-level package because the checkout's root is on sys.path
    import genoformer

    genoformer.stand_aside(__name__)  # the installed package named data takes this folder's place

import importlib
from typing import Any

_HOMES = {
    **dict.fromkeys(
        (
            "A",
            "C",
            "G",
            "T",
            "N",
            "PAD",
            "MASK",
            "BOS",
            "VOCAB_SIZE",
            "InvalidBaseError",
            "NotDNAError",
            "encode",
            "decode",
            "reverse_complement",
        ),
        "genome.alphabet",
    ),
    **dict.fromkeys(
        (
            "PackedRandomWindowDataset",
            "PackedTiledWindowDataset",
            "RandomWindowDataset",
            "TiledWindowDataset",
            "WholeRecordDataset",
            "tile_starts",
        ),
        "genome.datasets",
    ),
    **dict.fromkeys(("ContigInfo", "GenomeStore", "prepare_genome_store"), "genome.store"),
    "GenomeDataModule": "genome.datamodule",
    **dict.fromkeys(("SequenceRecord", "read_records"), "genome.seqfiles"),
    "ShardSampler": "sampling",
    **dict.fromkeys(("Interval", "SplitSpec", "split_intervals"), "splits"),
    **dict.fromkeys(("Keep", "Tile", "tile_windows"), "tiling"),
    "TimeSeriesWindowDataset": "timeseries.datasets",
    **dict.fromkeys(("SeriesInfo", "TimeSeriesStore", "prepare_timeseries_store"), "timeseries.store"),
    "TimeSeriesDataModule": "timeseries.datamodule",
}
"""Where each public name lives (a module of this package)."""


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = list(_HOMES)
