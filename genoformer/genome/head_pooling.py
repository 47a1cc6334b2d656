"""How a sequence head pools the per-base features (`HeadPooling`), importable without torch: the
`finetune` command parses it before anything runs; `genoformer.genome.heads` pools."""

from __future__ import annotations

import enum


class HeadPooling(str, enum.Enum):
    """How a sequence head pools the per-base features (YAML: the member name, e.g. `pooling:
    MEAN`; Python and the `finetune` command also take it in lower case)."""

    MEAN = "MEAN"
    """Mean over the real bases (padding left out)."""
    LAST = "LAST"
    """The state that has seen the whole sequence: the last base of a causal model (on both strands:
    the last base of the forward reading and of the reverse-complement reading)."""
    ATTENTION = "ATTENTION"
    """A weighted mean with weights from a learned query (softmax over the real bases)."""

    @classmethod
    def _missing_(cls, value: object) -> HeadPooling | None:
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None
