"""The training base every genoformer LightningModule shares.

`TrainingModule` holds what the DNA language model and the forecaster train with alike:

- runtime settings (`genoformer.core.runtime.RuntimeSettings`) handed to the trunk and compiled
  blocks when asked, never saved;
- exact resume: every random draw of training step s (masking, dropout) comes from generators
  seeded by (seed, s, rank), so a run resumed at step s draws what the uninterrupted run drew,
  whatever ran in between (validation, a restart);
- checkpoints tagged with their kind and format version, with canonical keys
  (`genoformer.core.checkpoints`);
- AdamW with weight decay on matrices only, linear warmup then cosine decay per step
  (`OptimizerSettings`), the fused CUDA AdamW where it is safe, and gradient clipping that works
  with it.

A wing subclasses it, sets `kind`, builds `self.model` (a `TransformerTrunk`) with
`self.runtime`, sets `self.optimization` (`OptimizerSettings.of(locals())` in its __init__, whose
arguments name the settings' fields) and writes its steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Union

import lightning as L
import numpy as np
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from genoformer.core import checkpoints
from genoformer.core.checkpoints import COMPILED_PREFIX, ModelKind
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerTrunk, compile_blocks

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of training step `step` on rank `rank`: well mixed, a pure function of its inputs."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def warmup_cosine(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup to 1 over `warmup_steps`, then cosine decay to
    `min_lr_ratio` at `total_steps` (held there afterwards)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class ArgumentGroup:
    """Base of a frozen dataclass that groups some of a training module's __init__ arguments: the
    module keeps them as arguments of its own (flat config keys, model.init_args.NAME), collects
    them with `of(locals())` and saves them with `to_dict()` among its hyperparameters."""

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> Self:
        """The group's fields among `arguments` (a module's __init__ locals), by name."""
        return cls(**{field.name: arguments[field.name] for field in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as the hyperparameters hold them (tuples as lists)."""
        return {
            name: list(value) if isinstance(value, tuple) else value for name, value in dataclasses.asdict(self).items()
        }


