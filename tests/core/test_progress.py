"""Progress in a log: plain lines every few seconds instead of a bar redrawn with carriage returns
(which a log shows as nothing until the end), for our tqdm bars and for training; and on a
terminal a training bar that reads "Epoch 0", not "Epoch 0/-2"."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from genoformer.core.callbacks import StepProgressBar, TrainingProgress, default_progress_bar
from genoformer.progress import PlainLines, tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


def test_a_bar_in_a_log_writes_plain_lines(monkeypatch):
    log = io.StringIO()  # not a terminal
    ticks = []

    def clock() -> float:  # each reading 10 s after the one before
        ticks.append(None)
        return 10.0 * len(ticks)

    monkeypatch.setattr("genoformer.progress.time", SimpleNamespace(monotonic=clock))
    with tqdm(total=12, desc="scoring", unit="window", file=log, mininterval=0) as bar:
        for _ in range(12):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("scoring:   0%") and lines[-1].startswith("scoring: 100%")
    assert 3 <= len(lines) <= 6  # one line every 30 s of the 120 s, not one per update


def test_plain_lines_keep_the_last_state_of_a_bar_that_clears_itself():
    log = io.StringIO()
    lines = PlainLines(log, seconds=3600)
    for status in ("\rwork:   0%| 0/3", "\rwork:  33%| 1/3", "\rwork: 100%| 3/3"):
        lines.write(status + "   ")
    lines.write("\r" + " " * 20)  # tqdm clears a bar with leave=False
    lines.write("\r")
    assert log.getvalue() == "work:   0%| 0/3\nwork: 100%| 3/3\n"


def test_a_bar_on_a_terminal_is_tqdm_s_own():
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    with tqdm(total=2, file=terminal, mininterval=0) as bar:
        bar.update(2)
    assert "\r" in terminal.getvalue()


def test_training_bar_on_a_terminal_reads_epoch_without_minus_two():
    bar = StepProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1)  # a run bounded by max_steps
    assert bar._get_train_description(0).rstrip() == "Epoch 0"
    bar._trainer = SimpleNamespace(max_epochs=3)
    assert bar._get_train_description(1).rstrip() == "Epoch 1/2"


@pytest.mark.slow
def test_training_in_a_log_prints_progress_lines(tmp_path):
    """The quick start with its output to a log (as `make quickstart > log` runs it): lines with
    the step, the loss and the time left while it trains, and the validation loss. (A 3-step fit of
    a tiny model in a subprocess, about 15 s: the only way to see what a log of `fit` holds.)"""
    store = tmp_path / "lambda.zarr"
    subprocess.run(
        [sys.executable, "cli.py", "prepare", "--fasta", str(LAMBDA), "--out", str(store)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    log = tmp_path / "fit.log"
    with log.open("w") as out:
        subprocess.run(
            [
                sys.executable,
                "cli.py",
                "fit",
                "--config",
                "configs/quickstart.yaml",
                "--trainer.default_root_dir",
                str(tmp_path / "run"),
                "--data.init_args.store",
                str(store),
                "--trainer.max_steps",
                "3",
                "--trainer.val_check_interval",
                "3",
                "--trainer.limit_val_batches",
                "1",
                "--trainer.enable_model_summary",
                "false",
                "--data.init_args.num_workers",
                "0",
                "--model.transformer.d_model",
                "32",
                "--model.transformer.n_layers",
                "1",
                "--model.transformer.n_heads",
                "2",
                "--model.transformer.max_seq_len",
                "512",
                "--model.transformer.attention",
                "[{class_path: genoformer.kernels.layout.SlidingWindow, init_args: {window: 128, block_size: 64}}]",
            ],
            cwd=REPO_ROOT,
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    text = log.read_text()
    assert "\r" not in text and "Epoch 0/-2" not in text
    assert "training from step 0 to step 3" in text
    assert re.search(r"^step 1/3 \(33%\): [\d.]+ s/step, .* left; train/loss [\d.]+$", text, re.MULTILINE), text
    assert re.search(r"^step 3/3 \(100%\): ", text, re.MULTILINE), text
    assert re.search(r"^validation at step 3: val/loss [\d.]+", text, re.MULTILINE), text


def test_validate_test_and_predict_in_a_log_count_each_dataloader_s_batches():
    """Lightning counts evaluation batches per dataloader: the lines name each one's own total
    (a line at the first batch, then at most one an hour, and at each dataloader's last)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
    from torch.utils.data import DataLoader

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            return super().test_step(batch, batch_idx)

    out = io.StringIO()
    trainer = Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[TrainingProgress(seconds=3600, stream=out)],
    )
    model = Model()
    two, three = DataLoader(RandomDataset(32, 4), batch_size=2), DataLoader(RandomDataset(32, 6), batch_size=2)
    trainer.validate(model, [two, three], verbose=False)
    trainer.test(model, [three, two], verbose=False)
    trainer.predict(model, [two])
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.endswith(("/2", "/3"))] == [
        "validating: batch 1/2",
        "validating: batch 2/2",
        "validating: batch 3/3",
        "testing: batch 3/3",
        "testing: batch 2/2",
        "predicting: batch 2/2",
    ], lines  # the first, then each last


def test_the_default_progress_follows_the_output(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(default_progress_bar(), TrainingProgress)
