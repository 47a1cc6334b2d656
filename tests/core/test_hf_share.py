"""Hugging Face export of every kind of model, round trip both ways: fine-tuned classifiers (sequence
and per base, LoRA merged), forecasters, and block-sparse layouts; a Hub id read through
huggingface_hub's cache; the model card's measured figures. transformers runs offline."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, STRAND_SWAP
from genoformer.data.genome.targets import TargetKind, TargetSpace
from genoformer.kernels.layout import BigBird, SlidingWindow
from model_helpers import random_tokens, tiny_config

from genoformer.core.checkpoints import REGROUPED, TAG_KEY, ModelKind
from genoformer.core.hf import LAYOUT_FILE, export_hf, merge_lora, modeling_source, read_hf_checkpoint
from genoformer.core.loading import load_module_weights, read_model_checkpoint
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.genome.finetune import FineTuner
from genoformer.genome.lm import GenoformerLM, Objective
from genoformer.genome.predict import FineTunedModel

LOAD = dict(trust_remote_code=True, local_files_only=True)


def save(module: L.LightningModule, path: Path) -> Path:
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(path)
    return path


def randomise(module: torch.nn.Module, *names: str) -> None:
    """Give parameters whose name contains one of `names` random values (so that they matter)."""
    torch.manual_seed(3)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if any(part in name for part in names):
                param.normal_(std=0.3)


def padded_batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens_BL int64 right-padded with PAD, lengths_B, attention_mask_BL)."""
    L_ = max(lengths)
    tokens_BL = random_tokens(len(lengths), L_, seed=seed, high=5).long()
    mask_BL = torch.arange(L_)[None] < torch.tensor(lengths)[:, None]
    return tokens_BL.masked_fill(~mask_BL, 5), torch.tensor(lengths), mask_BL.long()


