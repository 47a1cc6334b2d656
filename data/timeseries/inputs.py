"""Time-series input files -> values on a regular time grid, for the store (`store.py`).

Input: a CSV (also .csv.gz, .csv.xz, .csv.bz2) has a header row naming the columns and one row
per observation, read with pandas; the delimiter (comma, semicolon, tab or bar) is found from the
header row unless given. The channels are ``columns`` (default: every numeric column that is not
a time column; a column counts as numeric when most of its non-empty cells are numbers, so that
one typo is reported instead of dropping the column). Missing cells (empty, ``?``, ``NaN``,
``NA``, ``null``, ...) are kept as missing. A value that is not a number is an error naming the
file, line and column.

Time: without ``time_column`` every row is one step at ``sampling_rate``. ``time_column`` names
one column or several joined by spaces (``["Date", "Time"]``): numbers are seconds; anything else
is parsed as dates and times (ISO 8601, or day-first with ``dayfirst``; columns named year, month,
day, hour, minute, second are assembled as such). The rows are put on a grid of one step: the
given ``sampling_rate``, or detected as the median time between rows (refined by a least-squares
fit of the times on their grid positions, so that rounding in the file cancels out). A row's
position is the previous row's plus its time difference in steps, rounded, so jitter below half a
step is tolerated and its largest size is recorded (``jitter``, in steps). Grid steps that no row
lands on are gaps: stored as missing and reported (``gaps``: count, missing steps, longest).
Rows that land on the same step are an error unless ``duplicates`` says which to keep ("first",
"last" or the "mean" of their observed values); times that go backwards are an error.

A .npy file holds (T,) or (T, C) values (``npy_channels_first`` for (C, T)), NaN for missing.
All files must have the same channels and sampling rate. ``missing`` says what happens to
missing values and gaps: "keep" (default: stored as missing, NaN), "error" (names file, row and
column, or the gap), "ffill" (carry the last value forward, the first value backward at the
start), "zero", or "linear" (interpolate in time, hold the end values): the fills are explicit
choices, never the default. Infinite values are always errors.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, Optional

import numpy as np
import pandas as pd

from genoformer.hints import option

MissingPolicy = Literal["keep", "error", "ffill", "zero", "linear"]
DuplicatePolicy = Literal["error", "first", "last", "mean"]
MISSING_POLICIES = ("keep", "error", "ffill", "zero", "linear")
DUPLICATE_POLICIES = ("error", "first", "last", "mean")
MISSING_TEXT = ["", "?", "NaN", "nan", "NA", "N/A", "n/a", "NULL", "null", "None", "none", "#N/A", "-"]
"""Cells read as missing values."""
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.xz", ".csv.bz2")
DELIMITERS = (",", ";", "\t", "|")
_DATE_PARTS = ("year", "month", "day", "hour", "minute", "second")


def is_timeseries_file_name(name: str) -> bool:
    """Whether a file name is one `prepare_timeseries_store` reads (.csv, .csv.gz/.xz/.bz2, .npy)."""
    return name.lower().endswith((*CSV_SUFFIXES, ".npy"))


def series_name(path: Path) -> str:
    """The file name without its .csv/.npy (and compression) suffixes."""
    lower = path.name.lower()
    for suffix in (*CSV_SUFFIXES, ".npy"):
        if lower.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def _open_text(path: Path) -> IO[str]:
    """The file as UTF-8 text, decompressed by its suffix."""
    lower = path.name.lower()
    opener = (
        gzip.open
        if lower.endswith(".gz")
        else lzma.open
        if lower.endswith(".xz")
        else bz2.open
        if lower.endswith(".bz2")
        else open
    )
    return opener(path, "rt", encoding="utf-8", newline="")


def _head_lines(path: Path, skip_rows: int) -> list[tuple[int, str]]:
    """(line number, text) of the first non-blank lines after the `skip_rows` skipped lines,
    from the first 64 KiB of the file; the first one is the header."""
    try:
        with _open_text(path) as text:
            head = text.read(1 << 16)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the CSV as UTF-8") from None
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise ValueError(f"{path}: cannot be read as a (compressed) CSV file ({exc})") from None
    if "\x00" in head:
        raise ValueError(f"{path}: binary data, not a CSV file")
    lines = head.lstrip("\ufeff").splitlines()
    if len(head) == 1 << 16 and lines:
        lines = lines[:-1]  # the last one may be cut
    found = [(number, line) for number, line in enumerate(lines, start=1) if number > skip_rows and line.strip()]
    if not found:
        skipped = f" after the {skip_rows} skipped lines" if skip_rows else ""
        raise ValueError(f"{path}: the file is empty{skipped}; expected a CSV with a header row")
    return found


def _field_count(line: str, sep: str) -> int:
    return len(next(csv.reader([line], delimiter=sep)))


def _check_preamble(path: Path, lines: list[tuple[int, str]], sep: str, delimiter: Optional[str]) -> None:
    """A header followed by rows with another number of fields, where a later line starts a
    table whose rows match it: lines before the header (a station's name, units, a title) that
    `skip_rows` skips. ValueError naming that line; nothing for a file whose first rows agree."""
    header_fields = _field_count(lines[0][1], sep)
    following = [_field_count(line, sep) for _, line in lines[1:6]]
    if not following or all(count == header_fields for count in following):
        return
    for index in range(1, min(len(lines) - 1, 20)):
        number, line = lines[index]
        candidate = delimiter if delimiter is not None else max(DELIMITERS, key=line.count)
        fields = _field_count(line, candidate)
        rows = [_field_count(text, candidate) for _, text in lines[index + 1 : index + 6]]
        names = next(csv.reader([line], delimiter=candidate))
        if fields > 1 and rows and all(count == fields for count in rows) and not all(_is_number(n) for n in names):
            before = f"{number - 1} line{'s' if number > 2 else ''}"
            raise ValueError(
                f"{path}: skip the {before} before the header with {option('skip_rows', number - 1)} (line {number} "
                f"looks like the header, {line.strip()[:60]!r}; the first line has {header_fields} fields, the rows "
                f"after it {following[0]})"
            )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _data_line(path: Path, row: int, skip_rows: int = 0) -> int:
    """The line number (1-based) of data row `row` (0-based, after the header; blank lines are
    skipped, as pandas does). Used on error paths only: it reads the file again."""
    with _open_text(path) as text:
        seen = -1  # the header is the first non-blank line after the skipped ones
        for number, line in enumerate(text, start=1):
            if number > skip_rows and line.strip():
                if seen == row:
                    return number
                seen += 1
    raise AssertionError(f"{path} has no data row {row}")


def _as_list(columns: str | Sequence[str] | None) -> list[str]:
    if columns is None:
        return []
    return [columns] if isinstance(columns, str) else list(columns)


def _named_columns(columns: str | Sequence[str] | None, header: Sequence[str]) -> list[str]:
    """`columns` as a list; one name that is not a column but whose comma-separated parts all
    are (`date,time`) is those columns."""
    if isinstance(columns, str) and columns not in header:
        parts = [part.strip() for part in columns.split(",")]
        if len(parts) > 1 and all(part in header for part in parts):
            return parts
    return _as_list(columns)


@dataclass
class _Table:
    """One CSV or .npy file, read: values (T, C) float64 with NaN for missing, and the time of
    each row in seconds since the first (None without a time column)."""

    names: list[str]
    values: np.ndarray
    seconds: Optional[np.ndarray] = None  # since the first row
    start: Optional[pd.Timestamp | float] = None  # the first row's time: a date, or its seconds as written
    skipped: list[str] = field(default_factory=list)
    row_line: Callable[[int], str] = lambda row: f"row {row}"  # data row (0-based) -> its place, for errors


def _read_csv(
    path: Path,
    time_column: str | Sequence[str] | None,
    columns: Sequence[str] | None,
    dayfirst: bool,
    delimiter: str | None,
    skip_rows: int = 0,
) -> _Table:
    """Read one CSV with pandas (see the module docstring)."""
    lines = _head_lines(path, skip_rows)
    header_text = lines[0][1]
    sep = delimiter if delimiter is not None else max(DELIMITERS, key=header_text.count)
    _check_preamble(path, lines, sep, delimiter)
    header = [name.strip() for name in next(csv.reader(io.StringIO(header_text), delimiter=sep))]
    if all(_is_number(name) for name in header):
        raise ValueError(f"{path}: the first row is numeric; the CSV needs a header row naming the columns")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: duplicate column names in the header {header}")
    time_columns = _named_columns(time_column, header)
    for name in time_columns + _as_list(columns):
        if name not in header:
            which = "time_column" if name in time_columns else "columns"
            raise ValueError(
                f"{path}: {which} {name!r} is not a column; the columns are {header} "
                f"(delimiter {sep!r}: pass {option('delimiter', metavar='CHAR')} if that is wrong)"
            )
    try:
        frame = pd.read_csv(
            path,
            sep=sep,
            skiprows=lines[0][0] - 1,
            header=0,
            names=header,
            index_col=False,
            na_values=MISSING_TEXT,
            keep_default_na=True,
            dtype={name: str for name in time_columns},
            skipinitialspace=True,
            encoding="utf-8",
            low_memory=False,
        )
    except pd.errors.ParserError as exc:
        raise ValueError(f"{path}: malformed CSV ({str(exc).strip()}); every row needs one value per column") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the CSV as UTF-8") from None
    if frame.empty:
        raise ValueError(f"{path}: no data rows after the header")
    where = lambda row: f"line {_data_line(path, row, skip_rows)}"  # noqa: E731 - error paths only
    _check_short_rows(path, frame, header, sep, skip_rows)
    value_names, skipped = _value_columns(path, frame, header, time_columns, columns, where)
    values = np.empty((len(frame), len(value_names)), dtype=np.float64)
    for c, name in enumerate(value_names):
        column = frame[name]
        numbers = column if pd.api.types.is_numeric_dtype(column.dtype) else pd.to_numeric(column, errors="coerce")
        if not pd.api.types.is_numeric_dtype(column.dtype):
            bad = np.flatnonzero(numbers.isna().to_numpy() & column.notna().to_numpy())
            if len(bad):
                raise ValueError(
                    f"{path}: {where(int(bad[0]))}, column {name!r}: {column.iloc[bad[0]]!r} is not a "
                    f"number (choose the value columns with {option('columns', metavar='[A,B]')})"
                )
        values[:, c] = numbers.to_numpy(dtype=np.float64, na_value=np.nan)
    table = _Table(value_names, values, skipped=skipped, row_line=where)
    if time_columns:
        table.seconds, table.start = _parse_times(path, frame, time_columns, dayfirst, where)
    return table


def _check_short_rows(path: Path, frame: pd.DataFrame, header: list[str], sep: str, skip_rows: int) -> None:
    """pandas fills the cells a short row lacks with NaN; a short row is a broken file, not
    missing values. Rows with an empty last cell are read again to tell the two apart."""
    last = frame[header[-1]]
    suspects = np.flatnonzero(last.isna().to_numpy())
    if not len(suspects):
        return
    wanted = set(suspects.tolist())
    with _open_text(path) as text:
        row = -1
        for number, line in enumerate(text, start=1):
            if number <= skip_rows or not line.strip():
                continue
            if row in wanted:
                fields = next(csv.reader([line.rstrip("\r\n")], delimiter=sep))
                if len(fields) < len(header):
                    raise ValueError(
                        f"{path}: line {number} has {len(fields)} fields, the header has {len(header)}; "
                        "every row needs one value per column (an empty cell is a missing value)"
                    )
            row += 1
            if row > suspects[-1]:
                return


def _value_columns(
    path: Path, frame: pd.DataFrame, header: list[str], time_columns: list[str], columns: Sequence[str] | None, where
) -> tuple[list[str], list[str]]:
    """(value columns, skipped non-numeric columns)."""
    if columns is not None:
        chosen = list(columns)
        if not chosen:
            raise ValueError(f"{path}: {option('columns', [])} chooses no column; name the value columns")
        clash = sorted(set(chosen) & set(time_columns))
        if clash:
            raise ValueError(
                f"{path}: {clash} are both time and value columns; drop them from one of "
                f"{option('columns', metavar='[A,B]')} and {option('time_column', metavar='NAME')}"
            )
        return chosen, []
    chosen, skipped = [], []
    for name in header:
        if name in time_columns:
            continue
        column = frame[name]
        if pd.api.types.is_bool_dtype(column.dtype):
            skipped.append(name)
        elif pd.api.types.is_numeric_dtype(column.dtype):
            chosen.append(name)
        else:
            present = column.dropna()
            numeric = pd.to_numeric(present, errors="coerce").notna().mean() if len(present) else 0.0
            (chosen if numeric > 0.5 else skipped).append(name)
    if not chosen:
        raise ValueError(
            f"{path}: no numeric column to store (the columns are {header}); choose the value columns "
            f"with {option('columns', metavar='[A,B]')}"
        )
    return chosen, skipped


_END_OF_DAY = r"(?:^|(?<=[ T]))24:00(?::00(?:\.0*)?)?$"
"""A time of 24:00 (ISO 8601's end of a day: the next day's 00:00), as hours written 1-24 end a day."""


def _parse_times(
    path: Path, frame: pd.DataFrame, time_columns: list[str], dayfirst: bool, where
) -> tuple[np.ndarray, pd.Timestamp | float]:
    """Seconds of each row since the first row, float64, and the first row's time (a Timestamp,
    or its seconds as written when the time column holds numbers). A time of 24:00, or an hour
    column of 24, is midnight of the next day."""
    label = time_columns[0] if len(time_columns) == 1 else "+".join(time_columns)
    parts = frame[time_columns]
    empty = parts.isna().any(axis=1).to_numpy()
    if empty.any():
        row = int(np.argmax(empty))
        raise ValueError(f"{path}: {where(row)}, time column {label!r} is empty; every row needs a time")
    if len(time_columns) == 1:
        numbers = pd.to_numeric(parts.iloc[:, 0], errors="coerce")
        if numbers.notna().all():
            seconds = numbers.to_numpy(dtype=np.float64)
            return seconds - seconds[0], float(seconds[0])
    lowered = [name.lower() for name in time_columns]
    if len(time_columns) > 1 and set(lowered) <= set(_DATE_PARTS) and {"year", "month", "day"} <= set(lowered):
        assembled = parts.apply(pd.to_numeric, errors="coerce")
        assembled.columns = lowered
        end_of_day = (assembled["hour"] == 24).to_numpy() if "hour" in assembled else np.zeros(len(assembled), bool)
        if end_of_day.any():
            assembled.loc[end_of_day, "hour"] = 0
        bad = assembled.isna().any(axis=1).to_numpy()
        if not bad.any():
            times = pd.to_datetime(assembled, errors="coerce", utc=True)
            bad = times.isna().to_numpy()
    else:
        text = (
            parts.iloc[:, 0]
            if len(time_columns) == 1
            else parts.iloc[:, 0].str.cat([parts.iloc[:, i] for i in range(1, len(time_columns))], sep=" ")
        )
        text = text.str.strip()
        end_of_day = text.str.contains(_END_OF_DAY, regex=True).to_numpy()
        if end_of_day.any():
            text = text.str.replace(_END_OF_DAY, "00:00", regex=True)
        times = pd.to_datetime(text, dayfirst=dayfirst, errors="coerce", utc=True)
        bad = times.isna().to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        value = " ".join(str(parts.iloc[row, i]) for i in range(len(time_columns)))
        first = " ".join(str(parts.iloc[0, i]) for i in range(len(time_columns)))
        raise ValueError(
            f"{path}: {where(row)}, time column {label!r}: {value!r} is not a time like the first row's {first!r} "
            f"(seconds, ISO 8601 dates and times, or day-first dates with {option('dayfirst')})"
        )
    if end_of_day.any():
        times = times + pd.to_timedelta(end_of_day.astype(np.int64), unit="D")
    return (times - times.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64), times.iloc[0]


@dataclass
class _Grid:
    """Where the rows of a table go on the time grid."""

    positions: np.ndarray  # grid step of each row, non-decreasing int64
    step: float  # seconds
    jitter: float  # largest distance of a row's time from its step, in steps
    start: Optional[pd.Timestamp | float] = None  # the time of step 0 where the grid is anchored (snap, resample)


Aggregation = Literal["mean", "median", "min", "max", "first", "last", "sum"]
AGGREGATIONS = ("mean", "median", "min", "max", "first", "last", "sum")
_EPOCH = pd.Timestamp(0, tz="UTC")


def step_seconds(sampling_rate: float | str) -> float:
    """The grid's step in seconds: 1 / `sampling_rate` for samples per second (360, "0.2"), or a
    period as pandas writes it ("5min", "1h", "30s", "100ms")."""
    try:
        rate = float(sampling_rate)
    except ValueError:
        try:
            seconds = pd.Timedelta(str(sampling_rate)).total_seconds()
        except ValueError:
            seconds = 0.0
        if seconds > 0:
            return seconds
        raise ValueError(
            f"{option('sampling_rate', metavar='RATE')} takes samples per second (360, 0.2) or a period "
            f"(5min, 1h, 30s, 100ms); got {sampling_rate!r}"
        ) from None
    if not rate > 0 or not np.isfinite(rate):
        raise ValueError(f"sampling_rate must be positive (samples per second), got {sampling_rate}")
    return 1.0 / rate


def tolerance_seconds(snap: float | str) -> float:
    """`snap` in seconds: a number of seconds (30) or a period ("30s", "2min")."""
    try:
        seconds = float(snap)
    except ValueError:
        try:
            seconds = pd.Timedelta(str(snap)).total_seconds()
        except ValueError:
            seconds = -1.0
    if not seconds >= 0 or not np.isfinite(seconds):
        raise ValueError(
            f"{option('snap', metavar='PERIOD')} takes how far a time may lie from its step: a period "
            f"(30s, 2min) or seconds (30); got {snap!r}"
        )
    return seconds


def period_text(seconds: float) -> str:
    """A step as a period that `step_seconds` reads back: 5min, 1h, 30s, 100ms."""
    for unit, size in (("D", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3)):
        count = seconds / size
        if count >= 1 and abs(count - round(count)) < 1e-9 * max(1.0, count):
            return f"{int(round(count))}{unit}"
    return f"{seconds:g}s"


def _check_increasing(path: Path, table: _Table, label: str) -> None:
    seconds = table.seconds
    back = np.flatnonzero(np.diff(seconds) < 0)
    if len(back):
        row = int(back[0]) + 1
        raise ValueError(
            f"{path}: the time column {label!r} goes backwards at {table.row_line(row)} "
            f"({seconds[row]:g} s after the first row, the row before at {seconds[row - 1]:g} s); "
            "sort the rows by time (one series per file)"
        )


def nominal_step(seconds: np.ndarray) -> Optional[float]:
    """The median time between rows, rounded to a whole second when it is one or more (the step a
    file was meant to have, for hints); None when every row has the same time."""
    diffs = np.diff(seconds)
    positive = diffs[diffs > 0]
    if not len(positive):
        return None
    median = float(np.median(positive))
    return float(round(median)) if median >= 1 else median


def _place_on_grid(path: Path, table: _Table, step: Optional[float], label: str) -> _Grid:
    """Grid positions of the rows (see the module docstring); `step` None: detected."""
    seconds = table.seconds
    _check_increasing(path, table, label)
    diffs = np.diff(seconds)
    detected = step is None
    if detected:
        positive = diffs[diffs > 0]
        if not len(positive):
            raise ValueError(
                f"{path}: every row has the same time; pass {option('sampling_rate', metavar='HZ')} "
                "or a time column that changes"
            )
        step = float(np.median(positive))
    positions = np.zeros(len(seconds), dtype=np.int64)
    np.cumsum(np.rint(diffs / step).astype(np.int64), out=positions[1:])
    if detected and positions[-1] > 0:  # least-squares slope of time on position: rounding cancels out
        k = positions.astype(np.float64)
        k_centred = k - k.mean()
        step = float((k_centred * (seconds - seconds.mean())).sum() / (k_centred * k_centred).sum())
    offsets = (seconds - positions * step) / step
    offsets -= np.median(offsets)
    jitter = float(np.abs(offsets).max()) if len(offsets) else 0.0
    if jitter >= 0.5:
        row = int(np.argmax(np.abs(offsets)))
        nominal = step if not detected else nominal_step(seconds)
        given = "" if not detected else f"{option('sampling_rate', period_text(nominal))} "
        rate = "the given sampling rate" if not detected else f"the detected step of {step:g} s"
        raise ValueError(
            f"{path}: snap each time to its nearest step, {given}{option('snap', period_text(nominal / 2))} (up to half "
            f"a step away; for several rows a step, average them instead: {given}{option('resample', 'mean')}) (the times "
            f"drift off a regular grid of {rate}: {table.row_line(row)} lies {offsets[row]:+.2f} steps from its place)"
        )
    return _Grid(positions, step, jitter)


def _grid_times(table: _Table) -> np.ndarray:
    """Each row's time in seconds from where the grid is anchored: the epoch (1970-01-01 UTC) for
    dates, so that a 5-minute grid falls on the clock's 5 minutes; zero for times in seconds."""
    origin = (table.start - _EPOCH).total_seconds() if isinstance(table.start, pd.Timestamp) else float(table.start)
    return origin + table.seconds


