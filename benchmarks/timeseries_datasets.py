"""Eight real time series under the long-horizon protocol: seasonal naive, AR and DLinear, and
rows for genoformer checkpoints.

    python -m benchmarks.timeseries_datasets                       # every dataset, the baselines (CPU)
    python -m benchmarks.timeseries_datasets --datasets sf_traffic electricity
    python -m benchmarks.timeseries_datasets --models runs/gpu_ts/eval   # add checkpoint rows
    python -m benchmarks.timeseries_datasets --baselines_from benchmarks/results/timeseries_datasets.json \
        --models runs/gpu_ts/eval                                      # the same, reusing the baselines' rows
    python -m benchmarks.timeseries_datasets --smoke OUT            # seconds: what the test runs

Steps, through the package's own commands:
1. `prepare_timeseries` on each dataset's file as it is shipped (dates and times, gaps, missing
   cells kept as missing; DATASETS says which columns), timed;
2. `evaluate_forecast --baseline seasonal_naive | ar | dlinear` on each store, at horizons 96,
   192, 336 and 720: MSE and MAE on values z-scored with the training part's statistics, every
   stride-1 test window, missing targets left out (genoformer.timeseries.protocol). Each result is
   a JSON file under WORK/eval/<method>/<dataset>.json, kept between runs (delete one to redo it);
3. model rows: `--models DIR` adds every DIR/<model>/<dataset>.json (the output of
   `evaluate_forecast --checkpoint ...`; `add_model_results` from Python), and the table says at
   which horizons each model beats each baseline;
4. OUT/timeseries_datasets.json, .md (one table per dataset and a summary) and .png (MSE by
   horizon, one panel per dataset).

The data: the two ECGs of ../shared/data/timeseries and six series of
../shared/data/fetch-more.sh (../shared-extra/timeseries), then four more of fetch-more.sh that no
model trains on (`Dataset.unseen`: the general forecaster's zero-shot checks, beside its held-out
dataset). A dataset whose file is absent is listed as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Optional

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table, publish, write_json_file
from genoformer.data.timeseries.store import TimeSeriesStore
from genoformer.timeseries.commands import DEFAULT_AR_ORDERS, describe_series, evaluate_forecast, prepare_timeseries

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "timeseries"
EXTRA = REPO.parent / "shared-extra" / "timeseries"
HORIZONS = (96, 192, 336, 720)
BASELINES = ("seasonal_naive", "ar", "dlinear")
LABELS = {"seasonal_naive": "seasonal naive", "ar": "AR", "dlinear": "DLinear"}


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One benchmark series: its file (under `root`), the `prepare_timeseries` options and a line
    saying what it is."""

    file: str
    root: str  # "shared" or "extra"
    about: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    unseen: bool = False
    """No model is trained on it (benchmarks/gpu_timeseries.sh): the general forecaster's zero-shot checks."""


DATASETS: dict[str, Dataset] = {
    "ecg_mitbih208": Dataset("ecg_mitbih208_360hz.csv", "shared", "ECG, MIT-BIH record 208, 360 Hz, 1 channel",
                             {"time_column": "t_seconds"}),
    "ecg_biosignalsplux": Dataset("ecg_biosignalsplux_1000hz.csv.gz", "shared", "ECG, biosignalsplux, 1 kHz, 1 channel",
                                  {"time_column": "t_seconds"}),
    "household_power": Dataset("minute_household_power.csv.xz", "extra",
                               "UCI household power, 1 minute, 7 channels, 1.25% missing",
                               {"time_column": ["Date", "Time"], "dayfirst": True}),
    "bike_sharing": Dataset("hourly_bikesharing.csv", "extra", "bike rentals per hour",
                            {"time_column": "ts", "columns": ["count"]}),
    "traffic_volume": Dataset("hourly_traffic_volume.csv", "extra",
                              "Minneapolis I-94 traffic volume per hour; 7,629 repeated hours (first kept), 23% missing",
                              {"time_column": "date_time", "columns": ["traffic_volume"], "duplicates": "first"}),
    "beijing_pm25": Dataset("hourly_beijing_pm.csv", "extra", "Beijing PM2.5 per hour, 4.7% missing",
                            {"time_column": ["year", "month", "day", "hour"], "columns": ["pm2.5"]}),
    "electricity": Dataset("hourly_electricity.csv", "extra", "electricity load per hour", {"time_column": "ts"}),
    "sf_traffic": Dataset("hourly_sf_traffic.csv", "extra", "San Francisco freeway occupancy per hour",
                          {"time_column": "ts"}),
    # never trained on by any model here: the general forecaster's zero-shot checks beside sf_traffic
    "solar_power": Dataset("hourly_solarpower.csv", "extra", "solar power per hour (zero-shot only)",
                           {"time_column": "ts"}, unseen=True),
    "wind_power": Dataset("hourly_windpower.csv", "extra", "wind power per hour (zero-shot only)",
                          {"time_column": "ts"}, unseen=True),
    "energy_appliance": Dataset("minute_energy_appliance.csv.xz", "extra",
                                "household appliances' energy every 10 minutes (zero-shot only)",
                                {"time_column": "date", "columns": ["Appliances"]}, unseen=True),
    "yosemite_temps": Dataset("minute_yosemite_temps.csv.xz", "extra", "Yosemite air temperature every 5 minutes (zero-shot only)",
                              {"time_column": "ds"}, unseen=True),
}
"""The eight protocol datasets, then series no model is trained on (`unseen`)."""