TUNED = {
    "classes_lora_last": dict(
        targets=TargetSpace(TargetKind.SEQUENCE_CLASSES, ("no", "yes", "maybe")), lora_rank=2, head={"pooling": "last"}
    ),
    "labels_attention": dict(
        targets=TargetSpace(TargetKind.SEQUENCE_LABELS, ("x", "y")), head={"pooling": "attention"}
    ),
    "values_mean": dict(
        targets=TargetSpace(TargetKind.SEQUENCE_VALUES, ("v", "w"), mean=(3.0, -1.0), std=(2.0, 0.5)), head={"layer": 1}
    ),
    "genes_per_base": dict(targets=TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)),
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, causal_checkpoint, mlm_checkpoint) -> dict[str, tuple[FineTuner, Path]]:
    """name -> (fine-tuned module in eval mode, its HF export); one of them on the block-sparse masked LM."""
    root = tmp_path_factory.mktemp("tuned")
    result = {}
    cases = {**TUNED, "masked_sparse": dict(targets=TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b")))}
    for name, options in cases.items():
        options = dict(options)
        targets = options.pop("targets").to_dict()
        pretrained = mlm_checkpoint if name == "masked_sparse" else causal_checkpoint
        torch.manual_seed(0)
        module = FineTuner(pretrained=str(pretrained), targets=targets, **options)
        randomise(module, "lora_B", "query", "head.")
        checkpoint = save(module, root / f"{name}.ckpt")
        result[name] = (module.eval(), export_hf(checkpoint, root / name, dtype="float32"))
    return result


@pytest.mark.parametrize("name", [*TUNED, "masked_sparse"])
def test_fine_tuned_models_load_into_transformers_and_back(tuned, name):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    module, directory = tuned[name]
    per_base = module.targets.kind.per_base
    config = AutoConfig.from_pretrained(directory, **LOAD)
    assert config.id2label == dict(enumerate(module.targets.names)) and config.head["kind"] == module.targets.kind.value
    auto = AutoModelForTokenClassification if per_base else AutoModelForSequenceClassification
    hf = auto.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()
    tokens_BL, lengths_B, mask_BL = padded_batch([61, 40, 17], seed=4)
    with torch.no_grad():
        logits = hf(input_ids=tokens_BL, attention_mask=mask_BL).logits
        expected = module(tokens_BL, lengths_B)
        if module.targets.kind in (TargetKind.SEQUENCE_VALUES, TargetKind.BASE_VALUES):
            expected = expected * module.value_std + module.value_mean
        predicted = hf.predict(tokens_BL, mask_BL)
        wanted = module.predict_outputs(tokens_BL, lengths_B)
    if per_base:  # padded positions are meaningless on both sides
        keep = mask_BL.bool()
        logits, expected, predicted, wanted = logits[keep], expected[keep], predicted[keep], wanted[keep]
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(predicted, wanted, rtol=0, atol=1e-4)
    # and back into genoformer: the same predictions from the directory
    loaded = FineTunedModel.load(directory).network
    with torch.no_grad():
        again = loaded.predict_outputs(tokens_BL, lengths_B)
    if per_base:
        again = again[mask_BL.bool()]
    torch.testing.assert_close(again, wanted, rtol=0, atol=1e-4)
    assert loaded.targets == module.targets
    # transformers' losses take the labels as genoformer's data gives them
    if module.targets.kind is TargetKind.SEQUENCE_CLASSES:
        assert torch.isfinite(hf(input_ids=tokens_BL, attention_mask=mask_BL, labels=torch.tensor([0, 1, 1])).loss)


def test_an_export_of_the_flat_layout_reads_in_todays_groups(tuned, tmp_path):
    """A directory exported before FineTuner grouped its head and strand arguments (flat
    hyperparameters in config.json) loads with its head as trained: here LAST pooling, which the
    default (MEAN) would change."""
    import shutil

    module, directory = tuned["classes_lora_last"]
    flat = shutil.copytree(directory, tmp_path / "flat")
    config = json.loads((flat / "config.json").read_text())
    hparams = config[TAG_KEY]["hyper_parameters"]
    for old, (group, field) in REGROUPED[ModelKind.GENOME_FINETUNED].items():
        hparams[old] = hparams[group].pop(field)
    del hparams["head"], hparams["strands"]
    (flat / "config.json").write_text(json.dumps(config))
    _, read = read_hf_checkpoint(flat)
    assert read["head"] == module.hparams["head"] and read["head"]["pooling"] == "LAST"
    tokens_BL, lengths_B, _ = padded_batch([61, 40, 17], seed=5)
    with torch.no_grad():
        again = FineTunedModel.load(flat).network.predict_outputs(tokens_BL, lengths_B)
        torch.testing.assert_close(again, module.predict_outputs(tokens_BL, lengths_B), rtol=0, atol=1e-4)


def test_lora_is_merged_into_plain_weights(tuned):
    module, directory = tuned["classes_lora_last"]
    state, hparams = read_hf_checkpoint(directory)
    assert hparams["lora_rank"] == 0 and not any("lora_" in key or "base_layer" in key for key in state["state_dict"])
    merged = merge_lora(
        {
            "m.base_layer.weight": torch.eye(2),
            "m.lora_A.default.weight": torch.ones(1, 2),
            "m.lora_B.default.weight": torch.full((2, 1), 0.5),
        },
        rank=1,
        alpha=4.0,
    )
    torch.testing.assert_close(merged["m.weight"], torch.eye(2) + 4.0 * 0.5)
    assert list(merged) == ["m.weight"]


@pytest.fixture(scope="module")
def forecaster(tmp_path_factory) -> tuple[Path, Path]:
    from genoformer.timeseries.model import ForecastConfig
    from genoformer.timeseries.module import TimeSeriesForecaster

    root = tmp_path_factory.mktemp("forecaster")
    torch.manual_seed(0)
    module = TimeSeriesForecaster(
        TransformerConfig(
            d_model=32, n_layers=2, n_heads=4, max_seq_len=64, attention=[SlidingWindow(window=16, block_size=16), None]
        ),
        ForecastConfig(patch_len=8, context=96, horizon=24, n_channels=2, quantiles=[0.1, 0.9]),
    )
    randomise(module, "head")
    checkpoint = save(module, root / "forecaster.ckpt")
    return checkpoint, export_hf(checkpoint, root / "hf")


def test_forecasters_round_trip_through_genoformer_and_transformers(forecaster):
    from transformers import AutoModel

    from genoformer.timeseries.forecaster import Forecaster

    checkpoint, directory = forecaster
    names = sorted(path.name for path in directory.iterdir())
    assert names == ["README.md", "config.json", "model.safetensors", "modeling_genoformer_forecaster.py"]
    series = np.sin(np.arange(2 * 90, dtype=np.float32) / 7).reshape(2, 90) * np.array([[3.0], [0.5]], np.float32) + 1
    want = Forecaster.from_checkpoint(checkpoint, device="cpu").forecast(series)
    got = Forecaster.from_checkpoint(directory, device="cpu").forecast(series)
    np.testing.assert_allclose(got.point, want.point, atol=1e-5)
    np.testing.assert_allclose(got.quantiles, want.quantiles, atol=1e-5)
    hf = AutoModel.from_pretrained(directory, **LOAD).eval()
    with torch.no_grad():
        out = hf(torch.from_numpy(series)[None])
    np.testing.assert_allclose(out.point[0].numpy(), want.point, atol=1e-5)
    np.testing.assert_allclose(out.quantiles[0].numpy(), want.quantiles, atol=1e-5)
    card = (directory / "README.md").read_text()
    assert "- time-series\n" in card and "pip install genoformer" in card and "24 samples" in card


@pytest.mark.parametrize(
    "layout",
    [
        SlidingWindow(window=40, block_size=16),
        BigBird(window=16, num_global_blocks=1, num_random_blocks=1, block_size=16, per_head=True, seed=3),
    ],
)
@pytest.mark.parametrize("objective", [Objective.CAUSAL_LM, Objective.MASKED_LM])
def test_block_sparse_language_models_compute_what_genoformer_computes(tmp_path, layout, objective):
    from transformers import AutoModel

    torch.manual_seed(1)
    module = GenoformerLM(tiny_config(attention=[layout, None]), objective=objective)
    checkpoint = save(module, tmp_path / "sparse.ckpt")
    directory = export_hf(checkpoint, tmp_path / "hf", dtype="float32")
    assert (directory / LAYOUT_FILE).is_file()
    state, hparams = read_model_checkpoint(checkpoint, ModelKind.GENOME_LM)
    ours = Transformer(TransformerConfig.from_dict(hparams["transformer"]))
    load_module_weights(ours, state)
    ours.eval()
    encoder = AutoModel.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()
    tokens_BL, lengths_B, mask_BL = padded_batch([97, 70], seed=6)  # lengths not a multiple of the block
    with torch.no_grad():
        want = ours.hidden_state(tokens_BL, lengths_B)
        got = encoder(input_ids=tokens_BL, attention_mask=mask_BL).last_hidden_state
        dense = Transformer(TransformerConfig.from_dict({**hparams["transformer"], "attention": [None]}))
        load_module_weights(dense, state)
        unlike = dense.eval().hidden_state(tokens_BL, lengths_B)
    for b, n in enumerate(lengths_B.tolist()):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=0, atol=1e-4)
        assert (unlike[b, :n] - want[b, :n]).abs().max() > 1e-2  # the layout matters at these lengths


def test_the_exported_modeling_file_imports_the_layouts_beside_it():
    source = modeling_source()
    assert "from .genoformer_layout import" in source and "from genoformer" not in source.replace(
        "from genoformer_layout", ""
    )


def test_a_hub_id_reads_from_the_hub_cache_and_fails_clearly_offline(tmp_path, causal_checkpoint, hf_cache):
    """The Hub is never contacted: a model id absent from the cache is a clear error, and one put
    into the cache (as `huggingface-cli download` leaves it) loads."""
    from genoformer.genome.scoring import Scorer

    with pytest.raises(FileNotFoundError, match="no such checkpoint file or directory here, and the Hugging Face Hub"):
        Scorer.from_checkpoint("someone/no-such-dna-model", device="cpu")
    directory = export_hf(causal_checkpoint, tmp_path / "hf")
    snapshot = hf_cache / "hub" / "models--lab--dna-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for path in directory.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    (hf_cache / "hub" / "models--lab--dna-model" / "refs").mkdir()
    (hf_cache / "hub" / "models--lab--dna-model" / "refs" / "main").write_text("0" * 40)
    codes = random_tokens(1, 40, seed=2)[0].numpy()
    from_hub = Scorer.from_checkpoint("lab/dna-model", device="cpu").log2_likelihood(codes)
    from_ckpt = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(codes)
    np.testing.assert_allclose(from_hub, from_ckpt, atol=1e-5, equal_nan=True)


def test_the_card_shows_run_metrics_and_reports(tmp_path, causal_checkpoint):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "last.ckpt"
    checkpoint.write_bytes(causal_checkpoint.read_bytes())
    (run / "metrics.csv").write_text("step,train/loss,val/loss,val/bits_per_base\n1,1.3,,\n2,,1.30,1.875\n")
    model = {
        "total": {"bits_per_base": 1.8, "bases": 1000},
        "records": [{"name": "chr1"}],
        "checkpoint": "x",
        "context": 8192,
    }
    markov = {"total": {"bits_per_base": 1.9, "bases": 1000}, "records": [{"name": "chr1"}], "model": {"order": 5}}
    (tmp_path / "model.json").write_text(json.dumps(model))
    (tmp_path / "markov.json").write_text(json.dumps(markov))
    directory = export_hf(checkpoint, tmp_path / "hf", reports=[tmp_path / "model.json", tmp_path / "markov.json"])
    card = (directory / "README.md").read_text()
    assert "| val/bits_per_base | 1.875 |" in card and "train/loss" not in card
    assert "| model.json | genoformer, 8,192-base context | chr1 | 1,000 | 1.8000 |" in card
    assert "| markov.json | order-5 Markov baseline | chr1 | 1,000 | 1.9000 |" in card
    with pytest.raises(ValueError, match="no total bits per base"):
        (tmp_path / "bad.json").write_text("{}")
        export_hf(checkpoint, tmp_path / "hf2", reports=[tmp_path / "bad.json"])


def test_the_card_says_what_the_model_was_trained_on_and_its_limitations(tmp_path, causal_checkpoint):
    """Training data from the run's config.yaml (or a line saying it is not recorded), the
    validation figures of the exported checkpoint's own step (a best checkpoint's, not the last
    validation's), and a limitations section."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "best.ckpt"
    checkpoint.write_bytes(causal_checkpoint.read_bytes())  # saved after optimizer step 3
    (run / "config.yaml").write_text(
        "data:\n  class_path: genoformer.data.genome.datamodule.GenomeDataModule\n"
        "  init_args:\n    fasta: [genomes/ecoli.fa.gz, genomes/saureus.fa.gz]\n"
    )
    (run / "metrics.csv").write_text("step,val/loss\n1,1.10\n2,1.05\n5,1.50\n")  # logged at step - 1
    card = (export_hf(checkpoint, tmp_path / "hf") / "README.md").read_text()
    training = card.split("## Training data")[1].split("##")[0]
    assert "fasta: `genomes/ecoli.fa.gz`, `genomes/saureus.fa.gz`" in training and "3 optimizer steps" in training
    assert "| val/loss | 1.05 |" in card
    limitations = card.split("## Limitations")[1].split("##")[0]
    assert "bases of context" in limitations and "not what the variant does" in limitations
    bare = (export_hf(causal_checkpoint, tmp_path / "bare") / "README.md").read_text()
    assert "the training data is not recorded beside this checkpoint" in bare and "## Limitations" in bare
