"""Time-series stores and context + horizon windows."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest
import torch
from data_helpers import ECG_CSV, require_shared
from genoformer.data import Interval, TimeSeriesStore, TimeSeriesWindowDataset, prepare_timeseries_store


def write_csv(path, header, rows):
    path.write_text("\n".join([",".join(header)] + [",".join(map(str, r)) for r in rows]) + "\n")
    return path


def test_real_ecg_store(tmp_path):
    csv = require_shared(ECG_CSV)
    store = TimeSeriesStore(
        prepare_timeseries_store([csv], tmp_path / "ecg.zarr", time_column="t_seconds", progress=False)
    )
    values = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=np.float64)[:, 1].astype(np.float32)
    assert store.channel_names == ["ecg_mV"] and abs(store.sampling_rate - 360) < 0.01
    assert np.array_equal(store.read(0, 0, len(values))[0], values)
    assert np.isclose(store.mean[0], values.mean(), atol=1e-5) and np.isclose(store.std[0], values.std(), atol=1e-5)
    assert store.min[0] == values.min() and store.max[0] == values.max()


def test_context_and_target_are_consecutive(tmp_path):
    t = np.arange(5000)
    data = np.stack([t, -t], axis=1).astype(np.float32)  # (T, C)
    np.save(tmp_path / "x.npy", data)
    path = prepare_timeseries_store(
        [tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=100.0, chunk_size=512, progress=False
    )
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
    with pytest.raises(ValueError, match=r"line 3, column 'b'.*missing='keep'.*missing='ffill'"):
        prepare_timeseries_store([path], tmp_path / "s.zarr", sampling_rate=1.0, missing="error", progress=False)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize(
    "policy,expected", [("ffill", [1, 1, 1, 4, 4]), ("zero", [0, 1, 0, 4, 0]), ("linear", [1, 1, 2.5, 4, 4])]
)
def test_missing_value_fill(tmp_path, policy, expected):
    path = write_csv(tmp_path / "x.csv", ["v"], [["nan"], [1], ["NaN"], [4], ["NA"]])
    store = TimeSeriesStore(
        prepare_timeseries_store([path], tmp_path / "s.zarr", sampling_rate=2.0, missing=policy, progress=False)
    )
    assert store.read(0, 0, 5)[0].tolist() == expected and store.series[0].filled == [3]
    assert store.series[0].missing == [0]


def test_missing_cells_are_kept_as_a_mask_by_default(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a;b;label\n1;2;x\n?;4;y\n5;;z\nNA;NaN;w\n9;10;v\n")  # ';'-separated, found from the header
    store = TimeSeriesStore(prepare_timeseries_store([path], tmp_path / "s.zarr", sampling_rate=1.0, progress=False))
    values = store.read(0, 0, 5)
    assert store.channel_names == ["a", "b"]  # the text column is left out, and said so
    assert store.series[0].skipped_columns == ["label"]
    assert np.isnan(values).tolist() == [[False, True, False, True, False], [False, False, True, True, False]]
    assert store.series[0].missing == [2, 2] and store.series[0].filled == [0, 0]
    assert store.mean.tolist() == pytest.approx([5.0, 16 / 3]) and store.std[0] == pytest.approx(np.std([1, 5, 9]))


def test_iso_dates_with_jitter_and_gaps(tmp_path):
    times = pd.date_range("2024-03-01 00:00", periods=10, freq="h")
    jitter = pd.to_timedelta([0, 70, -50, 0, 0, 0, 0, 10, 0, -20], unit="s")  # tolerated: far below half a step
    rows = [(t + j).isoformat(sep="T") for t, j in zip(times, jitter)]
    keep = [0, 1, 2, 3, 6, 7, 9]  # steps 4, 5 and 8 have no row
    path = tmp_path / "iso.csv"
    path.write_text("when,load,temp\n" + "".join(f"{rows[i]},{i * 10},{i}\n" for i in keep))
    store = TimeSeriesStore(prepare_timeseries_store([path], tmp_path / "s.zarr", time_column="when", progress=False))
    info = store.series[0]
    assert store.sampling_rate == pytest.approx(1 / 3600, rel=1e-3) and info.length == 10
    assert info.gaps == {"count": 2, "missing_steps": 3, "longest": 2} and info.missing == [3, 3]
    assert 0.01 < info.jitter < 0.03 and info.start_time.startswith("2024-03-01T00:00:00")
    load = store.read(0, 0, 10)[0]
    assert np.flatnonzero(np.isnan(load)).tolist() == [4, 5, 8]
    assert load[keep].tolist() == [i * 10 for i in keep]
    with pytest.raises(ValueError, match=r"time step 4 \(a gap"):
        prepare_timeseries_store([path], tmp_path / "e.zarr", time_column="when", missing="error", progress=False)
    given = TimeSeriesStore(
        prepare_timeseries_store(
            [path], tmp_path / "g.zarr", time_column="when", sampling_rate=1 / 1800, progress=False
        )
    )  # a given step: 30 min
    assert given.series[0].length == 19 and given.sampling_rate == 1 / 1800


def test_day_first_dates_in_separate_date_and_time_columns(tmp_path):
    path = tmp_path / "power.csv.gz"
    text = "Date,Time,power,volts\n" + "".join(
        f"{d}/01/2007,{h:02d}:{m:02d}:00,{v},{230 + v}\n"
        for v, (d, h, m) in enumerate([(12, 23, 58), (12, 23, 59), (13, 0, 0), (13, 0, 1), (13, 0, 3)])
    )  # 12 January, midnight; one gap
    path.write_bytes(gzip.compress(text.replace(",3,233", ",?,?").encode()))
    store = TimeSeriesStore(
        prepare_timeseries_store(
            [path], tmp_path / "s.zarr", time_column=["Date", "Time"], dayfirst=True, progress=False
        )
    )
    info = store.series[0]
    assert store.sampling_rate == pytest.approx(1 / 60) and info.length == 6 and info.name == "power"
    assert info.start_time.startswith("2007-01-12T23:58:00")
    assert info.gaps == {"count": 1, "missing_steps": 1, "longest": 1} and info.missing == [2, 2]
    assert np.isnan(store.read(0, 0, 6)).tolist() == [[False, False, False, True, True, False]] * 2
    # month first, 12 January reads as 1 December and 13 January does not parse: the error names the row
    with pytest.raises(
        ValueError, match=r"line 4, time column 'Date\+Time': '13/01/2007 00:00:00' is not a time.*dayfirst=True"
    ):
        prepare_timeseries_store([path], tmp_path / "m.zarr", time_column=["Date", "Time"], progress=False)


def test_date_parts_in_columns_and_chosen_columns(tmp_path):
    path = tmp_path / "pm.csv"
    path.write_text(
        "No,year,month,day,hour,pm2.5,TEMP,cbwd\n1,2010,1,1,22,NA,-11,NW\n2,2010,1,1,23,129,-12,NW\n"
        "3,2010,1,2,0,148,-11,SE\n"
    )
    store = TimeSeriesStore(
        prepare_timeseries_store(
            [path],
            tmp_path / "s.zarr",
            time_column=["year", "month", "day", "hour"],
            columns=["pm2.5", "TEMP"],
            progress=False,
        )
    )
    assert store.channel_names == ["pm2.5", "TEMP"] and store.sampling_rate == pytest.approx(1 / 3600)
    assert store.series[0].start_time.startswith("2010-01-01T22:00") and store.series[0].missing == [1, 0]


def test_duplicate_times(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("t,v\n0,1\n1,2\n1,4\n2,\n2,8\n3,5\n")
    with pytest.raises(ValueError, match=r"line 4 falls on the same time step.*2 such rows.*duplicates='first'"):
        prepare_timeseries_store([path], tmp_path / "e.zarr", time_column="t", progress=False)
    for policy, expected in (("first", [1, 2, np.nan, 5]), ("last", [1, 4, 8, 5]), ("mean", [1, 3, 8, 5])):
        store = TimeSeriesStore(
            prepare_timeseries_store(
                [path], tmp_path / f"{policy}.zarr", time_column="t", duplicates=policy, progress=False
            )
        )
        assert np.array_equal(store.read(0, 0, 4)[0], np.array(expected, np.float32), equal_nan=True), policy
        assert store.series[0].duplicates == 2 and store.sampling_rate == 1.0


def test_bad_inputs_are_errors_that_say_where(tmp_path):
    def fails(text, match, name="x.csv", **options):
        path = tmp_path / name
        path.write_text(text)
        options = {"sampling_rate": 1.0, **options}
        with pytest.raises(ValueError, match=match):
            prepare_timeseries_store([path], tmp_path / "s.zarr", progress=False, **options)
        assert not (tmp_path / "s.zarr").exists()

    fails("a,b\n1,2\n\n3,4\n5,x7\n", r"x.csv: line 5, column 'b': 'x7' is not a number")  # blank line counted
    fails("a,b\n1,2\n3\n", "line 3 has 1 fields, the header has 2")
    fails("a,b\n1,2\n3,4,5\n", "malformed CSV.*line 3")
    fails("1,2\n3,4\n", "header row")
    fails("a,b\nx,y\nz,w\n", "no numeric column")
    fails("a,b\n1,2\n", "time_column 'time' is not a column; the columns are \\['a', 'b'\\]", time_column="time")
    fails("a,b\n1,2\n", "columns 'c' is not a column", columns=["c"])
    fails("t,v\n0,1\n2,2\n1,3\n", r"goes backwards at line 4.*sort the rows", time_column="t", sampling_rate=None)
    fails("t,v\n0,1\n1,2\n,3\n", r"line 4, time column 't' is empty", time_column="t", sampling_rate=None)
    fails("t,v\n0,1\n1,2\n2,3\n", r"same time step", time_column="t", sampling_rate=0.4)  # a wrong rate
    fails("t,v\n" + "".join(f"{i * 1.01},{i}\n" for i in range(300)), r"drift off a regular grid", time_column="t")
    fails("a,b\n1,\n2,\n", "column 'b' has no values at all")
    fails("a\n1\ninf\n", "infinite value at line 3, column 'a'")
    fails("", "the file is empty")
    ok = write_csv(tmp_path / "ok.csv", ["a"], [[1], [2]])
    with pytest.raises(ValueError, match="sampling rate unknown"):
        prepare_timeseries_store([ok], tmp_path / "s.zarr", progress=False)
    with pytest.raises(FileNotFoundError):
        prepare_timeseries_store([tmp_path / "missing.csv"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)


def test_context_may_reach_before_the_interval(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(1000, dtype=np.float32))
    path = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    test_part = [Interval(0, 800, 1000)]
    inside = TimeSeriesWindowDataset(path, 100, 50, intervals=test_part, stride=1, normalize=False)
    protocol = TimeSeriesWindowDataset(
        path, 100, 50, intervals=test_part, stride=1, normalize=False, context_before_interval=True
    )
    assert len(inside) == 200 - 150 + 1 and len(protocol) == 200 - 50 + 1
    first, last = protocol[0], protocol[len(protocol) - 1]
    assert first["target"][0, 0] == 800 and first["context"][0, 0] == 700  # context from the earlier part
    assert last["target"][0, -1] == 999


def test_stores_of_format_version_1_still_read(tmp_path):
    import zarr
    from genoformer.data.storage import METADATA_KEY

    np.save(tmp_path / "x.npy", np.arange(50, dtype=np.float32))
    path = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    group = zarr.open_group(path, mode="r+")
    meta = dict(group.attrs[METADATA_KEY])
    keep = ("name", "length", "source", "source_name", "source_sha256", "filled", "values_sha256")
    meta.update(format_version=1, series=[{key: s[key] for key in keep} for s in meta["series"]])
    group.attrs[METADATA_KEY] = meta  # what a store written before missing values were kept holds
    store = TimeSeriesStore(path)
    assert store.series[0].gaps["count"] == 0 and not store.series[0].has_missing
    assert TimeSeriesWindowDataset(path, 10, 5, stride=5)[0]["target"][0].tolist() == pytest.approx(
        ((np.arange(10, 15) - 24.5) / np.std(np.arange(50))).tolist(), rel=1e-5
    )


def test_a_store_of_an_older_format_warns_and_prepare_rebuilds_it(tmp_path, caplog):
    """Format 3 keeps a CRC32C per chunk; a store of format 2 (none) is read with a warning that
    says how to rebuild it, and `prepare` with the same inputs rebuilds it."""
    import zarr
    from genoformer.data.storage import METADATA_KEY

    np.save(tmp_path / "x.npy", np.arange(50, dtype=np.float32))
    path = prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "s.zarr", sampling_rate=1.0, progress=False)
    codecs = zarr.open_array(path / "series" / "0", mode="r").metadata.codecs
    assert type(codecs[-1]).__name__ == "Crc32cCodec"
    group = zarr.open_group(path, mode="r+")
    group.attrs[METADATA_KEY] = {**group.attrs[METADATA_KEY], "format_version": 2}
    with caplog.at_level("WARNING"):
        TimeSeriesStore(path)
    assert "without chunk checksums" in caplog.text and "prepare_timeseries --inputs" in caplog.text
    prepare_timeseries_store([tmp_path / "x.npy"], path, sampling_rate=1.0, progress=False)
    assert TimeSeriesStore(path).metadata["format_version"] == 3
