"""Lightning callbacks, usable from YAML under `trainer.callbacks` by class_path."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from genoformer.data.storage import atomic_build


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
    ) -> None:
        """
        Args:
            filename: name of the PNG inside the run directory.
            train_key: logged metric plotted as the training curve (one point per optimizer step).
            val_key: logged metric plotted as the validation curve (one point per validation run).
            baseline_filename: baseline report inside the run directory, drawn when present
                ({"total": {"bits_per_base": ...}, "model": {"order": k}} as `genoformer baseline` writes).
        """
        self.filename = filename
        self.train_key = train_key
        self.val_key = val_key
        self.baseline_filename = baseline_filename
        self.train: dict[int, float] = {}
        self.val: dict[int, float] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        value = trainer.callback_metrics.get(self.train_key)
        if value is not None:
            self.train[trainer.global_step] = float(value)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.val_key)
        if value is not None and not trainer.sanity_checking:
            self.val[trainer.global_step] = float(value)

    def state_dict(self) -> dict[str, Any]:
        return {"train": dict(self.train), "val": dict(self.val)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train = dict(state_dict["train"])
        self.val = dict(state_dict["val"])

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)  # every rank: log_dir broadcasts
        if trainer.is_global_zero:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.plot(run_dir / self.filename, baseline=read_baseline(run_dir / self.baseline_filename))

    def plot(self, path: Path, baseline: tuple[float, str] | None = None) -> Path:
        """Draw the recorded curves into `path` (PNG) and return it; `baseline` is (bits per base,
        label) of a horizontal reference line."""
        figure = Figure(figsize=(7, 4.5), layout="constrained")
        FigureCanvasAgg(figure)
        ax = figure.add_subplot()
        for key, points, style in ((self.train_key, self.train, "-"), (self.val_key, self.val, "o-")):
            if points:
                steps = sorted(points)
                ax.plot(steps, [points[s] for s in steps], style, label=key, markersize=3)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss (nats per base)")
        bits_axis = ax.secondary_yaxis("right", functions=(lambda nats: nats / math.log(2), lambda bits: bits * math.log(2)))
        bits_axis.set_ylabel("bits per base")
        ax.grid(alpha=0.3)
        if baseline is not None:
            bits, label = baseline
            ax.axhline(bits * math.log(2), color="black", linestyle="--", linewidth=1, label=f"{label}: {bits:.3f} bits/base")
        if self.train or self.val:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no loss values were logged", ha="center", va="center", transform=ax.transAxes)
        figure.savefig(path, dpi=120)
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
