"""PredictionWriter: what it stores, and that it writes atomically."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from genoformer.core.callbacks import PredictionWriter


def fake_trainer(run_dir: Path) -> SimpleNamespace:
    datamodule = SimpleNamespace(window=4, eval_stride=None, contig_names=lambda: ["chrA", "chrB"])
    return SimpleNamespace(
        log_dir=str(run_dir),
        default_root_dir=str(run_dir),
        world_size=1,
        global_rank=0,
        datamodule=datamodule,
        ckpt_path=str(run_dir / "last.ckpt"),
    )


def batches(value: float) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "embeddings": torch.full((2, 3), value),
            "contig": torch.tensor([0, 1]),
            "start": torch.tensor([0, 0]),
            "length": torch.tensor([4, 3]),
        }
    ]


def test_writes_tiles_with_what_was_computed(tmp_path, capsys):
    writer = PredictionWriter()
    writer.write_on_epoch_end(fake_trainer(tmp_path), None, batches(1.0), None)
    path = tmp_path / "predictions.npz"
    assert f"wrote 2 tile embeddings to {path}" in capsys.readouterr().out
    with np.load(path) as saved:
        assert saved["embeddings"].shape == (2, 3) and list(saved["contig_name"]) == ["chrA", "chrB"]
        assert str(saved["pooling"]) == "mean" and int(saved["layer"]) == -1
        assert int(saved["window"]) == 4 and int(saved["stride"]) == 4
        assert str(saved["checkpoint"]) == str(tmp_path / "last.ckpt")


def test_a_failed_write_leaves_the_earlier_file_and_no_partial_one(tmp_path, monkeypatch):
    writer = PredictionWriter()
    trainer = fake_trainer(tmp_path)
    writer.write_on_epoch_end(trainer, None, batches(1.0), None)

    def fail_half_way(file, *args, **kwargs):
        Path(file).write_bytes(b"PK partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        writer.write_on_epoch_end(trainer, None, batches(2.0), None)
    with np.load(tmp_path / "predictions.npz") as saved:
        assert (saved["embeddings"] == 1.0).all()
    assert [path.name for path in tmp_path.iterdir()] == ["predictions.npz"]
