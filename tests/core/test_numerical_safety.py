"""NonFiniteGuard: a NaN loss or gradient is caught at its step, reported with the batch's
source (store, contig, range), and either stops the run or is skipped and counted."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from genoformer.data import GenomeDataModule, GenomeStore, prepare_genome_store
from model_helpers import tiny_config

from genoformer.core.callbacks import NonFiniteError, NonFiniteGuard
from genoformer.genome.lm import GenoformerLM

BAD_STEP = 2


@pytest.fixture(scope="module")
def lambda_store(tmp_path_factory, repo_root) -> Path:
    fasta = repo_root / "examples" / "lambda_phage.fasta.gz"
    return prepare_genome_store([fasta], tmp_path_factory.mktemp("lambda") / "lambda.zarr", progress=False)


class Poison(L.Callback):
    """At BAD_STEP: a NaN in the loss (through the model's logits) or in one gradient only."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.batch: dict | None = None
        self.before: dict | None = None
        self.after: dict | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == BAD_STEP:
            self.batch = batch
            self.before = {k: v.clone() for k, v in pl_module.state_dict().items()}
            if self.where == "loss":
                pl_module.model.embed.weight.data[batch["tokens"][0, 0].long()] = float("nan")

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == BAD_STEP and self.where == "gradient":
            pl_module.model.norm.weight.grad[0] = float("inf")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == BAD_STEP + 1:
            self.after = {k: v.clone() for k, v in pl_module.state_dict().items()}


def _fit(root: Path, store: Path, guard: NonFiniteGuard, poison: Poison, max_steps: int = 4) -> L.Trainer:
    L.seed_everything(0, verbose=False)
    module = GenoformerLM(tiny_config(), warmup_steps=1, learning_rate=1e-3)
    data = GenomeDataModule(str(store), window=64, batch_size=2, num_workers=0, samples_per_epoch=64)
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        callbacks=[guard, poison],
    )
    trainer.fit(module, datamodule=data)
    return trainer


@pytest.mark.parametrize("where", ["loss", "gradient"])
def test_stop_reports_the_step_and_where_the_batch_came_from(tmp_path, lambda_store, where):
    poison = Poison(where)
    with pytest.raises(NonFiniteError) as caught:
        _fit(tmp_path, lambda_store, NonFiniteGuard("stop"), poison)
    message = str(caught.value)
    assert f"non-finite {where} at global step {BAD_STEP}" in message
    name = GenomeStore(lambda_store).contigs[int(poison.batch["contig"][0])].name
    start = int(poison.batch["start"][0])
    assert f"store {lambda_store}" in message and f"{name}[{start}:{start + 64})" in message
    assert "policy: skip" in message  # says how to skip instead


def test_skip_leaves_weights_untouched_counts_and_goes_on(tmp_path, lambda_store, caplog):
    poison = Poison("gradient")
    guard = NonFiniteGuard("skip")
    trainer = _fit(tmp_path, lambda_store, guard, poison)
    assert trainer.global_step == 4 and guard.skipped == 1
    for key, value in poison.before.items():
        assert torch.equal(poison.after[key], value), f"{key} changed in a skipped step"
    assert all(torch.isfinite(p).all() for p in trainer.lightning_module.parameters())
    assert any("skipping step: non-finite gradient at global step 2" in r.getMessage() for r in caplog.records)
    assert guard.state_dict() == {"skipped": 1}


def test_skip_stops_after_max_skipped(tmp_path, lambda_store):
    with pytest.raises(NonFiniteError, match="more than max_skipped=0"):
        _fit(tmp_path, lambda_store, NonFiniteGuard("skip", max_skipped=0), Poison("gradient"))


def test_bad_policy_is_rejected():
    with pytest.raises(ValueError, match="'stop' or 'skip'"):
        NonFiniteGuard("ignore")
