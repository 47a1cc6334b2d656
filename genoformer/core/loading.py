"""Loading a model: any checkpoint (a .ckpt file, a directory of `genoformer export --format hf`, a
Hub id, a run directory or a pretrained model's name) read into what it holds.

Above both readers: genoformer.core.checkpoints (the .ckpt conventions and `resolve_checkpoint`)
and genoformer.core.hf (Hugging Face directories) build on nothing here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from genoformer.core.checkpoints import ModelKind, checkpoint_kind, read_checkpoint, resolve_checkpoint
from genoformer.core.hf import read_hf_checkpoint


def read_model_checkpoint(path: Union[str, Path], kind: ModelKind) -> tuple[dict, dict]:
    """(checkpoint, hyper_parameters) of a checkpoint of `kind`, from a .ckpt file, from a Hugging
    Face directory of `genoformer export --format hf` (safetensors and JSON, nothing unpickled) or
    from a Hub id of such a directory; ValueError saying what the file holds and which commands
    read it otherwise."""
    path = resolve_checkpoint(path)
    if path.is_dir():
        checkpoint, _ = read_hf_checkpoint(path)
    else:
        checkpoint = read_checkpoint(path)
    found = checkpoint_kind(checkpoint) if isinstance(checkpoint, dict) else None
    if found is None:
        raise ValueError(
            f"{path} is not a genoformer model checkpoint (no model tag, hyperparameters or weights); pass a "
            f".ckpt file written by `genoformer fit` or `genoformer export`."
        )
    if found is not kind:
        raise ValueError(
            f"{path} holds {found.description}, not {kind.description}; it is read by {found.readers}."
        )
    return checkpoint, dict(checkpoint["hyper_parameters"])
