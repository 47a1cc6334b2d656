"""Labelled DNA for fine-tuning: what the targets are, datasets of them, and their data module.

Two shapes of task:

- per sequence (`classify`, `regress`): labelled sequences read by `genoformer.data.genome.labels`
  (TSV/CSV, FASTA + TSV, BED on a genome); a batch is every sequence right-padded with PAD:
  ``{"tokens": uint8 (B, L), "length": int64 (B,), "targets": int64 (B,) | float32 (B, K),
  "index": int64 (B,)}``;
- per base (`annotate`; `regress` on a bedGraph signal): whole annotated genomes read by
  `genoformer.data.genome.annotations`, cut into windows: training draws random windows, validation
  and test tile their contigs; ``{"tokens": uint8 (B, W), "length": int64 (B,), "targets": int64
  (B, W) | float32 (B, W), ...}`` with IGNORE (classes) or NaN (values) where there is no target.

Splits never leak: validation and test sequences that also occur in training (on either strand)
are an error; without a validation file a share of the training data is held out, keeping
identical sequences together (sequence tasks) or as whole regions with a gap (per-base tasks).
Training samples are a pure function of (seed, epoch, index), so a resumed run sees what the
uninterrupted one saw (see genoformer.data.sampling).

Shape legend: B batch, L longest sequence of the batch, W window, K targets.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Sequence
from typing import Any, Literal, Optional

import lightning as L
import numpy as np
import torch
from genoformer.data.genome.alphabet import PAD, reverse_complement
from genoformer.data.genome.annotations import (
    ANNOTATION_CLASSES,
    STRAND_SWAP,
    AnnotatedContig,
    read_annotated_genomes,
    read_signal_tracks,
    region_holdout,
)
from genoformer.data.genome.labels import (
    LabelledSequences,
    canonical_key,
    class_balance,
    leak_check,
    read_labelled,
    split_leak_free,
)
from genoformer.data.genome.targets import TargetKind, TargetSpace, Task
from genoformer.data.loaders import ShardedLoaders
from genoformer.data.sampling import sample_rng, split_key
from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)

IGNORE = -100
"""Per-base class target where there is none (padding); cross-entropy skips it."""

BEDGRAPH_SUFFIXES = (".bedgraph", ".bedgraph.gz", ".bdg", ".bdg.gz")


def _sequence_space(seqs: LabelledSequences) -> TargetSpace:
    kind = TargetKind(seqs.kind)
    if kind is not TargetKind.SEQUENCE_VALUES:
        return TargetSpace(kind, seqs.label_names)
    values = seqs.targets.astype(np.float64)
    return TargetSpace(
        kind, seqs.label_names, mean=values.mean(0).tolist(), std=np.maximum(values.std(0), 1e-8).tolist()
    )


# ---------------------------------------------------------------------------------- datasets
class SequenceDataset(Dataset):
    """Labelled sequences, one per sample; training (`shuffle`) visits them in a fresh order each
    epoch, a pure function of (seed, epoch)."""

    def __init__(self, seqs: LabelledSequences, *, shuffle: bool, seed: int = 0) -> None:
        self.seqs = seqs
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._orders: dict[int, np.ndarray] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.seqs)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng((self.seed, epoch)).permutation(len(self.seqs))}
        return self._orders[epoch]

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        epoch, index = split_key(key, self.epoch)
        item = int(self._order(epoch)[index]) if self.shuffle else index
        return {
            "tokens": torch.from_numpy(self.seqs.codes[item]),
            "targets": torch.as_tensor(self.seqs.targets[item]),
            "index": item,
        }


def _padded_tokens(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """tokens (B, L) right-padded with PAD, their real lengths, and the other scalar entries."""
    lengths = [len(s["tokens"]) for s in samples]
    tokens_BL = torch.full((len(samples), max(lengths)), PAD, dtype=torch.uint8)
    for row, sample in enumerate(samples):
        tokens_BL[row, : lengths[row]] = sample["tokens"]
    batch: dict[str, Any] = {"tokens": tokens_BL, "length": torch.tensor(lengths, dtype=torch.int64)}
    for key in samples[0]:
        if key not in ("tokens", "targets"):
            batch[key] = torch.tensor([s[key] for s in samples])
    return batch


def pad_sequences(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate labelled sequences: tokens right-padded with PAD, targets stacked ((B,) or (B, K))."""
    return {**_padded_tokens(samples), "targets": torch.stack([s["targets"] for s in samples])}


