"""The genome data module: windows of a genome store, built from FASTA on first use.

Training draws random windows (ShardSampler gives each DDP rank its own indices and Lightning
sets its epoch); validation and test tile their splits; checkpoints carry how far training got
(genoformer.data.loaders). Batches: ``{"tokens": torch.uint8 (B, L), "contig": int64 (B,),
"start": int64 (B,), ...}``, or with ``pack`` ``{"tokens": torch.uint8 (B, L), "cu_seqlens": int32
(N + 1,), "doc_contig": int64 (N,), ...}`` for N documents (see genoformer.data.packing).

Context parallelism: when the trainer's strategy splits every window over several processes
(`WindowSplit`), each process reads only its part of each training, validation and test window
(``tokens`` (B, P), P of the window's L positions), and the samples are sharded over the groups
of processes that share windows instead of over processes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import lightning as L
from genoformer.data.genome.datasets import (
    PackedRandomWindowDataset,
    PackedTiledWindowDataset,
    RandomWindowDataset,
    TiledWindowDataset,
    WholeRecordDataset,
)
from genoformer.data.genome.store import GenomeStore, prepare_genome_store
from genoformer.data.loaders import ShardedLoaders, store_built_from
from genoformer.data.packing import collate_packed
from genoformer.data.splits import SequenceSource, SplitSpec, split_intervals
from torch.utils.data import DataLoader, Dataset

from genoformer.hints import hint, option

log = logging.getLogger(__name__)


@runtime_checkable
class WindowSplit(Protocol):
    """A trainer strategy that splits every window over several processes (context parallelism:
    genoformer.core.context_parallel.ContextParallelStrategy). The data module asks its trainer's
    strategy, when it is one, which positions of each window this process reads and over which
    replicas the samples are sharded. The protocol lives here, with the side that asks, so that
    the data never imports the model."""

    def window_part(self, window: int) -> tuple[tuple[int, int], ...]:
        """The positions of a window of ``window`` tokens this process reads: (first, stop) ranges
        in the order it holds them."""

    def sample_replica(self) -> tuple[int, int]:
        """(replica, replicas): the processes that share windows form one replica, and the
        samples are sharded over replicas (every process of one reads the same windows)."""


class GenomeDataModule(ShardedLoaders, L.LightningDataModule):
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
        rank: This process's rank for sharding (default: from torch.distributed, else 0). Under a
            strategy that splits windows (`WindowSplit`), its replica instead.
        world_size: Number of ranks (default: from torch.distributed, else 1); under a strategy
            that splits windows, its number of replicas.
        source_weights: Share of the training windows from each source file, by file name (e.g.
            ``{ecoli_k12_mg1655.fasta.gz: 1, drosophila_dm3_chr2R.fasta.gz: 1}``: half each, whatever
            their lengths); every training file must be named. Default: files weighted by length.
            Not with ``pack``.
        whole_records: Every training window is one whole training interval (a whole chromosome
            with ``split.by`` contigs or files), as long as it is, at most ``window`` tokens (a
            longer one gives a random window of ``window`` tokens inside it): a bacterial
            chromosome in one window (`genoformer.data.genome.datasets.WholeRecordDataset`).
            Validation and test tiles are then not padded to the window either. Window lengths
            differ, so batch_size must be 1. Not with ``pack``, ``source_weights`` or context
            parallelism.
    """

    store_inputs: ClassVar[str] = "fasta"
    """The option naming the files ``store`` is built from: `genoformer fit` leaves them out when
    its command line names an existing store and not them (the store is then used as it is)."""

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
        source_weights: dict[str, float] | None = None,
        whole_records: bool = False,
    ) -> None:
        super().__init__()
        if whole_records and (batch_size != 1 or pack or source_weights is not None):
            raise ValueError(
                f"whole_records=True gives windows of different lengths, one per batch: set batch_size to 1 (got "
                f"{batch_size}), and leave pack ({pack}) false and source_weights unset (got {source_weights})"
            )
        if pack and max_shift:
            raise ValueError(
                f"max_shift={max_shift} does nothing with pack=True (packed pieces start anywhere "
                "already); set max_shift to 0 or pack to false"
            )
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
        if pack and source_weights is not None:
            raise ValueError("source_weights is not supported with pack=True yet; leave one of them out")
        self.pack = pack
        self.source_weights = source_weights
        self.seed = seed
        self.cache_bytes = cache_mb << 20
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.rank = rank
        self.world_size = world_size
        self.whole_records = whole_records
        self.datasets: dict[str, Dataset] = {}

    def prepare_data(self) -> None:
        """Build the store from ``fasta`` when it does not exist; an existing store must have been
        built from exactly these files (same SHA-256), else FileExistsError says what to do."""
        if store_built_from(self.store_path, self.fasta, "contigs", "data.init_args.fasta"):
            return
        if not self.fasta:
            raise FileNotFoundError(
                f"genome store {self.store_path} does not exist and no `fasta` files were "
                "given to build it; run `genoformer prepare` or set data.fasta"
            )
        prepare_genome_store(self.fasta, self.store_path)

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets the stage needs: fit (train + val), validate, test or predict.

        Raises ValueError when `validate` or `test` asks for a split that holds no data, naming
        the option that creates it.
        """
        store = GenomeStore(self.store_path, self.cache_bytes)
        if stage == "predict":
            # Prediction covers every contig whole, whatever the split, one tile per row (packed or not).
            self.datasets["predict"] = TiledWindowDataset(
                store, self.window, self.eval_stride, cache_bytes=self.cache_bytes
            )
            return
        intervals = split_intervals(
            [SequenceSource(c.name, c.length, c.source_name) for c in store.contigs], self.split
        )
        part = self._window_part()
        if stage in ("fit", None):
            if not self.pack and not self.whole_records:
                self._check_record_lengths(store, intervals["train"])
            if self.whole_records:
                self.datasets["train"] = WholeRecordDataset(
                    store,
                    self.window,
                    self.samples_per_epoch,
                    intervals=intervals["train"],
                    seed=self.seed,
                    max_n_fraction=self.max_n_fraction,
                    reverse_complement=self.reverse_complement,
                    cache_bytes=self.cache_bytes,
                )
            elif self.pack:
                self.datasets["train"] = PackedRandomWindowDataset(
                    store,
                    self.window,
                    self.samples_per_epoch,
                    intervals=intervals["train"],
                    seed=self.seed,
                    max_n_fraction=self.max_n_fraction,
                    reverse_complement=self.reverse_complement,
                    cache_bytes=self.cache_bytes,
                )
            else:
                self.datasets["train"] = RandomWindowDataset(
                    store,
                    self.window,
                    self.samples_per_epoch,
                    intervals=intervals["train"],
                    seed=self.seed,
                    max_n_fraction=self.max_n_fraction,
                    reverse_complement=self.reverse_complement,
                    max_shift=self.max_shift,
                    cache_bytes=self.cache_bytes,
                    source_weights=self.source_weights,
                    part=part,
                )
        tiled, extra = (PackedTiledWindowDataset, {}) if self.pack else (TiledWindowDataset, {"part": part})
        if self.whole_records:
            extra = {"pad": False}
        for name, needed_by in (("val", "validate"), ("test", "test")):
            if intervals[name]:
                self.datasets[name] = tiled(
                    store,
                    self.window,
                    self.eval_stride,
                    intervals=intervals[name],
                    cache_bytes=self.cache_bytes,
                    **extra,
                )
            elif stage == needed_by:
                raise ValueError(
                    f"the {name} split of {self.store_path} is empty: hold out a part with "
                    + hint(f"split=SplitSpec({name}_fraction=0.02)", f"--data.init_args.split.{name}_fraction 0.02")
                    + f", or name {name} contigs or files (split.by)"
                )

    def _window_split(self) -> WindowSplit | None:
        """The trainer's strategy when it splits windows over processes, else None (also without a trainer)."""
        strategy = getattr(self.trainer, "strategy", None)
        return strategy if isinstance(strategy, WindowSplit) else None

    def _window_part(self) -> tuple[tuple[int, int], ...] | None:
        """The positions of each window this process reads; None: all of them."""
        split = self._window_split()
        if split is None:
            return None
        if self.whole_records:
            raise ValueError(
                "whole_records=True cannot be combined with context parallelism yet: a part of every window needs "
                "windows of one length; set " + option("whole_records", False) + " and a window"
            )
        if self.pack:
            raise ValueError(
                "pack=True cannot be combined with context parallelism yet: the ring attention "
                "(genoformer.kernels.ring) does not keep packed documents apart across processes; set "
                + option("pack", False)
            )
        return split.window_part(self.window)

    def _sampler_replica(self) -> tuple[int | None, int | None]:
        split = self._window_split()
        return super()._sampler_replica() if split is None else split.sample_replica()

    def _check_record_lengths(self, store: GenomeStore, train: list) -> None:
        """Point at ``pack`` when training intervals are shorter than the window (they give no
        windows unpacked): a WARNING for some, ValueError when all are."""
        short = [interval for interval in train if interval.length < self.window]
        if not short:
            return
        pack = option("pack", True)
        if len(short) == len(train):
            raise ValueError(
                f"no interval of {self.store_path} is at least {self.window} bases long (the window; its {len(short)} "
                f"training intervals are {max(iv.length for iv in short)} bases at most), so no training window can be "
                f"drawn unpacked. Pack records into windows end to end: {pack}; or use a shorter window"
            )
        log.warning(
            "%d of %d training intervals of %s are shorter than the window (%d bases) and give no windows "
            "unpacked; to train on them too, pack records into windows: %s",
            len(short),
            len(train),
            self.store_path,
            self.window,
            pack,
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
            # whole windows (also of parts), or unpadded whole-record windows
            length = (
                int(batch["length"][row])
                if "length" in batch
                else (batch["tokens"].shape[1] if self.whole_records else self.window)
            )
            strand = " (reverse complement)" if "reverse" in batch and bool(batch["reverse"][row]) else ""
            rows.append(f"{names[contig]}[{start}:{start + length}){strand}")
        return f"store {self.store_path}: " + ", ".join(rows[:8]) + (", ..." if len(rows) > 8 else "")


def describe_documents(batch: dict[str, Any], names: list[str]) -> str:
    """The documents of a packed genome batch: contig[start:end) (strand) per document, rows
    separated by " | ", PAD documents as "PAD x n"."""
    cu_seqlens = batch["cu_seqlens"].tolist()
    row_length = batch["tokens"].shape[1]
    rows: list[list[str]] = []
    for doc, (contig, start, reverse) in enumerate(
        zip(batch["doc_contig"].tolist(), batch["doc_start"].tolist(), batch["doc_reverse"].tolist())
    ):
        length = cu_seqlens[doc + 1] - cu_seqlens[doc]
        if cu_seqlens[doc] % row_length == 0:
            rows.append([])
        strand = " (reverse complement)" if reverse else ""
        rows[-1].append(f"PAD x {length}" if contig < 0 else f"{names[contig]}[{start}:{start + length}){strand}")
    return " | ".join(", ".join(row) for row in rows[:8]) + (" | ..." if len(rows) > 8 else "")
