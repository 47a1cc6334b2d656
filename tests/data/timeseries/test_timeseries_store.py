"""Time-series stores and context + horizon windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_helpers import ECG_CSV, require_shared

from genoformer.data import Interval, TimeSeriesStore, TimeSeriesWindowDataset, prepare_timeseries_store


def write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def test_real_ecg_store(tmp_path):
    csv = require_shared(ECG_CSV)
    store = TimeSeriesStore(prepare_timeseries_store([csv], tmp_path / "ecg.zarr", time_column="t_seconds",
                                                     progress=False))
    values = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=np.float64)[:, 1].astype(np.float32)
    assert store.channel_names == ["ecg_mV"] and abs(store.sampling_rate - 360) < 0.01
    assert np.array_equal(store.read(0, 0, len(values))[0], values)
    assert np.isclose(store.mean[0], values.mean(), atol=1e-5) and np.isclose(store.std[0], values.std(), atol=1e-5)
    assert store.min[0] == values.min() and store.max[0] == values.max()


def test_context_and_target_are_consecutive(tmp_path):
    t = np.arange(5000)
    data = np.stack([t, -t], axis=1).astype(np.float32)  # (T, C)
    np.save(tmp_path / "x.npy", data)
    path = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=100.0,
                                    chunk_size=512, progress=False)
    store = TimeSeriesStore(path)
    assert store.channel_names == ["ch0", "ch1"]
    ds = TimeSeriesWindowDataset(path, 300, 50, samples_per_epoch=20, normalize=False)
    for i in range(20):
        s = ds[(0, i)]
        assert s["context"].shape == (2, 300) and s["target"].shape == (2, 50) and s["context"].dtype == torch.float32
        assert s["context"][0, 0] == s["start"] and s["target"][0, 0] == s["start"] + 300
        assert torch.equal(s["context"][1], -s["context"][0])
    tiled = TimeSeriesWindowDataset(path, 300, 50, stride=1000, normalize=True)
    assert len(tiled) == 1 + (5000 - 350) // 1000
    assert abs(float(tiled[0]["context"][0, 0]) - (0 - store.mean[0]) / store.std[0]) < 1e-4


def test_missing_values_error_names_row_and_column(tmp_path):
    path = write_csv(tmp_path / "x.csv", ["a", "b"], [[1, 2], [3, "nan"], [5, 6]])
    with pytest.raises(ValueError, match=r"line 3, column 'b'.*missing='ffill'"):
        prepare_timeseries_store([path], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("policy,expected", [("ffill", [1, 1, 1, 4, 4]), ("zero", [0, 1, 0, 4, 0]),
                                             ("linear", [1, 1, 2.5, 4, 4])])
def test_missing_value_fill(tmp_path, policy, expected):
    path = write_csv(tmp_path / "x.csv", ["v"], [["nan"], [1], ["NaN"], [4], ["NA"]])
    store = TimeSeriesStore(prepare_timeseries_store([path], tmp_path / "s.zarr", sampling_rate=2.0,
                                                     missing=policy, progress=False))
    assert store.read(0, 0, 5)[0].tolist() == expected and store.series[0].filled == [3]


def test_ragged_row_and_other_bad_inputs(tmp_path):
    ragged = tmp_path / "r.csv"
    ragged.write_text("a,b\n1,2\n3\n")
    with pytest.raises(ValueError, match="line 3 has 1 fields, the header has 2"):
        prepare_timeseries_store([ragged], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    no_header = write_csv(tmp_path / "n.csv", ["1", "2"], [[3, 4]])
    with pytest.raises(ValueError, match="header row"):
        prepare_timeseries_store([no_header], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    ok = write_csv(tmp_path / "ok.csv", ["a"], [[1], [2]])
    with pytest.raises(ValueError, match="sampling rate unknown"):
        prepare_timeseries_store([ok], tmp_path / "s.zarr", progress=False)
    with pytest.raises(FileNotFoundError):
        prepare_timeseries_store([tmp_path / "missing.csv"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    text = tmp_path / "x.csv"
    text.write_text("a\n1\nhello\n")
    with pytest.raises(ValueError, match="line 3, column 'a': 'hello' is not a number"):
        prepare_timeseries_store([text], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    assert not (tmp_path / "s.zarr").exists()


def test_context_may_reach_before_the_interval(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    path = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    test_part = [Interval(0, 800, 1000)]
    inside = TimeSeriesWindowDataset(path, 100, 50, intervals=test_part, stride=1, normalize=False)
    protocol = TimeSeriesWindowDataset(path, 100, 50, intervals=test_part, stride=1, normalize=False,
                                       context_before_interval=True)
    assert len(inside) == 200 - 150 + 1 and len(protocol) == 200 - 50 + 1
    first, last = protocol[0], protocol[len(protocol) - 1]
    assert first["target"][0, 0] == 800 and first["context"][0, 0] == 700  # context from the earlier part
    assert last["target"][0, -1] == 999
