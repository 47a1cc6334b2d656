"""The time-series commands `genoformer prepare_timeseries`, `forecast` and `evaluate_forecast`,
and the Python functions behind them.

    genoformer prepare_timeseries --inputs ecg.csv --out ecg.zarr --time_column t_seconds
    genoformer prepare_timeseries --inputs power.csv.xz --out power.zarr --time_column Date,Time --dayfirst
    genoformer prepare_timeseries --inputs monitor.csv --out monitor.zarr --time_column timestamp \
        --sampling_rate 5min --snap 150s
    genoformer forecast --checkpoint CKPT --store ecg.zarr --at 90000 --out forecast.npz
    genoformer evaluate_forecast --store ecg.zarr --checkpoint CKPT --out results.json   # and the baselines
    genoformer evaluate_forecast --store ecg.zarr --checkpoint [A.ckpt,B.ckpt] --out ensemble.json
    genoformer evaluate_forecast --store ecg.zarr --baseline ar,dlinear --out baselines.json

Shape legend: C channels, T time steps, H horizon, K quantile levels, N windows, P look-back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from genoformer.data.inputs import expand_inputs
from genoformer.data.storage import atomic_build, refuse_existing
from genoformer.data.timeseries.inputs import Aggregation
from genoformer.data.timeseries.store import (
    DuplicatePolicy,
    MissingPolicy,
    TimeSeriesStore,
    is_timeseries_file_name,
    prepare_timeseries_store,
)
from genoformer.hints import hint, option
from genoformer.kernels.dispatch import Backend
from genoformer.timeseries.baselines import (
    BASELINES,
    DEFAULT_AR_ORDERS,
    DLINEAR_LOOKBACK,
    BaselineName,
    BaselineOptions,
    fill_short_gaps,
)
from genoformer.timeseries.forecaster import Forecaster
from genoformer.timeseries.protocol import (
    PROTOCOL_HORIZONS,
    ProtocolSplit,
    check_horizons,
    evaluate_protocol,
    zscore_stats,
)


def prepare_timeseries(
    *,
    inputs: Union[str, list[str]],
    out: Path,
    sampling_rate: Optional[Union[float, str]] = None,
    time_column: Optional[Union[str, list[str]]] = None,
    columns: Optional[list[str]] = None,
    skip_rows: int = 0,
    dayfirst: bool = False,
    delimiter: Optional[str] = None,
    snap: Optional[str] = None,
    resample: Optional[Aggregation] = None,
    duplicates: DuplicatePolicy = "error",
    missing: MissingPolicy = "keep",
    npy_channels_first: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build a chunked zarr time-series store from CSV or .npy files (one series per file).

    Rows are put on a regular time grid: steps without a row are gaps, stored as missing values
    like the missing cells, and the command reports them. Times that jitter around a grid (a
    monitor's readings a few seconds off every 5 minutes, a new phase after each restart) go to
    their nearest step with --snap, or are aggregated per step with --resample. As with
    `prepare`, re-running with the same inputs and options is a no-op. docs/timeseries.md shows
    the options on a monitor's export and a weather station's.

    Args:
        inputs: Input files (.csv with a header row, also .csv.gz/.xz/.bz2, or .npy): several after
            one flag (--inputs a.csv b.csv, so a shell glob works), a folder (every such file in
            it), or a list ("[a.csv,b.csv]"); all must have the same channels.
        out: Store directory to create, conventionally ending in .zarr.
        sampling_rate: The grid's step as samples per second (360, 0.2) or as a period (5min,
            1h, 30s, 100ms); detected from time_column when not given (the median time between
            rows), required without a time column.
        time_column: CSV column with the time, in seconds or as dates and times (ISO 8601, or
            day-first with --dayfirst; 24:00 is midnight of the next day, as hours written 1-24 end
            a day); several are joined: Date,Time or year,month,day,hour. Not stored as channels.
        columns: CSV columns to store: glucose, glucose,insulin or "[glucose,insulin]" (default: every
            numeric column).
        skip_rows: Lines before the CSV's header to skip (a title, a station's name, units).
        dayfirst: A flag: dates are day first (16/12/2006).
        delimiter: CSV delimiter (default: the one of , ; tab | most frequent in the header).
        snap: Put each row on the grid step nearest its time when it lies at most this far from
            it: a period (30s, 150s; half a step snaps every row) or seconds. The grid falls on the
            clock for dates (a 5-minute step on :00, :05, ...). Needs --sampling_rate.
        resample: Aggregate the rows of each grid step, [k step, (k + 1) step): mean, median,
            min, max, first, last or sum (missing values left out; a step without a row is a
            gap). Needs --sampling_rate; the grid falls on the clock as for --snap.
        duplicates: Rows on the same time step: error, first, last or mean (of observed values).
        missing: Missing cells (empty, ?, NaN, NA, ...) and gaps: keep (stored as missing, which
            models mask and the evaluator skips), error, or fill them: ffill, zero or linear.
        npy_channels_first: A flag: .npy arrays are (channels, time) instead of (time, channels).
        overwrite: A flag: always rebuild. Without it, a complete store built from the same files
            with the same options is kept as it is, and any other existing `out` is an error.
    """
    path = prepare_timeseries_store(
        expand_inputs(inputs, is_input=is_timeseries_file_name, kind=".csv/.npy"),
        out,
        sampling_rate=sampling_rate,
        time_column=time_column,
        columns=columns,
        dayfirst=dayfirst,
        delimiter=delimiter,
        skip_rows=skip_rows,
        snap=snap,
        resample=resample,
        duplicates=duplicates,
        missing=missing,
        npy_channels_first=npy_channels_first,
        overwrite=overwrite,
    )
    store = TimeSeriesStore(path)
    print(
        f"time-series store ready: {path} ({len(store.series)} series, channels {store.channel_names}, "
        f"{store.sampling_rate:.6g} Hz)"
    )
    for line in describe_series(store):
        print(line)
    return path