def dataset_path(dataset: Dataset, shared: Path, extra: Path) -> Path:
    return (shared if dataset.root == "shared" else extra) / dataset.file


def prepare(name: str, dataset: Dataset, source: Path, stores: Path) -> dict[str, Any]:
    """Build (or keep) the store of one dataset; returns where it is, how long the build took,
    and what the reader found."""
    store = stores / f"{name}.zarr"
    started = time.perf_counter()
    prepare_timeseries(inputs=[str(source)], out=store, **dataset.options)
    seconds = time.perf_counter() - started
    opened = TimeSeriesStore(store)
    info = opened.series[0]
    return {"store": str(store), "prepare_seconds": round(seconds, 2), "length": info.length,
            "sampling_rate": opened.sampling_rate, "channels": opened.channel_names, "missing": info.missing,
            "gaps": info.gaps, "duplicates": info.duplicates, "start_time": info.start_time,
            "summary": describe_series(opened)}


def evaluate(method: str, store: Path, out: Path, horizons: tuple[int, ...], ar_orders: tuple[int, ...]) -> dict:
    """One baseline's `evaluate_forecast` result (computed once: an existing `out` is read)."""
    if not out.exists():
        started = time.perf_counter()
        evaluate_forecast(store=store, out=out, baseline=method, horizons=list(horizons), ar_orders=list(ar_orders))
        payload = json.loads(out.read_text())
        payload["seconds"] = round(time.perf_counter() - started, 1)
        write_json_file(out, payload)
    return json.loads(out.read_text())


def add_model_results(summary: dict, model: str, dataset: str, payload: dict) -> None:
    """Add the rows of one `evaluate_forecast --checkpoint` result (`payload`, its JSON) for
    `dataset` under the name `model`."""
    entry = summary["datasets"].setdefault(dataset, {"methods": {}})
    entry["methods"][model] = _rows(payload, "forecaster")


def _rows(payload: dict, method: str) -> dict[str, dict]:
    """The rows of one method (forecaster, or a baseline's name) of an evaluate_forecast result."""
    return {str(row["horizon"]): {"mse": row["mse"], "mae": row["mae"], "windows": row["windows"],
                                  "lookback": row["lookback"], **({"wql": row["wql"]} if "wql" in row else {})}
            for row in payload["results"] if row.get("method", method) == method}


def wins(summary: dict) -> list[dict]:
    """Per model (a method that is not a baseline) and baseline: on how many datasets the model
    has the lower MSE at every horizon both have."""
    rows = []
    models = sorted({m for entry in summary["datasets"].values() for m in entry.get("methods", {})} - set(BASELINES))
    for model in models:
        row: dict[str, Any] = {"model": model}
        for baseline in BASELINES:
            beaten, compared = 0, 0
            for entry in summary["datasets"].values():
                mine, theirs = entry.get("methods", {}).get(model), entry.get("methods", {}).get(baseline)
                if not mine or not theirs:
                    continue
                common = sorted(set(mine) & set(theirs), key=int)
                if not common:
                    continue
                compared += 1
                beaten += all(mine[h]["mse"] < theirs[h]["mse"] for h in common)
            row[f"beats {LABELS[baseline]} at every horizon"] = f"{beaten} of {compared}"
        rows.append(row)
    return rows


