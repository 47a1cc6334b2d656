"""GenoformerLM: objectives, schedule, optimiser groups, a short fit, checkpoints, YAML config."""

from __future__ import annotations

import math
import sys

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from genoformer.data import GenomeDataModule, SplitSpec
from genoformer.data.genome.alphabet import MASK, PAD, N
from genoformer.kernels.layout import SlidingWindow
from lightning.pytorch.cli import LightningCLI
from model_helpers import WINDOW, fit_tiny, random_tokens, tiny_config, token_loader

from genoformer.core.callbacks import LossPlotCallback
from genoformer.core.training import warmup_cosine
from genoformer.genome.lm import IGNORE, GenoformerLM, Objective, mask_tokens


def test_mask_tokens_is_bert_style_on_bases_only():
    tokens_BL = random_tokens(64, 1000, high=5)  # A C G T N
    tokens_BL[:, -50:] = PAD
    inputs_BL, targets_BL = mask_tokens(tokens_BL, 0.15, generator=torch.Generator().manual_seed(0))
    tokens_BL = tokens_BL.long()
    selected_BL = targets_BL != IGNORE
    bases_BL = tokens_BL < N
    assert not selected_BL[~bases_BL].any()  # never N or PAD
    assert selected_BL[bases_BL].float().mean().item() == pytest.approx(0.15, abs=0.005)
    torch.testing.assert_close(targets_BL[selected_BL], tokens_BL[selected_BL])
    assert torch.equal(inputs_BL[~selected_BL], tokens_BL[~selected_BL])
    chosen = inputs_BL[selected_BL]
    masked = (chosen == MASK).float().mean().item()
    replaced = ((chosen != MASK) & (chosen != tokens_BL[selected_BL])).float().mean().item()
    assert masked == pytest.approx(0.8, abs=0.01)
    assert replaced == pytest.approx(0.1 * 3 / 4, abs=0.01)  # a random base differs 3 times in 4
    assert (chosen[chosen != MASK] < N).all()


def test_warmup_cosine_schedule():
    kwargs = dict(warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert warmup_cosine(0, **kwargs) == pytest.approx(0.1)
    assert warmup_cosine(9, **kwargs) == pytest.approx(1.0)
    assert warmup_cosine(10, **kwargs) == pytest.approx(1.0)
    assert warmup_cosine(60, **kwargs) == pytest.approx(0.55)
    assert warmup_cosine(110, **kwargs) == pytest.approx(0.1)
    assert warmup_cosine(500, **kwargs) == pytest.approx(0.1)
    assert warmup_cosine(0, warmup_steps=0, total_steps=10, min_lr_ratio=0.0) == pytest.approx(1.0)


def test_objective_sets_attention_direction_and_initial_loss_is_uniform():
    torch.manual_seed(0)  # the initial loss depends on the random init; do not depend on test order
    causal = GenoformerLM(tiny_config(causal=False), objective=Objective.CAUSAL_LM)
    masked = GenoformerLM(tiny_config(), objective="MASKED_LM")
    assert causal.model.config.causal and not masked.model.config.causal
    tokens_BL = random_tokens(4, 64)
    for module in (causal, masked):
        loss, n_targets = module.loss(tokens_BL)
        assert loss.item() == pytest.approx(math.log(8), abs=0.1)  # small init: near-uniform logits
    assert causal.loss(tokens_BL)[1].item() == 4 * 63
    padded_BL = tokens_BL.clone()
    padded_BL[:, 40:] = PAD
    assert causal.loss(padded_BL, torch.full((4,), 40))[1].item() == 4 * 39  # PAD targets skipped


def test_weight_decay_groups():
    module = GenoformerLM(tiny_config(), weight_decay=0.1, total_steps=100)
    optimizer = module.configure_optimizers()["optimizer"]
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert any(p is module.model.embed.weight for p in decay["params"])
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(module.model.parameters()))


def test_short_fit_logs_metrics_checkpoints_and_plots(tmp_path):
    callback = LossPlotCallback()
    trainer, module = fit_tiny(tmp_path, Objective.CAUSAL_LM, callbacks=[callback], n_kv_heads=2)
    metrics = trainer.callback_metrics
    for split in ("train", "val"):
        assert torch.isfinite(metrics[f"{split}/loss"])
        assert metrics[f"{split}/bpb"].item() == pytest.approx(metrics[f"{split}/loss"].item() / math.log(2), rel=1e-5)
    assert sorted(callback.train) == [1, 2, 3] and sorted(callback.val) == [2]
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert module.trained_seq_len == WINDOW
    assert trainer.lr_scheduler_configs[0].interval == "step"

    # the checkpoint holds plain values only and rebuilds the module alone
    path = tmp_path / "final.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["objective"] == "CAUSAL_LM"
    assert checkpoint["trained_seq_len"] == WINDOW
    restored = GenoformerLM.load_from_checkpoint(path)
    assert restored.model.config == module.model.config and restored.trained_seq_len == WINDOW
    tokens_BL = random_tokens(2, 50)
    torch.testing.assert_close(restored.eval()(tokens_BL), module.eval()(tokens_BL))


def test_predict_step_mean_pools_real_tokens():
    module = GenoformerLM(tiny_config(), objective=Objective.MASKED_LM).eval()
    tokens_BL = random_tokens(2, 40)
    padded_BL = torch.cat([tokens_BL, torch.full((2, 24), PAD, dtype=torch.uint8)], dim=1)
    batch = {"tokens": padded_BL, "length": torch.tensor([40, 40]), "start": torch.tensor([0, 7])}
    with torch.no_grad():
        out = module.predict_step(batch, 0)
        expected_BE = module.model.hidden_state(tokens_BL).mean(1)
    assert torch.equal(out["start"], batch["start"])
    torch.testing.assert_close(out["embeddings"], expected_BE, rtol=1e-5, atol=1e-5)


