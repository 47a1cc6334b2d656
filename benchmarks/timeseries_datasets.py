"""Eight real time series under the long-horizon protocol: seasonal naive, AR and DLinear, and rows
for genoformer checkpoints.

1. `prepare_timeseries` on each dataset's file as shipped (dates and times, gaps, missing cells
   kept as missing; DATASETS says which columns);
2. `evaluate_forecast --baseline seasonal_naive | ar | dlinear` on each store at horizons 96 to
   720: MSE and MAE on values z-scored with the training part's statistics, every stride-1 test
   window, missing targets left out (genoformer.timeseries.protocol); each result is kept under
   WORK/eval/<method>/<dataset>.json between runs (delete one to redo it);
3. `--models DIR` adds every DIR/<model>/<dataset>.json (`evaluate_forecast --checkpoint` outputs,
   e.g. of benchmarks/gpu_timeseries.sh) as rows, and says at which horizons each model beats each
   baseline; the forecaster trained across datasets is judged zero-shot on its held-out dataset
   and on four series no model trains on (`Dataset.unseen`).
The data: the two ECGs of ../shared/data/timeseries and ten series of ../shared/data/fetch-more.sh
(../shared-extra/timeseries); a dataset whose file is absent is listed as skipped.

    python -m benchmarks.timeseries_datasets --out OUT                     # the baselines, ~30 min on 2 cores
    python -m benchmarks.timeseries_datasets --out OUT --methods --models runs/gpu_timeseries/eval   # model rows
    python -m benchmarks.timeseries_datasets --out benchmarks/results --from BASELINES.json MODELS.json
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from genoformer.data.timeseries.store import TimeSeriesStore

from benchmarks.common import Benchmark, Summary, at_least, join, table, verdict, write_json_file
from genoformer.timeseries.baselines import BASELINES, DEFAULT_AR_ORDERS
from genoformer.timeseries.commands import describe_series, evaluate_forecast, prepare_timeseries

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "timeseries"
EXTRA = REPO.parent / "shared-extra" / "timeseries"
HORIZONS = (96, 192, 336, 720)
LABELS = {name: baseline.label for name, baseline in BASELINES.items()}


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
    "ecg_mitbih208": Dataset(
        "ecg_mitbih208_360hz.csv", "shared", "ECG, MIT-BIH record 208, 360 Hz, 1 channel", {"time_column": "t_seconds"}
    ),
    "ecg_biosignalsplux": Dataset(
        "ecg_biosignalsplux_1000hz.csv.gz",
        "shared",
        "ECG, biosignalsplux, 1 kHz, 1 channel",
        {"time_column": "t_seconds"},
    ),
    "household_power": Dataset(
        "minute_household_power.csv.xz",
        "extra",
        "UCI household power, 1 minute, 7 channels, 1.25% missing",
        {"time_column": ["Date", "Time"], "dayfirst": True},
    ),
    "bike_sharing": Dataset(
        "hourly_bikesharing.csv", "extra", "bike rentals per hour", {"time_column": "ts", "columns": ["count"]}
    ),
    "traffic_volume": Dataset(
        "hourly_traffic_volume.csv",
        "extra",
        "Minneapolis I-94 traffic volume per hour; 7,629 repeated hours (first kept), 23% missing",
        {"time_column": "date_time", "columns": ["traffic_volume"], "duplicates": "first"},
    ),
    "beijing_pm25": Dataset(
        "hourly_beijing_pm.csv",
        "extra",
        "Beijing PM2.5 per hour, 4.7% missing",
        {"time_column": ["year", "month", "day", "hour"], "columns": ["pm2.5"]},
    ),
    "electricity": Dataset("hourly_electricity.csv", "extra", "electricity load per hour", {"time_column": "ts"}),
    "sf_traffic": Dataset(
        "hourly_sf_traffic.csv", "extra", "San Francisco freeway occupancy per hour", {"time_column": "ts"}
    ),
    # never trained on by any model here: the general forecaster's zero-shot checks beside sf_traffic
    "solar_power": Dataset(
        "hourly_solarpower.csv", "extra", "solar power per hour (zero-shot only)", {"time_column": "ts"}, unseen=True
    ),
    "wind_power": Dataset(
        "hourly_windpower.csv", "extra", "wind power per hour (zero-shot only)", {"time_column": "ts"}, unseen=True
    ),
    "energy_appliance": Dataset(
        "minute_energy_appliance.csv.xz",
        "extra",
        "household appliances' energy every 10 minutes (zero-shot only)",
        {"time_column": "date", "columns": ["Appliances"]},
        unseen=True,
    ),
    "yosemite_temps": Dataset(
        "minute_yosemite_temps.csv.xz",
        "extra",
        "Yosemite air temperature every 5 minutes (zero-shot only)",
        {"time_column": "ds"},
        unseen=True,
    ),
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
    return {
        "store": str(store),
        "prepare_seconds": round(seconds, 2),
        "length": info.length,
        "sampling_rate": opened.sampling_rate,
        "channels": opened.channel_names,
        "missing": info.missing,
        "gaps": info.gaps,
        "duplicates": info.duplicates,
        "start_time": info.start_time,
        "summary": describe_series(opened),
    }


def evaluate(method: str, store: Path, out: Path, horizons: tuple[int, ...], ar_orders: tuple[int, ...]) -> dict:
    """One baseline's `evaluate_forecast` result (computed once: an existing `out` is read)."""
    if not out.exists():
        started = time.perf_counter()
        evaluate_forecast(store=store, out=out, baseline=[method], horizons=list(horizons), ar_orders=list(ar_orders))
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
    return {
        str(row["horizon"]): {
            "mse": row["mse"],
            "mae": row["mae"],
            "windows": row["windows"],
            "lookback": row["lookback"],
            **({"wql": row["wql"]} if "wql" in row else {}),
        }
        for row in payload["results"]
        if row["method"] == method
    }


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
        rows.append(
            {
                "series (zero-shot)": name,
                "MSE / seasonal naive": " / ".join(f"{mine[h]['mse'] / naive[h]['mse']:.2f}" for h in common),
                "beats seasonal naive at every horizon": "yes"
                if all(mine[h]["mse"] < naive[h]["mse"] for h in common)
                else "no",
                "MSE / AR": " / ".join(f"{mine[h]['mse'] / ar[h]['mse']:.2f}" for h in common),
                "within 10 % of AR at every horizon": "yes"
                if all(mine[h]["mse"] <= 1.1 * ar[h]["mse"] for h in common)
                else "no",
            }
        )
    return rows