@dataclasses.dataclass(frozen=True)
class OptimizerSettings(ArgumentGroup):
    """How a training module's weights learn: AdamW, weight decay on matrices only, linear warmup
    then cosine decay per step (`adamw_warmup_cosine`). What a run was, saved with the
    hyperparameters, beside `RuntimeSettings` (how it ran, never saved). A module takes the fields
    as arguments of its own, so that configs and command lines name them as they always did
    (model.init_args.learning_rate, ...), and collects them with `OptimizerSettings.of(locals())`."""

    learning_rate: float
    """Peak learning rate, reached after the warmup."""
    weight_decay: float
    """AdamW weight decay of matrices (embeddings and linear weights); norm weights never decay."""
    betas: tuple[float, float]
    """AdamW (beta1, beta2)."""
    warmup_steps: int
    """Optimizer steps of linear warmup from 0 to learning_rate."""
    total_steps: Optional[int]
    """Optimizer steps at which the cosine decay ends; None: the trainer's estimated_stepping_batches."""
    min_lr_ratio: float
    """Final learning rate as a fraction of learning_rate."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))


class TrainingModule(L.LightningModule):
    """Base of genoformer's LightningModules (see the module docstring)."""

    kind: ClassVar[ModelKind]
    model: TransformerTrunk
    optimization: OptimizerSettings

    def __init__(self, runtime: Union[RuntimeSettings, Mapping[str, Any], None] = None) -> None:
        super().__init__()
        self.runtime = RuntimeSettings.from_mapping(runtime)
        self._blocks_compiled = False
        self.base_seed: Optional[int] = None  # base of the per-step seeds: the global seed at the first fit

    def configure_model(self) -> None:
        """Lightning's hook before a run (fit, validate, test, predict): the runtime settings
        reach the trunk here, and its blocks are compiled when asked."""
        self.model.apply_runtime(self.runtime)
        if self.runtime.compile and not self._blocks_compiled:
            compile_blocks(self.model, mode="reduce-overhead" if self.runtime.cuda_graphs else None)
            self._blocks_compiled = True

    # ------------------------------------------------------------------- exact resume
    def on_fit_start(self) -> None:
        if self.base_seed is None:  # a resumed run keeps the seed of its checkpoint
            self.base_seed = torch.initial_seed()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        torch.manual_seed(step_seed(self.base_seed, self.global_step, self.global_rank))

    # ------------------------------------------------------------------- checkpoints
    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's loader, after `checkpoints.verify_checkpoint_file` checked the file (a
        local path; a file object or remote path is read as Lightning reads it)."""
        if isinstance(checkpoint_path, (str, Path)) and "://" not in str(checkpoint_path):
            checkpoints.verify_checkpoint_file(checkpoint_path)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoints.tag(checkpoint, self.kind)
        checkpoint["seed"] = self.base_seed

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state_dict = checkpoints.canonical_state_dict(checkpoint["state_dict"])
        own_keys = {key.replace(COMPILED_PREFIX, ""): key for key in self.state_dict()}
        checkpoint["state_dict"] = {own_keys.get(key, key): value for key, value in state_dict.items()}
        self.base_seed = checkpoint.get("seed")

    # ------------------------------------------------------------------- optimiser
    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_warmup_cosine(
            self.model,
            lambda: self.trainer.estimated_stepping_batches,
            self.optimization,
            fused=fused_adamw_allowed(self),
        )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Optional[float] = None,
        gradient_clip_algorithm: Optional[str] = None,
    ) -> None:
        # Lightning refuses to clip for any optimizer that unscales gradients in its step (fused
        # AdamW), a rule that matters only under a GradScaler. `fused_adamw_allowed` keeps fused
        # optimizers away from one, so their gradients are in their true scale and are clipped
        # here directly, exactly as Lightning clips them for an unfused optimizer.
        if gradient_clip_val and optimizer.defaults.get("fused"):
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if gradient_clip_algorithm == "value":
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def fused_adamw_allowed(module: L.LightningModule) -> bool:
    """Whether the module's optimizer may be the fused AdamW: every parameter on CUDA, whole
    gradients on every device (one device or DDP, not FSDP's shards), and no GradScaler (16-mixed
    scales the loss, and a fused step unscales inside, after clipping)."""
    on_cuda = all(param.is_cuda for param in module.parameters())
    trainer = module._trainer  # None when called outside a Trainer (benchmarks, tests): no strategy, no scaler
    if trainer is None:
        return on_cuda
    whole_gradients = isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy))
    return on_cuda and whole_gradients and getattr(trainer.precision_plugin, "scaler", None) is None


def adamw_warmup_cosine(
    model: torch.nn.Module,
    estimated_steps: Callable[[], float],
    settings: OptimizerSettings,
    *,
    fused: bool = False,
    own_rates: Sequence[tuple[torch.nn.Module, float]] = (),
) -> dict[str, Any]:
    """AdamW (weight decay on matrices only) with `warmup_cosine` per step, as Lightning's
    configure_optimizers returns it; settings.total_steps None: `estimated_steps()` (the trainer's
    estimated_stepping_batches). `own_rates`: (module, peak learning rate) of modules that train at
    their own rate (a fine-tuning head), under the same schedule; only trainable parameters train."""
    weight_decay, total_steps = settings.weight_decay, settings.total_steps
    groups = []
    for module, rate in [(model, settings.learning_rate), *own_rates]:
        decay, no_decay = [], []
        for param in module.parameters():  # tied weights appear once
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        groups += [
            {"params": decay, "weight_decay": weight_decay, "lr": rate},
            {"params": no_decay, "weight_decay": 0.0, "lr": rate},
        ]
    optimizer = torch.optim.AdamW(
        [group for group in groups if group["params"]],
        lr=settings.learning_rate,
        betas=settings.betas,
        # fused (CUDA): one kernel for all parameters instead of several per tensor group
        fused=fused,
    )
    if total_steps is None:
        estimated = estimated_steps()
        if not math.isfinite(estimated):
            raise ValueError(
                "cannot derive total_steps: the trainer has no max_steps or max_epochs; set "
                "model.init_args.total_steps or trainer.max_steps."
            )
        total_steps = int(estimated)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: warmup_cosine(
            step, warmup_steps=settings.warmup_steps, total_steps=total_steps, min_lr_ratio=settings.min_lr_ratio
        ),
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