def _grid_start(table: _Table, seconds: float) -> pd.Timestamp | float:
    return _EPOCH + pd.Timedelta(seconds=seconds) if isinstance(table.start, pd.Timestamp) else seconds


def _snap_to_grid(path: Path, table: _Table, step: float, tolerance: float, label: str) -> _Grid:
    """Each row on the grid step nearest its time, when at most `tolerance` seconds away."""
    _check_increasing(path, table, label)
    times = _grid_times(table)
    steps = np.rint(times / step)
    distance = np.abs(times - steps * step)
    far = np.flatnonzero(distance > tolerance * (1 + 1e-9))
    if len(far):
        row = int(far[0])
        raise ValueError(
            f"{path}: snap up to half a step, {option('snap', period_text(step / 2))}, or average the rows of each step, "
            f"{option('resample', 'mean')} ({table.row_line(row)} lies {distance[row]:g} s from the nearest "
            f"{period_text(step)} step, more than {option('snap', period_text(tolerance))} allows; {len(far)} rows in all)"
        )
    positions = (steps - steps[0]).astype(np.int64)
    return _Grid(positions, step, float(distance.max() / step), _grid_start(table, float(steps[0] * step)))


def _resample(table: _Table, step: float, how: str) -> tuple[_Grid, np.ndarray, int]:
    """The rows of each grid step [k step, (k + 1) step) aggregated by `how` (pandas' groupby,
    missing values left out; a step with none observed stays missing): (grid of the steps with
    rows, their values (U, C), rows merged into another row's step)."""
    steps = np.floor(_grid_times(table) / step + 1e-9)
    grouped = pd.DataFrame(table.values).groupby(steps, sort=True)
    values = grouped.sum(min_count=1) if how == "sum" else grouped.agg(how)
    unique = values.index.to_numpy(dtype=np.float64)
    grid = _Grid((unique - unique[0]).astype(np.int64), step, 0.0, _grid_start(table, float(unique[0] * step)))
    return grid, values.to_numpy(dtype=np.float64), len(table.values) - len(unique)