def arguments(parser) -> None:
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO / "runs" / "timeseries_datasets",
        help="stores and per-method results (kept between runs)",
    )
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument(
        "--methods",
        nargs="*",
        choices=list(BASELINES),
        default=list(BASELINES),
        help="baselines to evaluate (none: only --models rows)",
    )
    parser.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS))
    parser.add_argument("--ar_orders", nargs="+", type=int, default=list(DEFAULT_AR_ORDERS))
    parser.add_argument(
        "--models",
        type=Path,
        nargs="*",
        default=[],
        help="folders holding MODEL/DATASET.json results of evaluate_forecast --checkpoint",
    )
    parser.add_argument(
        "--zero_shot_model",
        default="general",
        help="the --models folder of the forecaster trained across datasets (benchmarks/gpu_timeseries.sh)",
    )
    parser.add_argument("--held_out", nargs="*", default=["sf_traffic"], help="the datasets left out of its training")
    parser.add_argument("--shared", type=Path, default=SHARED, help="folder of the two ECG files")
    parser.add_argument("--extra", type=Path, default=EXTRA, help="folder of the fetch-more.sh time series")


def measure(args) -> dict:
    if args.smoke:
        args.datasets, args.horizons, args.ar_orders = ["ecg_mitbih208"], [96], [8, 32]
        args.methods = [m for m in args.methods if m != "dlinear"]  # DLinear trains: seconds become a minute
        args.shared, args.work = REPO / "examples", args.out / "work"
    summary: dict[str, Any] = {"horizons": sorted(args.horizons), "datasets": {}}
    for name in args.datasets:
        dataset = DATASETS[name]
        source = (REPO / "examples" / dataset.file) if args.smoke else dataset_path(dataset, args.shared, args.extra)
        if not source.exists():
            summary["datasets"][name] = {
                "skipped": f"{source} not found (bash ../shared/data/fetch-more.sh fetches it)"
            }
            continue
        if args.methods:
            data = prepare(name, dataset, source, args.work / "stores")
            entry = summary["datasets"][name] = {"data": {k: v for k, v in data.items() if k != "store"}, "methods": {}}
            for method in args.methods:
                payload = evaluate(
                    method,
                    Path(data["store"]),
                    args.work / "eval" / method / f"{name}.json",
                    tuple(summary["horizons"]),
                    tuple(args.ar_orders),
                )
                entry["methods"][method] = _rows(payload, method)
    for folder in args.models:
        for model_dir in sorted(p for p in Path(folder).iterdir() if p.is_dir()):
            for result in sorted(model_dir.glob("*.json")):
                if result.stem in DATASETS:
                    add_model_results(summary, model_dir.name, result.stem, json.loads(result.read_text()))
    if args.models:
        summary["zero_shot"] = {
            "model": args.zero_shot_model,
            "datasets": [*args.held_out, *(n for n in args.datasets if DATASETS[n].unseen)],
        }
    return summary


