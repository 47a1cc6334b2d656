"""The DNA language model: causal or masked LM objective and metrics around `Transformer`.

Batches come from genoformer.data: {"tokens": torch.uint8 (B, L), ...metadata}; tiled
evaluation batches also carry "length" (B,): the real tokens before PAD, which attention then
ignores. Packed batches (GenomeDataModule's `pack`) carry "cu_seqlens" (documents + 1,)
instead: documents end to end in each row, which the model keeps apart (see genoformer.core.transformer),
and the causal LM does not predict a document's first token from the document before it. The
tokens are cast to int64 on the device here. Metrics (per split: train, val, test):
    <split>/loss  mean cross-entropy in nats over the predicted positions
    <split>/bpb   bits per base = loss / ln 2

Training base (runtime settings, exact resume, tagged checkpoints, AdamW schedule):
`genoformer.core.training.TrainingModule`. This module adds the alphabet to its checkpoints and
checks it on load.

Shape legend: B batch, L sequence length, E model width, V vocabulary size, N = B * L.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any, Optional

import torch
import torch.nn.functional as F

from genoformer.core.checkpoints import ModelKind
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.training import OptimizerSettings, TrainingModule
from genoformer.core.transformer import Transformer, TransformerConfig, document_positions, fused, over_chunks
from genoformer.data.genome.alphabet import MASK, PAD, TOKEN_CODES, VOCAB_SIZE, T, check_alphabet

LN2 = math.log(2.0)
IGNORE = -100
"""Target value that cross_entropy skips."""


class Objective(str, enum.Enum):
    """Training objective (YAML: the member name, e.g. `objective: MASKED_LM`)."""

    CAUSAL_LM = "CAUSAL_LM"
    """Predict each token from the ones before it; causal attention in every layer."""
    MASKED_LM = "MASKED_LM"
    """BERT-style: predict masked nucleotides from both sides; bidirectional attention."""


def mask_tokens(
    tokens_BL: torch.Tensor, mask_prob: float, generator: Optional[torch.Generator] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT-style corruption for masked-LM training.

    Each A/C/G/T position is selected with probability `mask_prob` (N and special tokens never
    are); a selected position becomes MASK with probability 0.8, a uniformly random base A/C/G/T
    with 0.1, and stays unchanged with 0.1.

    Returns:
        inputs_BL (int64): the corrupted tokens.
        targets_BL (int64): the original token at selected positions, IGNORE elsewhere.
    """
    tokens_BL = tokens_BL.long()
    rand_BL = torch.rand(tokens_BL.shape, device=tokens_BL.device, generator=generator)
    action_BL = torch.rand(tokens_BL.shape, device=tokens_BL.device, generator=generator)
    random_base_BL = torch.randint(0, T + 1, tokens_BL.shape, device=tokens_BL.device, generator=generator)
    selected_BL = (rand_BL < mask_prob) & (tokens_BL <= T)
    inputs_BL = torch.where(selected_BL & (action_BL < 0.8), MASK, tokens_BL)
    inputs_BL = torch.where(selected_BL & (action_BL >= 0.8) & (action_BL < 0.9), random_base_BL, inputs_BL)
    targets_BL = torch.where(selected_BL, tokens_BL, IGNORE)
    return inputs_BL, targets_BL


