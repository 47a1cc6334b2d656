"""The inference policy every trained model runs under: device, autocast, weights, pooling.

`Embedder`, `Scorer` (genome wing) and `Forecaster` (time-series wing) run trained weights the
same way: on `inference_device` (CUDA when there is one), under bfloat16 autocast on CUDA (as
training runs, and as the Triton kernels need) and float32 elsewhere, with runtime settings for
inference (`RuntimeSettings.for_inference`, position-wise work in chunks of `INFERENCE_CHUNK`),
and pool per-token vectors with `Pooling`.

Shape legend: T tokens of one sequence, E model width, X sequences.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Union

import numpy as np
import torch
from torch import nn

from genoformer.core.checkpoints import canonical_state_dict
from genoformer.core.pooling import Pooling
from genoformer.hints import option

INFERENCE_CHUNK = 1 << 16
"""Positions per chunk of the position-wise work when trained weights run (the runtime's
sequence_chunk): a window of a whole chromosome holds the large intermediates (SwiGLU, float32
rotations, logits) of this many positions at a time; a window of up to this many runs as one."""


def inference_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """The device to run a trained model on: `device`, or CUDA when available, else the CPU; a
    clear error when CUDA is asked for and this torch build sees no GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {str(device)!r} asks for a CUDA GPU, but this torch build ({torch.__version__}) sees "
            f"none; pass {option('device', 'cpu')} to run on the CPU, or leave device unset to pick CUDA "
            "when it is available."
        )
    return resolved


def default_autocast_dtype(device: torch.device, autocast_dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """`autocast_dtype`, or bfloat16 on CUDA (as training runs, and as the Triton kernels need),
    None (full float32) elsewhere."""
    if autocast_dtype is None and device.type == "cuda":
        return torch.bfloat16
    return autocast_dtype


def autocast(device: torch.device, autocast_dtype: Optional[torch.dtype]) -> torch.autocast:
    """The autocast context for running a model under the policy (disabled when dtype is None)."""
    return torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None)


def load_module_weights(network: nn.Module, checkpoint: Mapping, prefix: str = "model.") -> None:
    """Load the weights a training module saved under `prefix` (its `self.model`) into `network`."""
    state_dict = canonical_state_dict(checkpoint["state_dict"])
    network.load_state_dict({key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)})


def pool_tokens(hidden_XTE: np.ndarray, pooling: Pooling) -> np.ndarray:
    """Pool per-token vectors (X, T, E) of X sequences of one length: (X, E), or as they are for NONE."""
    if pooling is Pooling.NONE:
        return hidden_XTE
    if pooling is Pooling.MEAN:
        return hidden_XTE.mean(axis=1, dtype=np.float64).astype(np.float32)
    if pooling is Pooling.MAX:
        return hidden_XTE.max(axis=1)
    if pooling is Pooling.FIRST:
        return hidden_XTE[:, 0]
    return hidden_XTE[:, -1]


class PoolAccumulator:
    """Pools one sequence's per-token vectors as they arrive in pieces (stitched windows), so a
    long sequence never needs all its vectors at once unless pooling is NONE."""

    def __init__(self, pooling: Pooling, length: int, width: int) -> None:
        self.pooling = pooling
        self.length = length
        if pooling is Pooling.NONE:
            self.value = np.empty((length, width), dtype=np.float32)
        elif pooling is Pooling.MEAN:
            self.value = np.zeros(width, dtype=np.float64)
        elif pooling is Pooling.MAX:
            self.value = np.full(width, -np.inf, dtype=np.float32)
        else:
            self.value = np.empty(width, dtype=np.float32)

    def add(self, start: int, vectors_PE: np.ndarray) -> None:
        """Positions [start, start + P) of the sequence."""
        if self.pooling is Pooling.NONE:
            self.value[start : start + len(vectors_PE)] = vectors_PE
        elif self.pooling is Pooling.MEAN:
            self.value += vectors_PE.sum(axis=0, dtype=np.float64)
        elif self.pooling is Pooling.MAX:
            np.maximum(self.value, vectors_PE.max(axis=0), out=self.value)
        elif self.pooling is Pooling.FIRST and start == 0:
            self.value[:] = vectors_PE[0]
        elif self.pooling is Pooling.LAST and start + len(vectors_PE) == self.length:
            self.value[:] = vectors_PE[-1]

    def result(self) -> np.ndarray:
        if self.pooling is Pooling.MEAN:
            return (self.value / self.length).astype(np.float32)
        return self.value
