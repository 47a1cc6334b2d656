"""Helpers for the model tests: tiny configs, random tokens and a short training run.
(A uniquely named module, so test files can import it next to other folders' helpers.)"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from genoformer.data.genome.alphabet import VOCAB_SIZE
from torch.utils.data import DataLoader

from genoformer.core.runtime import RUNTIME_FIELDS, RuntimeSettings
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.genome.lm import GenoformerLM, Objective

WINDOW = 96  # training window of the shared run (not a multiple of 16 on purpose)


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(vocab_size=VOCAB_SIZE, d_model=32, n_layers=2, n_heads=4, max_seq_len=512)
    values.update(overrides)
    return TransformerConfig(**values)


def split_runtime(overrides: dict) -> tuple[dict, RuntimeSettings]:
    """(architecture overrides, runtime settings) from one dict of keyword arguments."""
    runtime = {key: overrides.pop(key) for key in RUNTIME_FIELDS if key in overrides}
    return overrides, RuntimeSettings(**runtime)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    """A tiny Transformer; runtime settings (attention_backend, ...) may be mixed into `overrides`."""
    torch.manual_seed(seed)
    architecture, runtime = split_runtime(overrides)
    return Transformer(tiny_config(**architecture), runtime).eval()


def random_tokens(batch: int, length: int, seed: int = 0, high: int = 4) -> torch.Tensor:
    """(B, L) uint8 codes drawn uniformly from A C G T (high=4) or A C G T N (high=5)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (batch, length), generator=generator, dtype=torch.uint8)


def token_loader(n: int, length: int, batch_size: int, seed: int = 0) -> DataLoader:
    tokens = random_tokens(n, length, seed)
    return DataLoader([{"tokens": row} for row in tokens], batch_size=batch_size)


def fit_tiny(root: Path, objective: Objective, callbacks=(), **config) -> tuple[L.Trainer, GenoformerLM]:
    L.seed_everything(0, verbose=False)
    architecture, runtime = split_runtime(config)
    module = GenoformerLM(
        tiny_config(**architecture), objective=objective, warmup_steps=2, learning_rate=1e-3, runtime=runtime
    )
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=True,
        default_root_dir=root,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=2,
        limit_val_batches=2,
    )
    trainer.fit(module, token_loader(12, WINDOW, 4, seed=1), token_loader(8, WINDOW, 4, seed=2))
    return trainer, module
