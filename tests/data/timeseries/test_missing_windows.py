"""Missing values through the datasets and the data module; several stores mixed, one channel at
a time, and windows normalised by their own context."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from genoformer.data.splits import Interval, SplitSpec
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.data.timeseries.datasets import MixedWindowDataset, TimeSeriesWindowDataset, normalize_by_context
from genoformer.data.timeseries.store import TimeSeriesStore, prepare_timeseries_store


def ramp_store(tmp_path, name, length, channels=1, gaps=(), scale=1.0):
    values = np.arange(length, dtype=np.float64)[:, None] * scale + np.arange(channels)[None] * 1000.0
    for lo, hi in gaps:
        values[lo:hi] = np.nan
    np.save(tmp_path / f"{name}.npy", values.astype(np.float32))
    return prepare_timeseries_store(
        [tmp_path / f"{name}.npy"], tmp_path / f"{name}.zarr", sampling_rate=1.0, progress=False
    )


def test_windows_whose_targets_are_all_missing_are_skipped_and_the_rest_keep_nan(tmp_path):
    store = ramp_store(tmp_path, "g", 100, gaps=[(40, 60)])
    tiled = TimeSeriesWindowDataset(store, 10, 5, stride=1, normalize=False)
    starts = [tiled.locate(0, i)[1] for i in range(len(tiled))]
    # target [s + 10, s + 15) is all missing for 40 <= s + 10 and s + 15 <= 60: s in [30, 45]
    assert starts == [s for s in range(86) if not 30 <= s <= 45] and tiled.skipped_windows == 16
    sample = tiled[starts.index(27)]  # target [37, 42): three observed values, then missing
    assert np.isnan(sample["target"][0].numpy()).tolist() == [False, False, False, True, True]
    assert torch.equal(sample["target"][0, :3], torch.tensor([37.0, 38.0, 39.0]))
    context = tiled[starts.index(50)]["context"][0]  # context [50, 60) missing, target [60, 65) observed
    assert torch.isnan(context).all()
    random = TimeSeriesWindowDataset(store, 10, 5, samples_per_epoch=200, normalize=False)
    assert all(not 30 <= random.locate(0, i)[1] <= 45 for i in range(200))
    with pytest.raises(ValueError, match="no window .* has an observed target value"):
        TimeSeriesWindowDataset(store, 10, 5, intervals=[Interval(0, 30, 60)], stride=1)


def test_store_statistics_count_observed_values_only(tmp_path):
    store = TimeSeriesStore(ramp_store(tmp_path, "s", 10, gaps=[(5, 10)]))
    assert store.mean[0] == pytest.approx(2.0) and store.std[0] == pytest.approx(np.std([0, 1, 2, 3, 4]))
    values = TimeSeriesWindowDataset(store, 3, 2, stride=1)[0]["context"][0]
    assert values.tolist() == pytest.approx(((np.arange(3) - 2.0) / np.std(range(5))).tolist())


def test_window_normalisation_uses_the_observed_context():
    values_CS = np.array([[1.0, np.nan, 3.0, 5.0, 7.0], [4.0, 4.0, 4.0, 4.0, 9.0]], np.float32)
    out = normalize_by_context(values_CS, 3)
    assert out[0, [0, 2, 3, 4]].tolist() == pytest.approx([-1.0, 1.0, 3.0, 5.0]) and np.isnan(out[0, 1])
    assert out[1].tolist() == pytest.approx([0, 0, 0, 0, 5.0])  # a constant context: shifted, scale 1


def test_mixed_windows_are_single_channels_of_every_store(tmp_path):
    a = ramp_store(tmp_path, "a", 400, channels=2)
    b = ramp_store(tmp_path, "b", 200, channels=1, scale=10.0)
    parts = [TimeSeriesWindowDataset(path, 20, 5, samples_per_epoch=1, normalize=False) for path in (a, b)]
    mixed = MixedWindowDataset(parts, samples_per_epoch=3000, seed=1, weights=[1, 3])
    samples = [mixed[(0, i)] for i in range(3000)]
    assert all(s["context"].shape == (1, 20) and s["target"].shape == (1, 5) for s in samples)
    share_b = np.mean([s["store"] == 1 for s in samples])
    assert 0.7 < share_b < 0.8  # weights 1 : 3
    assert {s["channel"] for s in samples if s["store"] == 0} == {0, 1} and {
        s["channel"] for s in samples if s["store"] == 1
    } == {0}
    for s in samples[:50]:  # the channel's own values: channel c of store a holds t + 1000 c, store b 10 t
        t = s["start"] + np.arange(25)
        expected = t + 1000.0 * s["channel"] if s["store"] == 0 else 10.0 * t
        assert np.array_equal(torch.cat([s["context"][0], s["target"][0]]).numpy(), expected.astype(np.float32))
    assert mixed[(0, 7)]["start"] == mixed[(0, 7)]["start"] and mixed[(1, 7)]["start"] != mixed[(0, 7)]["start"]
    tiled = MixedWindowDataset([TimeSeriesWindowDataset(path, 20, 5, normalize=False) for path in (a, b)])
    assert len(tiled) == (1 + (400 - 25) // 5) * 2 + (1 + (200 - 25) // 5)


def test_data_module_over_several_stores(tmp_path):
    a = ramp_store(tmp_path, "a", 600, channels=2, gaps=[(100, 130)])
    b = ramp_store(tmp_path, "b", 300, channels=1, scale=10.0)
    with pytest.raises(ValueError, match="different channels.*channel_independent"):
        TimeSeriesDataModule([str(a), str(b)], context=32, horizon=8, num_workers=0).setup("fit")
    dm = TimeSeriesDataModule(
        [str(a), str(b)],
        context=32,
        horizon=8,
        batch_size=16,
        num_workers=0,
        samples_per_epoch=64,
        channel_independent=True,
        window_normalize=True,
        split=SplitSpec(val_fraction=0.2),
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["context"].shape == (16, 1, 32) and set(batch["store"].tolist()) <= {0, 1}
    observed = batch["context"][~torch.isnan(batch["context"])]
    assert observed.abs().max() < 10  # scaled by each window's own context, whatever the store's units
    val = list(dm.val_dataloader())
    assert sum(len(b["store"]) for b in val) == (1 + (120 + 0 - 40) // 8) * 2 + (1 + (60 - 40) // 8)
    assert "a.zarr:a[" in dm.describe_batch(batch) or "b.zarr:b[" in dm.describe_batch(batch)
    state = dm.state_dict()
    assert [s["channel_names"] for s in state["stores"]] == [["ch0", "ch1"], ["ch0"]]
    dm.load_state_dict(state)
    swapped = TimeSeriesDataModule(
        [str(b), str(a)], context=32, horizon=8, num_workers=0, channel_independent=True, window_normalize=True
    )
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        swapped.load_state_dict(state)
    with pytest.raises(ValueError, match="builds one store"):
        TimeSeriesDataModule([str(a), str(b)], sources=["x.csv"])
    with pytest.raises(FileNotFoundError, match="missing.zarr .*prepare_timeseries"):
        TimeSeriesDataModule([str(a), str(tmp_path / "missing.zarr")], num_workers=0).prepare_data()
