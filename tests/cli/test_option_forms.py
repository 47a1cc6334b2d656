"""List options as people type them, and parser errors as one line: the option, what it takes,
where to see every option, and the cause last."""

from __future__ import annotations

import inspect
import json
import re
import shlex
import typing
from pathlib import Path

import numpy as np
import pytest
from genoformer.data.timeseries.store import TimeSeriesStore

from genoformer.cli import TOOL_COMMANDS, _tool_arguments, main, parsing_function


@pytest.fixture
def monitor_csv(tmp_path) -> Path:
    path = tmp_path / "monitor.csv"
    rows = [f"{t},{100 + np.sin(t / 7):.3f},{5 + np.cos(t / 5):.3f},{t % 3}" for t in range(1500)]
    path.write_text("t_seconds,glucose,insulin,meal\n" + "\n".join(rows) + "\n")
    return path


def channels(store: Path) -> list[str]:
    return TimeSeriesStore(store).channel_names


@pytest.mark.parametrize(
    "columns, expected",
    [
        (["glucose"], ["glucose"]),
        (["glucose,insulin"], ["glucose", "insulin"]),
        (["glucose, insulin"], ["glucose", "insulin"]),
        (["[glucose,insulin]"], ["glucose", "insulin"]),
        (["glucose", "insulin"], ["glucose", "insulin"]),
    ],
    ids=["one", "comma", "comma_space", "list", "several"],
)
def test_columns_take_one_value_comma_separated_values_or_a_list(tmp_path, monitor_csv, columns, expected):
    out = tmp_path / "monitor.zarr"
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(monitor_csv),
            "--out",
            str(out),
            "--time_column",
            "t_seconds",
            "--columns",
            *columns,
        ]
    )
    assert channels(out) == expected


def test_option_equals_value_is_the_same_as_option_value(tmp_path, monitor_csv):
    out = tmp_path / "monitor.zarr"
    main(
        [
            "prepare_timeseries",
            f"--inputs={monitor_csv}",
            f"--out={out}",
            "--time_column=t_seconds",
            "--columns=glucose,insulin",
            "--overwrite",
        ]
    )
    assert channels(out) == ["glucose", "insulin"]


def test_horizons_take_comma_separated_numbers(tmp_path, monitor_csv, capsys):
    store = tmp_path / "monitor.zarr"
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(monitor_csv),
            "--out",
            str(store),
            "--time_column",
            "t_seconds",
            "--columns",
            "glucose",
        ]
    )
    main(
        [
            "evaluate_forecast",
            "--store",
            str(store),
            "--baseline",
            "seasonal_naive",
            "--horizons",
            "96,192",
            "--out",
            str(tmp_path / "sn.json"),
        ]
    )
    assert [row["horizon"] for row in json.loads((tmp_path / "sn.json").read_text())["results"]] == [96, 192]


def test_a_value_or_list_option_splits_commas_only_between_existing_files(tmp_path):
    forecast = parsing_function(TOOL_COMMANDS["forecast"])
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    a.touch(), b.touch()
    assert _tool_arguments(forecast, ["--checkpoint", f"{a},{b}"]) == ["--checkpoint", json.dumps([str(a), str(b)])]
    assert _tool_arguments(forecast, ["--checkpoint", f"{a},{tmp_path / 'c.ckpt'}"]) == [
        "--checkpoint",
        f"{a},{tmp_path / 'c.ckpt'}",
    ]  # not both files: one path, reported missing as typed
    evaluate = parsing_function(TOOL_COMMANDS["evaluate"])
    assert _tool_arguments(evaluate, ["--regions", "NC_001416.1:1,001-2,000"]) == [
        "--regions",
        "NC_001416.1:1,001-2,000",
    ]
    assert _tool_arguments(evaluate, ["--inputs", "a.fa,b.fa"]) == ["--inputs", '["a.fa", "b.fa"]']


def _typed_option(command: str) -> str | None:
    """An option of the command that takes a number or one of some words (None: it has none)."""
    for parameter in inspect.signature(parsing_function(TOOL_COMMANDS[command])).parameters.values():
        annotation = parameter.annotation
        arms = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
        if str not in arms and any(arm in (int, float) or typing.get_origin(arm) is typing.Literal for arm in arms):
            return parameter.name
    return None


def only_line(capsys, args: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("command", list(TOOL_COMMANDS))
def test_every_parser_error_is_one_line_with_the_cause_last(capsys, command):
    pointer = f"(all options: genoformer {command} --help)"
    line = only_line(capsys, [command, "--no_such_option", "1"])
    assert pointer in line and line.endswith("; unknown option --no_such_option")
    option = _typed_option(command)
    if option is None:
        return
    line = only_line(capsys, [command, f"--{option}", "many"])
    assert line.startswith(f"genoformer {command}: error: --{option} takes ") and pointer in line
    assert line.endswith("; got 'many'")
    line = only_line(capsys, [command, f"--{option}"])
    assert line.startswith(f"genoformer {command}: error: --{option} takes ") and line.endswith("; no value given")


def test_a_missing_option_and_a_stray_word_are_one_line(capsys):
    line = only_line(capsys, ["forecast", "--store", "s.zarr", "--out", "f.npz"])
    assert line.startswith("genoformer forecast: error: --checkpoint takes a path (a.ckpt)")
    assert line.endswith("; --checkpoint not given (required)")
    line = only_line(capsys, ["prepare_timeseries", "--inputs", "a.csv", "--out", "a.zarr", "--overwrite", "maybe"])
    assert line.endswith("; 'maybe' follows no option")


def test_the_forms_an_error_names_work_as_typed(tmp_path, monitor_csv, capsys):
    """`--columns glucose` was refused with a nine-line union dump; the error for a bad list now
    names the comma form, and that form, typed as printed, works."""
    store = tmp_path / "monitor.zarr"
    main(
        [
            "prepare_timeseries",
            "--inputs",
            str(monitor_csv),
            "--out",
            str(store),
            "--time_column",
            "t_seconds",
            "--columns",
            "glucose",
        ]
    )
    args = [
        "evaluate_forecast",
        "--store",
        str(store),
        "--baseline",
        "seasonal_naive",
        "--out",
        str(tmp_path / "sn.json"),
    ]
    line = only_line(capsys, [*args, "--horizons", "96;192"])
    example = re.search(r"comma-separated \((\S+)\)", line).group(1)
    main([*args, *shlex.split(f"--horizons {example}")])
    assert json.loads((tmp_path / "sn.json").read_text())["protocol"]["horizons"] == [96, 192]