def zero_shot(summary: dict) -> list[dict]:
    """The general forecaster (`summary["zero_shot"]["model"]`) on the series it never trained on (its held-out
    dataset and the unseen ones): does it beat seasonal naive at every horizon, and is it within 10 % of AR
    (MSE at most 1.1 x AR's) at every horizon -- the issue's two zero-shot targets."""
    spec = summary.get("zero_shot")
    if not spec:
        return []
    rows = []
    for name in spec["datasets"]:
        methods = summary["datasets"].get(name, {}).get("methods", {})
        mine, naive, ar = methods.get(spec["model"]), methods.get("seasonal_naive"), methods.get("ar")
        if not mine or not naive or not ar:
            continue
        common = sorted(set(mine) & set(naive) & set(ar), key=int)
        rows.append({"series (zero-shot)": name,
                     "MSE / seasonal naive": " / ".join(f"{mine[h]['mse'] / naive[h]['mse']:.2f}" for h in common),
                     "beats seasonal naive at every horizon": "yes" if all(mine[h]["mse"] < naive[h]["mse"] for h in common) else "no",
                     "MSE / AR": " / ".join(f"{mine[h]['mse'] / ar[h]['mse']:.2f}" for h in common),
                     "within 10 % of AR at every horizon": "yes" if all(mine[h]["mse"] <= 1.1 * ar[h]["mse"] for h in common) else "no"})
    return rows


def render(summary: dict) -> str:
    """The markdown: one table per dataset (MSE and MAE per method and horizon), then the wins."""
    parts = [environment_markdown(summary["environment"], summary["command"]), ""]
    if "baselines_measured" in summary:
        measured = summary["baselines_measured"]
        parts += [f"Baseline rows reused from an earlier run (`{measured['command']}`, "
                  f"{measured['environment'].get('date_utc', '')} on {measured['environment'].get('device', '')}).", ""]
    parts.append("Long-horizon protocol (70/10/20 chronological split, z-scored with the training part's statistics, "
                 "every stride-1 test window, missing targets left out): MSE / MAE, and for quantile models the "
                 "mean weighted quantile loss (wQL). DLinear: look-back 336, Adam on the full-batch training MSE, "
                 "best step on validation.")
    overview = []
    for name, entry in summary["datasets"].items():
        if "skipped" in entry:
            overview.append({"dataset": name, "what": entry["skipped"]})
            continue
        data = entry.get("data", {})
        overview.append({"dataset": name, "what": DATASETS[name].about if name in DATASETS else "",
                         "steps": data.get("length"), "channels": len(data.get("channels", [])),
                         "prepare (s)": data.get("prepare_seconds")})
    parts += ["", markdown_table(overview)]
    for name, entry in summary["datasets"].items():
        methods = entry.get("methods", {})
        if not methods:
            continue
        order = [m for m in BASELINES if m in methods] + sorted(m for m in methods if m not in BASELINES)
        table = []
        for h in summary["horizons"]:
            row: dict[str, Any] = {"horizon": h}
            for method in order:
                result = methods[method].get(str(h))
                cell = "" if result is None else f"{result['mse']:.3f} / {result['mae']:.3f}"
                if result is not None and "wql" in result:
                    cell += f" (wQL {result['wql']:.3f})"
                row[LABELS.get(method, method)] = cell
            table.append(row)
        extra = entry.get("notes", "")
        parts += ["", f"**{name}**{': ' + extra if extra else ''}", "", markdown_table(table)]
    if wins(summary):
        parts += ["", markdown_table(wins(summary))]
    if zero_shot(summary):
        spec = summary["zero_shot"]
        parts += ["", f"`{spec['model']}` zero-shot (never trained on these series; ratios at horizons "
                  f"{', '.join(map(str, summary['horizons']))}):", "", markdown_table(zero_shot(summary))]
    return "\n".join(parts)