def summarize(data: dict) -> Summary:
    tables = (
        [table(wins(data), "Datasets on which each model has the lower MSE at every horizon")] if wins(data) else []
    )
    if zero_shot(data):
        tables.append(
            table(
                [{k: v for k, v in r.items() if "every horizon" not in k} for r in zero_shot(data)],
                f"`{data['zero_shot']['model']}` zero-shot (never trained on these series; MSE ratios at "
                f"horizons {', '.join(map(str, data['horizons']))})",
            )
        )
    for name, entry in data["datasets"].items():
        methods = entry.get("methods", {})
        order = [m for m in BASELINES if m in methods] + sorted(m for m in methods if m not in BASELINES)
        rows = [
            {
                "horizon": h,
                **{
                    LABELS.get(m, m): " / ".join(
                        f"{methods[m][str(h)][k]:.3f}" for k in ("mse", "mae") if str(h) in methods[m]
                    )
                    for m in order
                },
            }
            for h in data["horizons"]
        ]
        if methods:
            tables.append(table(rows, f"{name}: MSE / MAE", headline=False))
    targets = []
    counts = {row["model"]: row for row in wins(data)}
    if "dataset_model" in counts:
        row = counts["dataset_model"]
        both = sum(
            all(_beats(entry["methods"], "dataset_model", b) for b in ("seasonal_naive", "ar"))
            for entry in data["datasets"].values()
            if "dataset_model" in entry.get("methods", {})
        )
        targets += [
            at_least(
                "per-dataset models beat seasonal naive and AR at every horizon on >= 6 of 8 datasets", both, 6, " of 8"
            ),
            at_least(
                "per-dataset models beat DLinear at every horizon on >= 4 of 8 datasets",
                int(row["beats DLinear at every horizon"].split()[0]),
                4,
                " of 8",
            ),
        ]
    shots = zero_shot(data)
    both = [
        r["series (zero-shot)"]
        for r in shots
        if r["beats seasonal naive at every horizon"] == "yes" and r["within 10 % of AR at every horizon"] == "yes"
    ]
    if shots:
        targets.append(
            verdict(
                "zero-shot: beats seasonal naive and within 10 % of AR at every horizon, every series",
                f"{len(both)} of {len(shots)} ({', '.join(both) or 'none'})",
                len(both) == len(shots),
            )
        )
    skipped = [f"{name}: {entry['skipped']}" for name, entry in data["datasets"].items() if "skipped" in entry]
    return Summary(tables=tables, targets=targets, notes=skipped)


def _beats(methods: dict, model: str, baseline: str) -> bool:
    mine, theirs = methods.get(model, {}), methods.get(baseline, {})
    common = set(mine) & set(theirs)
    return bool(common) and all(mine[h]["mse"] < theirs[h]["mse"] for h in common)


BENCHMARK = Benchmark(
    "timeseries_datasets",
    "Time series: eight datasets and four unseen series",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=join,
    baseline="seasonal naive, least-squares AR and DLinear under the same protocol",
)

if __name__ == "__main__":
    BENCHMARK.main()