def _merge_duplicates(
    path: Path, table: _Table, grid: _Grid, policy: str, label: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """(unique positions, their values (U, C), merged row count) under the duplicates policy."""
    positions, values = grid.positions, table.values
    same = np.flatnonzero(np.diff(positions) == 0)
    if not len(same):
        return positions, values, 0
    if policy == "error":
        row = int(same[0]) + 1
        raise ValueError(
            f"{path}: {table.row_line(row)} falls on the same time step as the row before it ({label!r}, "
            f"{len(same)} such rows in all); choose which to keep with {option('duplicates', 'first')}, "
            f"{option('duplicates', 'last')} or {option('duplicates', 'mean')}"
        )
    starts = np.flatnonzero(np.r_[True, np.diff(positions) > 0])
    unique = positions[starts]
    if policy == "first":
        return unique, values[starts], len(same)
    if policy == "last":
        return unique, values[np.r_[starts[1:] - 1, len(positions) - 1]], len(same)
    if policy != "mean":
        raise ValueError(f"duplicates={policy!r}: use one of {', '.join(DUPLICATE_POLICIES)}")
    observed = ~np.isnan(values)
    sums = np.add.reduceat(np.where(observed, values, 0.0), starts, axis=0)
    counts = np.add.reduceat(observed.astype(np.int64), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return unique, np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), len(same)


def gap_summary(present_T: np.ndarray) -> dict:
    """Runs of grid steps without a row: {"count", "missing_steps", "longest"}."""
    edges = np.diff(np.r_[0, (~present_T).astype(np.int8), 0])
    lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    return {"count": int(len(lengths)), "missing_steps": int(lengths.sum()), "longest": int(lengths.max(initial=0))}


def _read_npy(path: Path, channels_first: bool) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path}: not a readable .npy file ({exc})") from exc
    if array.ndim == 1:
        array = array[:, None]
    elif array.ndim == 2:
        array = array.T if channels_first else array
    else:
        raise ValueError(f"{path}: array of shape {array.shape}; expected (T,) or (T, C)")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{path}: dtype {array.dtype} is not numeric")
    return array.astype(np.float64)  # (T, C)


