"""`resolve_checkpoint`: every way a command may name a checkpoint. Run directories are made of
small files that hold Lightning's ModelCheckpoint record as Lightning saves it (the key, the state
dict); tests/cli/test_finetune_commands.py resolves a real fine-tuning run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genoformer import shipped
from genoformer.core.checkpoints import best_checkpoint, resolve_checkpoint

MONITORED = "ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"
LAST_ONLY = "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 50, 'every_n_epochs': 0, 'train_time_interval': None}"


def _save(path: Path, best: str | None = None, score: float = 0.19) -> Path:
    """A checkpoint file holding the ModelCheckpoint records of a run (best: the best file's path as recorded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    callbacks = {LAST_ONLY: {"monitor": None, "best_model_path": "", "best_model_score": None}}
    if best is not None:
        callbacks[MONITORED] = {"monitor": "val/loss", "best_model_path": best, "best_model_score": torch.tensor(score)}
    torch.save({"state_dict": {}, "callbacks": callbacks}, path)
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    """A run whose best checkpoint was recorded by a path that no longer exists (the run was moved)."""
    run = tmp_path / "runs" / "splice"
    _save(run / "checkpoints" / "epoch=0-step=40.ckpt", "/elsewhere/runs/splice/checkpoints/epoch=0-step=40.ckpt")
    _save(run / "checkpoints" / "epoch=0-step=60.ckpt")  # a later top-k file that is not the best
    _save(run / "checkpoints" / "last.ckpt", "/elsewhere/runs/splice/checkpoints/epoch=0-step=40.ckpt")
    return run


def test_a_file_is_itself(run):
    path = run / "checkpoints" / "epoch=0-step=60.ckpt"
    assert resolve_checkpoint(path) == path


def test_a_run_directory_is_its_recorded_best_found_by_name_in_the_run(run, capsys):
    best = run / "checkpoints" / "epoch=0-step=40.ckpt"
    assert resolve_checkpoint(run) == best
    assert f"checkpoint {run} is {best} (the run's best checkpoint, val/loss 0.19)" in capsys.readouterr().err
    assert resolve_checkpoint(run / "checkpoints") == best
    assert resolve_checkpoint(run / "best") == best
    assert resolve_checkpoint(str(run / "checkpoints" / "best")) == best
    assert resolve_checkpoint(run / "last") == run / "checkpoints" / "last.ckpt"


def test_best_and_last_alone_name_the_run_in_the_working_directory(run, monkeypatch):
    monkeypatch.chdir(run)
    assert resolve_checkpoint("best") == Path("checkpoints") / "epoch=0-step=40.ckpt"
    assert resolve_checkpoint("last") == Path("checkpoints") / "last.ckpt"


def test_a_run_without_a_monitor_is_its_last_checkpoint_and_says_why(tmp_path, capsys):
    last = _save(tmp_path / "quick" / "checkpoints" / "last.ckpt")
    assert resolve_checkpoint(tmp_path / "quick") == last
    assert "it records no best one (no validation monitor)" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="recorded no best checkpoint .* pass .*quick/last"):
        resolve_checkpoint(tmp_path / "quick" / "best")


def test_without_a_record_the_one_kept_checkpoint_is_the_best(tmp_path):
    kept = _save(tmp_path / "r" / "checkpoints" / "epoch=0-step=9.ckpt")
    _save(tmp_path / "r" / "checkpoints" / "last.ckpt")
    assert best_checkpoint(tmp_path / "r" / "checkpoints")[0] == kept


def test_a_folder_without_a_run_and_a_missing_path_say_what_to_pass(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no run .* RUN_DIR/best"):
        resolve_checkpoint(tmp_path / "empty")
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="the working directory holds no run"):
        resolve_checkpoint("best")
    with pytest.raises(FileNotFoundError, match="a pretrained model's name .*genoformer-dna"):
        resolve_checkpoint(tmp_path / "nope.ckpt")
    with pytest.raises(FileNotFoundError, match="is named genoformer-dna: pass that name"):
        resolve_checkpoint("examples/genoformer_dna.ckpt")  # the guides' path, from another folder


def test_a_pretrained_name_is_found_in_a_clone_then_in_the_cache(tmp_path, monkeypatch, capsys):
    assert resolve_checkpoint("genoformer-dna") == shipped.examples_dir() / "genoformer_dna.ckpt"
    monkeypatch.setattr(shipped, "checkout_root", lambda: None)  # as an installed wheel sees it
    monkeypatch.setenv("GENOFORMER_HOME", str(tmp_path / "models"))
    cached = _save(tmp_path / "models" / "genoformer_forecaster.ckpt")
    assert resolve_checkpoint("genoformer-forecaster") == cached
    assert f"is {cached} (general time-series forecaster" in capsys.readouterr().err


def test_a_pretrained_name_offline_says_where_to_put_the_file(tmp_path, monkeypatch, hf_cache):
    monkeypatch.setattr(shipped, "checkout_root", lambda: None)
    monkeypatch.setenv("GENOFORMER_HOME", str(tmp_path / "models"))
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint("genoformer-gene-annotator")
    message = str(error.value)
    assert (
        f"Put the file genoformer_gene_annotator.ckpt (examples/ of the genoformer repository) at {tmp_path}/models/"
        "genoformer_gene_annotator.ckpt, or set GENOFORMER_HOME" in message
    )
    assert "Hugging Face Hub gave no model genoformer/genoformer-gene-annotator" in message


def test_the_model_cache_defaults_to_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("GENOFORMER_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert shipped.model_cache() == tmp_path / "genoformer"
