"""Lightning callbacks, usable from YAML under `trainer.callbacks` by class_path."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    ModelCheckpoint,
    ProgressBar,
    RichProgressBar,
    TQDMProgressBar,
)
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from genoformer.data.storage import atomic_build
from genoformer.progress import LINE_SECONDS, interactive

log = logging.getLogger(__name__)


class LossPlotCallback(L.Callback):
    """At the end of fit, write a PNG of train and validation loss against the optimizer step,
    with bits per base (loss / ln 2) on the right axis, into the run directory (the logger's
    log_dir, else trainer.default_root_dir).

    When the run directory holds a baseline report (by default `baseline.json`, as written by
    `genoformer baseline --out <run dir>/baseline.json` on the validation data), its total bits
    per base is drawn as a horizontal line, so the curve is read against the classical model."""

    def __init__(
        self,
        filename: str = "loss.png",
        train_key: str = "train/loss",
        val_key: str = "val/loss",
        baseline_filename: str = "baseline.json",
        bits_per_base: bool = True,
        metric_keys: Sequence[str] = (),
    ) -> None:
        """
        Args:
            filename: name of the PNG inside the run directory.
            train_key: logged metric plotted as the training curve (one point per optimizer step).
            val_key: logged metric plotted as the validation curve (one point per validation run).
            baseline_filename: baseline report inside the run directory, drawn when present
                ({"total": {"bits_per_base": ...}, "model": {"order": k}} as `genoformer baseline` writes).
            bits_per_base: label the losses as nats per base with bits per base on the right axis
                (language models); False: a plain loss axis (fine-tuning).
            metric_keys: validation metrics drawn in a second panel beside the loss (e.g.
                val/accuracy, val/auroc), those that were logged.
        """
        self.filename = filename
        self.train_key = train_key
        self.val_key = val_key
        self.baseline_filename = baseline_filename
        self.bits_per_base = bits_per_base
        self.metric_keys = list(metric_keys)
        self.train: dict[int, float] = {}
        self.val: dict[int, float] = {}
        self.metrics: dict[str, dict[int, float]] = {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        value = trainer.callback_metrics.get(self.train_key)
        if value is not None:
            self.train[trainer.global_step] = float(value)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.val_key)
        if value is not None:
            self.val[trainer.global_step] = float(value)
        for key in self.metric_keys:
            value = trainer.callback_metrics.get(key)
            if value is not None:
                self.metrics.setdefault(key, {})[trainer.global_step] = float(value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "train": dict(self.train),
            "val": dict(self.val),
            "metrics": {k: dict(v) for k, v in self.metrics.items()},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train = dict(state_dict["train"])
        self.val = dict(state_dict["val"])
        self.metrics = {k: dict(v) for k, v in state_dict.get("metrics", {}).items()}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)  # every rank: log_dir broadcasts
        if trainer.is_global_zero:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.plot(run_dir / self.filename, baseline=read_baseline(run_dir / self.baseline_filename))

    def plot(self, path: Path, baseline: tuple[float, str] | None = None) -> Path:
        """Draw the recorded curves into `path` (PNG) and return it; `baseline` is (bits per base,
        label) of a horizontal reference line."""
        panels = 2 if self.metrics else 1
        figure = Figure(figsize=(7 * panels, 4.5), layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.add_subplot(1, panels, 1)
        for key, points, style in ((self.train_key, self.train, "-"), (self.val_key, self.val, "o-")):
            if points:
                steps = sorted(points)
                ax.plot(steps, [points[s] for s in steps], style, label=key, markersize=3)
        ax.set_xlabel("optimizer step")
        if self.bits_per_base:
            ax.set_ylabel("loss (nats per base)")
            bits_axis = ax.secondary_yaxis(
                "right", functions=(lambda nats: nats / math.log(2), lambda bits: bits * math.log(2))
            )
            bits_axis.set_ylabel("bits per base")
        else:
            ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if self.metrics:
            metric_ax = figure.add_subplot(1, panels, 2)
            for key, points in self.metrics.items():
                steps = sorted(points)
                metric_ax.plot(steps, [points[s] for s in steps], "o-", label=key, markersize=3)
            metric_ax.set_xlabel("optimizer step")
            metric_ax.set_ylabel("validation metric")
            metric_ax.grid(alpha=0.3)
            metric_ax.legend()
        if baseline is not None:
            bits, label = baseline
            ax.axhline(
                bits * math.log(2), color="black", linestyle="--", linewidth=1, label=f"{label}: {bits:.3f} bits/base"
            )
        if self.train or self.val:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no loss values were logged", ha="center", va="center", transform=ax.transAxes)
        with atomic_build(Path(path), overwrite=True) as tmp:
            figure.savefig(tmp, dpi=120, format="png")
        return path


def read_baseline(path: Path) -> tuple[float, str] | None:
    """(bits per base, label) from a `genoformer baseline` report, or None when there is none."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    order = report.get("model", {}).get("order")
    label = "Markov baseline" if order is None else f"order-{order} Markov baseline"
    return float(report["total"]["bits_per_base"]), label


