"""What the inference classes of a DNA language model share (Embedder, Scorer, Generator): the
kind of checkpoint they read, the network they build from it, the alphabet check, and the default
window (the context the model was trained at)."""

from __future__ import annotations

from typing import Any, ClassVar

from genoformer.core.checkpoints import ModelKind
from genoformer.core.inference import InferenceModel
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.data.genome.alphabet import check_alphabet


class LanguageModelRunner(InferenceModel):
    """An `InferenceModel` over a DNA language model's `Transformer` (genoformer.genome.lm.GenoformerLM's network)."""

    kind: ClassVar[ModelKind] = ModelKind.GENOME_LM

    @classmethod
    def check(cls, checkpoint: dict[str, Any], name: str) -> None:
        check_alphabet(checkpoint, f"{name}: load it")

    @classmethod
    def build(cls, hparams: dict[str, Any], runtime: RuntimeSettings) -> Transformer:
        return Transformer(TransformerConfig.from_dict(hparams["transformer"]), runtime)
