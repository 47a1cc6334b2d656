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
from typing import Literal, Optional

import torch

from genoformer.core.checkpoints import (
    TAG_KEY,
    canonical_state_dict,
    checkpoint_kind,
    read_checkpoint,
    resolve_checkpoint,
    tag,
    write_checkpoint,
)
from genoformer.core.hf import export_hf
from genoformer.core.runtime import RUNTIME_FIELDS
from genoformer.data.storage import refuse_existing

KEPT_KEYS = (
    "state_dict",
    "hyper_parameters",
    "trained_seq_len",
    "alphabet",
    "pytorch-lightning_version",
    "epoch",
    "global_step",
    TAG_KEY,
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export(
    *,
    checkpoint: Path,
    out: Path,
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
    format: Literal["ckpt", "hf"] = "ckpt",
    reports: Optional[list[Path]] = None,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint's weights and configuration without optimizer state: a .ckpt or a Hugging Face directory.

    Args:
        checkpoint: Any kind of genoformer model: a .ckpt file (`genoformer fit` or `finetune`), a run
            directory (its best checkpoint), RUN_DIR/best or RUN_DIR/last, or a pretrained model's name.
        out: The exported .ckpt file, or with --format hf the directory to create.
        dtype: Storage type of floating-point weights; auto: as the checkpoint stores them
            (bfloat16 halves a float32 file; the model is cast back to float32 when it is loaded
            on a CPU).
        format: ckpt (the same .ckpt layout) or hf (a Hugging Face directory: config.json,
            model.safetensors, modeling file for transformers' trust_remote_code, tokenizer for
            DNA models, model card); every kind of model exports both ways.
        reports: With --format hf: JSON reports of `genoformer evaluate --out` and `genoformer
            baseline --out` whose bits per base the model card shows.
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    checkpoint = resolve_checkpoint(checkpoint)
    if format == "hf":
        if dtype == "float16":
            raise ValueError("--format hf stores float32 or bfloat16 weights; pass --dtype bfloat16 or float32")
        return export_hf(checkpoint, out, dtype=dtype, reports=reports or [], overwrite=overwrite)
    if reports:
        raise ValueError("--reports go into the model card of --format hf; a .ckpt export has no card")
    refuse_existing(out, overwrite)
    state = read_checkpoint(checkpoint)
    kind = checkpoint_kind(state)
    if kind is None:
        raise ValueError(
            f"{checkpoint} is not a genoformer model checkpoint (no model tag, hyperparameters or "
            "weights); pass a .ckpt file written by `genoformer fit`."
        )
    exported = {key: state[key] for key in KEPT_KEYS if key in state}
    architecture = exported["hyper_parameters"].get("transformer")
    if isinstance(architecture, dict):  # runtime settings that older checkpoints stored there
        exported["hyper_parameters"]["transformer"] = {k: v for k, v in architecture.items() if k not in RUNTIME_FIELDS}
    exported["state_dict"] = {
        name: tensor.to(DTYPES[dtype]) if tensor.is_floating_point() and dtype != "auto" else tensor
        for name, tensor in canonical_state_dict(state["state_dict"]).items()
    }
    tag(exported, kind)
    write_checkpoint(exported, out, overwrite=overwrite)
    print(
        f"wrote {out} ({kind.description}, {out.stat().st_size / 2**20:.1f} MiB, {'stored' if dtype == 'auto' else dtype} weights)"
    )
    return out
