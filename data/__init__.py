"""Chunked zarr stores for genomes and time series, datasets and Lightning data modules.

Data flows one way: sequence files -> ``prepare_*_store`` writes a zarr store -> a dataset reads
windows -> a data module batches them.
"""

from genoformer.data.genome.alphabet import (
    BOS,
    MASK,
    PAD,
    VOCAB_SIZE,
    A,
    C,
    G,
    InvalidBaseError,
    N,
    T,
    decode,
    encode,
    reverse_complement,
)
from genoformer.data.genome.datasets import (
    PackedRandomWindowDataset,
    PackedTiledWindowDataset,
    RandomWindowDataset,
    TiledWindowDataset,
    tile_starts,
)
from genoformer.data.genome.store import ContigInfo, GenomeStore, prepare_genome_store
from genoformer.data.sampling import ShardSampler
from genoformer.data.genome.seqfiles import SequenceRecord, read_records
from genoformer.data.splits import Interval, SplitSpec, split_intervals
from genoformer.data.tiling import Keep, Tile, tile_windows
from genoformer.data.timeseries.datasets import TimeSeriesWindowDataset
from genoformer.data.timeseries.store import SeriesInfo, TimeSeriesStore, prepare_timeseries_store


def __getattr__(name: str):
    """Import the Lightning data modules on first use, so that DataLoader workers started with
    spawn (which import this package to unpickle a dataset) do not pay for importing Lightning."""
    if name in ("GenomeDataModule", "TimeSeriesDataModule"):
        if name == "GenomeDataModule":
            from genoformer.data.genome.datamodule import GenomeDataModule

            return GenomeDataModule
        from genoformer.data.timeseries.datamodule import TimeSeriesDataModule

        return TimeSeriesDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "A", "C", "G", "T", "N", "PAD", "MASK", "BOS", "VOCAB_SIZE", "InvalidBaseError",
    "encode", "decode", "reverse_complement",
    "prepare_genome_store", "GenomeStore", "ContigInfo",
    "prepare_timeseries_store", "TimeSeriesStore", "SeriesInfo",
    "RandomWindowDataset", "TiledWindowDataset", "PackedRandomWindowDataset", "PackedTiledWindowDataset", "TimeSeriesWindowDataset", "Tile", "Keep", "tile_windows", "tile_starts",
    "ShardSampler", "SplitSpec", "Interval", "split_intervals",
    "GenomeDataModule", "TimeSeriesDataModule", "SequenceRecord", "read_records",
]
