"""Time-series stores: CSV or NumPy (.npy) files -> zarr v3 group of float32 (C, T) arrays.

Layout (zarr v3 group)::

    <store>/zarr.json     attributes["genoformer"]: store metadata (see storage.py) plus
                          "sampling_rate" (Hz), "channel_names", "missing" (the policy used),
                          "stats" {"mean", "std", "min", "max"}: per-channel lists over all series,
                          "series": list of {name, length, source, source_name, source_sha256,
                          filled (missing values filled per channel), values_sha256}
    <store>/series/<i>    (C, T_i) float32, chunked along time

Input: a CSV has a header row naming the columns, one row per time step; ``time_column`` (if
given) is dropped from the channels and, when ``sampling_rate`` is not given, sets it from the
mean time step. A .npy file holds (T,) or (T, C) values (``npy_channels_first`` for (C, T)).
All files must have the same channels; blank lines are skipped (as pandas does). Missing
values (empty cells, NaN, "NA") follow
``missing``: "error" (default; names file, row and column), "ffill" (carry the last value
forward, the first value backward at the start), "zero", or "linear" (interpolate in time, hold
the end values). Infinite values and ragged rows are always errors.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import zarr
from tqdm.auto import tqdm
from zarr.codecs import BloscCodec

from genoformer.hints import option
from genoformer.data.storage import (
    METADATA_KEY,
    ChunkCache,
    atomic_build,
    base_metadata,
    open_store_group,
    reusable_store,
    sha256_files,
)


TIMESERIES_FORMAT = "genoformer.timeseries"
TIMESERIES_FORMAT_VERSION = 1
MissingPolicy = Literal["error", "ffill", "zero", "linear"]
_MISSING_TEXT = {"", "nan", "na", "n/a", "null", "none"}


@dataclass(frozen=True)
class SeriesInfo:
    """One series (source file) of a time-series store."""

    index: int
    name: str
    length: int
    source: str
    source_name: str
    source_sha256: str
    filled: list[int]
    values_sha256: str


def is_timeseries_file_name(name: str) -> bool:
    """Whether a file name is one `prepare_timeseries_store` reads (.csv or .npy)."""
    return name.lower().endswith((".csv", ".npy"))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_csv(path: Path, time_column: str | None) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(channel names, values (T, C) float64 with NaN for missing, time values or None)."""
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"{path}: the file is empty; expected a CSV with a header row")
    if b"\x00" in raw[:4096]:
        raise ValueError(f"{path}: binary data, not a CSV file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the CSV as UTF-8") from None
    try:
        return _parse_csv(path, text, time_column)
    except csv.Error as exc:
        raise ValueError(f"{path}: malformed CSV ({exc})") from None


def _parse_csv(path: Path, text: str, time_column: str | None) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    reader = csv.reader(io.StringIO(text, newline=""))  # newline="": \n, \r\n and \r all end a row
    header = [h.strip() for h in next(reader)]
    if all(_is_number(h) for h in header):
        raise ValueError(f"{path}: the first row is numeric; the CSV needs a header row naming the columns")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: duplicate column names in the header {header}")
    if time_column is not None and time_column not in header:
        raise ValueError(f"{path}: time_column {time_column!r} is not a column; columns are {header}")
    width = len(header)
    rows: list[list[float]] = []
    for line_no, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != width:
            raise ValueError(f"{path}: line {line_no} has {len(row)} fields, the header has {width}; "
                             "every row needs one value per column")
        values = []
        for col, cell in enumerate(row):
            cell = cell.strip()
            if cell.lower() in _MISSING_TEXT:
                values.append(math.nan)
                continue
            try:
                values.append(float(cell))
            except ValueError:
                raise ValueError(f"{path}: line {line_no}, column {header[col]!r}: {cell!r} is not a number") from None
        rows.append(values)
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    table = np.array(rows, dtype=np.float64)  # (T, width)
    if time_column is None:
        return header, table, None
    t_col = header.index(time_column)
    keep = [i for i in range(width) if i != t_col]
    return [header[i] for i in keep], table[:, keep], table[:, t_col]


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


