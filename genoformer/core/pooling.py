"""How an embedding pools the per-token vectors of one sequence (`Pooling`), importable without
torch: the commands parse it before anything runs; `genoformer.core.inference` pools.

Shape legend: T tokens of one sequence, E model width.
"""

from __future__ import annotations

import enum


class Pooling(str, enum.Enum):
    """How per-token vectors of one sequence become its embedding."""

    MEAN = "mean"
    """Mean over all positions: (E,)."""
    MAX = "max"
    """Element-wise maximum over all positions: (E,)."""
    FIRST = "first"
    """The first position: (E,). With causal attention it has seen one token only."""
    LAST = "last"
    """The last position: (E,). With causal attention it has seen the whole window."""
    NONE = "none"
    """Every position: (T, E)."""
