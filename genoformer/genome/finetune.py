"""Fine-tuning a pretrained DNA language model on labels: `FineTuner` and `genoformer finetune`.

`FineTuner` puts a head (`genoformer.genome.heads`) on the trunk of a pretrained genoformer
language model and trains it on a `LabelledDataModule` (genoformer.data.genome.labelled): a class,
labels or values per sequence, or a class or value per base. How much of the trunk trains:

- everything (full fine-tuning, the default);
- nothing (`freeze_backbone`: a linear probe of the frozen features; the head still trains);
- low-rank adapters on every attention and MLP projection (`lora_rank` > 0), through peft; the
  trunk's own weights stay as they were.

The head (`head`: how it pools, which layer it reads, whether it reads both strands side by side)
trains at its own learning rate (`head_learning_rate`). Each training sequence is read on a random
strand (`strands.reverse_complement`: per-base targets flip with it and swap strand classes), and
evaluation averages the predictions of both strands (`strands.test_time`), so that a prediction
does not depend on which strand a file holds.

Training stops early when the validation loss (`VALIDATION_MONITOR`, the metric the recipes' best
checkpoint is chosen by) has not improved for `patience` validations in a row, and the last
training step is always validated, so that the run's last checkpoint has a validation score to
set beside the best one's (`validation_summary`).

Metrics (torchmetrics), logged per split (val, test) as <split>/<name>: classes: accuracy,
balanced_accuracy, mcc, f1, auroc, auprc; labels: accuracy, f1, auroc, auprc; values: pearson,
spearman, mse; per-base classes: accuracy, balanced_accuracy, mcc (and coding_mcc, coding on
either strand vs not, for gene annotation); per-base values: pearson, mse. <split>/loss always.

Shape legend: B batch, L length (padded), F feature width, K outputs.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn
from torchmetrics import classification as tmc
from torchmetrics import regression as tmr

from genoformer.core.checkpoints import ModelKind
from genoformer.core.loading import load_module_weights, read_model_checkpoint
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.training import (
    ArgumentGroup,
    OptimizerSettings,
    TrainingModule,
    adamw_warmup_cosine,
    fused_adamw_allowed,
)
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.data.genome.alphabet import TOKEN_CODES, VOCAB_SIZE, check_alphabet
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, CDS_MINUS, CDS_PLUS
from genoformer.data.genome.labelled import IGNORE
from genoformer.data.genome.targets import TargetKind, TargetSpace
from genoformer.genome.heads import (
    HeadOnTrunk,
    HeadSettings,
    StrandSettings,
    add_lora,
    flip_within,
    reverse_complement_rows,
)

VALIDATION_MONITOR = "val/loss"
"""The validation metric that early stopping watches and that the recipes' best checkpoint
(checkpoints/best.ckpt) is chosen by: lower is better."""


class Adaptation(str, enum.Enum):
    """Which weights of the trunk train."""

    FULL = "full"
    LINEAR_PROBE = "linear_probe"
    LORA = "lora"


@dataclasses.dataclass(frozen=True)
class AdaptationSettings(ArgumentGroup):
    """Which weights of the pretrained trunk train, and from what (FineTuner's arguments of these names)."""

    freeze_backbone: bool
    lora_rank: int
    lora_alpha: Optional[float]
    from_scratch: bool

    def __post_init__(self) -> None:
        if self.freeze_backbone and self.lora_rank:
            raise ValueError(
                "freeze_backbone and lora_rank contradict each other: a linear probe trains no "
                "adapters; pass one of them"
            )
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be 0 (no adapters) or positive, got {self.lora_rank}")

    @property
    def adaptation(self) -> Adaptation:
        return (
            Adaptation.LORA if self.lora_rank else Adaptation.LINEAR_PROBE if self.freeze_backbone else Adaptation.FULL
        )


class FineTuner(HeadOnTrunk, TrainingModule):
    """A pretrained trunk + a fine-tuning head (see the module docstring); its forward pass and
    predictions are those of the network it trains (genoformer.genome.heads.HeadOnTrunk)."""

    kind = ModelKind.GENOME_FINETUNED

    def __init__(
        self,
        pretrained: Optional[str] = None,
        transformer: Optional[dict[str, Any]] = None,
        targets: Optional[dict[str, Any]] = None,
        head: HeadSettings = HeadSettings(),
        strands: StrandSettings = StrandSettings(),
        freeze_backbone: bool = False,
        lora_rank: int = 0,
        lora_alpha: Optional[float] = None,
        from_scratch: bool = False,
        learning_rate: float = 1e-4,
        head_learning_rate: Optional[float] = None,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_steps: int = 50,
        total_steps: Optional[int] = None,
        min_lr_ratio: float = 0.1,
        patience: int = 3,
        runtime: Optional[RuntimeSettings] = None,
    ) -> None:
        """
        Args:
            pretrained: a genoformer DNA language model (`genoformer.core.checkpoints.resolve_checkpoint`:
                genoformer-dna, a .ckpt of `genoformer fit` or `export`, a run directory, ...): its
                architecture and weights start the trunk.
            transformer: the trunk's architecture (`TransformerConfig.to_dict()`), when rebuilding
                a fine-tuned model from its checkpoint (its hyperparameters hold it); with it,
                `pretrained` is not read.
            targets: what the head predicts (`TargetSpace.to_dict()`); None: the data module's
                (`LabelledDataModule.target_space`) when training starts.
            head: what the head reads and how it is built: pooling, layer, both_strands, dropout
                (genoformer.genome.heads.HeadSettings, or a mapping of its fields).
            strands: how training and evaluation use the two strands: reverse_complement (train
                on a random strand), test_time (evaluate and predict with the mean over both)
                (genoformer.genome.heads.StrandSettings, or a mapping of its fields).
            freeze_backbone: train the head only (a linear probe of the frozen trunk).
            lora_rank: rank of low-rank adapters (peft LoRA) on every block projection; 0: none.
                The trunk's own weights are frozen then.
            lora_alpha: LoRA scaling numerator (the update is scaled by alpha / rank); None: 2 * rank.
            from_scratch: the pretrained architecture with fresh random weights (what pretraining buys).
            learning_rate: peak AdamW learning rate of the trunk (or of its adapters).
            head_learning_rate: peak learning rate of the head; None: 10 * learning_rate.
            weight_decay: AdamW weight decay of matrices.
            betas: AdamW (beta1, beta2).
            warmup_steps: linear warmup steps.
            total_steps: steps at which the cosine decay ends; None: the trainer's estimate.
            min_lr_ratio: final learning rate as a share of the peak.
            patience: early stopping: stop training after this many validations in a row without
                a lower validation loss; 0: train all the steps.
            runtime: how to run (genoformer.core.runtime.RuntimeSettings); never saved.
        """
        super().__init__(runtime)
        adapting = AdaptationSettings.of(locals())
        self.optimization = OptimizerSettings.of(locals())
        head, strands = HeadSettings.from_mapping(head), StrandSettings.from_mapping(strands)
        if patience < 0:
            raise ValueError(f"patience must be 0 (no early stopping) or a number of validations, got {patience}")
        weights = None
        if transformer is None:
            if pretrained is None:
                raise ValueError(
                    "FineTuner needs a pretrained model: pass --pretrained CKPT (model.init_args.pretrained)"
                )
            checkpoint, hparams = read_model_checkpoint(pretrained, ModelKind.GENOME_LM)
            check_alphabet(checkpoint, f"{pretrained}: fine-tune it")
            transformer = hparams["transformer"]
            weights = None if from_scratch else checkpoint
        config = dataclasses.replace(TransformerConfig.from_dict(transformer), vocab_size=VOCAB_SIZE)
        trunk = Transformer(config, self.runtime)
        if weights is not None:
            load_module_weights(trunk, weights)
        if not config.tie_embeddings:
            trunk.head.requires_grad_(False)  # the language-model head is not used
        self.put_trunk(trunk, head, strands)
        self.adaptation = adapting.adaptation
        if self.adaptation is Adaptation.LINEAR_PROBE:
            self.model.requires_grad_(False)
        elif self.adaptation is Adaptation.LORA:
            add_lora(self.model, lora_rank, 2.0 * lora_rank if lora_alpha is None else lora_alpha)
        self.head_learning_rate = 10.0 * learning_rate if head_learning_rate is None else head_learning_rate
        self.reverse_complement = strands.reverse_complement
        self.patience = patience
        self.metrics = nn.ModuleDict()
        self.save_hyperparameters(
            {
                "pretrained": None if pretrained is None else str(pretrained),
                "transformer": config.to_dict(),
                "targets": None,
                "head": dataclasses.replace(head, both_strands=self.both_strands).to_dict(),
                "strands": strands.to_dict(),
                **adapting.to_dict(),
                **self.optimization.to_dict(),
                "head_learning_rate": head_learning_rate,
                "patience": patience,
            }
        )
        if targets is not None:
            self.set_targets(TargetSpace.from_dict(targets))

    # ------------------------------------------------------------------ the head
    def set_targets(self, targets: TargetSpace) -> None:
        """Build the head for `targets` (once), its metrics, and save the targets with the model; a
        different target space later is an error."""
        first = self.targets is None
        super().set_targets(targets)
        if first:
            self.hparams["targets"] = targets.to_dict()
            self.metrics = nn.ModuleDict({split: split_metrics(targets) for split in ("val", "test")})

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        space = getattr(datamodule, "target_space", None)
        if space is not None:
            self.set_targets(space)
            if space.kind.per_base and datamodule.window > self.model.config.max_seq_len:
                raise ValueError(
                    f"data window {datamodule.window} exceeds the model's max_seq_len="
                    f"{self.model.config.max_seq_len}; lower --window"
                )
        if self.head is None:
            raise ValueError(
                "FineTuner has no targets: train it with LabelledDataModule (genoformer finetune) or "
                "give model.init_args.targets"
            )
        self.head.to(self.device)

    # ------------------------------------------------------------------ forward
    def features(self, tokens_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """The network's features, without gradients through a frozen trunk (a linear probe)."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.adaptation is not Adaptation.LINEAR_PROBE):
            return super().features(tokens_BL, lengths_B)

    # ------------------------------------------------------------------ loss
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        kind = self.targets.kind
        if kind is TargetKind.SEQUENCE_CLASSES:
            return F.cross_entropy(outputs.float(), targets.long())
        if kind is TargetKind.SEQUENCE_LABELS:
            return F.binary_cross_entropy_with_logits(outputs.float(), targets.float())
        if kind is TargetKind.BASE_CLASSES:
            return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten().long(), ignore_index=IGNORE)
        standardised = (targets.float() - self.value_mean) / self.value_std
        if kind is TargetKind.BASE_VALUES:
            standardised = standardised.squeeze(-1) if standardised.ndim == 3 else standardised
            outputs = outputs.squeeze(-1)
        known = torch.isfinite(standardised)
        return F.mse_loss(outputs.float()[known], standardised[known])

    def _random_strand(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and targets with a random half of the rows on the other strand."""
        tokens_BL, lengths_B, targets = batch["tokens"], batch["length"], batch["targets"]
        flip_B = torch.rand(tokens_BL.shape[0], device=tokens_BL.device) < 0.5
        tokens_BL = torch.where(flip_B[:, None], reverse_complement_rows(tokens_BL, lengths_B), tokens_BL.long())
        if self.targets.kind.per_base:
            flipped = flip_within(targets, lengths_B)
            if self.targets.kind.classes:
                swap = torch.as_tensor(self.targets.swap(), device=targets.device)
                flipped = torch.where(flipped == IGNORE, IGNORE, swap[flipped.clamp(min=0)])
            targets = torch.where(flip_B[:, None], flipped, targets)
        return tokens_BL, targets

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.reverse_complement:
            tokens_BL, targets = self._random_strand(batch)
        else:
            tokens_BL, targets = batch["tokens"], batch["targets"]
        loss = self.loss(self(tokens_BL, batch["length"]), targets)
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens_BL.shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], split: str) -> None:
        tokens_BL, lengths_B, targets = batch["tokens"], batch["length"], batch["targets"]
        features_BLF = self.features(tokens_BL, lengths_B)  # once, for the loss and the predictions
        loss = self.loss(self._head(features_BLF, lengths_B), targets)
        self.log(f"{split}/loss", loss, prog_bar=split == "val", batch_size=tokens_BL.shape[0], sync_dist=True)
        predictions = self._predictions(features_BLF, tokens_BL, lengths_B)
        metrics = self.metrics[split]
        if self.targets.kind.per_base:
            known = targets != IGNORE if self.targets.kind.classes else torch.isfinite(targets)
            predictions, targets = predictions[known], targets[known]
        if self.targets.kind is TargetKind.SEQUENCE_CLASSES and self.targets.outputs == 2:
            metrics.update(predictions[:, 1], targets)
        elif self.targets.kind is TargetKind.BASE_VALUES:
            metrics.update(predictions.squeeze(-1), targets)
        else:
            metrics.update(predictions, targets.long() if self.targets.kind.probabilities else targets)
        self.log_dict({f"{split}/{name}": metric for name, metric in metrics.items()}, batch_size=tokens_BL.shape[0])

    # ------------------------------------------------------------------ optimiser, callbacks, checkpoints
    def configure_callbacks(self) -> list[Callback]:
        """Early stopping on the validation loss (unless patience is 0), and a validation at the
        last training step."""
        callbacks: list[Callback] = [ValidateLastStep()]
        if self.patience:
            # strict=False: a run without validation data trains its steps
            callbacks.append(
                EarlyStopping(monitor=VALIDATION_MONITOR, mode="min", patience=self.patience, strict=False)
            )
        return callbacks

    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_warmup_cosine(
            self.model,
            lambda: self.trainer.estimated_stepping_batches,
            self.optimization,
            fused=fused_adamw_allowed(self),
            own_rates=[(self.head, self.head_learning_rate)],
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["alphabet"] = dict(TOKEN_CODES)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_alphabet(checkpoint, "load it")
        targets = (checkpoint.get("hyper_parameters") or {}).get("targets")
        if targets is not None:
            self.set_targets(TargetSpace.from_dict(targets))
        super().on_load_checkpoint(checkpoint)


class ValidateLastStep(Callback):
    """Validate after the last training step (trainer.max_steps) even when it is not a multiple of
    the validation interval: Lightning validates a step on which the trainer is asked to stop."""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


HEADLINE_METRICS = ("val/accuracy", "val/coding_mcc", "val/mcc", "val/pearson", "val/f1")
"""The metric shown beside the validation loss in `validation_summary`: the first one logged."""


@dataclasses.dataclass(frozen=True)
class Validation:
    """One validation of a run: the optimizer step after which it ran, and its val/* metrics."""

    step: int
    metrics: dict[str, float]


def read_validations(metrics_csv: Union[str, Path]) -> list[Validation]:
    """The validations recorded in a run's metrics.csv, in order. Lightning logs a validation
    with the number of optimizer steps before the one that triggered it, so its step is that + 1."""
    with open(metrics_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [
        Validation(
            int(row["step"]) + 1,
            {key: float(value) for key, value in row.items() if key.startswith("val/") and value not in ("", None)},
        )
        for row in rows
        if row.get(VALIDATION_MONITOR) not in ("", None)
    ]


def validation_summary(
    validations: list[Validation],
    *,
    best: Path,
    last: Path,
    max_steps: int,
    patience: int,
    stopped_early: bool,
    predict: str,
) -> str:
    """What a finished run's best and last checkpoints scored on validation, said plainly when
    the last is worse, whether early stopping (`patience` validations) ended it before
    `max_steps`, and the command that predicts with the best (`predict`, a command line with the
    placeholder CHECKPOINT)."""
    if not validations:
        return f"no validation ran; the model is {last}"
    best_run = min(validations, key=lambda v: v.metrics[VALIDATION_MONITOR])  # the first of equals
    last_run = validations[-1]
    shown = next((key for key in HEADLINE_METRICS if key in last_run.metrics), None)

    def line(label: str, run: Validation, path: Path) -> str:
        metric = "" if shown is None else f"  {shown} {run.metrics.get(shown, float('nan')):.4g}"
        return (
            f"  {label}: step {run.step:<6} {VALIDATION_MONITOR} {run.metrics[VALIDATION_MONITOR]:.4g}{metric}  {path}"
        )

    lines = [
        f"validation ({VALIDATION_MONITOR}, lower is better; {len(validations)} validations):",
        line("best", best_run, best),
        line("last", last_run, last),
    ]
    if stopped_early:
        lines.append(
            f"stopped early at step {last_run.step} of {max_steps}: {VALIDATION_MONITOR} did not improve "
            f"for {patience} validations (--patience)"
        )
    elif last_run.step < max_steps:
        lines.append(
            f"training ended at step {last_run.step} of {max_steps}, on a limit other than max_steps "
            "(max_epochs or max_time; Lightning's message above names it)"
        )
    best_loss, last_loss = best_run.metrics[VALIDATION_MONITOR], last_run.metrics[VALIDATION_MONITOR]
    if best_run is last_run:
        lines.append("the last checkpoint is the best one")
    else:
        lines.append(
            f"the last checkpoint is WORSE than the best: {VALIDATION_MONITOR} {last_loss:.4g} against "
            f"{best_loss:.4g} at step {best_run.step}"
        )
    lines.append(f"predict with the best checkpoint:\n  {predict.replace('CHECKPOINT', str(best))}")
    return "\n".join(lines)


def split_metrics(targets: TargetSpace) -> torchmetrics.MetricCollection:
    """The metrics of one split for `targets` (see the module docstring)."""
    k = targets.outputs
    kind = targets.kind
    if kind is TargetKind.SEQUENCE_CLASSES and k == 2:
        metrics = {
            "accuracy": tmc.BinaryAccuracy(),
            "balanced_accuracy": _BinaryBalancedAccuracy(),
            "mcc": tmc.BinaryMatthewsCorrCoef(),
            "f1": tmc.BinaryF1Score(),
            "auroc": tmc.BinaryAUROC(),
            "auprc": tmc.BinaryAveragePrecision(),
        }
    elif kind is TargetKind.SEQUENCE_CLASSES:
        metrics = {
            "accuracy": tmc.MulticlassAccuracy(k, average="micro"),
            "balanced_accuracy": tmc.MulticlassAccuracy(k, average="macro"),
            "mcc": tmc.MulticlassMatthewsCorrCoef(k),
            "f1": tmc.MulticlassF1Score(k, average="macro"),
            "auroc": tmc.MulticlassAUROC(k),
            "auprc": tmc.MulticlassAveragePrecision(k),
        }
    elif kind is TargetKind.SEQUENCE_LABELS:
        metrics = {
            "accuracy": tmc.MultilabelAccuracy(k),
            "f1": tmc.MultilabelF1Score(k),
            "auroc": tmc.MultilabelAUROC(k),
            "auprc": tmc.MultilabelAveragePrecision(k),
        }
    elif kind is TargetKind.SEQUENCE_VALUES:
        metrics = {
            "pearson": tmr.PearsonCorrCoef(num_outputs=k),
            "spearman": tmr.SpearmanCorrCoef(num_outputs=k),
            "mse": tmr.MeanSquaredError(num_outputs=k),
        }
        if k > 1:
            metrics = {name: _MeanOverTargets(metric) for name, metric in metrics.items()}
    elif kind is TargetKind.BASE_CLASSES:
        metrics = {
            "accuracy": tmc.MulticlassAccuracy(k, average="micro"),
            "balanced_accuracy": tmc.MulticlassAccuracy(k, average="macro"),
            "mcc": tmc.MulticlassMatthewsCorrCoef(k),
        }
        if tuple(targets.names) == ANNOTATION_CLASSES:
            metrics["coding_mcc"] = _CodingMCC()
    else:
        metrics = {"pearson": tmr.PearsonCorrCoef(), "mse": tmr.MeanSquaredError()}
    return torchmetrics.MetricCollection(metrics)


class _BinaryBalancedAccuracy(tmc.MulticlassAccuracy):
    """Balanced accuracy from the probability of the positive class (threshold 0.5)."""

    def __init__(self) -> None:
        super().__init__(2, average="macro")

    def update(self, probability_B: torch.Tensor, target_B: torch.Tensor) -> None:
        super().update((probability_B >= 0.5).long(), target_B)


class _CodingMCC(tmc.BinaryMatthewsCorrCoef):
    """Per-base MCC of "coding on either strand" (CDS+ or CDS-) against everything else."""

    def update(self, probabilities_NK: torch.Tensor, target_N: torch.Tensor) -> None:
        called_N = probabilities_NK.argmax(-1)
        super().update(_coding(called_N), _coding(target_N))


def _coding(classes_N: torch.Tensor) -> torch.Tensor:
    return ((classes_N == CDS_PLUS) | (classes_N == CDS_MINUS)).long()


class _MeanOverTargets(torchmetrics.Metric):
    """A per-target regression metric averaged over the targets (one number to log)."""

    full_state_update = False

    def __init__(self, metric: torchmetrics.Metric) -> None:
        super().__init__()
        self.metric = metric

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.metric.update(predictions, targets)

    def compute(self) -> torch.Tensor:
        return self.metric.compute().float().mean()

    def reset(self) -> None:
        super().reset()
        self.metric.reset()