def cross_entropy_sum(logits_BLV: torch.Tensor, targets_BL: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy in nats (float32) over the targets that are not IGNORE."""
    logits_NV = logits_BLV.reshape(-1, logits_BLV.shape[-1]).float()
    return F.cross_entropy(logits_NV, targets_BL.reshape(-1), ignore_index=IGNORE, reduction="sum")


def head_cross_entropy_sum(hidden_BLE: torch.Tensor, head_VE: torch.Tensor, targets_BL: torch.Tensor) -> torch.Tensor:
    """`cross_entropy_sum` of the output head's logits hidden_BLE @ head_VE^T: one region on a GPU,
    position-wise over chunks (`genoformer.core.transformer.over_chunks`)."""
    return cross_entropy_sum(F.linear(hidden_BLE, head_VE), targets_BL)


def _tokens(batch: dict[str, Any]) -> torch.Tensor:
    """The (B, L) token ids of a batch; a clear error for batches of another kind."""
    if "tokens" not in batch:
        raise TypeError(
            f"GenoformerLM trains on token batches ({{'tokens': (B, L), ...}}, as GenomeDataModule "
            f"gives), got a batch with keys {sorted(batch)}; time-series batches train "
            "genoformer.timeseries.module.TimeSeriesForecaster (model.class_path, as in "
            "configs/timeseries_tiny_cpu.yaml)."
        )
    return batch["tokens"]


class GenoformerLM(TrainingModule):
    """A genomic language model: `Transformer` + causal or masked LM objective + AdamW."""

    kind = ModelKind.GENOME_LM

    def __init__(
        self,
        transformer: TransformerConfig,
        objective: Objective = Objective.CAUSAL_LM,
        mask_prob: float = 0.15,
        learning_rate: float = 3e-4,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 1000,
        total_steps: Optional[int] = None,
        min_lr_ratio: float = 0.1,
        runtime: Optional[RuntimeSettings] = None,
    ) -> None:
        """
        Args:
            transformer: the architecture. Its `causal` field is set from `objective`. A mapping in
                the layout of `TransformerConfig.to_dict()` is accepted too (checkpoints store that).
            objective: CAUSAL_LM (next-token prediction) or MASKED_LM (BERT-style 80/10/10
                masking, loss on the masked positions only, bidirectional attention).
            mask_prob: fraction of A/C/G/T positions selected for prediction (MASKED_LM only).
            learning_rate: peak AdamW learning rate, reached after warmup.
            weight_decay: AdamW weight decay for matrices (embeddings and linear weights);
                norm weights are never decayed.
            betas: AdamW (beta1, beta2).
            warmup_steps: optimizer steps of linear warmup from 0 to learning_rate.
            total_steps: optimizer steps at which the cosine decay ends; None: the trainer's
                estimated_stepping_batches (from max_steps or max_epochs).
            min_lr_ratio: final learning rate as a fraction of learning_rate.
            runtime: how to run (attention backend, activation checkpointing, fused regions,
                compile): `genoformer.core.runtime.RuntimeSettings`; never saved in checkpoints.
        """
        super().__init__(runtime)
        objective = Objective(objective)
        if isinstance(transformer, Mapping):
            transformer = TransformerConfig.from_dict(transformer)
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob}.")
        config = dataclasses.replace(transformer, causal=objective is Objective.CAUSAL_LM, vocab_size=VOCAB_SIZE)
        self.objective = objective
        self.mask_prob = mask_prob
        self.optimization = OptimizerSettings.of(locals())
        self.model = Transformer(config, self.runtime)
        self.trained_seq_len = 0  # longest training batch length so far: the default embedding window
        # Plain values only, so checkpoints load with torch.load(weights_only=True) and
        # GenoformerLM.load_from_checkpoint(path) rebuilds the module.
        self.save_hyperparameters(
            {
                "transformer": config.to_dict(),
                "objective": objective.value,
                "mask_prob": mask_prob,
                **self.optimization.to_dict(),
            }
        )

    def forward(self, tokens_BL: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (B, L, V); cu_seqlens: optional packed documents (see genoformer.core.transformer)."""
        return self.model(tokens_BL, cu_seqlens=cu_seqlens)

    # ---------------------------------------------------------------------------- objective
    def loss(
        self,
        tokens_BL: torch.Tensor,
        lengths_B: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cross-entropy in nats over the predicted positions, number of those positions
        as a 0-d tensor; no host sync).

        CAUSAL_LM predicts tokens 1..L-1 from their prefixes, skipping special-token targets;
        MASKED_LM predicts the positions chosen by `mask_tokens`. lengths_B: real tokens per
        row of a PAD-padded batch (keys beyond are masked in attention). cu_seqlens: packed
        documents (one entry per document, plus one); CAUSAL_LM then also skips every
        document's first token, which only the previous document precedes.
        Context parallelism (the trunk's `sequence_shard` set): tokens_BL is this process's part of
        every sequence; the mean and the count are the whole sequences' (every part's in the value,
        this part's in the gradient).
        """
        tokens_BL = tokens_BL.long()
        shard = self.model.sequence_shard
        if self.objective is Objective.CAUSAL_LM:
            hidden_BLE = self.model.hidden_state(tokens_BL, lengths_B, layer=-1, cu_seqlens=cu_seqlens)
            if shard is None:  # the last position predicts nothing
                targets_BL = F.pad(tokens_BL[:, 1:], (0, 1), value=PAD)
            else:  # the token after a part's last one may belong to another process's part
                targets_BL = shard.next_tokens(tokens_BL, fill=PAD)
            targets_BL = torch.where(targets_BL < PAD, targets_BL, IGNORE)
            if cu_seqlens is not None:
                B, L = tokens_BL.shape
                next_first_BL = F.pad(document_positions(cu_seqlens.to(tokens_BL.device), B, L)[:, 1:] == 0, (0, 1))
                targets_BL = torch.where(next_first_BL, IGNORE, targets_BL)
        else:
            inputs_BL, targets_BL = mask_tokens(tokens_BL, self.mask_prob)
            hidden_BLE = self.model.hidden_state(inputs_BL, lengths_B, layer=-1, cu_seqlens=cu_seqlens)
        n_targets = (targets_BL != IGNORE).sum()
        fuse = self.runtime.fused_elementwise or self.runtime.compile
        head_VE = self.model.head.weight

        def chunk_loss(hidden_BCE: torch.Tensor, targets_BC: torch.Tensor) -> torch.Tensor:
            return fused(head_cross_entropy_sum, fuse, hidden_BCE)(hidden_BCE, head_VE, targets_BC)

        # sequence_chunk: the logits and their float32 softmax exist for one chunk at a time
        total = over_chunks(chunk_loss, self.runtime.sequence_chunk, hidden_BLE, targets_BL)
        if shard is not None:
            total, n_targets = shard.sum(total), shard.sum(n_targets)
        return total / n_targets.clamp(min=1), n_targets

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        tokens_BL = _tokens(batch)
        shard = self.model.sequence_shard  # context parallelism: tokens_BL is a part of each sequence
        self.trained_seq_len = max(self.trained_seq_len, tokens_BL.shape[1] if shard is None else shard.seq_len)
        loss, _ = self.loss(tokens_BL, batch.get("length"), batch.get("cu_seqlens"))
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens_BL.shape[0])
        self.log("train/bpb", loss / LN2, batch_size=tokens_BL.shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], split: str) -> None:
        loss, n_targets = self.loss(_tokens(batch), batch.get("length"), batch.get("cu_seqlens"))
        n_targets = int(n_targets)  # weights the epoch mean, so it is the per-base mean
        self.log(f"{split}/loss", loss, prog_bar=split == "val", batch_size=n_targets, sync_dist=True)
        self.log(f"{split}/bpb", loss / LN2, batch_size=n_targets, sync_dist=True)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        """Mean-pooled last-layer embeddings: {"embeddings": float32 (B, E)} plus the batch's
        other entries (metadata such as contig and start) passed through unchanged. PAD positions
        are left out of the mean and masked in attention. For other layers, pooling and
        long-sequence tiling use genoformer.genome.embeddings.Embedder."""
        tokens_BL = _tokens(batch).long()
        hidden_BLE = self.model.hidden_state(tokens_BL, batch.get("length"), layer=-1).float()
        keep_BL1 = (tokens_BL != PAD).unsqueeze(-1).float()
        pooled_BE = (hidden_BLE * keep_BL1).sum(1) / keep_BL1.sum(1).clamp(min=1.0)
        return {**{k: v for k, v in batch.items() if k != "tokens"}, "embeddings": pooled_BE}

    # ----------------------------------------------------------------------- checkpointing
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["trained_seq_len"] = self.trained_seq_len
        checkpoint["alphabet"] = dict(TOKEN_CODES)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_alphabet(checkpoint, "load it")
        super().on_load_checkpoint(checkpoint)
        self.trained_seq_len = checkpoint.get("trained_seq_len", 0)