def _fill_missing(values: np.ndarray, policy: str, path: Path, names: list[str], where) -> list[int]:
    """Apply the missing policy to NaN in values (T, C), in place; return the values filled per
    channel. `where(step)` describes a grid step for errors."""
    missing = np.isnan(values)
    counts = missing.sum(axis=0).tolist()
    if not any(counts) or policy == "keep":
        return [0] * values.shape[1]
    if policy == "error":
        row, col = np.argwhere(missing)[0]
        raise ValueError(
            f"{path}: missing value at {where(int(row))}, column {names[col]!r} "
            f"({sum(counts)} missing in all); keep them as missing with {option('missing', 'keep')}, "
            f"or fill them: {option('missing', 'ffill')}, {option('missing', 'zero')} or "
            f"{option('missing', 'linear')}"
        )
    for col in range(values.shape[1]):
        gaps = missing[:, col]
        if not gaps.any():
            continue
        series = values[:, col]
        if policy == "zero":
            series[gaps] = 0.0
        elif policy == "ffill":
            idx = np.where(~gaps, np.arange(len(series)), 0)
            np.maximum.accumulate(idx, out=idx)
            first = int(np.argmax(~gaps))
            idx[:first] = first
            series[:] = series[idx]
        elif policy == "linear":
            t = np.arange(len(series))
            series[gaps] = np.interp(t[gaps], t[~gaps], series[~gaps])
        else:
            raise ValueError(f"missing={policy!r}: use one of {', '.join(MISSING_POLICIES)}")
    return counts


