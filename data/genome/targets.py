"""The one vocabulary of fine-tuning: what a user asks for (`Task`: the --task of `genoformer
finetune`), what a model predicts (`TargetKind`) and the targets of one model (`TargetSpace`, saved
with it). A task becomes a kind by its data: classify gives one class per sequence
(SEQUENCE_CLASSES) or several labels (SEQUENCE_LABELS), regress values per sequence
(SEQUENCE_VALUES) or per base from a signal track (BASE_VALUES), annotate gene classes per base
(BASE_CLASSES).

A new kind of target touches three files: its member here, with what the head's outputs become
(`TargetKind.readout`) and what its predictions say in words (`TargetSpace.predicted`), and its
task when it has one of its own (`Task`); its loss and metrics in genoformer/genome/finetune.py
(`FineTuner.loss`, `split_metrics`); and the reader that gives labelled data of that kind
(genoformer.data.genome.labels, or .annotations per base). docs/extending.md shows one whole."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Task = Literal[
    "classify",
    "regress",
    "annotate",
]
"""What `genoformer finetune --task` asks for."""


class TargetKind(str, enum.Enum):
    """What a fine-tuned model predicts."""

    SEQUENCE_CLASSES = "sequence_classes"
    """One class per sequence (binary or multi-class): softmax over the classes."""
    SEQUENCE_LABELS = "sequence_labels"
    """Any number of labels per sequence (multi-label): one sigmoid per label."""
    SEQUENCE_VALUES = "sequence_values"
    """One or more numbers per sequence (regression)."""
    BASE_CLASSES = "base_classes"
    """One class per base (a label track, e.g. coding on each strand)."""
    BASE_VALUES = "base_values"
    """One number per base (a signal track)."""

    @property
    def per_base(self) -> bool:
        return self in (TargetKind.BASE_CLASSES, TargetKind.BASE_VALUES)

    @property
    def classes(self) -> bool:
        return self in (TargetKind.SEQUENCE_CLASSES, TargetKind.BASE_CLASSES)

    @property
    def probabilities(self) -> bool:
        """Whether the predictions are probabilities (of classes or labels) rather than values."""
        return self.classes or self is TargetKind.SEQUENCE_LABELS

    @property
    def column_prefix(self) -> str:
        """What the output columns of a prediction table are named after a target: p_ for probabilities, y_ for values."""
        return "p_" if self.probabilities else "y_"

    def readout(self, outputs: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Predictions (float32) from the head's outputs (..., K): probabilities of the classes
        (softmax) or of each label (sigmoid), or values in the data's units (the head predicts
        them standardised by the training data's `mean` and `std`)."""
        if self.classes:
            return outputs.float().softmax(dim=-1)
        if self is TargetKind.SEQUENCE_LABELS:
            return outputs.float().sigmoid()
        return outputs.float() * std + mean


@dataclasses.dataclass(frozen=True)
class TargetSpace:
    """The targets a data module serves and a fine-tuned model predicts (saved with the model).

    `names`: the classes in index order, or one name per label or value. `strand_swap`: for each
    class, the class it becomes on the other strand (per-base classes; identity otherwise).
    `mean`, `std`: of each value target in training (the model predicts standardised values).
    """

    kind: TargetKind
    names: tuple[str, ...]
    strand_swap: tuple[int, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TargetKind(self.kind))
        for field in ("names", "strand_swap", "mean", "std"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        # class names stay text through hyperparameter files (YAML reads a bare 0 as a number)
        object.__setattr__(self, "names", tuple(str(name) for name in self.names))
        if not self.names:
            raise ValueError("a target space needs at least one class, label or value name")
        if self.kind.classes and len(self.names) < 2:
            raise ValueError(f"classification needs at least 2 classes, got {list(self.names)}")

    @property
    def outputs(self) -> int:
        """Outputs of the head: one per class, label or value."""
        return len(self.names)

    def swap(self) -> tuple[int, ...]:
        """The class permutation under reverse complement (identity unless strand_swap is set)."""
        return self.strand_swap or tuple(range(self.outputs))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, **{k: list(getattr(self, k)) for k in ("names", "strand_swap", "mean", "std")}}

    def predicted(self, outputs_NK: np.ndarray) -> list[str]:
        """Per sequence, the prediction in words from its outputs (N, K): the most probable class;
        the labels with probability >= 0.5 (joined by ","); or the values (joined by ",")."""
        if self.kind is TargetKind.SEQUENCE_CLASSES:
            return [self.names[i] for i in outputs_NK.argmax(1)]
        if self.kind is TargetKind.SEQUENCE_LABELS:
            return [",".join(n for n, p in zip(self.names, row) if p >= 0.5) for row in outputs_NK]
        return [",".join(f"{v:.6g}" for v in row) for row in outputs_NK]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TargetSpace:
        return cls(**values)