def _fill_missing(values: np.ndarray, policy: str, path: Path, names: list[str], row_offset: int, row_word: str) -> list[int]:
    """Fill NaN in values (T, C) in place according to the policy; return counts per channel."""
    missing = np.isnan(values)
    counts = missing.sum(axis=0).tolist()
    if not any(counts):
        return counts
    if policy == "error":
        row, col = np.argwhere(missing)[0]
        raise ValueError(f"{path}: missing value at {row_word} {row + row_offset}, column {names[col]!r} "
                         f"({sum(counts)} missing in all); to fill them pass {option('missing', 'ffill')}, "
                         f"{option('missing', 'zero')} or {option('missing', 'linear')}")
    for col in range(values.shape[1]):
        gaps = missing[:, col]
        if not gaps.any():
            continue
        if gaps.all():
            raise ValueError(f"{path}: column {names[col]!r} has no values at all; nothing to fill from")
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
            raise ValueError(f"missing={policy!r}: use 'error', 'ffill', 'zero' or 'linear'")
    return counts


def prepare_timeseries_store(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    sampling_rate: float | None = None,
    time_column: str | None = None,
    channel_names: Sequence[str] | None = None,
    missing: MissingPolicy = "error",
    npy_channels_first: bool = False,
    chunk_size: int = 1 << 16,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Build a time-series store at ``out`` from CSV and/or .npy files and return its path.

    Args:
        paths: Input files (``.csv`` or ``.npy``); each becomes one series. All need the same channels.
        out: Directory of the zarr store to create.
        sampling_rate: Samples per second. Required unless ``time_column`` gives the times.
        time_column: CSV column holding time in seconds; not stored as a channel.
        channel_names: Names for the channels (default: the CSV header, or ch0, ch1, ... for .npy).
        missing: "error" (default), "ffill", "zero" or "linear"; see the module docstring.
        npy_channels_first: .npy arrays are (C, T) instead of (T, C).
        chunk_size: Time steps per chunk.
        overwrite: Always rebuild. Without it, a complete store built from the same files (same
            SHA-256) with the same options is kept as it is (the call returns at once) and any other
            existing ``out`` is an error.
        progress: Show a tqdm progress bar over the files.
        command: Command line recorded in the metadata (default: ``sys.argv``).
    """
    out = Path(out)
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not paths:
        raise ValueError("no input files given; pass one or more .csv or .npy paths")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"input file not found: {path}")
        if path.suffix.lower() not in (".csv", ".npy"):
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .csv or .npy")
    if missing not in ("error", "ffill", "zero", "linear"):
        raise ValueError(f"missing={missing!r}: use 'error', 'ffill', 'zero' or 'linear'")
    arguments = {"paths": [str(p.resolve()) for p in paths], "sampling_rate": sampling_rate,
                 "time_column": time_column, "missing": missing, "npy_channels_first": npy_channels_first,
                 "chunk_size": chunk_size, "channel_names": None if channel_names is None else list(channel_names)}
    existing = None if overwrite else reusable_store(out, TIMESERIES_FORMAT, arguments, "paths")
    if existing is not None and [s["source_sha256"] for s in existing["series"]] == sha256_files(paths):
        return out
    names_seen: list[str] | None = list(channel_names) if channel_names is not None else None
    rate = sampling_rate
    loaded = []
    for path in tqdm(paths, desc="read", unit="file", disable=not progress):
        times = None
        if path.suffix.lower() == ".csv":
            names, values, times = _read_csv(path, time_column)
            row_offset, row_word = 2, "line"
        else:
            values = _read_npy(path, npy_channels_first)
            names = [f"ch{i}" for i in range(values.shape[1])]
            row_offset, row_word = 0, "row"
        if channel_names is not None:
            if len(channel_names) != values.shape[1]:
                raise ValueError(f"{path}: {values.shape[1]} channels, but channel_names has {len(channel_names)}")
            names = list(channel_names)
        if names_seen is None:
            names_seen = names
        elif names != names_seen:
            raise ValueError(f"{path}: channels {names} differ from {names_seen} of the first file")
        if np.isinf(values).any():
            row, col = np.argwhere(np.isinf(values))[0]
            raise ValueError(f"{path}: infinite value at {row_word} {row + row_offset}, column {names[col]!r}")
        filled = _fill_missing(values, missing, path, names, row_offset, row_word)
        if times is not None:
            steps = np.diff(times)
            if len(steps) and (np.isnan(steps).any() or (steps <= 0).any()):
                raise ValueError(f"{path}: the time column {time_column!r} must increase strictly")
            # The mean step over the whole file: rounding in the CSV cancels out.
            file_rate = (len(times) - 1) / float(times[-1] - times[0]) if len(steps) else None
            if rate is None:
                rate = file_rate
            elif file_rate is not None and not math.isclose(file_rate, rate, rel_tol=1e-3):
                raise ValueError(f"{path}: sampling rate {file_rate:g} Hz from {time_column!r} differs from {rate:g} Hz")
        loaded.append((path, values.astype(np.float32).T.copy(), filled))  # (C, T)
    if rate is None or not rate > 0:
        raise ValueError(f"sampling rate unknown: pass {option('sampling_rate', metavar='HZ')} (samples per "
                         f"second) or {option('time_column', metavar='COLUMN')} (a column of times in seconds)")
    with atomic_build(out, overwrite) as tmp:
        group = zarr.open_group(tmp, mode="w-")
        meta = base_metadata(TIMESERIES_FORMAT, TIMESERIES_FORMAT_VERSION, arguments, command)
        group.attrs[METADATA_KEY] = meta
        series_group = group.create_group("series")
        series = []
        all_values = np.concatenate([v for _, v, _ in loaded], axis=1).astype(np.float64)  # (C, sum T)
        for index, (path, values, filled) in enumerate(loaded):
            array = series_group.create_array(
                str(index), shape=values.shape, dtype="float32", chunks=(values.shape[0], min(chunk_size, values.shape[1])),
                compressors=BloscCodec(cname="zstd", clevel=5, shuffle="shuffle", typesize=4), fill_value=0.0,
            )
            array[:] = values
            series.append({"name": path.stem, "length": int(values.shape[1]), "source": str(path.resolve()),
                           "source_name": path.name, "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                           "filled": filled, "values_sha256": hashlib.sha256(values).hexdigest()})
        check = zarr.open_group(tmp, mode="r")
        for index, info in enumerate(series):
            if hashlib.sha256(np.ascontiguousarray(check[f"series/{index}"][:])).hexdigest() != info["values_sha256"]:
                raise OSError(f"verification failed for series {info['name']!r} in {tmp}")
        meta.update({
            "sampling_rate": float(rate),
            "channel_names": names_seen,
            "missing": missing,
            "stats": {"mean": all_values.mean(axis=1).tolist(), "std": all_values.std(axis=1).tolist(),
                      "min": all_values.min(axis=1).tolist(), "max": all_values.max(axis=1).tolist()},
            "series": series,
            "complete": True,
        })
        group.attrs[METADATA_KEY] = meta
    return out


class TimeSeriesStore:
    """Read-only access to a time-series store with a per-process LRU cache of decoded chunks."""

    def __init__(self, path: str | Path, cache_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        _, self.metadata = open_store_group(self.path, TIMESERIES_FORMAT, (TIMESERIES_FORMAT_VERSION,))
        self.sampling_rate: float = self.metadata["sampling_rate"]
        self.channel_names: list[str] = list(self.metadata["channel_names"])
        stats = self.metadata["stats"]
        self.mean = np.array(stats["mean"], dtype=np.float32)  # (C,)
        self.std = np.array(stats["std"], dtype=np.float32)  # (C,)
        self.min = np.array(stats["min"], dtype=np.float32)
        self.max = np.array(stats["max"], dtype=np.float32)
        self.series: tuple[SeriesInfo, ...] = tuple(SeriesInfo(index=i, **s) for i, s in enumerate(self.metadata["series"]))
        self.chunk_size: int = int(self.metadata["arguments"]["chunk_size"])
        self._reset_handles()

    def _reset_handles(self) -> None:
        self._group: zarr.Group | None = None
        self._cache = ChunkCache(self.cache_bytes)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_group")
        state.pop("_cache")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_handles()

    @property
    def num_channels(self) -> int:
        return len(self.channel_names)

    def _chunk(self, index: int, chunk: int) -> np.ndarray:
        def load() -> np.ndarray:
            if self._group is None:
                self._group = zarr.open_group(self.path, mode="r")
            return self._group[f"series/{index}"][:, chunk * self.chunk_size:(chunk + 1) * self.chunk_size]
        return self._cache.get((index, chunk), load)

    def read(self, series: int, start: int, end: int) -> np.ndarray:
        """Values of series ``series`` in [start, end) as a new float32 array (C, end - start)."""
        length = self.series[series].length
        if not 0 <= start <= end <= length:
            raise IndexError(f"[{start}, {end}) is outside series {self.series[series].name!r} of length {length}")
        cs = self.chunk_size
        out = np.empty((self.num_channels, end - start), dtype=np.float32)
        pos = start
        while pos < end:
            chunk = pos // cs
            hi = min(end, (chunk + 1) * cs)
            out[:, pos - start:hi - start] = self._chunk(series, chunk)[:, pos - chunk * cs:hi - chunk * cs]
            pos = hi
        return out