def plot(summary: dict, path: Path) -> None:
    """MSE by horizon, one panel per dataset, one line per method."""
    names = [n for n, e in summary["datasets"].items() if e.get("methods")]
    if not names:
        return
    columns = min(4, len(names))
    rows = -(-len(names) // columns)
    figure = Figure(figsize=(3.6 * columns, 2.9 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    # one colour per method in every panel (the unseen series have no per-dataset model)
    methods = list(dict.fromkeys(m for n in names for m in summary["datasets"][n]["methods"]))
    colours = {method: f"C{index}" for index, method in enumerate(methods)}
    for ax, name in zip(axes, names):
        for method, results in summary["datasets"][name]["methods"].items():
            hs = sorted(int(h) for h in results)
            ax.plot(hs, [results[str(h)]["mse"] for h in hs], marker="o", ms=3, color=colours[method],
                    label=LABELS.get(method, method))
        ax.set_title(name, fontsize=9)
        ax.set_xticks(list(summary["horizons"]))
        ax.grid(alpha=0.3)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    axes[0].set_ylabel("test MSE (z-scored)")
    axes[0].legend(fontsize=7)
    figure.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=REPO / "benchmarks" / "results",
                        help="where timeseries_datasets.json/.md/.png go (default benchmarks/results)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "timeseries_datasets",
                        help="stores and per-method results (kept between runs)")
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=BASELINES, default=list(BASELINES))
    parser.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS))
    parser.add_argument("--ar_orders", nargs="+", type=int, default=list(DEFAULT_AR_ORDERS))
    parser.add_argument("--models", type=Path, nargs="*", default=[],
                        help="folders holding MODEL/DATASET.json results of evaluate_forecast --checkpoint")
    parser.add_argument("--baselines_from", type=Path, default=None,
                        help="an earlier run's timeseries_datasets.json: its baseline rows are reused for the datasets it has "
                             "(the baselines take about half an hour on two cores; their results do not change)")
    parser.add_argument("--zero_shot_model", default="general",
                        help="the --models folder of the forecaster trained across datasets (benchmarks/gpu_timeseries.sh)")
    parser.add_argument("--held_out", nargs="*", default=["sf_traffic"],
                        help="the datasets left out of that forecaster's training (its zero-shot checks, with the unseen ones)")
    parser.add_argument("--shared", type=Path, default=SHARED, help="folder of the two ECG files")
    parser.add_argument("--extra", type=Path, default=EXTRA, help="folder of the fetch-more.sh time series")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: the MIT-BIH ECG only, horizon 96, AR orders 8 and 32")
    args = parser.parse_args(argv)
    if args.smoke:
        args.datasets, args.horizons, args.ar_orders = ["ecg_mitbih208"], [96], [8, 32]
    horizons = tuple(sorted(args.horizons))
    summary: dict[str, Any] = {"environment": describe_environment("cpu"), "command": command_line(),
                               "horizons": list(horizons), "datasets": {}}
    earlier = {}
    if args.baselines_from:
        previous = json.loads(args.baselines_from.read_text())
        earlier = previous["datasets"]
        # where the reused rows were measured (kept through any number of reuses)
        summary["baselines_measured"] = previous.get("baselines_measured") or {
            "command": previous["command"], "environment": previous["environment"]}
    for name in args.datasets:
        dataset = DATASETS[name]
        source = dataset_path(dataset, args.shared, args.extra)
        if not source.exists():
            summary["datasets"][name] = {"skipped": f"{source} not found (bash ../shared/data/fetch-more.sh fetches it)"}
            print(f"{name}: skipped, {source} not found")
            continue
        if name in earlier and all(m in earlier[name].get("methods", {}) for m in args.methods):
            summary["datasets"][name] = {key: earlier[name][key] for key in ("data", "methods", "baselines")}
            summary["datasets"][name]["methods"] = {m: earlier[name]["methods"][m] for m in args.methods}
            print(f"{name}: baselines from {args.baselines_from}")
            continue
        data = prepare(name, dataset, source, args.work / "stores")
        entry = summary["datasets"][name] = {"data": data, "methods": {}, "baselines": {}}
        for method in args.methods:
            payload = evaluate(method, Path(data["store"]), args.work / "eval" / method / f"{name}.json", horizons,
                               tuple(args.ar_orders))
            entry["methods"][method] = _rows(payload, method)
            entry["baselines"][method] = {"seconds": payload.get("seconds"), **payload["methods"][method]}
            print(f"{name} {method}: " + ", ".join(f"{h} {r['mse']:.3f}" for h, r in entry["methods"][method].items()))
    for folder in args.models:
        for model_dir in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
            for result in sorted(model_dir.glob("*.json")):
                if result.stem in summary["datasets"]:
                    add_model_results(summary, model_dir.name, result.stem, json.loads(result.read_text()))
    if args.models:
        summary["zero_shot"] = {"model": args.zero_shot_model,
                                "datasets": [*args.held_out, *(n for n in args.datasets if DATASETS[n].unseen)]}
    args.out.mkdir(parents=True, exist_ok=True)
    plot(summary, args.out / "timeseries_datasets.png")
    publish(args.out, "timeseries_datasets", summary, render(summary))
    return summary


if __name__ == "__main__":
    main()