class PredictionWriter(BasePredictionWriter):
    """At the end of `genoformer predict`, write every tile's embedding to a .npz file in the run
    directory: `embeddings` float32 (N, E), `contig` (N,) index, `contig_name` (N,), `start` and
    `length` (N,) in bases; one file per rank under DDP (`<stem>.rank<r>.npz`). The file also
    records what was computed, as 0-d arrays: `pooling` ("mean", as GenoformerLM.predict_step
    pools), `layer` (-1, the last block), `window` and `stride` (tokens per tile and the step
    between tile starts, from the data module) and `checkpoint` (the weights' file).

    Written under a temporary name and renamed when complete; the command line refuses to
    replace an earlier file unless given --overwrite (`genoformer.cli.GenoformerCLI`).
    """

    def __init__(self, filename: str = "predictions.npz") -> None:
        """
        Args:
            filename: name of the .npz file inside the run directory.
        """
        super().__init__(write_interval="epoch")
        self.filename = filename

    def output_path(self, trainer: L.Trainer) -> Path:
        """Where this rank writes: `<log_dir>/<filename>`, or `<stem>.rank<r>.npz` under DDP."""
        path = Path(trainer.log_dir or trainer.default_root_dir) / self.filename
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        if not batches:
            return
        columns = {
            key: torch.cat([batch[key].detach().cpu() for batch in batches]).numpy()
            for key in ("embeddings", "contig", "start", "length")
        }
        datamodule = trainer.datamodule
        names = datamodule.contig_names() if hasattr(datamodule, "contig_names") else []
        if names:
            columns["contig_name"] = np.array([names[i] for i in columns["contig"]], dtype=str)
        window = int(datamodule.window)
        columns.update(
            pooling=np.array("mean"),
            layer=np.array(-1),
            window=np.array(window),
            stride=np.array(int(datamodule.eval_stride or window)),
            checkpoint=np.array(str(trainer.ckpt_path or "")),
        )
        path = self.output_path(trainer)
        with atomic_build(path, overwrite=True) as tmp:
            np.savez(tmp, **columns)
        print(f"wrote {len(columns['embeddings'])} tile embeddings to {path}")


class Preempted(SystemExit):
    """Training stopped on a signal after saving its state; the exit status is 128 + the signal
    number, as a shell reports a process ended by that signal."""


