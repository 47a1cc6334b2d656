"""One way to load a model: every inference class loads through InferenceModel.from_checkpoint
(genoformer.core.loading.load_model), which checks the checkpoint's kind before building anything."""

from __future__ import annotations

import pytest

from genoformer.core.checkpoints import ModelKind
from genoformer.core.inference import InferenceModel
from genoformer.core.transformer import Transformer
from genoformer.genome.embeddings import Embedder
from genoformer.genome.generate import Generator
from genoformer.genome.predict import GeneAnnotator, SequencePredictor
from genoformer.genome.scoring import Scorer
from genoformer.timeseries.forecaster import Forecaster

CLASSES = [Embedder, Scorer, Generator, SequencePredictor, GeneAnnotator, Forecaster]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_inference_class_loads_through_the_one_from_checkpoint(cls):
    assert issubclass(cls, InferenceModel)
    for name in ("from_checkpoint", "load"):
        assert getattr(cls, name).__func__ is getattr(InferenceModel, name).__func__, f"{cls.__name__}.{name}"


def test_the_loaded_model_is_ready_and_its_kind_checked(causal_checkpoint):
    loaded = Embedder.load(causal_checkpoint)
    assert loaded.kind is ModelKind.GENOME_LM and isinstance(loaded.network, Transformer)
    assert not loaded.network.training and loaded.source == causal_checkpoint
    scorer = Scorer.from_loaded(loaded, device="cpu", mask_period=3)
    assert scorer.model is loaded.network and scorer.context == loaded.context and scorer.mask_period == 3
    with pytest.raises(
        ValueError, match="holds a DNA language model, not a time-series forecaster; it is read by genoformer embed"
    ):
        Forecaster.from_checkpoint(causal_checkpoint)