def pad_windows(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate windows with per-base targets: tokens padded with PAD, targets (B, W) with IGNORE
    (classes) or NaN (values) beyond each window's end."""
    batch = _padded_tokens(samples)
    first = samples[0]["targets"]
    fill = float("nan") if first.is_floating_point() else IGNORE
    targets_BW = torch.full(batch["tokens"].shape, fill, dtype=first.dtype)
    for row, sample in enumerate(samples):
        targets_BW[row, : len(sample["targets"])] = sample["targets"]
    return {**batch, "targets": targets_BW}


@dataclasses.dataclass(frozen=True)
class Track:
    """One contig with a target per base: class indices (uint8) or values (float32, NaN: none)."""

    name: str
    codes: np.ndarray
    targets: np.ndarray


class RandomTrackWindows(Dataset):
    """Random windows of `window` bases over tracks, uniform over all starts (contigs weighted by
    length); a contig shorter than the window is served whole. Sample (epoch, index) is a pure
    function of (seed, epoch, index)."""

    def __init__(self, tracks: Sequence[Track], window: int, samples_per_epoch: int, *, seed: int = 0) -> None:
        if not tracks:
            raise ValueError("no training contigs: the annotation inputs hold no sequence")
        self.tracks = list(tracks)
        self.window = window
        self.samples_per_epoch = samples_per_epoch
        self.seed = seed
        self.epoch = 0
        self._cum = np.cumsum([max(1, len(t.codes) - window + 1) for t in self.tracks])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.samples_per_epoch

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        epoch, index = split_key(key, self.epoch)
        u = int(sample_rng(self.seed, epoch, index).integers(self._cum[-1]))
        contig = int(np.searchsorted(self._cum, u, side="right"))
        start = u - (int(self._cum[contig - 1]) if contig else 0)
        track = self.tracks[contig]
        end = min(start + self.window, len(track.codes))
        return {
            "tokens": torch.from_numpy(track.codes[start:end].copy()),
            "targets": torch.from_numpy(_track_targets(track.targets[start:end])),
            "contig": contig,
            "start": start,
        }


class TiledTrackWindows(Dataset):
    """Every base of every track exactly once: consecutive windows of `window` bases (the last of
    a contig shorter), for validation and test."""

    def __init__(self, tracks: Sequence[Track], window: int) -> None:
        self.tracks = list(tracks)
        self.tiles = [
            (i, start, min(start + window, len(t.codes)))
            for i, t in enumerate(self.tracks)
            for start in range(0, len(t.codes), window)
        ]

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return len(self.tiles)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        _, index = split_key(key, 0)
        contig, start, end = self.tiles[index]
        track = self.tracks[contig]
        return {
            "tokens": torch.from_numpy(track.codes[start:end].copy()),
            "targets": torch.from_numpy(_track_targets(track.targets[start:end])),
            "contig": contig,
            "start": start,
        }


def _track_targets(targets: np.ndarray) -> np.ndarray:
    return targets.astype(np.float32) if targets.dtype.kind == "f" else targets.astype(np.int64)


def contig_tracks(contigs: Sequence[AnnotatedContig]) -> list[Track]:
    return [Track(c.name, c.codes, c.labels) for c in contigs]


# ---------------------------------------------------------------------------------- data module
class LabelledDataModule(ShardedLoaders, L.LightningDataModule):
    """Labelled DNA for `genoformer finetune` (and `fit` with model FineTuner): sequences with
    labels, or genomes with per-base labels (see the module docstring).

    Args:
        task: classify (a class or labels per sequence), regress (values per sequence from a
            table, or per base from a bedGraph on `genome`) or annotate (per-base gene classes
            from GenBank or GFF3 annotations).
        train: training files: TSV/CSV with `sequence` and `label` (or `label_<name>`) columns;
            FASTA files with a TSV from record `name` to labels; BED intervals on `genome` with a
            label column; GenBank/GFF3 annotated genomes (annotate); a bedGraph (per-base regress).
        val: validation files of the same kind; none: `val_fraction` of `train` is held out.
        test: test files, read by `genoformer test` (and by `finetune --test`).
        genome: FASTA/GenBank file or genome store that BED/bedGraph intervals and GFF3 files
            without a ##FASTA section refer to.
        val_fraction: share of `train` held out for validation when `val` is not given.
        batch_size: sequences or windows per batch.
        window: bases per window of a per-base task (at most the model's max_seq_len).
        samples_per_epoch: random training windows per epoch of a per-base task.
        max_length: longest sequence a sequence task accepts (the model's context); longer ones
            are an error that names them.
        leaks: what to do with training sequences that also occur (on either strand) in the
            validation or test files: error (say how many), or drop them from training (and say
            how many); held-out sets are never changed.
        num_workers: DataLoader worker processes.
        seed: seed of the held-out split and of the training order.
    """

    def __init__(
        self,
        task: Task,
        train: list[str],
        val: Optional[list[str]] = None,
        test: Optional[list[str]] = None,
        genome: Optional[str] = None,
        val_fraction: float = 0.1,
        batch_size: int = 32,
        window: int = 1024,
        samples_per_epoch: int = 100_000,
        max_length: int = 8192,
        leaks: Literal["error", "drop"] = "error",
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if task not in typing.get_args(Task):
            raise ValueError(f"task must be one of {', '.join(typing.get_args(Task))}, got {task!r}")
        if not train:
            raise ValueError("no training files: pass --train FILE ... (or data.init_args.train)")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.task = task
        self.train_files = list(train)
        self.val_files = list(val) if val else []
        self.test_files = list(test) if test else []
        self.genome = genome
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.window = window
        self.samples_per_epoch = samples_per_epoch
        self.max_length = max_length
        if leaks not in ("error", "drop"):
            raise ValueError(f"leaks must be error or drop, got {leaks!r}")
        self.leaks = leaks
        self.num_workers = num_workers
        self.seed = seed
        self.multiprocessing_context = None
        self.persistent_workers = False
        self.rank = None
        self.world_size = None
        self.splits: dict[str, Any] = {}
        self.target_space: Optional[TargetSpace] = None

    @property
    def per_base(self) -> bool:
        return self.task == "annotate" or (self.task == "regress" and _is_bedgraph(self.train_files))

    # ----------------------------------------------------------------- reading
    def setup(self, stage: Optional[str] = None) -> None:
        if "train" not in self.splits:
            if self.per_base:
                self._read_tracks()
            else:
                self._read_sequences()
        if stage == "test" and not self.test_files:
            raise ValueError("no test files: pass --test FILE ... (or data.init_args.test) to evaluate a test split")

    def _read_sequences(self) -> None:
        train = read_labelled(self.train_files, task=self.task, genome=self.genome)
        classes = train.label_names if TargetKind(train.kind) is TargetKind.SEQUENCE_CLASSES else None
        held_out = {}
        if self.val_files:
            held_out["validation"] = read_labelled(self.val_files, task=self.task, genome=self.genome, classes=classes)
        if self.test_files:
            held_out["test"] = read_labelled(self.test_files, task=self.task, genome=self.genome, classes=classes)
        for name, seqs in held_out.items():
            train = self._without_leaks(train, seqs, name)
        if self.val_files:
            val = held_out["validation"]
        else:
            train, val = split_leak_free(train, self.val_fraction, self.seed)
            print(f"no validation files: {len(val):,} of the training sequences held out for validation")
        self.splits = {"train": train, "val": val}
        if self.test_files:
            self.splits["test"] = held_out["test"]
        for name, seqs in self.splits.items():
            longest = max(len(c) for c in seqs.codes)
            if longest > self.max_length:
                raise ValueError(
                    f"the {name} data holds a sequence of {longest:,} bases, longer than max_length="
                    f"{self.max_length:,} (the model's context); shorten it, or raise data.init_args.max_length "
                    "up to the pretrained model's max_seq_len"
                )
        log.info("training labels: %s", class_balance(train))
        print(f"training data: {len(train):,} sequences; {class_balance(train)}")
        self.target_space = _sequence_space(train)

    def _without_leaks(self, train: LabelledSequences, other: LabelledSequences, name: str) -> LabelledSequences:
        """`train` after the leak rule (`leaks`) against the held-out set `other`."""
        if self.leaks == "error":
            try:
                leak_check(train, other, name)
            except ValueError as error:
                raise ValueError(
                    f"{error}; or drop them from training with --leaks drop (data.init_args.leaks)"
                ) from None
            return train
        held = {canonical_key(codes) for codes in other.codes}
        keep = [i for i, codes in enumerate(train.codes) if canonical_key(codes) not in held]
        if len(keep) < len(train):
            print(f"dropped {len(train) - len(keep):,} training sequences that also occur in the {name} data")
        return train.subset(keep)

    def _read_tracks(self) -> None:
        if self.task == "annotate":
            if self.val_files:
                train, val = self._tracks(self.train_files), self._tracks(self.val_files)
            else:
                kept, held = region_holdout(
                    read_annotated_genomes(self.train_files, genome=self.genome),
                    self.val_fraction,
                    gap=self.window,
                    seed=self.seed,
                )
                train, val = contig_tracks(kept), contig_tracks(held)
            self.target_space = TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)
        else:
            if self.genome is None:
                raise ValueError("a bedGraph track needs the genome it refers to: pass --genome FASTA|STORE")
            train = self._tracks(self.train_files)
            if self.val_files:
                val = self._tracks(self.val_files)
            else:
                train, val = _hold_out_track_regions(train, self.val_fraction, gap=self.window)
            values = np.concatenate([t.targets[np.isfinite(t.targets)] for t in train]).astype(np.float64)
            self.target_space = TargetSpace(
                TargetKind.BASE_VALUES, ("signal",), mean=[values.mean()], std=[max(values.std(), 1e-8)]
            )
        _check_no_shared_contigs(train, val, "validation")
        self.splits = {"train": train, "val": val}
        if self.test_files:
            self.splits["test"] = self._tracks(self.test_files)
            _check_no_shared_contigs(train, self.splits["test"], "test")
        bases = sum(len(t.codes) for t in train)
        print(
            f"training data: {len(train):,} contigs, {bases:,} bases; "
            f"validation {sum(len(t.codes) for t in val):,} bases"
        )
        if self.target_space.kind is TargetKind.BASE_CLASSES:
            counts = np.bincount(np.concatenate([t.targets for t in train]), minlength=len(ANNOTATION_CLASSES))
            shares = ", ".join(f"{name} {count / max(1, bases):.1%}" for name, count in zip(ANNOTATION_CLASSES, counts))
            print(f"training bases per class: {shares}")

    def _tracks(self, files: Sequence[str]) -> list[Track]:
        """Per-base tracks of `files`: gene classes (annotate) or signal values (regress)."""
        if self.task == "annotate":
            return contig_tracks(read_annotated_genomes(files, genome=self.genome))
        return [Track(*track) for file in files for track in read_signal_tracks(file, genome=self.genome)]

    # ----------------------------------------------------------------- loaders
    def _dataset(self, split: str) -> Dataset:
        data = self.splits[split]
        if not self.per_base:
            return SequenceDataset(data, shuffle=split == "train", seed=self.seed)
        if split == "train":
            return RandomTrackWindows(data, self.window, self.samples_per_epoch, seed=self.seed)
        return TiledTrackWindows(data, self.window)

    def train_dataloader(self) -> DataLoader:
        return self._split_loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._split_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._split_loader("test")

    def _split_loader(self, split: str) -> DataLoader:
        dataset = self._dataset(split)
        if split == "train" and len(dataset) < self.batch_size:
            raise ValueError(
                f"{len(dataset)} training samples are fewer than batch_size={self.batch_size}; lower --batch_size"
            )
        return self._loader(dataset, split == "train", pad_windows if self.per_base else pad_sequences)


def _is_bedgraph(files: Sequence[str]) -> bool:
    return all(str(f).lower().endswith(BEDGRAPH_SUFFIXES) for f in files)


def _check_no_shared_contigs(train: Sequence[Track], other: Sequence[Track], what: str) -> None:
    """A per-base split leaks when the same sequence is in both: refuse contigs that are equal
    (either strand) to a training contig."""
    seen = {t.codes.tobytes() for t in train} | {reverse_complement(t.codes).tobytes() for t in train}
    shared = [t.name for t in other if t.codes.tobytes() in seen]
    if shared:
        raise ValueError(
            f"{len(shared)} {what} contig(s) are also in the training data ({', '.join(shared[:3])}); "
            f"give {what} files of another genome, or leave --val out to hold out regions of training"
        )


def _hold_out_track_regions(tracks: list[Track], fraction: float, *, gap: int) -> tuple[list[Track], list[Track]]:
    """The last `fraction` of each track's bases held out, `gap` bases dropped between the parts."""
    kept, held = [], []
    for track in tracks:
        cut = int(len(track.codes) * (1.0 - fraction))
        if cut - gap < 1:
            kept.append(track)
            continue
        kept.append(Track(f"{track.name}:0-{cut - gap}", track.codes[: cut - gap], track.targets[: cut - gap]))
        held.append(Track(f"{track.name}:{cut}-{len(track.codes)}", track.codes[cut:], track.targets[cut:]))
    if not held:
        raise ValueError("the tracks are too short to hold out a validation region; pass --val FILE")
    return kept, held