class ResumeCheckpoint(L.Callback):
    """Keep `last.ckpt` (of the ModelCheckpoint with `save_last: true`) resumable at the moments
    the periodic checkpoints miss: when the job is told to stop (SIGTERM, SIGUSR1: what SLURM and
    most schedulers send before they kill a job) and when training ends between two periodic saves.

    A signal only sets a flag; the checkpoint is written at the end of the training step that is
    running (so weights, optimizer, scheduler, data position and step counters agree), the step's
    metrics are logged and flushed, and the process exits with status 128 + the signal number
    (143 for SIGTERM) before anything else runs (validation, the next step). Where Lightning
    stops first on a SIGTERM of its own (at the end of a step, or while validating), the
    checkpoint is written then, with the same training state, and the exit status is still 128 +
    the signal number: a scheduler never mistakes a stopped job for a finished one. `genoformer fit
    ... --ckpt_path last` continues from there, and metrics.csv ends up with every step's row once.
    """

    def __init__(self, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")) -> None:
        """
        Args:
            signals: names of the signals that mean "save and stop".
        """
        unknown = [name for name in signals if not isinstance(getattr(signal, name, None), signal.Signals)]
        if unknown:
            raise ValueError(f"unknown signal name(s) {unknown}; use names such as SIGTERM or SIGUSR1")
        self.signals = tuple(getattr(signal, name) for name in signals)
        self.received: Optional[signal.Signals] = None
        self.saved_path: Optional[Path] = None
        self._previous: dict[signal.Signals, Any] = {}

    @staticmethod
    def _last_checkpoint(trainer: L.Trainer) -> tuple[ModelCheckpoint, Path]:
        """The ModelCheckpoint with save_last and its `last.ckpt`, which `--ckpt_path last` resumes from."""
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath:
                return callback, Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
        raise ValueError(
            "ResumeCheckpoint writes the last.ckpt of a ModelCheckpoint with save_last: true; "
            "add one to trainer.callbacks (see configs/quickstart.yaml)"
        )

    def _write_last(self, trainer: L.Trainer) -> Path:
        callback, path = self._last_checkpoint(trainer)
        # recorded before saving (it is part of the saved state), so that the ModelCheckpoint
        # overwrites this file later instead of starting last-v1.ckpt beside it
        callback.last_model_path = str(path)
        trainer.save_checkpoint(path, weights_only=False)  # all of it: what resuming needs
        return path

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._last_checkpoint(trainer)  # a config error now, not at the first signal
        self.received, self.saved_path = None, None
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        previous = self._previous.get(self.received)
        if callable(previous):  # e.g. Lightning's SIGTERM handler, which stops DDP workers
            previous(signum, frame)

    def _requested(self, trainer: L.Trainer) -> bool:
        requested = self.received is not None
        if trainer.world_size > 1:  # one rank may get the signal: all stop together
            requested = trainer.strategy.reduce_boolean_decision(requested, all=False)
        return requested

    def _save(self, trainer: L.Trainer) -> None:
        path = self.saved_path = self._write_last(trainer)
        if trainer.is_global_zero:
            name = (self.received or signal.SIGTERM).name
            print(
                f"genoformer: {name} received; saved {path} at step {trainer.global_step}. Resume with the same "
                "command plus --ckpt_path last",
                file=sys.stderr,
                flush=True,
            )

    @property
    def _status(self) -> int:
        return 128 + int(self.received or signal.SIGTERM)

    def _stop_if_saved(self) -> None:
        """Exit (raise Preempted) once the signal's checkpoint is written and its step logged."""
        if self.saved_path is not None:
            raise Preempted(self._status)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # between optimizer steps only: mid-accumulation gradients are not in a checkpoint. The
        # exit waits for the first hook after Lightning has logged this step's metrics.
        step_ends = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if self.saved_path is None and step_ends and self._requested(trainer):
            self._save(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_saved()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_saved()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._stop_if_saved()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.received is None:
            self._write_last(trainer)
            return
        if self.saved_path is None:  # the signal came during the last step: saved, and still a stop
            self._save(trainer)
        raise Preempted(self._status)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.received is None or isinstance(exception, Preempted):
            return
        # Lightning stopped first, with its own SIGTERMException (exit status 0): at the end of
        # the step or while validating. Save then, and exit as a stop on a signal does.
        if self.saved_path is None:
            self._save(trainer)
        if isinstance(exception, SystemExit):
            exception.code = self._status


class NonFiniteError(FloatingPointError):
    """A training step produced a non-finite loss or gradient (NonFiniteGuard with policy stop)."""


class NonFiniteGuard(L.Callback):
    """Find a non-finite loss or gradient at the step where it appears, say where its batch came
    from (store, record, position: the data module's `describe_batch`), and apply a policy:

    - stop: raise NonFiniteError with that report (the default);
    - skip: leave the weights and optimizer state untouched for that step (its gradients are
      dropped), log a WARNING with the report, and count it in `train/skipped_batches` (kept in
      checkpoints); stop once more than `max_skipped` steps were skipped.

    Costs one device-to-host copy of two flags per optimizer step. Under fp16 mixed precision the
    gradient scaler already skips overflowing steps, so only the loss is checked there.
    """

    def __init__(self, policy: Literal["stop", "skip"] = "stop", max_skipped: Optional[int] = 100) -> None:
        """
        Args:
            policy: stop (raise at the first non-finite step) or skip (drop that step and count it).
            max_skipped: with skip, the number of skipped steps after which training stops anyway
                (None: no limit).
        """
        if policy not in ("stop", "skip"):
            raise ValueError(f"policy must be 'stop' or 'skip', got {policy!r}")
        self.policy = policy
        self.max_skipped = max_skipped
        self.skipped = 0
        # the micro-batches of the optimizer step that is running (several with gradient accumulation)
        self._batches: deque[tuple[int, Any]] = deque(maxlen=1)
        self._losses: deque[torch.Tensor] = deque(maxlen=1)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batches = deque(maxlen=trainer.accumulate_grad_batches)
        self._losses = deque(maxlen=trainer.accumulate_grad_batches)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batches.append((batch_idx, batch))

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        check_grads = getattr(trainer.precision_plugin, "scaler", None) is None and params
        losses = torch.stack([loss.float().reshape(()) for loss in self._losses]) if self._losses else None
        flags = [torch.isfinite(losses).all() if losses is not None else torch.tensor(True)]
        if check_grads:
            norms = torch.stack([torch.linalg.vector_norm(p.grad.detach().float()) for p in params])
            flags.append(torch.isfinite(norms).all())
        finite = [bool(flag) for flag in torch.stack([f.to(flags[0].device) for f in flags]).tolist()]
        loss_ok, grads_ok = finite[0], finite[-1]
        bad = not (loss_ok and grads_ok)
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            self._handle(
                trainer,
                optimizer,
                "loss" if not loss_ok else "gradient" if not grads_ok else "loss or gradient (on another rank)",
            )
        self._losses.clear()
        self._batches.clear()

    def _handle(self, trainer: L.Trainer, optimizer: Any, what: str) -> None:
        report = (
            f"non-finite {what} at global step {trainer.global_step} (epoch {trainer.current_epoch}); "
            f"{self._describe(trainer)}"
        )
        if self.policy == "stop":
            raise NonFiniteError(
                f"{report}. To skip such steps and count them instead, add "
                "genoformer.core.callbacks.NonFiniteGuard with policy: skip to trainer.callbacks"
            )
        self.skipped += 1
        if self.max_skipped is not None and self.skipped > self.max_skipped:
            raise NonFiniteError(
                f"{report}; {self.skipped} steps were non-finite, more than max_skipped="
                f"{self.max_skipped}: stopping (lower the learning rate or check the data)"
            )
        log.warning("skipping step: %s (%d skipped so far)", report, self.skipped)
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None  # the optimizer leaves parameters without gradients untouched

    def _describe(self, trainer: L.Trainer) -> str:
        describe = getattr(trainer.datamodule, "describe_batch", None)
        parts = []
        for batch_idx, batch in self._batches:
            if describe is not None:
                where = describe(batch)
            else:
                where = f"keys {sorted(batch)}" if isinstance(batch, dict) else type(batch).__name__
            parts.append(f"batch {batch_idx}: {where}")
        return "; ".join(parts) if parts else "no batch recorded"

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.policy == "skip":
            pl_module.log("train/skipped_batches", float(self.skipped), on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))


# ----------------------------------------------------------------------- training progress
class TrainingProgress(ProgressBar):
    """Training progress as plain lines, for output that is not a terminal (a log, a pipe), where
    a redrawn bar shows nothing until the run ends: the step, what it has logged for the bar
    (the loss), seconds per step and the time left, at most every `seconds` seconds and at the
    last step; after each validation its metrics; for validate, test and predict the batches
    done. The training commands use it unless the trainer has a progress bar or none
    (`default_progress_bar`)."""

    def __init__(self, seconds: float = LINE_SECONDS, stream: Optional[Any] = None) -> None:
        super().__init__()
        self.seconds = seconds
        self.stream = stream
        self.enabled = True
        self._started = 0.0
        self._first_step = 0
        self._last_line = -math.inf

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def _line(self, text: str) -> None:
        if self.enabled and self.trainer.is_global_zero:
            stream = sys.stderr if self.stream is None else self.stream
            stream.write(text + "\n")
            stream.flush()
            self._last_line = time.monotonic()

    def _due(self) -> bool:
        return time.monotonic() - self._last_line >= self.seconds

    def _metrics(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> str:
        metrics = {
            key: value
            for key, value in self.get_metrics(trainer, pl_module).items()
            if key != "v_num" and key.startswith(prefix)
        }
        return ", ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in metrics.items()
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started, self._first_step = time.monotonic(), trainer.global_step
        goal = f" to step {trainer.max_steps:,}" if trainer.max_steps > 0 else ""
        self._line(f"training from step {trainer.global_step:,}{goal}")
        self._last_line = -math.inf  # the first step's line follows at once: the speed, early

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, last = trainer.global_step, trainer.max_steps
        if not (self._due() or step == last):
            return
        done = step - self._first_step
        per_step = (time.monotonic() - self._started) / max(done, 1)
        where = (
            f"step {step:,}/{last:,} ({100 * step / last:.0f}%)"
            if last > 0
            else f"step {step:,} (epoch {trainer.current_epoch})"
        )
        left = f", about {_clock(per_step * (last - step))} left" if last > 0 and step < last else ""
        metrics = self._metrics(trainer, pl_module)
        self._line(
            f"{where}: {per_step:.2f} s/step, {_clock(time.monotonic() - self._started)} so far{left}"
            + (f"; {metrics}" if metrics else "")
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = ", ".join(
            f"{key} {float(value):.4g}" for key, value in trainer.callback_metrics.items() if key.startswith("val")
        )
        self._line(f"validation at step {trainer.global_step:,}" + (f": {metrics}" if metrics else ""))

    def _evaluation_batch(self, what: str, batch_idx: int, total: float) -> None:
        """A line for a batch of validate, test or predict; `total` is the batches of its dataloader,
        which Lightning's `total_*_batches_current_dataloader` read at the index that
        `has_dataloader_changed` recorded (the caller records it first)."""
        if self._due() or batch_idx + 1 == total:
            of = f"/{int(total):,}" if math.isfinite(total) else ""
            self._line(f"{what}: batch {batch_idx + 1:,}{of}")

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.state.fn == "validate":
            self.has_dataloader_changed(dataloader_idx)
            self._evaluation_batch("validating", batch_idx, self.total_val_batches_current_dataloader)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.has_dataloader_changed(dataloader_idx)
        self._evaluation_batch("testing", batch_idx, self.total_test_batches_current_dataloader)

    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.has_dataloader_changed(dataloader_idx)
        self._evaluation_batch("predicting", batch_idx, self.total_predict_batches_current_dataloader)


def _clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepProgressBar(RichProgressBar):
    """Lightning's Rich bar on a terminal, whose training bar reads "Epoch N" when the run is
    bounded by steps (Lightning's reads "Epoch 0/-2", from max_epochs -1)."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is None or self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"  # as wide as Lightning's
        return super()._get_train_description(current_epoch)


def default_progress_bar() -> ProgressBar:
    """The training commands' progress: plain lines (`TrainingProgress`) when stderr or stdout is
    not a terminal, else Lightning's Rich bar (`StepProgressBar`), or its tqdm bar without Rich."""
    if not (interactive(sys.stdout) and interactive(sys.stderr)):
        return TrainingProgress()
    return StepProgressBar() if importlib.util.find_spec("rich") is not None else TQDMProgressBar()
