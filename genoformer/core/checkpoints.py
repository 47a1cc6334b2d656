"""Checkpoints: one reader and one writer's conventions for every model genoformer trains.

A genoformer checkpoint is a Lightning checkpoint (`torch.save` of plain values and tensors)
with these conventions, kept by `genoformer.core.training.TrainingModule` when it saves:

- `checkpoint["genoformer"] == {"kind": ..., "format_version": FORMAT_VERSION}`: what the file
  holds (`ModelKind`), so a command given the wrong kind says which command reads it instead of
  failing inside `load_state_dict`.
- `state_dict` keys are canonical: without torch.compile's `_orig_mod.` wrapper prefix, so a
  compiled model's checkpoint loads into a plain one and the other way round.
- `hyper_parameters` describe what the model is, never how it ran (`genoformer.core.runtime`).

Checkpoints written before the tag existed (format version 0) are recognised by their
hyperparameters once, here (`checkpoint_kind`), and nowhere else.

Reading a .ckpt unpickles it, but only plain containers and tensors
(`torch.load(weights_only=True)`), so a checkpoint cannot run code when it is loaded. A Hugging
Face directory of `genoformer export --format hf` is read without unpickling anything
(safetensors and JSON), and so is a Hub model named by its id (`owner/name`, downloaded through
huggingface_hub): prefer those for models from other people.
"""

from __future__ import annotations

import enum
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import torch

FORMAT_VERSION = 1
"""Version of the conventions above written into every checkpoint's "genoformer" entry."""
TAG_KEY = "genoformer"
COMPILED_PREFIX = "_orig_mod."
"""What torch.compile's wrapper module inserts into parameter names."""
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
"""A Hugging Face Hub model id (owner/name), read when no local path of that name exists."""


class ModelKind(str, enum.Enum):
    """What a checkpoint holds; each kind names the commands that read it."""

    GENOME_LM = "genome_lm"
    """A DNA language model (genoformer.genome.lm.GenoformerLM)."""
    FORECASTER = "forecaster"
    """A time-series forecaster (genoformer.timeseries.module.TimeSeriesForecaster)."""
    GENOME_FINETUNED = "genome_finetuned"
    """A DNA model fine-tuned on labels: classifier, regressor or annotator (genoformer.genome.finetune.FineTuner)."""

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self][0]

    @property
    def readers(self) -> str:
        return _DESCRIPTIONS[self][1]


_DESCRIPTIONS = {
    ModelKind.GENOME_LM: (
        "a DNA language model",
        "genoformer embed, score, evaluate, variant_effect, mutagenesis, generate (Python: genoformer.genome.embeddings.Embedder)",
    ),
    ModelKind.GENOME_FINETUNED: (
        "a fine-tuned DNA model (classifier, regressor or gene annotator)",
        "genoformer classify, annotate (Python: genoformer.genome.predict.SequencePredictor, GeneAnnotator)",
    ),
    ModelKind.FORECASTER: (
        "a time-series forecaster",
        "genoformer forecast, evaluate_forecast (Python: genoformer.timeseries.forecaster.Forecaster)",
    ),
}

_UNREADABLE_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError)
"""What torch.load raises for a file that is not a complete checkpoint of plain values and tensors."""


def canonical_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with torch.compile's `_orig_mod.` left out of every key."""
    return {key.replace(COMPILED_PREFIX, ""): value for key, value in state_dict.items()}


def tag(checkpoint: dict[str, Any], kind: ModelKind) -> None:
    """Mark `checkpoint` (as Lightning is about to save it) as holding `kind`, with canonical keys."""
    checkpoint[TAG_KEY] = {"kind": ModelKind(kind).value, "format_version": FORMAT_VERSION}
    checkpoint["state_dict"] = canonical_state_dict(checkpoint["state_dict"])


def checkpoint_kind(checkpoint: Mapping[str, Any]) -> ModelKind | None:
    """The kind a checkpoint holds: its tag, or for an untagged one (format version 0) what its
    hyperparameters show; None when neither tells."""
    tagged = checkpoint.get(TAG_KEY)
    if isinstance(tagged, Mapping):
        version = tagged.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(
                f"the checkpoint has genoformer checkpoint format {version!r}; this genoformer reads formats up to "
                f"{FORMAT_VERSION}: upgrade genoformer to read it"
            )
        try:
            return ModelKind(tagged.get("kind"))
        except ValueError:
            return None
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, Mapping) or "state_dict" not in checkpoint:
        return None
    if "forecast" in hparams and "transformer" in hparams:
        return ModelKind.FORECASTER
    if "objective" in hparams and "transformer" in hparams:
        return ModelKind.GENOME_LM
    return None


def check_checkpoint_file(path: Union[str, Path]) -> Path:
    """`path` as a Path when it looks like a checkpoint file (exists, complete zip container, as
    torch.save writes); FileNotFoundError or ValueError, in our words, otherwise. Cheap: reads the
    end of the file only."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path}; pass the .ckpt file written by training "
            "(e.g. <run dir>/checkpoints/last.ckpt)."
        )
    if not zipfile.is_zipfile(path):
        raise _unreadable_error(path)
    return path


def read_checkpoint(path: Union[str, Path]) -> dict:
    """The contents of a checkpoint file (tensors on the CPU), unpickling plain values only.

    FileNotFoundError for a missing file; ValueError, in our words, for a file torch cannot read
    (truncated, or not a checkpoint) or one that holds objects other than plain values and tensors.
    """
    path = check_checkpoint_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except _UNREADABLE_ERRORS as exc:
        raise _unreadable_error(path) from exc


def resolve_model_path(path: Union[str, Path]) -> Path:
    """`path` as it is when it exists (or does not look like a Hub id); a Hub model id (owner/name)
    otherwise, downloaded (or found in the local Hub cache) through huggingface_hub."""
    if Path(path).exists() or not HUB_ID.match(str(path)) or str(path).endswith(".ckpt"):
        return Path(path)
    from huggingface_hub import snapshot_download  # only a Hub id needs it
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=str(path)))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise FileNotFoundError(
            f"{path}: no such checkpoint file or directory here, and the Hugging Face Hub gave no model of that id "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no network?'}); pass a .ckpt "
            "file, a directory of `genoformer export --format hf`, or a Hub id (owner/name) with a network."
        ) from error


def read_model_checkpoint(path: Union[str, Path], kind: ModelKind) -> tuple[dict, dict]:
    """(checkpoint, hyper_parameters) of a checkpoint of `kind`, from a .ckpt file, from a Hugging
    Face directory of `genoformer export --format hf` (safetensors and JSON, nothing unpickled) or
    from a Hub id of such a directory; ValueError saying what the file holds and which commands
    read it otherwise."""
    path = resolve_model_path(path)
    if path.is_dir():
        from genoformer.core.hf import read_hf_checkpoint  # hf builds on this module

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


def _unreadable_error(path: Path) -> ValueError:
    """Our message for a checkpoint file torch cannot read (rather than torch's own advice)."""
    return ValueError(
        f"{path} is not a readable genoformer checkpoint: the file is truncated (an interrupted copy or "
        "save) or was not written by `genoformer fit`. Pass a .ckpt file written by training, e.g. "
        "<run dir>/checkpoints/last.ckpt."
    )