@dataclass
class LoadedFile:
    """One input file on its grid, as the store keeps it."""

    path: Path
    values_CT: np.ndarray
    filled: list[int]
    missing: list[int]
    gaps: dict
    duplicates: int
    jitter: float
    start_time: Optional[str]
    skipped_columns: list[str]


def load_file(
    path: Path,
    *,
    step: Optional[float],
    time_column,
    columns,
    dayfirst: bool,
    delimiter: Optional[str],
    missing: str,
    duplicates: str,
    npy_channels_first: bool,
    channel_names: Optional[Sequence[str]],
    skip_rows: int = 0,
    snap: Optional[float] = None,
    resample: Optional[str] = None,
) -> tuple[LoadedFile, list[str], Optional[float]]:
    """One file on its grid: (loaded series, channel names, its step in seconds or None).
    `snap` (seconds) puts each row on its nearest step, `resample` aggregates the rows of each
    step; both need `step` and a time column (see the module docstring)."""
    label = "+".join(_as_list(time_column))
    if path.name.lower().endswith(CSV_SUFFIXES):
        table = _read_csv(path, time_column, columns, dayfirst, delimiter, skip_rows)
    else:
        if time_column is not None or columns is not None:
            raise ValueError(f"{path}: a .npy file has no named columns; time_column and columns apply to CSV files")
        values = _read_npy(path, npy_channels_first)
        table = _Table([f"ch{i}" for i in range(values.shape[1])], values)
    names = table.names
    if channel_names is not None:
        if len(channel_names) != len(names):
            raise ValueError(f"{path}: {len(names)} channels, but channel_names has {len(channel_names)}")
        names = list(channel_names)
    if np.isinf(table.values).any():
        row, col = np.argwhere(np.isinf(table.values))[0]
        raise ValueError(f"{path}: infinite value at {table.row_line(int(row))}, column {names[col]!r}")
    gaps, merged, jitter, start_time, file_step = gap_summary(np.ones(0, bool)), 0, 0.0, None, None
    if table.seconds is None:
        grid_TC = table.values
        where = table.row_line
    else:
        if (snap is not None or resample is not None) and step is None:
            nominal = nominal_step(table.seconds)
            which = "snap" if snap is not None else "resample"
            raise ValueError(
                f"{path}: pass the grid's step as well, {option('sampling_rate', period_text(nominal or 1.0))} "
                f"(the median time between rows) ({option(which, metavar='...')} needs the grid's step)"
            )
        if resample is not None:
            grid, values, merged = _resample(table, step, resample)
            positions = grid.positions
        else:
            grid = (
                _place_on_grid(path, table, step, label)
                if snap is None
                else _snap_to_grid(path, table, step, snap, label)
            )
            positions, values, merged = _merge_duplicates(path, table, grid, duplicates, label)
        grid_TC = np.full((int(positions[-1]) + 1, len(names)), np.nan)
        grid_TC[positions] = values
        present = np.zeros(len(grid_TC), bool)
        present[positions] = True
        gaps, jitter, file_step = gap_summary(present), grid.jitter, grid.step
        start = table.start if grid.start is None else grid.start
        if isinstance(start, pd.Timestamp):
            start_time = start.isoformat()

        def where(step_index: int) -> str:
            if present[step_index] and resample is None:
                return table.row_line(int(np.searchsorted(grid.positions, step_index)))
            return f"time step {step_index} (a gap: no row at {step_index * grid.step:g} s after the first row)"

    if np.isnan(grid_TC).all(axis=0).any():
        col = int(np.flatnonzero(np.isnan(grid_TC).all(axis=0))[0])
        raise ValueError(
            f"{path}: column {names[col]!r} has no values at all; leave it out with "
            f"{option('columns', metavar='[A,B]')}"
        )
    filled = _fill_missing(grid_TC, missing, path, names, where)
    loaded = LoadedFile(
        path,
        grid_TC.astype(np.float32).T.copy(),
        filled,
        np.isnan(grid_TC).sum(axis=0).tolist(),
        gaps,
        merged,
        jitter,
        start_time,
        table.skipped,
    )
    return loaded, names, file_step
