"""Lightning data modules: YAML construction, preparing the store, batches, a short fit."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
import yaml
from data_helpers import write_fasta
from genoformer.data import (
    GenomeDataModule,
    RandomWindowDataset,
    SplitSpec,
    TimeSeriesDataModule,
    prepare_timeseries_store,
)
from jsonargparse import ArgumentParser

from genoformer.hints import command_line_hints


def test_genome_module_from_yaml_prepares_store(tmp_path, small_records):
    fasta = write_fasta(tmp_path / "g.fa.gz", small_records)
    config = {
        "data": {
            "store": str(tmp_path / "g.zarr"),
            "fasta": [str(fasta)],
            "window": 1024,
            "batch_size": 4,
            "num_workers": 0,
            "samples_per_epoch": 16,
            "split": {"by": "contigs", "val": ["chrC"]},
        }
    }
    parser = ArgumentParser()
    parser.add_class_arguments(GenomeDataModule, "data")
    cfg = parser.instantiate_classes(parser.parse_string(yaml.safe_dump(config)))
    dm = cfg.data
    assert isinstance(dm.split, SplitSpec) and dm.split.val == ["chrC"]
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].dtype == torch.uint8 and batch["tokens"].shape == (4, 1024)
    assert len(dm.train_dataloader()) == 4
    val = list(dm.val_dataloader())
    assert all((b["contig"] == 2).all() for b in val)
    assert sum(len(b["index"]) for b in val) == -(-21_000 // 1024)


class _Probe(L.LightningModule):
    """Records which windows each epoch saw; the loss is a dummy."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(batch["start"].tolist())
        return (self.weight * batch["tokens"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_sees_new_windows_each_epoch(small_store):
    dm = GenomeDataModule(str(small_store), window=512, batch_size=4, num_workers=0, samples_per_epoch=8)
    probe = _Probe()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(probe, datamodule=dm)
    assert len(probe.seen[0]) == 8 and probe.seen[0] != probe.seen[1]


def test_timeseries_module_batches(tmp_path):
    import numpy as np

    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(4000, 3)).astype(np.float32))
    store = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "ts.zarr", sampling_rate=50.0, progress=False)
    dm = TimeSeriesDataModule(str(store), context=256, horizon=32, batch_size=5, num_workers=0, samples_per_epoch=10)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["context"].shape == (5, 3, 256) and batch["target"].shape == (5, 3, 32)
    val = list(dm.val_dataloader())
    assert sum(len(b["start"]) for b in val) == 1 + (400 - 288) // 32  # every tile of the last 10 %
    for b in val:  # validation windows lie in the last 10 % of the series
        assert (b["start"] >= 3600).all() and (b["start"] + 288 <= 4000).all()


def test_store_built_from_other_files_is_refused_with_what_to_do(tmp_path, small_store, small_records):
    same = GenomeDataModule(str(small_store), fasta=[str(small_store.parent / "small.fa.gz")], num_workers=0)
    same.prepare_data()  # built from exactly these files: kept as it is
    other = write_fasta(tmp_path / "other.fa", small_records[:1])
    with pytest.raises(FileExistsError, match="not from the files that data.init_args.fasta names") as caught:
        GenomeDataModule(str(small_store), fasta=[str(other)], num_workers=0).prepare_data()
    # what works comes first, in the caller's words; deleting the store (which would rebuild it from
    # the other files) is not advised
    message = str(caught.value)
    assert "small.fa.gz" in message and "use it as it is" not in message and "delete" not in message
    assert message.index("fasta=[]") < message.index("store=NEW.zarr")
    GenomeDataModule(str(small_store), fasta=[], num_workers=0).prepare_data()  # as it says: the store as it is
    with command_line_hints(prefix="data.init_args.", bare_flags=False), pytest.raises(FileExistsError) as caught:
        GenomeDataModule(str(small_store), fasta=[str(other)], num_workers=0).prepare_data()
    assert "--data.init_args.fasta '[]'" in str(caught.value) and "--data.init_args.store NEW.zarr" in str(caught.value)
    with pytest.raises(FileNotFoundError, match=r"data.init_args.fasta: input file not found: .*missing.fa"):
        GenomeDataModule(str(small_store), fasta=[str(tmp_path / "missing.fa")], num_workers=0).prepare_data()


