"""Time series as people bring them, read with the commands as typed: a monitor's export whose
times jitter around a 5-minute grid with a new phase after each restart, a weather station's with
a line before the header and hours written 1-24; every hint an error prints is run as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_helpers import fails
from genoformer.data.timeseries.store import TimeSeriesStore

from genoformer.cli import main

FILES = Path(__file__).resolve().parents[1] / "data" / "timeseries" / "files"
MONITOR = FILES / "monitor_export.csv"
WEATHER = FILES / "weather_station.csv"


def hinted(message: str, pattern: str) -> list[str]:
    """The options a message prints, cut out where `pattern` matches and split as a shell would."""
    found = re.search(pattern, message)
    assert found, message
    return shlex.split(found.group(0))


def monitor_args(out: Path) -> list[str]:
    return [
        "prepare_timeseries",
        "--inputs",
        str(MONITOR),
        "--out",
        str(out),
        "--time_column",
        "timestamp",
        "--sampling_rate",
        "5min",
    ]


@pytest.fixture(scope="module")
def monitor_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("monitor") / "monitor.zarr"
    main([*monitor_args(out), "--snap", "150s"])
    return out


def test_jittered_times_with_the_exact_rate_name_snap_and_resample(tmp_path, capsys):
    err = fails(capsys, monitor_args(tmp_path / "m.zarr"))
    assert "drift off a regular grid" in err
    main([*monitor_args(tmp_path / "snap.zarr"), *hinted(err, r"--snap \S+")])
    assert TimeSeriesStore(tmp_path / "snap.zarr").series[0].start_time == "2026-11-02T00:00:00+00:00"
    main([*monitor_args(tmp_path / "mean.zarr"), *hinted(err, r"--resample \w+")])  # bins [:00, :05), ...
    assert TimeSeriesStore(tmp_path / "mean.zarr").series[0].start_time == "2026-11-01T23:55:00+00:00"


def test_snapped_rows_sit_on_the_clock_grid_with_their_values(monitor_store):
    store = TimeSeriesStore(monitor_store)
    info = store.series[0]
    rows = pd.read_csv(MONITOR)
    times = pd.to_datetime(rows["timestamp"], utc=True)
    steps = ((times - pd.Timestamp(info.start_time)).dt.total_seconds() / 300).round().astype(int).to_numpy()
    values = store.read(0, 0, info.length)[0]
    assert store.sampling_rate == pytest.approx(1 / 300)
    assert info.length == steps[-1] + 1 == 1778 and info.duplicates == 0
    assert np.array_equal(values[steps], rows["glucose_mg_dl"].to_numpy(np.float32))
    assert np.isnan(values).sum() == info.length - len(rows) == info.gaps["missing_steps"]
    assert info.jitter < 0.5 and store.channel_names == ["glucose_mg_dl"]


def test_resample_aggregates_the_rows_of_each_step(tmp_path):
    csv = tmp_path / "minutes.csv"
    times = pd.date_range("2026-01-05 10:00", periods=60, freq="min")
    keep = np.r_[0:20, 25:60]  # no row in 10:20-10:25
    pd.DataFrame({"time": times[keep].strftime("%Y-%m-%d %H:%M"), "load": np.arange(60.0)[keep]}).to_csv(
        csv, index=False
    )
    for how, expected in (
        ("mean", [2.0, 7.0, 12.0, 17.0, np.nan, 27.0]),
        ("max", [4.0, 9.0, 14.0, 19.0, np.nan, 29.0]),
    ):
        out = tmp_path / f"{how}.zarr"
        main(
            [
                "prepare_timeseries",
                "--inputs",
                str(csv),
                "--out",
                str(out),
                "--time_column",
                "time",
                "--sampling_rate",
                "5min",
                "--resample",
                how,
            ]
        )
        store = TimeSeriesStore(out)
        assert store.series[0].length == 12 and store.series[0].duplicates == 55 - 11  # rows into 11 steps
        np.testing.assert_array_equal(store.read(0, 0, 6)[0], np.array(expected, np.float32))


def test_snap_names_a_row_beyond_its_tolerance(tmp_path, capsys):
    err = fails(capsys, [*monitor_args(tmp_path / "m.zarr"), "--snap", "30s"])
    assert re.search(r"line \d+ lies \d+ s from the nearest 5min step, more than --snap 30s allows", err)
    main([*monitor_args(tmp_path / "m.zarr"), *hinted(err, r"--snap \S+(?=,)")])


def test_snap_without_a_rate_names_the_rate_to_give(tmp_path, capsys):
    args = [
        "prepare_timeseries",
        "--inputs",
        str(MONITOR),
        "--out",
        str(tmp_path / "m.zarr"),
        "--time_column",
        "timestamp",
        "--snap",
        "150s",
    ]
    err = fails(capsys, args)
    main([*args, *hinted(err, r"--sampling_rate \S+")])
    assert TimeSeriesStore(tmp_path / "m.zarr").sampling_rate == pytest.approx(1 / 300)


def test_weather_station_preamble_and_hours_to_24(tmp_path, capsys):
    args = [
        "prepare_timeseries",
        "--inputs",
        str(WEATHER),
        "--out",
        str(tmp_path / "w.zarr"),
        "--time_column",
        "date,time",
        "--dayfirst",
    ]
    err = fails(capsys, args)
    assert "line 2 looks like the header" in err
    main([*args, *hinted(err, r"--skip_rows \d+")])
    store = TimeSeriesStore(tmp_path / "w.zarr")
    info = store.series[0]
    assert info.start_time == "2026-03-01T01:00:00+00:00" and info.length == 504
    assert info.gaps["count"] == 0 and info.duplicates == 0
    assert store.channel_names == ["temperature_c", "humidity_pct", "wind_speed_ms", "precipitation_mm"]
    rows = pd.read_csv(WEATHER, sep=";", skiprows=1)
    end_of_first_day = rows.index[(rows["date"] == "01.03.2026") & (rows["time"] == "24:00")][0]
    assert end_of_first_day == 23  # 24:00 is the step after 23:00, before 02.03 01:00
    np.testing.assert_array_equal(store.read(0, 0, 504)[0], rows["temperature_c"].to_numpy(np.float32))


def test_the_command_that_rebuilds_a_store_reads_the_file_as_it_was_read(tmp_path):
    """A damaged store's error names the command that rebuilds it: with the reading options it was
    built with (the line before the header, the 1-24 hours, the jittered times)."""
    weather, monitor = tmp_path / "w.zarr", tmp_path / "m.zarr"
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(WEATHER),
            "--out",
            str(weather),
            "--time_column",
            "date,time",
            "--dayfirst",
            "--skip_rows",
            "1",
        ]
    )
    main([*monitor_args(monitor), "--snap", "150s"])
    for path, options in ((weather, ["--skip_rows 1", "--time_column date,time"]), (monitor, ["--snap 150s"])):
        store = TimeSeriesStore(path)
        before = store.read(0, 0, store.series[0].length)
        assert all(typed in store.rebuild for typed in options), store.rebuild
        words = shlex.split(store.rebuild)
        assert words[0] == "genoformer"
        main(words[1:])
        np.testing.assert_array_equal(TimeSeriesStore(path).read(0, 0, store.series[0].length), before)


def test_a_rate_as_a_period_without_a_time_column(tmp_path):
    out = tmp_path / "w.zarr"
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(WEATHER),
            "--out",
            str(out),
            "--skip_rows",
            "1",
            "--sampling_rate",
            "1h",
            "--columns",
            "temperature_c,humidity_pct",
        ]
    )
    store = TimeSeriesStore(out)
    assert store.sampling_rate == pytest.approx(1 / 3600) and store.channel_names == ["temperature_c", "humidity_pct"]
    assert store.series[0].length == 504


def test_a_rate_that_is_neither_a_number_nor_a_period_names_both_forms(tmp_path, capsys):
    err = fails(
        capsys,
        [
            "prepare_timeseries",
            "--inputs",
            str(WEATHER),
            "--out",
            str(tmp_path / "w.zarr"),
            "--skip_rows",
            "1",
            "--sampling_rate",
            "hourly",
        ],
    )
    assert (
        "--sampling_rate RATE takes samples per second (360, 0.2) or a period (5min, 1h, 30s, 100ms); got 'hourly'"
        in err
    )


def test_ar_on_a_gappy_series_says_which_option_fixes_it(monitor_store, tmp_path, capsys):
    """The 4-hour signal loss leaves the validation part no window of order + 96 steps: no order
    can be chosen there; one order given needs no choosing."""
    args = [
        "evaluate_forecast",
        "--store",
        str(monitor_store),
        "--baseline",
        "ar",
        "--horizons",
        "96",
        "--out",
        str(tmp_path / "ar.json"),
    ]
    err = fails(capsys, args)
    assert "no order can be chosen on the validation part at horizon 96" in err
    main([*args, *hinted(err, r"--ar_orders \S+")])
    result = json.loads((tmp_path / "ar.json").read_text())
    assert result["results"][0]["horizon"] == 96 and np.isfinite(result["results"][0]["mse"])
    assert list(result["methods"]["ar"]["orders"]["96"]["validation_mse"].values()) == [None]
