"""`genoformer export`: a small, portable copy of a training checkpoint for sharing and inference.

A Lightning checkpoint of `genoformer fit` carries the optimizer's moments, the schedule and the
loop state as well as the weights: three to four times the model's size. The exported file keeps
what rebuilds the model (its kind tag, hyperparameters, weights, trained context) in the same
.ckpt layout, so whatever reads the training checkpoint (`Embedder.from_checkpoint`, `genoformer
evaluate`, `Forecaster.from_checkpoint`, `GenoformerLM.load_from_checkpoint`) reads the export
unchanged; it cannot resume training. Any kind of model exports, and a checkpoint written before
kind tags existed comes out tagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from genoformer.core.checkpoints import TAG_KEY, canonical_state_dict, checkpoint_kind, read_checkpoint, tag
from genoformer.core.hf import export_hf
from genoformer.core.runtime import RUNTIME_FIELDS
from genoformer.data.storage import atomic_build, refuse_existing

KEPT_KEYS = ("state_dict", "hyper_parameters", "trained_seq_len", "alphabet", "pytorch-lightning_version", "epoch",
             "global_step", TAG_KEY)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export(
    *,
    checkpoint: Path,
    out: Path,
    dtype: Literal["float32", "bfloat16", "float16"] = "float32",
    format: Literal["ckpt", "hf"] = "ckpt",
    overwrite: bool = False,
) -> Path:
    """Write the weights and configuration of a training checkpoint without optimizer state.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit` (any kind of model).
        out: The exported .ckpt file, or with --format hf the directory to create.
        dtype: Storage type of floating-point weights (bfloat16 halves the file; the model is
            cast back to float32 when it is loaded on a CPU).
        format: ckpt (the same .ckpt layout, any kind of model) or hf (a Hugging Face directory:
            config.json, model.safetensors, tokenizer, modeling file for transformers'
            trust_remote_code, model card; DNA language models with dense attention for now).
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    if format == "hf":
        if dtype == "float16":
            raise ValueError("--format hf stores float32 or bfloat16 weights; pass --dtype bfloat16 or float32")
        return export_hf(checkpoint, out, dtype=dtype, overwrite=overwrite)
    refuse_existing(out, overwrite)
    state = read_checkpoint(checkpoint)
    kind = checkpoint_kind(state)
    if kind is None:
        raise ValueError(f"{checkpoint} is not a genoformer model checkpoint (no model tag, hyperparameters or "
                         "weights); pass a .ckpt file written by `genoformer fit`.")
    exported = {key: state[key] for key in KEPT_KEYS if key in state}
    architecture = exported["hyper_parameters"].get("transformer")
    if isinstance(architecture, dict):  # runtime settings that older checkpoints stored there
        exported["hyper_parameters"]["transformer"] = {k: v for k, v in architecture.items() if k not in RUNTIME_FIELDS}
    exported["state_dict"] = {
        name: tensor.to(DTYPES[dtype]) if tensor.is_floating_point() else tensor
        for name, tensor in canonical_state_dict(state["state_dict"]).items()
    }
    tag(exported, kind)
    with atomic_build(out, overwrite) as tmp:
        torch.save(exported, tmp)
    print(f"wrote {out} ({kind.description}, {out.stat().st_size / 2**20:.1f} MiB, {dtype} weights)")
    return out
