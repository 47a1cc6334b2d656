"""Exact resume: a run that crashes and continues from its last checkpoint ends with the same
weights, optimizer and scheduler state as a run that was never interrupted (bit-identical on the
CPU), whether the checkpoint lies mid-epoch, at the end of an epoch or before a validation.

The crash is injected in process here (fast); tests/core/test_fault_injection.py kills a real
`genoformer fit` process with SIGKILL and with SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from genoformer.data import GenomeDataModule, prepare_genome_store
from genoformer.data.sampling import ShardSampler
from lightning.pytorch.callbacks import ModelCheckpoint
from model_helpers import tiny_config

from genoformer.core.callbacks import ResumeCheckpoint
from genoformer.genome.lm import GenoformerLM, Objective

MAX_STEPS = 12
SAMPLES_PER_EPOCH = 5  # batch size 1: epochs end after steps 5 and 10


class Crash(RuntimeError):
    """The injected fault."""


class CrashAt(L.Callback):
    """Raise before training step `step` runs (after the checkpoints of earlier steps were saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Crash(f"injected crash at step {self.step}")


class RecordBatches(L.Callback):
    """The (epoch, index) of every training sample, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen += [(trainer.current_epoch, int(i)) for i in batch["index"]]


def _run(root: Path, store: Path, every: int, callbacks=(), ckpt_path=None) -> tuple[L.Trainer, GenoformerLM]:
    L.seed_everything(0, verbose=False)
    module = GenoformerLM(tiny_config(dropout=0.1), objective=Objective.MASKED_LM, warmup_steps=3, learning_rate=1e-3)
    data = GenomeDataModule(
        str(store), window=128, batch_size=1, num_workers=0, samples_per_epoch=SAMPLES_PER_EPOCH, seed=3
    )
    trainer = L.Trainer(
        max_steps=MAX_STEPS,
        accelerator="cpu",
        logger=False,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=4,
        check_val_every_n_epoch=None,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=every),
            ResumeCheckpoint(),
            *callbacks,
        ],
    )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


def _final_state(root: Path) -> dict:
    return torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _assert_same_training_state(resumed: dict, reference: dict) -> None:
    assert resumed["global_step"] == reference["global_step"] == MAX_STEPS
    assert resumed["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), f"weights differ: {key}"
    for key, value in reference["optimizer_states"][0]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(resumed["optimizer_states"][0]["state"][key][name], tensor), f"optimizer {key}.{name}"
    assert resumed["lr_schedulers"] == reference["lr_schedulers"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, repo_root) -> Path:
    """The lambda phage genome shipped in examples/ (48.5 kb)."""
    fasta = repo_root / "examples" / "lambda_phage.fasta.gz"
    return prepare_genome_store([fasta], tmp_path_factory.mktemp("lambda") / "lambda.zarr", progress=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, small_store) -> tuple[dict, list]:
    root = tmp_path_factory.mktemp("uninterrupted")
    record = RecordBatches()
    _run(root, small_store, every=1, callbacks=[record])
    return _final_state(root), record.seen


@pytest.mark.parametrize(
    "every, crash_at",
    [(3, 8), (5, 7), (4, 11)],
    ids=["mid_epoch", "at_epoch_end", "after_validation"],
)
def test_resume_after_crash_is_bit_identical(tmp_path, small_store, uninterrupted, every, crash_at):
    reference, reference_seen = uninterrupted
    first = RecordBatches()
    with pytest.raises(Crash):
        _run(tmp_path, small_store, every, callbacks=[CrashAt(crash_at), first])
    saved_at = crash_at // every * every
    assert _final_state(tmp_path)["global_step"] == saved_at
    second = RecordBatches()
    _run(tmp_path, small_store, every, callbacks=[second], ckpt_path="last")
    # the batches after the checkpoint are neither skipped nor replayed
    assert first.seen[:saved_at] + second.seen == reference_seen
    _assert_same_training_state(_final_state(tmp_path), reference)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sampler_resume_skips_exactly_the_consumed_samples(world_size):
    total = 23
    for consumed in (0, 1, 7, 12, 23):
        rest = []
        for rank in range(world_size):
            sampler = ShardSampler(total, rank=rank, world_size=world_size)
            sampler.resume_from(4, consumed)
            keys = list(sampler)
            assert all(epoch == 4 for epoch, _ in keys)
            rest += [index for _, index in keys]
            padded = -(-total // world_size) * world_size
            assert [index for _, index in sampler] == list(range(rank, padded, world_size)), "skipping is one-shot"
        assert sorted(rest) == list(range(consumed, padded)), "the next pass holds every index not yet consumed"
