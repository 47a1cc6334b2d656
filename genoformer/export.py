"""`genoformer export`: a small, portable copy of a training checkpoint for sharing and inference.

A Lightning checkpoint of `genoformer fit` carries the optimizer's moments, the schedule and the
loop state as well as the weights: three to four times the model's size. The exported file keeps
what rebuilds the model (hyperparameters, weights, trained context) in the same .ckpt layout, so
`Embedder.from_checkpoint`, `genoformer evaluate` and `GenoformerLM.load_from_checkpoint` read it
unchanged; it cannot resume training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from genoformer.data.storage import atomic_build, refuse_existing

from genoformer.embeddings import Embedder

KEPT_KEYS = ("state_dict", "hyper_parameters", "trained_seq_len", "pytorch-lightning_version", "epoch", "global_step")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export(
    *,
    checkpoint: Path,
    out: Path,
    dtype: Literal["float32", "bfloat16", "float16"] = "float32",
    overwrite: bool = False,
) -> Path:
    """Write the weights and configuration of a training checkpoint without optimizer state.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit`.
        out: The exported .ckpt file.
        dtype: Storage type of floating-point weights (bfloat16 halves the file; the model is
            cast back to float32 when it is loaded on a CPU).
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    Embedder.from_checkpoint(checkpoint, device="cpu")  # a clear error now if it is not ours
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    exported = {key: state[key] for key in KEPT_KEYS if key in state}
    exported["state_dict"] = {
        name: tensor.to(DTYPES[dtype]) if tensor.is_floating_point() else tensor
        for name, tensor in state["state_dict"].items()
    }
    with atomic_build(out, overwrite) as tmp:
        torch.save(exported, tmp)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {dtype} weights)")
    return out
