"""The inference policy every trained model runs under: device, autocast, weights, pooling.

Every inference class is an `InferenceModel`: `Embedder`, `Scorer`, `Generator`,
`SequencePredictor`, `GeneAnnotator` (genome wing) and `Forecaster` (time-series wing). They load
through one `from_checkpoint` (genoformer.core.loading.load_model: any checkpoint, its kind checked,
the network the class builds, the weights loaded) and run trained weights the same way: on
`inference_device` (CUDA when there is one), under bfloat16 autocast on CUDA (as training runs, and
as the Triton kernels need) and float32 elsewhere, with runtime settings for inference
(`RuntimeSettings.for_inference`, position-wise work in chunks of `INFERENCE_CHUNK`); per-token
vectors are pooled with `Pooling`.

Shape legend: T tokens of one sequence, E model width, X sequences.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Union

import numpy as np
import torch
from torch import nn

from genoformer.core.checkpoints import ModelKind
from genoformer.core.loading import LoadedModel, load_model
from genoformer.core.pooling import Pooling
from genoformer.core.runtime import RuntimeSettings
from genoformer.hints import option
from genoformer.kernels.dispatch import Backend

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

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


class InferenceModel:
    """Base of the inference classes: the policy (device, autocast) and the one `from_checkpoint`.

    A subclass names the `kind` it reads, `build`s its network from a checkpoint's hyperparameters
    and makes itself `from_loaded` (the loaded model plus its own options)."""

    kind: ClassVar[ModelKind]
    prefix: ClassVar[str] = "model."
    """Where the training module saved the network's weights ("model.": its `self.model`; "": all of it)."""

    def __init__(self, device: Optional[Union[str, torch.device]], autocast_dtype: Optional[torch.dtype]) -> None:
        """device None: CUDA when available, else CPU; autocast_dtype None: bfloat16 on CUDA, float32 elsewhere."""
        self.device = inference_device(device)
        self.autocast_dtype = default_autocast_dtype(self.device, autocast_dtype)

    def on_device(self, network: nn.Module) -> nn.Module:
        """`network` on this model's device, in eval mode."""
        return network.to(self.device).eval()

    @classmethod
    def check(cls, checkpoint: dict[str, Any], name: str) -> None:
        """Refuse the checkpoint `name` if this class cannot run it (ValueError saying what to do)."""

    @classmethod
    def build(cls, hparams: dict[str, Any], runtime: RuntimeSettings) -> nn.Module:
        """The network of a checkpoint with these hyperparameters (its weights are loaded after)."""
        raise NotImplementedError

    @classmethod
    def from_loaded(
        cls,
        loaded: LoadedModel,
        *,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
        **options: Any,
    ) -> Self:
        """This class running `loaded` (`options`: the class's own, such as a Scorer's mask_period)."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: Union[str, Path], backend: Backend = Backend.AUTO) -> LoadedModel:
        """The model of checkpoint `path` as this class reads it, on the CPU, attention through `backend`."""
        runtime = RuntimeSettings.for_inference(backend, sequence_chunk=INFERENCE_CHUNK)
        return load_model(path, cls.kind, cls.build, runtime, prefix=cls.prefix, check=cls.check)

    @classmethod
    def from_checkpoint(
        cls,
        path: Union[str, Path],
        device: Optional[Union[str, torch.device]] = None,
        backend: Backend = Backend.AUTO,
        autocast_dtype: Optional[torch.dtype] = None,
        **options: Any,
    ) -> Self:
        """Load a checkpoint to run: a .ckpt file, a run directory (its best checkpoint), RUN_DIR/best or
        RUN_DIR/last, a directory of `genoformer export --format hf`, a pretrained model's name or a
        Hub id (genoformer.core.checkpoints.resolve_checkpoint); a checkpoint of another kind is
        refused, naming the commands that read it.

        Args:
            path: the checkpoint.
            device: where to run; None: CUDA when available, else CPU.
            backend: attention backend to run with (the training backend may not exist here);
                AUTO picks per device.
            autocast_dtype: None: bfloat16 autocast on CUDA (as in training, and as the Triton
                kernels need), float32 on the CPU.
            options: the class's own options (see its constructor).
        """
        return cls.from_loaded(cls.load(path, backend), device=device, autocast_dtype=autocast_dtype, **options)


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