MODEL_YAML = """
model:
  class_path: genoformer.genome.lm.GenoformerLM
  init_args:
    objective: MASKED_LM
    learning_rate: 6.0e-4
    warmup_steps: 200
    transformer:
      d_model: 64
      n_layers: 4
      n_heads: 4
      n_kv_heads: 2
      max_seq_len: 8192
      attention:
        - class_path: genoformer.kernels.layout.SlidingWindow
          init_args: {window: 256, block_size: 128}
        - class_path: genoformer.kernels.layout.BigBird
          init_args: {window: 256, num_random_blocks: 2, seed: 0}
        - null
    runtime:
      attention_backend: AUTO
      activation_checkpointing: true
trainer:
  logger: false
  callbacks:
    - class_path: genoformer.core.callbacks.LossPlotCallback
"""


def test_yaml_config_builds_the_module(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["genoformer"])
    config = tmp_path / "model.yaml"
    config.write_text(MODEL_YAML)
    cli = LightningCLI(run=False, args=["--config", str(config)], save_config_callback=None)
    module = cli.model
    assert isinstance(module, GenoformerLM) and module.objective is Objective.MASKED_LM
    transformer = module.model.config
    assert transformer.kv_heads == 2 and not transformer.causal and module.model.runtime.activation_checkpointing
    assert transformer.attention[0] == SlidingWindow(window=256, block_size=128) and transformer.attention[2] is None
    assert any(isinstance(c, LossPlotCallback) for c in cli.trainer.callbacks)
    # the plain form stored in checkpoints is valid YAML for the same field
    assert yaml.safe_load(yaml.safe_dump(module.hparams["transformer"])) == module.hparams["transformer"]


def test_fit_and_test_on_a_genome_data_module(tmp_path):
    """The real data path: FASTA -> store -> GenomeDataModule -> GenoformerLM, including the
    PAD-padded last validation tile (its "length" masks the padding in attention)."""
    rng = np.random.default_rng(0)
    fasta = tmp_path / "toy.fa"
    fasta.write_text(">toy\n" + "".join(rng.choice(list("ACGT"), 3000)) + "\n")
    data = GenomeDataModule(
        store=str(tmp_path / "toy.zarr"),
        fasta=[str(fasta)],
        window=128,
        batch_size=4,
        num_workers=0,
        samples_per_epoch=16,
        split=SplitSpec(val_fraction=0.1, test_fraction=0.05),
    )
    module = GenoformerLM(tiny_config(attention=[SlidingWindow(window=32, block_size=16), None]), objective="MASKED_LM")
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=2,
    )
    trainer.fit(module, datamodule=data)
    assert torch.isfinite(trainer.callback_metrics["val/loss"])
    (results,) = trainer.test(module, datamodule=data, verbose=False)
    assert results["test/bpb"] == pytest.approx(results["test/loss"] / math.log(2), rel=1e-5)


def test_batches_without_tokens_get_a_clear_error():
    module = GenoformerLM(tiny_config())
    with pytest.raises(TypeError, match="time-series batches"):
        module.training_step({"context": torch.zeros(2, 1, 8), "target": torch.zeros(2, 1, 4)}, 0)


def test_loss_plot_draws_the_baseline_of_the_run_directory(tmp_path):
    import json

    from genoformer.core.callbacks import read_baseline

    assert read_baseline(tmp_path / "baseline.json") is None
    (tmp_path / "baseline.json").write_text(
        json.dumps({"total": {"bits_per_base": 1.9, "bases": 10}, "model": {"order": 11}})
    )
    assert read_baseline(tmp_path / "baseline.json") == (1.9, "order-11 Markov baseline")
    callback = LossPlotCallback()
    callback.train = {1: 1.4, 2: 1.35}
    plain = callback.plot(tmp_path / "plain.png").read_bytes()
    drawn = callback.plot(tmp_path / "drawn.png", baseline=read_baseline(tmp_path / "baseline.json")).read_bytes()
    assert plain != drawn


def test_fused_adamw_trains_with_gradient_clipping_under_bf16(tmp_path, monkeypatch):
    """GPU configs clip gradients and run bf16-mixed with the fused AdamW, a pair Lightning's own
    clipping refuses ("does not allow for gradient clipping"). The CPU has a fused AdamW too, so
    the same path runs here with the CUDA check lifted; clipping must really bound the norm."""
    import genoformer.core.training as training_module

    monkeypatch.setattr(training_module, "fused_adamw_allowed", lambda module: True)
    module = GenoformerLM(tiny_config(), warmup_steps=1, learning_rate=1e-3)
    norms = []

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # after the clipped step
            assert trainer.optimizers[0].defaults["fused"]
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())

    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1e-3,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[Spy()],
    )
    trainer.fit(module, token_loader(8, WINDOW, 4, seed=1))
    assert len(norms) == 2 and all(norm == pytest.approx(1e-3, rel=1e-3) for norm in norms)


def test_fused_adamw_only_where_clipping_stays_exact(tmp_path):
    """Fused needs CUDA parameters, one device or DDP, and no GradScaler: on the CPU, never."""
    from genoformer.core.training import fused_adamw_allowed

    module = GenoformerLM(tiny_config(), total_steps=10)
    module.trainer = L.Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    assert not fused_adamw_allowed(module)
    assert not module.configure_optimizers()["optimizer"].defaults["fused"]
