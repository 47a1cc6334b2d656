"""One way to load a model: any checkpoint (a .ckpt file, a directory of `genoformer export
--format hf`, a Hub id, a run directory or a pretrained model's name) into its kind, its
hyperparameters and its network with the weights loaded, ready to run under the inference policy.

    loaded = load_model("genoformer-dna", ModelKind.GENOME_LM, build, RuntimeSettings.for_inference())

`build(hyper_parameters, runtime)` makes the network a kind needs (each wing knows its own, so
that this module imports no wing); the inference classes (`genoformer.core.inference.InferenceModel`:
Embedder, Scorer, Generator, SequencePredictor, GeneAnnotator, Forecaster) all load through here.

Above both readers: genoformer.core.checkpoints (the .ckpt conventions and `resolve_checkpoint`)
and genoformer.core.hf (Hugging Face directories) build on nothing here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Union

from torch import nn

from genoformer.core.checkpoints import (
    ModelKind,
    canonical_state_dict,
    checkpoint_kind,
    read_checkpoint,
    resolve_checkpoint,
)
from genoformer.core.hf import read_hf_checkpoint
from genoformer.core.runtime import RuntimeSettings

Build = Callable[[dict[str, Any], RuntimeSettings], nn.Module]
"""Makes the network of a kind from its checkpoint's hyperparameters, running with the settings given."""


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A checkpoint's model, weights loaded, in eval mode on the CPU."""

    kind: ModelKind
    hparams: dict[str, Any]
    """What the model is (its checkpoint's hyperparameters)."""
    network: nn.Module
    checkpoint: dict[str, Any]
    """The checkpoint as read (tensors on the CPU), for what else it records ("alphabet", ...)."""
    source: Path
    """The file or directory the checkpoint argument resolved to."""

    @property
    def context(self) -> int:
        """The context the model was trained at (`trained_seq_len`), at most its max_seq_len; the
        max_seq_len when the checkpoint does not say."""
        max_len = int(self.hparams["transformer"]["max_seq_len"])
        return min(int(self.checkpoint.get("trained_seq_len") or max_len), max_len)


def load_model(
    spec: Union[str, Path],
    kind: ModelKind,
    build: Build,
    runtime: RuntimeSettings,
    *,
    prefix: str = "model.",
    check: Callable[[dict[str, Any], str], None] | None = None,
) -> LoadedModel:
    """The model of checkpoint `spec` (anything `resolve_checkpoint` takes), which must hold `kind`:
    `build(hyper_parameters, runtime)` with the weights the training module saved under `prefix`
    ("model.": its `self.model`; "": the whole module), in eval mode. `check(checkpoint, name)`
    may refuse the checkpoint first (ValueError saying what to do; `name` is `spec` as given)."""
    source = resolve_checkpoint(spec)
    checkpoint, hparams = read_model_checkpoint(source, kind)
    if check is not None:
        check(checkpoint, str(spec))
    network = build(hparams, runtime)
    load_module_weights(network, checkpoint, prefix)
    return LoadedModel(kind, hparams, network.eval(), checkpoint, source)


def load_module_weights(network: nn.Module, checkpoint: Mapping, prefix: str = "model.") -> None:
    """Load the weights a training module saved under `prefix` (its `self.model`) into `network`."""
    state_dict = canonical_state_dict(checkpoint["state_dict"])
    network.load_state_dict({key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)})


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
        raise ValueError(f"{path} holds {found.description}, not {kind.description}; it is read by {found.readers}.")
    return checkpoint, dict(checkpoint["hyper_parameters"])