def describe_series(store: TimeSeriesStore) -> list[str]:
    """One line per series: length, start, gaps, missing values, merged duplicates, jitter and
    the columns left out."""
    lines = []
    for info in store.series:
        gaps = info.gaps
        words = [f"  series {info.name!r}: {info.length} steps"]
        if info.start_time:
            words.append(f"from {info.start_time}")
        words.append(f"gaps: {gaps['count']} ({gaps['missing_steps']} steps, longest {gaps['longest']})")
        if any(info.missing):
            words.append(f"missing values per channel: {info.missing}")
        if any(info.filled):
            words.append(f"filled per channel: {info.filled}")
        if info.duplicates:
            words.append(f"rows merged as duplicates: {info.duplicates}")
        if info.jitter >= 0.01:
            words.append(f"largest jitter {info.jitter:.2f} steps")
        if info.skipped_columns:
            words.append(f"non-numeric columns left out: {info.skipped_columns}")
        lines.append(", ".join(words))
    return lines


def _open_store(store: Path) -> TimeSeriesStore:
    if not Path(store).exists():
        build = hint(
            f"prepare_timeseries_store(['FILE.csv'], {str(store)!r}, time_column='t_seconds')",
            f"genoformer prepare_timeseries --inputs FILE.csv --out {store} --time_column t_seconds",
        )
        raise FileNotFoundError(
            f"time-series store not found: {store}; build it with `{build}` (or give the "
            "sampling rate instead of a time column)."
        )
    return TimeSeriesStore(store)