def test_short_intervals_are_reported_at_warning_with_their_total_length(small_store, caplog):
    with caplog.at_level(logging.WARNING, logger="genoformer.data"):
        RandomWindowDataset(small_store, window=25_000, samples_per_epoch=4)
    (record,) = [r for r in caplog.records if "shorter than the window" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "1 interval(s)" in record.getMessage() and "21000 bases in total" in record.getMessage()
    assert "chrC[0:21000)" in record.getMessage()


def test_records_shorter_than_the_window_point_to_pack(small_store, caplog):
    """Unpacked, a record shorter than the window gives no training window: the data module says
    so and names `pack`, which trains on it (in the caller's words)."""
    module = GenomeDataModule(
        str(small_store),
        window=25_000,
        batch_size=2,
        num_workers=0,
        samples_per_epoch=4,
        split=SplitSpec(by="region", val_fraction=0.0, test_fraction=0.0),
    )
    with caplog.at_level(logging.WARNING, logger="genoformer.data"):
        module.setup("fit")
    (record,) = [r for r in caplog.records if "pack records into windows" in r.getMessage()]
    assert "1 of 3 training intervals" in record.getMessage() and "pack=True" in record.getMessage()

    too_long = dict(
        window=60_000,
        batch_size=2,
        num_workers=0,
        samples_per_epoch=4,
        split=SplitSpec(by="region", val_fraction=0.0, test_fraction=0.0),
    )
    with command_line_hints(prefix="data.init_args.", bare_flags=False), pytest.raises(ValueError) as caught:
        GenomeDataModule(str(small_store), **too_long).setup("fit")
    assert "is at least 60000 bases long" in str(caught.value) and "--data.init_args.pack true" in str(caught.value)
    packed = GenomeDataModule(str(small_store), **too_long, pack=True)  # the hint: packed, it trains
    packed.setup("fit")
    assert next(iter(packed.train_dataloader()))["tokens"].shape == (2, 60_000)


def test_timeseries_checkpoint_carries_the_normalization_and_refuses_other_data(tmp_path):
    import numpy as np

    rng = np.random.default_rng(1)
    np.save(tmp_path / "a.npy", rng.normal(2.0, 3.0, size=(500, 2)).astype(np.float32))
    np.save(tmp_path / "b.npy", rng.normal(0.0, 1.0, size=(500, 2)).astype(np.float32))
    trained = TimeSeriesDataModule(
        str(prepare_timeseries_store([tmp_path / "a.npy"], tmp_path / "a.zarr", sampling_rate=10.0, progress=False))
    )
    state = trained.state_dict()
    assert state["channel_names"] == ["ch0", "ch1"] and state["sampling_rate"] == 10.0
    assert np.allclose(state["mean"], [2.0, 2.0], atol=0.5) and np.allclose(state["std"], [3.0, 3.0], atol=0.5)
    trained.load_state_dict(state)  # the same store: accepted
    other = TimeSeriesDataModule(
        str(prepare_timeseries_store([tmp_path / "b.npy"], tmp_path / "b.zarr", sampling_rate=10.0, progress=False))
    )
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        other.load_state_dict(state)


def test_batches_are_page_locked_on_cuda_machines(small_store, monkeypatch):
    """Pinned batches let the copy to the GPU overlap the previous step (see _ShardedLoaders)."""
    module = GenomeDataModule(store=str(small_store), window=64, batch_size=2, num_workers=0, samples_per_epoch=8)
    module.setup("fit")
    assert module.train_dataloader().pin_memory is torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert module.train_dataloader().pin_memory and module.val_dataloader().pin_memory


def test_whole_record_windows_train_one_record_per_step(small_store):
    split = SplitSpec(by="contigs", val=["chrC"])
    dm = GenomeDataModule(
        str(small_store),
        window=1 << 20,
        batch_size=1,
        num_workers=0,
        samples_per_epoch=6,
        split=split,
        whole_records=True,
        max_n_fraction=1.0,
    )
    dm.setup("fit")
    lengths = {int(dm.datasets["train"][i]["tokens"].shape[0]) for i in range(6)}
    assert lengths <= {50_000, 33_000} and lengths
    val = next(iter(dm.val_dataloader()))
    assert val["tokens"].shape == (1, 21_000) and "length" not in val  # chrC whole, not padded to the window
    assert "chrC[0:21000)" in dm.describe_batch(val)
    with pytest.raises(ValueError, match="set batch_size to 1"):
        GenomeDataModule(str(small_store), window=1 << 20, batch_size=2, whole_records=True)
