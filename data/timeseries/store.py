"""Time-series stores: CSV or NumPy (.npy) files -> zarr v3 group of float32 (C, T) arrays.

Layout (zarr v3 group)::

    <store>/zarr.json     attributes["genoformer"]: store metadata (see storage.py) plus
                          "sampling_rate" (Hz), "channel_names", "missing" (the policy used),
                          "stats" {"mean", "std", "min", "max"}: per-channel lists over the
                          observed values of all series,
                          "series": list of {name, length, source, source_name, source_sha256,
                          filled, missing, gaps, duplicates, jitter, start_time, values_sha256}
    <store>/series/<i>    (C, T_i) float32 on a regular time grid, chunked along time; NaN marks
                          a missing value (the store's mask: an observed value is never NaN);
                          each compressed chunk followed by its CRC32C (zarr's crc32c codec),
                          checked on every read: a damaged chunk is one error naming the store
                          and the `genoformer prepare_timeseries ... --overwrite` that rebuilds it

Reading the files (CSV, .npy) and putting their rows on the time grid: `inputs`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import zarr
from genoformer.data.storage import (
    METADATA_KEY,
    ChunkCache,
    atomic_build,
    base_metadata,
    damaged_store,
    open_store_group,
    rebuild_command,
    reusable_store,
    sha256_files,
    warn_unchecked_store,
)
from genoformer.data.timeseries.inputs import (
    AGGREGATIONS,
    DUPLICATE_POLICIES,
    MISSING_POLICIES,
    Aggregation,
    DuplicatePolicy,
    LoadedFile,
    MissingPolicy,
    is_timeseries_file_name,
    load_file,
    series_name,
    step_seconds,
    tolerance_seconds,
)
from zarr.codecs import BloscCodec, Crc32cCodec

from genoformer.hints import option
from genoformer.progress import tqdm

log = logging.getLogger(__name__)

TIMESERIES_FORMAT = "genoformer.timeseries"
TIMESERIES_FORMAT_VERSION = 3
"""3: every chunk followed by its CRC32C, checked on every read; 2 (still read, with a warning): no
chunk checksums; 1 (still read, with a warning): no missing values either."""


@dataclass(frozen=True)
class SeriesInfo:
    """One series (source file) of a time-series store.

    ``filled``: values filled per channel (by the missing policy); ``missing``: values still
    missing per channel (NaN in the store); ``gaps``: grid steps no row landed on
    ({"count", "missing_steps", "longest"}); ``duplicates``: rows merged into an earlier row's
    step; ``jitter``: the largest distance of a row's time from its grid step, in steps;
    ``start_time``: the first step's date and time (ISO 8601) when the times were dates, else
    None; ``skipped_columns``: CSV columns left out because they are not numeric.
    """

    index: int
    name: str
    length: int
    source: str
    source_name: str
    source_sha256: str
    filled: list[int]
    values_sha256: str
    missing: list[int] = field(default_factory=list)
    gaps: dict = field(default_factory=lambda: {"count": 0, "missing_steps": 0, "longest": 0})
    duplicates: int = 0
    jitter: float = 0.0
    start_time: Optional[str] = None
    skipped_columns: list[str] = field(default_factory=list)

    @property
    def has_missing(self) -> bool:
        return any(self.missing)


def prepare_timeseries_store(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    sampling_rate: float | str | None = None,
    time_column: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    dayfirst: bool = False,
    delimiter: str | None = None,
    duplicates: DuplicatePolicy = "error",
    channel_names: Sequence[str] | None = None,
    missing: MissingPolicy = "keep",
    npy_channels_first: bool = False,
    skip_rows: int = 0,
    snap: float | str | None = None,
    resample: Aggregation | None = None,
    chunk_size: int = 1 << 16,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Build a time-series store at ``out`` from CSV and/or .npy files and return its path.

    Args:
        paths: Input files (``.csv``, ``.csv.gz``/``.xz``/``.bz2`` or ``.npy``); each becomes one
            series. All need the same channels.
        out: Directory of the zarr store to create.
        sampling_rate: Samples per second (the grid's step is 1 / sampling_rate), or the step as a
            period ("5min", "1h", "30s", "100ms"). Required unless ``time_column`` gives the times
            (then detected from them).
        time_column: CSV column(s) holding the time: seconds, or dates and times (several columns
            are joined with spaces, e.g. ["Date", "Time"]). Not stored as channels.
        columns: CSV columns to store as channels (default: every numeric column).
        dayfirst: Dates are day first (16/12/2006 is 16 December).
        delimiter: CSV delimiter (default: the one of , ; tab | most frequent in the header row).
        duplicates: Rows on the same time step: "error" (default), "first", "last" or "mean".
        channel_names: Names for the channels (default: the CSV header, or ch0, ch1, ... for .npy).
        missing: "keep" (default: stored as NaN, the mask), "error", "ffill", "zero" or "linear";
            see the module docstring.
        npy_channels_first: .npy arrays are (C, T) instead of (T, C).
        skip_rows: Lines before a CSV's header to skip (a title, a station's name, units).
        snap: Put each row on the grid step nearest its time when it lies at most this far from
            it: a period ("30s", "150s") or seconds; the grid falls on the clock (a 5-minute step on
            :00, :05, ...) for dates, on multiples of the step for times in seconds. Needs
            ``sampling_rate``.
        resample: Aggregate the rows of each grid step, [k step, (k + 1) step), by "mean",
            "median", "min", "max", "first", "last" or "sum" (missing values left out), the grid
            anchored as for ``snap``. Needs ``sampling_rate``; excludes ``snap``.
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
        if not is_timeseries_file_name(path.name):
            raise ValueError(f"{path}: unsupported file type; use .csv (also .csv.gz, .csv.xz, .csv.bz2) or .npy")
    if missing not in MISSING_POLICIES:
        raise ValueError(f"missing={missing!r}: use one of {', '.join(MISSING_POLICIES)}")
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"duplicates={duplicates!r}: use one of {', '.join(DUPLICATE_POLICIES)}")
    step = None if sampling_rate is None else step_seconds(sampling_rate)
    tolerance = None if snap is None else tolerance_seconds(snap)
    if snap is not None and resample is not None:
        raise ValueError(
            f"give one of {option('snap', metavar='PERIOD')} (each row to its nearest step) and "
            f"{option('resample', metavar='AGGREGATION')} (the rows of each step aggregated)"
        )
    if resample is not None and resample not in AGGREGATIONS:
        raise ValueError(f"resample={resample!r}: use one of {', '.join(AGGREGATIONS)}")
    if skip_rows < 0:
        raise ValueError(f"skip_rows must be 0 or more, got {skip_rows}")
    if delimiter is not None and len(delimiter) != 1:
        raise ValueError(f"delimiter must be one character, got {delimiter!r}")
    time_column = time_column if time_column is None or isinstance(time_column, str) else list(time_column)
    arguments = {
        "paths": [str(p.resolve()) for p in paths],
        "sampling_rate": sampling_rate,
        "time_column": time_column,
        "columns": None if columns is None else list(columns),
        "dayfirst": dayfirst,
        "delimiter": delimiter,
        "duplicates": duplicates,
        "missing": missing,
        "npy_channels_first": npy_channels_first,
        "skip_rows": skip_rows,
        "snap": snap,
        "resample": resample,
        "chunk_size": chunk_size,
        "channel_names": None if channel_names is None else list(channel_names),
    }
    existing = None if overwrite else reusable_store(out, TIMESERIES_FORMAT, arguments, "paths")
    if existing is not None and [s["source_sha256"] for s in existing["series"]] == sha256_files(paths):
        if existing.get("format_version") == TIMESERIES_FORMAT_VERSION:
            return out
        log.warning(
            "%s was built from the same files by an older genoformer (format %s): rebuilding it with chunk "
            "checksums (format %d)",
            out,
            existing.get("format_version"),
            TIMESERIES_FORMAT_VERSION,
        )
        overwrite = True
    names_seen: list[str] | None = None
    loaded: list[LoadedFile] = []
    for path in tqdm(paths, desc="read", unit="file", disable=not progress):
        series, names, file_step = load_file(
            path,
            step=step,
            time_column=time_column,
            columns=columns,
            dayfirst=dayfirst,
            delimiter=delimiter,
            missing=missing,
            duplicates=duplicates,
            npy_channels_first=npy_channels_first,
            channel_names=channel_names,
            skip_rows=skip_rows,
            snap=tolerance,
            resample=resample,
        )
        if names_seen is None:
            names_seen = names
        elif names != names_seen:
            raise ValueError(f"{path}: channels {names} differ from {names_seen} of the first file")
        if file_step is not None:
            if step is None:
                step = file_step
            elif not math.isclose(file_step, step, rel_tol=1e-3):
                raise ValueError(
                    f"{path}: its time step of {file_step:g} s ({1 / file_step:g} Hz) differs from "
                    f"{step:g} s ({1 / step:g} Hz) of the files before it"
                )
        loaded.append(series)
    if step is None:
        raise ValueError(
            f"sampling rate unknown: pass {option('sampling_rate', metavar='HZ')} (samples per "
            f"second) or {option('time_column', metavar='COLUMN')} (a column of times)"
        )
    with atomic_build(out, overwrite) as tmp:
        group = zarr.open_group(tmp, mode="w-")
        meta = base_metadata(TIMESERIES_FORMAT, TIMESERIES_FORMAT_VERSION, arguments, command)
        group.attrs[METADATA_KEY] = meta
        series_group = group.create_group("series")
        series = []
        for index, item in enumerate(loaded):
            values = item.values_CT
            array = series_group.create_array(
                str(index),
                shape=values.shape,
                dtype="float32",
                chunks=(values.shape[0], min(chunk_size, values.shape[1])),
                compressors=[BloscCodec(cname="zstd", clevel=5, shuffle="shuffle", typesize=4), Crc32cCodec()],
                fill_value=np.nan,
            )
            array[:] = values
            series.append(
                {
                    "name": series_name(item.path),
                    "length": int(values.shape[1]),
                    "source": str(item.path.resolve()),
                    "source_name": item.path.name,
                    "source_sha256": sha256_files([item.path])[0],
                    "filled": item.filled,
                    "values_sha256": hashlib.sha256(values).hexdigest(),
                    "missing": item.missing,
                    "gaps": item.gaps,
                    "duplicates": item.duplicates,
                    "jitter": item.jitter,
                    "start_time": item.start_time,
                    "skipped_columns": item.skipped_columns,
                }
            )
        check = zarr.open_group(tmp, mode="r")
        for index, info in enumerate(series):
            if hashlib.sha256(np.ascontiguousarray(check[f"series/{index}"][:])).hexdigest() != info["values_sha256"]:
                raise OSError(f"verification failed for series {info['name']!r} in {tmp}")
        meta.update(
            {
                "sampling_rate": 1.0 / step,
                "channel_names": names_seen,
                "missing": missing,
                "stats": _channel_stats([item.values_CT for item in loaded]),
                "series": series,
                "complete": True,
            }
        )
        group.attrs[METADATA_KEY] = meta
    return out


def rebuild(path: Path, arguments: dict) -> str:
    """The `genoformer prepare_timeseries` command that builds the store at ``path`` again from its
    inputs (``arguments`` as recorded in its metadata), replacing it."""
    defaults = {
        "sampling_rate": None,
        "time_column": None,
        "columns": None,
        "skip_rows": 0,
        "dayfirst": False,
        "delimiter": None,
        "snap": None,
        "resample": None,
        "duplicates": "error",
        "missing": "keep",
        "npy_channels_first": False,
    }
    options = {
        name: arguments.get(name, default)
        for name, default in defaults.items()
        if arguments.get(name, default) != default
    }
    return rebuild_command("prepare_timeseries", "--inputs", arguments.get("paths", ["SERIES.csv"]), path, options)


def _channel_stats(values: list[np.ndarray]) -> dict[str, list[float]]:
    """Mean, std, min and max of each channel over the observed values of all series (C, T_i),
    accumulated in float64 one series at a time."""
    n_channels = values[0].shape[0]
    count, total, square = np.zeros(n_channels), np.zeros(n_channels), np.zeros(n_channels)
    low, high = np.full(n_channels, np.inf), np.full(n_channels, -np.inf)
    for values_CT in values:
        x = values_CT.astype(np.float64)
        observed = ~np.isnan(x)
        count += observed.sum(axis=1)
        total += np.where(observed, x, 0.0).sum(axis=1)
        low = np.minimum(low, np.where(observed, x, np.inf).min(axis=1))
        high = np.maximum(high, np.where(observed, x, -np.inf).max(axis=1))
    mean = total / count
    for values_CT in values:
        x = values_CT.astype(np.float64)
        square += np.nansum(np.square(x - mean[:, None]), axis=1)
    return {"mean": mean.tolist(), "std": np.sqrt(square / count).tolist(), "min": low.tolist(), "max": high.tolist()}


class TimeSeriesStore:
    """Read-only access to a time-series store with a per-process LRU cache of decoded chunks."""

    def __init__(self, path: str | Path, cache_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        _, self.metadata = open_store_group(self.path, TIMESERIES_FORMAT, (1, 2, TIMESERIES_FORMAT_VERSION))
        self.rebuild = rebuild(self.path, self.metadata.get("arguments", {}))
        """The command that builds this store again from its inputs, replacing it."""
        if self.metadata["format_version"] < 3:
            warn_unchecked_store(self.path, self.rebuild)
        self.sampling_rate: float = self.metadata["sampling_rate"]
        self.channel_names: list[str] = list(self.metadata["channel_names"])
        stats = self.metadata["stats"]
        self.mean = np.array(stats["mean"], dtype=np.float32)  # (C,)
        self.std = np.array(stats["std"], dtype=np.float32)  # (C,)
        self.min = np.array(stats["min"], dtype=np.float32)
        self.max = np.array(stats["max"], dtype=np.float32)
        self.series: tuple[SeriesInfo, ...] = tuple(
            SeriesInfo(index=i, **s) for i, s in enumerate(self.metadata["series"])
        )
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
            try:
                return self._group[f"series/{index}"][:, chunk * self.chunk_size : (chunk + 1) * self.chunk_size]
            except (ValueError, RuntimeError) as error:  # zarr's crc32c codec, or a chunk that does not decode
                raise damaged_store(
                    self.path, self.rebuild, f"series {self.series[index].name!r}, chunk {chunk}: {error}"
                ) from error

        return self._cache.get((index, chunk), load)

    def verify(self) -> None:
        """Read every chunk of every series and compare each with the SHA-256 recorded at the
        build; CorruptStoreError naming the first series that differs."""
        for info in self.series:
            values = np.ascontiguousarray(self.read(info.index, 0, info.length))
            if hashlib.sha256(values).hexdigest() != info.values_sha256:
                raise damaged_store(
                    self.path,
                    self.rebuild,
                    f"series {info.name!r}: its values differ from the SHA-256 recorded when the store was built",
                )

    def read(self, series: int, start: int, end: int) -> np.ndarray:
        """Values of series ``series`` in [start, end) as a new float32 array (C, end - start),
        NaN where a value is missing."""
        length = self.series[series].length
        if not 0 <= start <= end <= length:
            raise IndexError(f"[{start}, {end}) is outside series {self.series[series].name!r} of length {length}")
        cs = self.chunk_size
        out = np.empty((self.num_channels, end - start), dtype=np.float32)
        pos = start
        while pos < end:
            chunk = pos // cs
            hi = min(end, (chunk + 1) * cs)
            out[:, pos - start : hi - start] = self._chunk(series, chunk)[:, pos - chunk * cs : hi - chunk * cs]
            pos = hi
        return out