def protocol_results(
    store: TimeSeriesStore,
    *,
    forecaster: Optional[Forecaster] = None,
    baseline: Optional[BaselineName] = None,
    horizons: tuple[int, ...] = PROTOCOL_HORIZONS,
    lookback: Optional[int] = None,
    train_fraction: float = 0.7,
    test_fraction: float = 0.2,
    ar_orders: tuple[int, ...] = DEFAULT_AR_ORDERS,
    dlinear_lookback: int = DLINEAR_LOOKBACK,
    batch_size: int = 256,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate a model or a baseline on every series of `store` under the protocol of
    `genoformer.timeseries.protocol`; returns {"results": [...], "protocol": {...}, ...}."""
    if (forecaster is None) == (baseline is None):
        raise ValueError("evaluate either a forecaster or a baseline: give exactly one of them.")
    raw = [store.read(info.index, 0, info.length) for info in store.series]
    splits = [ProtocolSplit.of(values.shape[1], train_fraction, test_fraction) for values in raw]
    protocol = {
        "train_fraction": train_fraction,
        "test_fraction": test_fraction,
        "horizons": list(horizons),
        "splits": [
            {"series": info.name, "length": s.length, "train_end": s.train_end, "test_start": s.test_start}
            for info, s in zip(store.series, splits)
        ],
    }
    common = dict(
        horizons=horizons,
        train_fraction=train_fraction,
        test_fraction=test_fraction,
        batch_size=batch_size,
        progress=progress,
    )
    if forecaster is not None:
        cfg = forecaster.config
        skipped = sorted(h for h in horizons if h > cfg.horizon)
        horizons = tuple(h for h in horizons if h <= cfg.horizon)
        if not horizons:
            raise ValueError(
                f"the model forecasts at most {cfg.horizon} steps, shorter than every horizon asked for "
                f"({', '.join(map(str, skipped))}); pass {option('horizons', [cfg.horizon])} or train "
                "with a longer forecast.horizon."
            )
        if skipped:
            print(f"skipped horizons {', '.join(map(str, skipped))}: the model forecasts at most {cfg.horizon} steps")
        protocol.update(horizons=list(horizons), skipped_horizons=skipped)
        common["horizons"] = horizons
        check_horizons(horizons, splits)
        lookback = cfg.context if lookback is None else lookback
        if not cfg.patch_len <= lookback <= cfg.context:
            raise ValueError(f"lookback must be in [{cfg.patch_len}, {cfg.context}] for this model, got {lookback}.")

        levels = cfg.quantiles or None

        def model_forecast(context_NCP: torch.Tensor, horizon: int) -> Any:
            point_NCH, quant_NCHK = forecaster.forecast_batch(context_NCP, horizon)
            return point_NCH if levels is None else (point_NCH, quant_NCHK)

        # windows cut and errors summed on the model's device: only the series cross to it, once
        results = evaluate_protocol(
            model_forecast, raw, lookback=lookback, quantile_levels=levels, device=forecaster.device, **common
        )
        return {
            "results": results,
            "protocol": protocol,
            "model": {
                "context": cfg.context,
                "horizon": cfg.horizon,
                "patch_len": cfg.patch_len,
                "members": len(forecaster.members),
            },
        }
    if lookback is not None:
        raise ValueError(
            f"{option('lookback', metavar='N')} applies to checkpoints; a baseline's look-back is its "
            "period or AR order."
        )
    check_horizons(horizons, splits)  # before any fitting
    zscored = []  # what the baselines are fitted on: short gaps filled, as their look-backs are
    for values, split in zip(raw, splits):
        mean_C, std_C = zscore_stats(values[:, : split.train_end])
        zscored.append(fill_short_gaps((values - mean_C[:, None]) / std_C[:, None]))
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; use {', '.join(BASELINES)}.")
    options = BaselineOptions(ar_orders=tuple(ar_orders), dlinear_lookback=dlinear_lookback)
    fitted, details = BASELINES[baseline].fit(zscored, splits, tuple(horizons), options)
    results = []
    for fitted_horizons, model in fitted:
        results += evaluate_protocol(model, raw, lookback=model.lookback, **{**common, "horizons": fitted_horizons})
    return {"results": results, "protocol": protocol, "baseline": {"name": baseline, **details}}


METHOD_LABELS = {"forecaster": "forecaster", **{name: baseline.label for name, baseline in BASELINES.items()}}
"""What the tables call each method: the model, and each baseline by its row's label."""


def comparison_table(results: list[dict[str, Any]], horizons: Sequence[int]) -> str:
    """A Markdown table of test MSE (MAE) per method (rows) and horizon (columns), the lowest
    MSE of each horizon in bold; "-" where a method has no score (a horizon beyond a model's)."""
    methods = list(dict.fromkeys(row["method"] for row in results))
    scores = {(row["method"], row["horizon"]): row for row in results}
    best = {h: min((scores[m, h]["mse"] for m in methods if (m, h) in scores), default=None) for h in horizons}
    lines = ["| method | " + " | ".join(f"horizon {h}" for h in horizons) + " |", "|---|" + "---|" * len(horizons)]
    for method in methods:
        cells = []
        for h in horizons:
            row = scores.get((method, h))
            if row is None:
                cells.append("-")
                continue
            mse = f"{row['mse']:.4f}"
            cells.append(f"{f'**{mse}**' if row['mse'] == best[h] and len(methods) > 1 else mse} ({row['mae']:.4f})")
        lines.append(f"| {METHOD_LABELS.get(method, method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def evaluate_forecast(
    *,
    store: Path,
    out: Path,
    checkpoint: Optional[Union[Path, list[Path]]] = None,
    baseline: list[BaselineName] = list(BASELINES),
    horizons: list[int] = list(PROTOCOL_HORIZONS),
    lookback: Optional[int] = None,
    train_fraction: float = 0.7,
    test_fraction: float = 0.2,
    ar_orders: list[int] = list(DEFAULT_AR_ORDERS),
    dlinear_lookback: int = DLINEAR_LOOKBACK,
    batch_size: int = 256,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Score forecasts under the long-horizon protocol (MSE and MAE on z-scored values) and write JSON.

    A checkpoint and the baselines (seasonal naive, AR and DLinear unless --baseline says
    otherwise) are scored on the same windows, printed side by side as one table (test MSE, MAE in
    parentheses, the best MSE of each horizon in bold) and written as JSON and as that table in
    Markdown (OUT with .md). Each series is split in time into train (the first
    train_fraction), validation and test (the last test_fraction); values are z-scored per
    channel with the training part's statistics; every forecast start in the test part whose
    horizon fits is scored (stride 1), its look-back reaching back into earlier parts. Missing
    target values are left out (a window with none observed is skipped); missing look-back values
    reach a model masked, and the baselines carry the last observed value forward. Baselines are
    fitted on the training part, gaps of up to 32 steps filled the same way (the AR order is
    chosen on validation, DLinear's training stops at its best validation MSE). Output:
    {"results": [{"method", "horizon", "mse", "mae", "lookback", "windows", "mse_by_step",
    "missing_targets", "windows_without_targets"}, ...], "methods": {method: what was fitted or
    loaded}, "protocol": ..., "table": ...}, where method is forecaster, seasonal_naive, ar or
    dlinear and mse_by_step the MSE of each forecast step (where in the horizon a model wins or
    loses); a model with quantiles also gets "quantile_loss" (mean pinball loss) and "wql" (mean
    weighted quantile loss).

    Args:
        store: Time-series store (from `genoformer prepare_timeseries`).
        out: JSON file to write; the table goes beside it with the suffix .md.
        checkpoint: A TimeSeriesForecaster: genoformer-forecaster, a .ckpt, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last; or a list of them, [A.ckpt,B.ckpt,...]: an
            ensemble, scored on the mean of their forecasts.
        baseline: Baselines scored beside it: seasonal_naive (last period repeated, period from
            the training autocorrelation), ar (least-squares linear autoregression, direct
            multi-horizon) and dlinear (trend and remainder, one linear layer each, Adam on the
            training MSE, best step on validation); one, several (ar,dlinear) or none ("[]").
        horizons: Forecast horizons to score; a checkpoint is scored on those it can forecast (at
            most its forecast.horizon), and the others are named as skipped.
        lookback: Samples the model sees before each forecast start; default its context.
        train_fraction: Fraction of each series for training (int(fraction * length) steps).
        test_fraction: Fraction of each series for test, at its end.
        ar_orders: AR orders to try on the validation part (those that fit in the training part).
        dlinear_lookback: DLinear's look-back (336, the paper's).
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: Replace an existing `out` and its table.
    """
    out = Path(out)
    table_path = out.with_suffix(".md")
    refuse_existing(out, overwrite)
    refuse_existing(table_path, overwrite)
    baselines = [baseline] if isinstance(baseline, str) else list(baseline)  # Python: one name, or a list
    methods = (["forecaster"] if checkpoint is not None else []) + list(dict.fromkeys(baselines))
    if not methods:
        raise ValueError(
            f"nothing to score: give {option('checkpoint', metavar='CKPT')}, "
            f"{option('baseline', list(BASELINES))} or both."
        )
    opened = _open_store(store)
    forecaster = None if checkpoint is None else load_forecaster(checkpoint, device, backend)
    common = dict(
        horizons=tuple(horizons),
        train_fraction=train_fraction,
        test_fraction=test_fraction,
        ar_orders=tuple(ar_orders),
        dlinear_lookback=dlinear_lookback,
        batch_size=batch_size,
    )
    results: list[dict[str, Any]] = []
    fitted: dict[str, Any] = {}
    protocol: Optional[dict[str, Any]] = None
    for method in methods:
        print(f"scoring {METHOD_LABELS[method]}")
        if method == "forecaster":
            payload = protocol_results(opened, forecaster=forecaster, lookback=lookback, **common)
            fitted[method] = payload["model"]
        else:
            payload = protocol_results(opened, baseline=method, **common)
            fitted[method] = {key: value for key, value in payload["baseline"].items() if key != "name"}
        protocol = protocol or payload["protocol"]
        results += [{"method": method, **row} for row in payload["results"]]
    table = comparison_table(results, sorted(set(horizons)))
    payload = {
        "results": results,
        "methods": fitted,
        "protocol": protocol,
        "table": table,
        "store": str(store),
        "checkpoint": [str(path) for path in checkpoint]
        if isinstance(checkpoint, list)
        else None
        if checkpoint is None
        else str(checkpoint),
    }
    with atomic_build(out, overwrite) as tmp:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
    heading = f"Test MSE (MAE) on z-scored values, {opened.path.name}"
    with atomic_build(table_path, overwrite) as tmp:
        tmp.write_text(f"{heading}\n\n{table}\n")
    print(f"{heading}:\n{table}")
    print(f"wrote {out} and {table_path}")
    return out


def _score(forecast_CH: np.ndarray, truth_CX: np.ndarray, std_C: np.ndarray) -> Optional[dict[str, float]]:
    """MSE and MAE of a forecast against the truth after it (its observed values), in the series'
    units and z-scored by the store's per-channel standard deviation; None without truth."""
    steps = min(forecast_CH.shape[1], truth_CX.shape[1])
    error_CX = forecast_CH[:, :steps].astype(np.float64) - truth_CX[:, :steps]
    observed = ~np.isnan(error_CX)
    if not observed.any():
        return None
    scaled_CX = error_CX / np.where(std_C > 0, std_C, 1.0)[:, None]
    return {
        "steps": steps,
        "mse": float(np.mean(error_CX[observed] ** 2)),
        "mae": float(np.mean(np.abs(error_CX[observed]))),
        "mse_zscored": float(np.mean(scaled_CX[observed] ** 2)),
        "mae_zscored": float(np.mean(np.abs(scaled_CX[observed]))),
    }


def forecast(
    *,
    checkpoint: Union[Path, list[Path]],
    store: Path,
    out: Path,
    series: str = "0",
    at: Optional[int] = None,
    horizon: Optional[int] = None,
    history: Optional[int] = None,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Forecast one series of a store with a checkpoint; write .npz and a PNG beside it.

    The model sees the `context` samples before `at` and forecasts `horizon` samples from `at`.
    Where the store holds values after `at` (the truth), the forecast is scored against them and
    the score printed: MSE and MAE in the series' units and z-scored by the store's standard
    deviation per channel. The .npz holds history, forecast, quantiles and levels (when the
    model has them), truth, at, sampling_rate, channel_names, start_time (when the store knows
    the series' dates) and the score; the PNG (same name, .png) draws history, truth, forecast and
    the widest quantile band, against dates when the store knows them, else seconds.

    Args:
        checkpoint: A TimeSeriesForecaster: genoformer-forecaster, a .ckpt, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last; or a list of them, [A.ckpt,B.ckpt,...]:
            an ensemble, which forecasts the mean of their forecasts.
        store: Time-series store (from `genoformer prepare_timeseries`).
        out: Output file, ending in .npz.
        series: Series name or index in the store.
        at: Forecast origin (sample index); default the end of the series (nothing to score).
        horizon: Samples to forecast; default the trained horizon.
        history: Samples of history to draw (default: 4 horizons); the model always sees its context.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: Replace an existing `out` and its PNG.
    """
    out = Path(out)
    png = out.with_suffix(".png")
    if out.suffix != ".npz":
        raise ValueError(f"the output must end in .npz ({option('out', metavar='FILE.npz')}), got {out}.")
    refuse_existing(out, overwrite)
    refuse_existing(png, overwrite)
    opened = _open_store(store)
    names = [info.name for info in opened.series]
    if series in names:
        index = names.index(series)
    elif series.isdigit() and int(series) < len(names):
        index = int(series)
    else:
        raise ValueError(f"no series {series!r} in {store}; its series are {names[:20]} (or give an index).")
    info = opened.series[index]
    length = info.length
    at = length if at is None else at
    if not 0 < at <= length:
        raise ValueError(
            f"the forecast origin must be in [1, {length}] for series {names[index]!r} "
            f"({option('at', metavar='T')}), got {at}."
        )
    forecaster = load_forecaster(checkpoint, device, backend)
    cfg = forecaster.config
    horizon = cfg.horizon if horizon is None else horizon
    context_CL = opened.read(index, max(0, at - cfg.context), at)
    result = forecaster.forecast(context_CL, horizon)
    truth_CX = opened.read(index, at, min(length, at + horizon))
    history = 4 * horizon if history is None else history
    arrays = {
        "history": opened.read(index, max(0, at - history), at),
        "forecast": result.point,
        "truth": truth_CX,
        "at": np.array(at),
        "sampling_rate": np.array(opened.sampling_rate),
        "channel_names": np.array(opened.channel_names, dtype=str),
    }
    if info.start_time is not None:
        arrays["start_time"] = np.array(info.start_time)
    if result.quantiles is not None:
        arrays.update(quantiles=result.quantiles, levels=np.array(result.levels))
    score = _score(result.point, truth_CX, opened.std.astype(np.float64))
    if score is not None:
        arrays.update({f"score_{key}": np.array(value) for key, value in score.items()})
    with atomic_build(out, overwrite) as tmp:
        np.savez(tmp, **arrays)
    with atomic_build(png, overwrite) as tmp:
        origin = (
            f"sample {at}"
            if info.start_time is None
            else f"{pd.Timestamp(info.start_time) + pd.Timedelta(seconds=at / opened.sampling_rate):%Y-%m-%d %H:%M} (sample {at})"
        )
        plot_forecast(arrays, tmp, title=f"{names[index]}: forecast from {origin}")
    if score is not None:
        print(
            f"score against the {score['steps']} samples after {at}: MSE {score['mse']:.4g}, MAE {score['mae']:.4g} "
            f"(z-scored: MSE {score['mse_zscored']:.4f}, MAE {score['mae_zscored']:.4f})"
        )
    else:
        test_start = ProtocolSplit.of(length).test_start
        print(
            f"nothing after sample {at} to score the forecast against; to score one, forecast from inside the "
            f"series, e.g. from the protocol's test part: {option('at', test_start)}"
        )
    print(f"wrote {out} and {png}")
    return out


def load_forecaster(checkpoint: Union[Path, list[Path]], device: Optional[str], backend: str) -> Forecaster:
    """The Forecaster of one checkpoint, or the ensemble of a list of them."""
    if isinstance(checkpoint, list):
        if not checkpoint:
            raise ValueError(f"{option('checkpoint', metavar='[A.ckpt,B.ckpt]')} got an empty list; give at least one.")
        return Forecaster.from_checkpoints(checkpoint, device=device, backend=Backend(backend))
    return Forecaster.from_checkpoint(checkpoint, device=device, backend=Backend(backend))


def plot_forecast(arrays: dict[str, Any], path: Path, *, title: str = "") -> Path:
    """Draw `forecast_figure` into a PNG (`forecast` writes it atomically)."""
    forecast_figure(arrays, title=title).savefig(path, dpi=120)
    return Path(path)


def forecast_figure(arrays: dict[str, Any], *, title: str = "") -> Figure:
    """History, truth, forecast and the widest quantile band of each channel (the arrays of
    `forecast`'s .npz), against dates when `arrays` has the series' start_time, else seconds
    from its start."""
    history_CT, forecast_CH, truth_CX = arrays["history"], arrays["forecast"], arrays["truth"]
    at, rate = int(arrays["at"]), float(arrays["sampling_rate"])
    names = [str(name) for name in arrays["channel_names"]]
    start = pd.Timestamp(str(arrays["start_time"])).tz_convert(None).to_datetime64() if "start_time" in arrays else None
    n_channels = history_CT.shape[0]
    figure = Figure(figsize=(10, 2.8 * n_channels + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(n_channels, 1, squeeze=False)[:, 0]

    def times(lo: int, n: int) -> np.ndarray:
        seconds = (lo + np.arange(n)) / rate
        return seconds if start is None else start + (seconds * 1e9).astype("timedelta64[ns]")

    for c, ax in enumerate(axes):
        ax.plot(
            times(at - history_CT.shape[1], history_CT.shape[1]), history_CT[c], color="0.3", lw=0.8, label="history"
        )
        if truth_CX.shape[1]:
            ax.plot(times(at, truth_CX.shape[1]), truth_CX[c], color="black", lw=0.8, label="truth")
        if "quantiles" in arrays:
            levels = list(arrays["levels"])
            ax.fill_between(
                times(at, forecast_CH.shape[1]),
                arrays["quantiles"][c, :, 0],
                arrays["quantiles"][c, :, -1],
                color="tab:blue",
                alpha=0.25,
                lw=0,
                label=f"{levels[0]:g} to {levels[-1]:g} quantiles",
            )
        ax.plot(times(at, forecast_CH.shape[1]), forecast_CH[c], color="tab:blue", lw=1.0, label="forecast")
        ax.axvline(times(at, 1)[0], color="tab:red", lw=0.6, ls="--")
        ax.set_ylabel(names[c])
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    axes[0].set_title(title)
    if start is None:
        axes[-1].set_xlabel("time (s)")
    else:
        axes[-1].set_xlabel("date and time")
        figure.autofmt_xdate()
    return figure
