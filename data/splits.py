"""Train/validation/test splits without leakage, as lists of half-open intervals.

A split holds out whole source files, whole contigs (or time series), or a region at the end of
every contig. Datasets draw each window inside one interval, so no window crosses a split
boundary. For ``by="region"`` each sequence of length L is cut in order as
``train [0, a) | val [a, b) | test [b, L)`` with ``L - a = round(L * (val_fraction + test_fraction))``
and ``L - b = round(L * test_fraction)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, Optional

SPLITS = ("train", "val", "test")


class Interval(NamedTuple):
    """Positions [start, end) of sequence ``index`` (a contig, or a time series)."""

    index: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


class SequenceSource(NamedTuple):
    """What a split needs to know about one sequence: its name, length and source file name."""

    name: str
    length: int
    source_name: str


@dataclass
class SplitSpec:
    """How to hold out validation and test data.

    Attributes:
        by: "region" (the last fractions of every contig/series), "contigs" (whole contigs or
            series by name) or "files" (every record of the named source files).
        val_fraction: With by="region": fraction of each sequence for validation.
        test_fraction: With by="region": fraction of each sequence for test (at the very end).
        val: With by="contigs"/"files": names (contig names, or source file names or paths).
        test: Like ``val``, for the test split.
    """

    by: Literal["region", "contigs", "files"] = "region"
    val_fraction: float = 0.05
    test_fraction: float = 0.0
    val: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.by not in ("region", "contigs", "files"):
            raise ValueError(f"split by={self.by!r}: use 'region', 'contigs' or 'files'")
        if not (0 <= self.val_fraction and 0 <= self.test_fraction and self.val_fraction + self.test_fraction < 1):
            raise ValueError(
                f"val_fraction={self.val_fraction} and test_fraction={self.test_fraction} must be "
                ">= 0 and sum to less than 1"
            )
        if self.by == "region" and (self.val or self.test):
            raise ValueError("split val/test name lists need by='contigs' or by='files', not by='region'")
        overlap = set(self.val) & set(self.test)
        if overlap:
            raise ValueError(f"{sorted(overlap)} are in both the val and the test split")


def split_intervals(sequences: Sequence[SequenceSource], spec: SplitSpec) -> dict[str, list[Interval]]:
    """Intervals of each split ("train", "val", "test") for these sequences (indices in order)."""
    result: dict[str, list[Interval]] = {name: [] for name in SPLITS}
    if spec.by == "region":
        for index, seq in enumerate(sequences):
            held_out = round(seq.length * (spec.val_fraction + spec.test_fraction))
            test_len = round(seq.length * spec.test_fraction)
            a, b = seq.length - held_out, seq.length - test_len
            for name, lo, hi in (("train", 0, a), ("val", a, b), ("test", b, seq.length)):
                if hi > lo:
                    result[name].append(Interval(index, lo, hi))
        return result

    def key_names(seq: SequenceSource) -> set[str]:
        return {seq.name} if spec.by == "contigs" else {seq.source_name}

    known = set().union(*(key_names(s) for s in sequences)) if sequences else set()
    for split_name, names in (("val", spec.val), ("test", spec.test)):
        wanted = {name.rsplit("/", 1)[-1] if spec.by == "files" else name for name in names}
        missing = wanted - known
        if missing:
            raise ValueError(
                f"split {split_name}: {sorted(missing)} not found among the "
                f"{'contig names' if spec.by == 'contigs' else 'source file names'} "
                f"{sorted(known)[:20]}"
            )
    val = {n.rsplit("/", 1)[-1] if spec.by == "files" else n for n in spec.val}
    test = {n.rsplit("/", 1)[-1] if spec.by == "files" else n for n in spec.test}
    for index, seq in enumerate(sequences):
        keys = key_names(seq)
        name = "val" if keys & val else "test" if keys & test else "train"
        result[name].append(Interval(index, 0, seq.length))
    return result


SplitName = Literal["train", "val", "test"]
"""The splits a command may read (--split)."""


def read_split_spec(config: Optional[Path]) -> Optional[SplitSpec]:
    """The data split of a training config (`data.init_args.split` of a `genoformer fit` config,
    its `include:` fragments merged, or of a run's config.yaml); None without a config. A config
    whose data section has no split uses the data module's default, ``SplitSpec()``."""
    if config is None:
        return None
    from genoformer.shipped import compose_config  # only a config needs jsonargparse (not DataLoader workers)

    config = Path(config)
    if not config.is_file():
        raise FileNotFoundError(
            f"split config not found: {config}; give the YAML the model was trained with "
            "(a `genoformer fit` config, or config.yaml in its run directory)"
        )
    content = compose_config(config)
    data = content.get("data") if isinstance(content, dict) else None
    if not isinstance(data, dict):
        raise ValueError(
            f"{config} has no `data:` section, so it holds no data split; give the YAML the model was "
            "trained with (a `genoformer fit` config, or config.yaml in its run directory)"
        )
    arguments = data.get("init_args", data)
    split = arguments.get("split") if isinstance(arguments, dict) else None
    if split is None:
        return SplitSpec()
    try:
        return SplitSpec(**split)
    except TypeError as error:
        raise ValueError(
            f"{config}: data split {split!r} is not a SplitSpec ({error}); its keys are by, "
            "val_fraction, test_fraction, val and test"
        ) from error
