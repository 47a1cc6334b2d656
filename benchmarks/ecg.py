"""ECG forecasting: does a transformer with an 8,192-sample look-back, trained for a few minutes on
one GPU, beat the classical baselines under the long-horizon protocol, and does the long look-back
help?

    python -m benchmarks.ecg OUT [--minutes 4] [--seeds 3]   # the GPUs of one machine, about 8 minutes in all
    python -m benchmarks.ecg OUT --seeds 12 --ensemble 6     # two ensembles of 6, each trained on one GPU
    python -m benchmarks.ecg OUT --smoke             # seconds on a CPU (what the test runs)
    python -m benchmarks.ecg OUT --steps_from transformer=model.json AR=ar.json   # error by step only

Steps, all through the real commands (`cli.py ...`):
1. `prepare_timeseries` on the MIT-BIH record 208 excerpt shipped in examples/ (108,000 samples at
   360 Hz); the baselines start right away on the CPU (`evaluate_forecast --baseline
   seasonal_naive` and `--baseline ar`) while the GPUs train;
2. a few timed training steps of every variant of `configs/ecg_8k_gpu.yaml` (VARIANTS: the config
   itself, trained decoder-style with its least-squares linear path, the same without that path,
   the model of the CPU config, the former forecast-token objective, patches of 64 and two
   regularisations; `--variants` picks some) to size each
   run: max_steps (and with it the cosine schedule) is set so that training fills `--minutes` with
   the variants sharing the GPUs, but never past the config's max_steps;
3. `fit` of every variant at once, with `--seeds` seeds each (default 1), spread over the GPUs
   (checkpoint with the best validation MSE kept); the variant with the lowest validation MSE,
   averaged over its seeds, is chosen (the test part is never looked at);
4. `evaluate_forecast` of the chosen variant's checkpoints (one per seed) with look-backs 8,192
   (the protocol result), 2,048 and 512, at horizons 96, 192, 336 and 720 (stride-1 test windows:
   about 21,000 per horizon); the test MSE is the mean over the seeds, their range beside it.
   With `--ensemble K`, consecutive groups of K seeds (each group trained on one GPU) are also
   evaluated as ensembles (`evaluate_forecast --checkpoint [A,B,...]`: the mean of their
   forecasts); the ensembles are then the model of the tables and plots;
5. `forecast` from a point of the test part (PNG), the look-back curve, the error by forecast
   step of the model and the baselines at the longest horizon (PNG and a table by part of the
   horizon), results.json and results.md (tables), and a short table printed last.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from benchmarks.common import (
    TrainStep,
    command_line,
    describe_environment,
    environment_markdown,
    last_logged_step,
    markdown_table,
    time_calls,
    write_atomically,
    write_json_file,
)

ECG_CSV = Path("examples/ecg_mitbih208_360hz.csv")
CONFIG = Path("configs/ecg_8k_gpu.yaml")
HORIZONS = (96, 192, 336, 720)
LOOKBACKS = (512, 2048, 8192)
# the former objective: forecast tokens after a bidirectional context, one forecast per window,
# whole-window statistics (docs/design/timeseries.md)
FORECAST_TOKENS = ["--model.init_args.forecast.every_token", "false", "--model.init_args.forecast.stats_fraction", "1.0",
                   "--model.init_args.transformer.causal", "false", "--model.init_args.transformer.max_seq_len", "640"]
# name -> overrides of configs/ecg_8k_gpu.yaml; the first is the config as shipped (decoder-style,
# with a linear path), then the transformer alone, the CPU config's model, the former objective,
# patches of 64 (as configs/ecg_8k_cpu.yaml) and two regularisations;
# the smoke run trains the first two; --variants picks others
VARIANTS: dict[str, list[str]] = {
    "config": [],
    # the config without its least-squares linear path: the transformer alone
    "no-linear": ["--model.init_args.forecast.linear_order", "0"],
    # the model of configs/ecg_8k_cpu.yaml (patches of 64, width 64, 2 layers, point forecasts,
    # 1,000 steps) with its linear path, trained here on a GPU
    "small": ["--model.init_args.forecast.patch_len", "64", "--model.init_args.forecast.quantiles", "[]",
              "--model.init_args.transformer.d_model", "64", "--model.init_args.transformer.n_layers", "2",
              "--model.init_args.transformer.max_seq_len", "128", "--model.init_args.transformer.dropout", "0.0",
              "--model.init_args.learning_rate", "2.0e-3", "--model.init_args.warmup_steps", "30",
              "--data.init_args.batch_size", "64", "--trainer.max_steps", "1000"],
    "forecast-tokens": FORECAST_TOKENS,
    "patch-64": ["--model.init_args.forecast.patch_len", "64"],
    # validation MSE is best near step 700 of 2,000: a schedule that ends sooner, or more dropout
    "steps-1000": ["--trainer.max_steps", "1000"],
    "dropout-0.3": ["--model.init_args.transformer.dropout", "0.3"],
}


def cli(*args: str, log: Path) -> None:
    """Run `python cli.py ARGS` from the repository root; its output goes to `log`."""
    with open(log, "w") as handle:
        subprocess.run([sys.executable, "cli.py", *args], check=True, stdout=handle, stderr=subprocess.STDOUT)


def start_cli(*args: str, log: Path, threads: int, gpu: int | None = None) -> tuple[subprocess.Popen, object]:
    """Start `python cli.py ARGS` in the background with at most `threads` BLAS/OpenMP threads (so
    that it leaves CPU cores to the training's data loaders), on GPU `gpu` alone when given."""
    handle = open(log, "w")
    env = {**os.environ, **{name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return subprocess.Popen([sys.executable, "cli.py", *args], stdout=handle, stderr=subprocess.STDOUT, env=env), handle


def wait_all(running: list[tuple[subprocess.Popen, object]], what: str) -> None:
    """Wait for every process; SystemExit naming the log of the first that failed."""
    failed = []
    for process, handle in running:
        if process.wait() != 0:
            failed.append(handle.name)
        handle.close()
    if failed:
        raise SystemExit(f"{what} failed; see {', '.join(failed)}")


def best_validation_mse(metrics_csv: Path) -> float:
    """The lowest val/mse logged in a run's metrics.csv (inf when none was)."""
    values = [float(row["val/mse"]) for row in csv.DictReader(open(metrics_csv)) if row.get("val/mse")]
    return min(values, default=math.inf)


def measure_step_seconds(overrides: list[str], steps: int) -> float:
    """Seconds per optimizer step of the configured model on its own batches (after 3 warm-up
    steps), measured in this process with the precision of the config."""
    import torch

    from genoformer.training_cli import training_cli

    built = training_cli(["--config", str(CONFIG), *overrides], run=False)
    module, data = built.model, built.datamodule
    data.prepare_data()
    data.setup("fit")
    device = built.trainer.strategy.root_device
    module.to(device).train()
    batches = iter(data.train_dataloader())

    def loss() -> torch.Tensor:
        batch = next(batches)
        return module.losses(batch["context"].to(device), batch["target"].to(device))["loss"]

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    train_step = TrainStep(loss, torch.optim.AdamW(module.parameters(), lr=1e-4), device, dtype)
    seconds = sum(time_calls(train_step.step, device, warmup=3, calls=steps)) / steps / 1e3
    module = train_step = built = None  # freed before the cache is emptied (the closure above reads module)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seconds


def mean_over_seeds(runs: list[list[dict]]) -> list[dict]:
    """One evaluation's rows (one per horizon) from several seeds' rows: MSE and MAE averaged, each
    seed's MSE kept in `mse_seeds`."""
    rows = []
    for per_horizon in zip(*runs):
        row = dict(per_horizon[0])
        row["mse"] = sum(r["mse"] for r in per_horizon) / len(per_horizon)
        row["mae"] = sum(r["mae"] for r in per_horizon) / len(per_horizon)
        row["mse_seeds"] = [r["mse"] for r in per_horizon]
        row["mse_by_step"] = [sum(step) / len(per_horizon) for step in zip(*(r["mse_by_step"] for r in per_horizon))]
        rows.append(row)
    return rows


STEP_PARTS = ((1, 96), (97, 192), (193, 336), (337, 720))
"""Parts of the longest horizon in which the error by step is averaged (steps, 1-based, inclusive)."""


def error_by_step_rows(curves: dict[str, list[float]]) -> list[dict]:
    """Mean MSE of each forecaster over each part of the horizon (STEP_PARTS, cut to its length)."""
    horizon = min(len(curve) for curve in curves.values())
    rows = []
    for first, last in STEP_PARTS:
        if first > horizon:
            break
        last = min(last, horizon)
        rows.append({"forecast steps": f"{first}-{last}",
                     **{name: sum(curve[first - 1:last]) / (last - first + 1) for name, curve in curves.items()}})
    return rows


def steps_from(specs: list[str]) -> dict[str, list[float]]:
    """{name: mse_by_step of the longest horizon} from NAME=FILE specs of `evaluate_forecast` JSON."""
    curves = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--steps_from {spec!r}: expected NAME=FILE with FILE an evaluate_forecast JSON")
        rows = json.loads(Path(path).read_text())["results"]
        rows = [row for row in rows if row.get("method") == "forecaster"] or rows  # a baseline's file: its own rows
        curves[name] = max(rows, key=lambda row: row["horizon"])["mse_by_step"]
    return curves


def plot_error_by_step(curves: dict[str, list[float]], path: Path, title: str) -> Path:
    """MSE of each forecast step 1..H, one line per forecaster (smoothed over 9 steps)."""
    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for name, curve in curves.items():
        smooth = [sum(curve[max(0, i - 4):i + 5]) / len(curve[max(0, i - 4):i + 5]) for i in range(len(curve))]
        ax.plot(range(1, len(curve) + 1), smooth, label=name, lw=1.2)
    ax.set_xlabel("forecast step (samples at 360 Hz)")
    ax.set_ylabel("test MSE at that step (z-scored)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure.savefig(path, dpi=120)
    return path


def plot_lookback_curve(model: dict[int, list[dict]], baselines: dict[str, list[dict]], path: Path,
                        name: str = "transformer") -> Path:
    """Test MSE against look-back, one line per horizon; the baselines as dashed levels."""
    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    lookbacks = sorted(model)
    horizons = [row["horizon"] for row in model[lookbacks[-1]]]
    colors = dict(zip(horizons, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for index, horizon in enumerate(horizons):
        mse = [next(r["mse"] for r in model[lb] if r["horizon"] == horizon) for lb in lookbacks]
        ax.plot(lookbacks, mse, "o-", color=colors[horizon], label=f"{name}, horizon {horizon}")
        ar = next(r["mse"] for r in baselines["ar"] if r["horizon"] == horizon)
        ax.axhline(ar, color=colors[horizon], ls="--", lw=0.8, label="AR baseline (dashed)" if index == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lookbacks, [f"{lb:,}" for lb in lookbacks])
    ax.set_xlabel("look-back (samples at 360 Hz)")
    ax.set_ylabel("test MSE (z-scored)")
    ax.set_title("ECG (MIT-BIH 208): forecast error against look-back")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for results.json, results.md and the PNGs")
    parser.add_argument("--minutes", type=float, default=5.0, help="training wall-clock budget")
    parser.add_argument("--smoke", action="store_true", help="a tiny CPU run of every step (seconds)")
    parser.add_argument("--run_dir", type=Path, default=Path("/tmp/ecg_bench_run"), help="scratch run directory")
    parser.add_argument("--seeds", type=int, default=1,
                        help="train every variant with this many seeds (0, 1, ...): the variant is chosen on its mean "
                        "validation MSE and the test MSE is the mean over its seeds' models (a seed alone moved "
                        "validation MSE by 0.05 on this record)")
    parser.add_argument("--first_seed", type=int, default=0,
                        help="the seeds are first_seed, first_seed + 1, ... (a repeat of a run with other seeds)")
    parser.add_argument("--ensemble", type=int, default=1,
                        help="evaluate every K consecutive seeds as one ensemble (the mean of their forecasts), each "
                        "ensemble's members trained on the same GPU; --seeds must be a multiple of K")
    parser.add_argument("--variants", nargs="+", default=None,
                        help=f"the variants to train (default: all of {list(VARIANTS)}; the smoke run: the first two)")
    parser.add_argument("--num_workers", type=int, default=None,
                        help="data-loader workers of each run (default: the config's); fewer leave CPU cores to other work")
    parser.add_argument("--steps_from", nargs="+", metavar="NAME=EVAL.json", default=None,
                        help="train nothing: draw OUT/error_by_step.png and print the table by part of the horizon "
                             "from `evaluate_forecast` outputs (each one's longest horizon), e.g. "
                             "'transformer=model.json' 'AR=ar.json'")
    args = parser.parse_args()
    began = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.steps_from:
        curves = steps_from(args.steps_from)
        plot_error_by_step(curves, out / "error_by_step.png", "ECG: error by forecast step")
        print(markdown_table(error_by_step_rows(curves)))
        return
    run_dir: Path = args.run_dir
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    store = run_dir / "ecg.zarr"
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    source = ECG_CSV
    horizons, lookbacks, ar_orders = HORIZONS, LOOKBACKS, None
    overrides = ["--data.init_args.store", str(store)]  # each variant adds its own run directory
    if args.num_workers is not None:
        overrides += ["--data.init_args.num_workers", str(args.num_workers)]
    if args.smoke:  # the first 20 s of the record, a tiny model, short horizons and look-backs
        source = run_dir / "ecg_head.csv"
        with open(ECG_CSV) as handle:
            source.write_text("".join(handle.readline() for _ in range(7201)))
        horizons, lookbacks, ar_orders = (16, 48), (64, 128, 256), (8, 32)
        overrides += ["--data.init_args.sources", f"[{source}]",  # what the store is built from
                      "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
                      "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2",
                      "--data.init_args.num_workers", "0", "--data.init_args.batch_size", "8",
                      "--data.init_args.eval_stride", "64",
                      "--model.init_args.forecast.context", "256", "--model.init_args.forecast.horizon", "48",
                      "--model.init_args.transformer.d_model", "32", "--model.init_args.transformer.n_layers", "1",
                      "--model.init_args.transformer.max_seq_len", "32", "--model.init_args.warmup_steps", "2",
                      "--model.init_args.forecast.linear_order", "32", "--model.init_args.linear_fit_batches", "2"]
    horizon_list = f"[{', '.join(map(str, horizons))}]"
    cli("prepare_timeseries", "--inputs", str(source), "--out", str(store), "--time_column", "t_seconds",
        log=logs / "prepare.log")

    # the baselines need no GPU: they run on the CPU while the model trains
    running = []
    for name in ("seasonal_naive", "ar"):
        extra = ["--ar_orders", f"[{', '.join(map(str, ar_orders))}]"] if ar_orders and name == "ar" else []
        running.append(start_cli("evaluate_forecast", "--store", str(store), "--baseline", name, "--horizons",
                                 horizon_list, "--out", str(out / f"baseline_{name}.json"), "--overwrite", *extra,
                                 log=logs / f"baseline_{name}.log", threads=4))

    import torch

    gpus = torch.cuda.device_count()
    slots = [None] if gpus == 0 else list(range(gpus))
    names = args.variants or (list(VARIANTS)[:2] if args.smoke else list(VARIANTS))
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    variants = {name: VARIANTS[name] for name in names}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs = [(name, seed) for name in variants for seed in seeds]
    if args.ensemble < 1 or args.seeds % args.ensemble:
        raise SystemExit(f"--seeds ({args.seeds}) must be a multiple of --ensemble ({args.ensemble}), which must be at least 1")
    groups = [seeds[first:first + args.ensemble] for first in range(0, len(seeds), args.ensemble)]
    # the members of one ensemble share a GPU: an ensemble is trained on one GPU
    placement = {(name, seed): slots[(index * len(groups) + seeds.index(seed) // args.ensemble) % len(slots)]
                 for index, name in enumerate(variants) for seed in seeds}

    def run_name(name: str, seed: int) -> str:
        return name if len(seeds) == 1 else f"{name}-seed{seed}"

    per_slot = max(list(placement.values()).count(slot) for slot in slots)  # runs sharing one GPU (or the CPU)
    train_seconds = 6.0 if args.smoke else args.minutes * 60
    budget = f"00:00:{int(args.minutes + 1):02d}:00"  # a safety net above the sized runs
    fits, sizing = [], {}
    config_max_steps = yaml.safe_load(CONFIG.read_text())["trainer"]["max_steps"]
    for name, extra in variants.items():
        variant_overrides = [*overrides, "--trainer.default_root_dir", str(run_dir / run_name(name, seeds[0])), *extra]
        step_seconds = measure_step_seconds(variant_overrides, steps=3 if args.smoke else 20)
        # validation and the checkpoints take a few percent of the time; never past the config's max_steps
        # a variant may shorten training (and its cosine schedule) with its own --trainer.max_steps
        cap = int(extra[extra.index("--trainer.max_steps") + 1]) if "--trainer.max_steps" in extra else config_max_steps
        max_steps = max(10, min(cap, int(0.9 * train_seconds / (step_seconds * per_slot))))
        sizing[name] = {"overrides": extra, "step_seconds_alone": step_seconds, "max_steps": max_steps, "seeds": {}}
    fit_began = time.perf_counter()
    for name, seed in runs:
        gpu = placement[name, seed]
        sizing[name]["seeds"][seed] = {"gpu": gpu}
        fits.append(start_cli("fit", "--config", str(CONFIG), *overrides,
                              "--trainer.default_root_dir", str(run_dir / run_name(name, seed)), *variants[name],
                              "--seed_everything", str(seed), "--model.init_args.seed", str(seed),
                              "--trainer.max_steps", str(sizing[name]["max_steps"]), "--trainer.max_time", budget,
                              "--model.init_args.total_steps", str(sizing[name]["max_steps"]),
                              "--trainer.enable_progress_bar", "false", log=logs / f"fit_{run_name(name, seed)}.log",
                              threads=2, gpu=gpu))
    wait_all(fits, "a fit")
    fit_seconds = time.perf_counter() - fit_began
    for name, seed in runs:
        metrics = run_dir / run_name(name, seed) / "metrics.csv"
        sizing[name]["seeds"][seed].update(best_val_mse=best_validation_mse(metrics), steps_done=last_logged_step(metrics))
    for name in variants:  # a variant's score: its best validation MSE averaged over the seeds
        per_seed = sizing[name]["seeds"].values()
        sizing[name]["best_val_mse"] = sum(r["best_val_mse"] for r in per_seed) / len(seeds)
        sizing[name]["steps_done"] = min(r["steps_done"] for r in per_seed)
    chosen = min(variants, key=lambda name: sizing[name]["best_val_mse"])
    checkpoints = {}
    for seed in seeds:
        folder = run_dir / run_name(chosen, seed) / "checkpoints"
        checkpoints[seed] = folder / "best.ckpt" if (folder / "best.ckpt").is_file() else folder / "last.ckpt"
    shutil.copy(run_dir / run_name(chosen, seeds[0]) / "metrics.csv", out / "metrics.csv")

    def evaluation_json(lookback: int, seed: int) -> Path:
        return out / (f"model_lookback{lookback}.json" if len(seeds) == 1 else f"model_lookback{lookback}_seed{seed}.json")

    evaluations = []
    for index, (seed, lookback) in enumerate((seed, lookback) for seed in seeds for lookback in lookbacks):
        evaluations.append(start_cli(
            "evaluate_forecast", "--store", str(store), "--checkpoint", str(checkpoints[seed]), "--baseline", "[]",
            "--horizons", horizon_list, "--lookback", str(lookback), "--out", str(evaluation_json(lookback, seed)),
            "--overwrite",
            log=logs / f"evaluate_{lookback}_seed{seed}.log", threads=2, gpu=slots[index % len(slots)]))
    wait_all(evaluations, "an evaluation")
    per_seed_model = {seed: {lb: json.loads(evaluation_json(lb, seed).read_text())["results"] for lb in lookbacks}
                      for seed in seeds}
    model = {lb: mean_over_seeds([per_seed_model[seed][lb] for seed in seeds]) for lb in lookbacks}
    members_model, ensembles = model, {}
    if args.ensemble > 1:  # every group of seeds as one forecaster; they are then the model of the tables
        evaluations = []
        for index, (group, lookback) in enumerate((g, lb) for g in range(len(groups)) for lb in lookbacks):
            listed = f"[{', '.join(str(checkpoints[seed]) for seed in groups[group])}]"
            evaluations.append(start_cli(
                "evaluate_forecast", "--store", str(store), "--checkpoint", listed, "--baseline", "[]", "--horizons", horizon_list,
                "--lookback", str(lookback), "--out", str(out / f"ensemble{group}_lookback{lookback}.json"),
                "--overwrite", log=logs / f"evaluate_{lookback}_ensemble{group}.log", threads=2,
                gpu=placement[chosen, groups[group][0]]))
        wait_all(evaluations, "an ensemble's evaluation")
        ensembles = {group: {lb: json.loads((out / f"ensemble{group}_lookback{lb}.json").read_text())["results"]
                             for lb in lookbacks} for group in range(len(groups))}
        model = {lb: mean_over_seeds([ensembles[group][lb] for group in ensembles]) for lb in lookbacks}
    wait_all(running, "a baseline")
    baselines = {name: json.loads((out / f"baseline_{name}.json").read_text())["results"] for name in ("seasonal_naive", "ar")}
    baseline_details = {name: json.loads((out / f"baseline_{name}.json").read_text())["methods"][name]
                        for name in ("seasonal_naive", "ar")}

    length = sum(1 for _ in open(source)) - 1
    origin = length - int(0.2 * length) + int(0.1 * length)  # inside the test part, truth known
    first_model = f"[{', '.join(str(checkpoints[seed]) for seed in groups[0])}]" if args.ensemble > 1 else str(checkpoints[seeds[0]])
    cli("forecast", "--checkpoint", first_model, "--store", str(store), "--at", str(origin),
        "--out", str(out / "forecast.npz"), "--history", str(2 * max(horizons)), "--overwrite", log=logs / "forecast.log")
    what = f"ensemble of {args.ensemble}" if args.ensemble > 1 else "transformer"
    plot_lookback_curve(model, baselines, out / "lookback_curve.png", what)
    step_curves = {f"transformer ({max(lookbacks):,})": members_model[max(lookbacks)][-1]["mse_by_step"],
                   **({f"ensemble of {args.ensemble} ({max(lookbacks):,})": model[max(lookbacks)][-1]["mse_by_step"]}
                      if args.ensemble > 1 else {}),
                   "AR": baselines["ar"][-1]["mse_by_step"],
                   "seasonal naive": baselines["seasonal_naive"][-1]["mse_by_step"]}
    plot_error_by_step(step_curves, out / "error_by_step.png",
                       f"ECG (MIT-BIH 208): error by forecast step, horizon {max(horizons)}")
    step_rows = error_by_step_rows(step_curves)

    longest = max(lookbacks)
    rows = []
    for index, horizon in enumerate(horizons):
        row = {"horizon": horizon}
        if args.ensemble > 1:
            row[f"single models, {longest:,} (mean of {len(seeds)})"] = members_model[longest][index]["mse"]
        for lookback in lookbacks:
            row[f"{what}, look-back {lookback:,}"] = model[lookback][index]["mse"]
        if len(seeds) > 1:
            spread = model[longest][index]["mse_seeds"]
            count = f"{len(groups)} ensembles" if args.ensemble > 1 else f"{len(seeds)} seeds"
            row[f"{longest:,}: range over {count}"] = f"{min(spread):.4f} to {max(spread):.4f}"
        row["seasonal naive"] = baselines["seasonal_naive"][index]["mse"]
        row["AR"] = baselines["ar"][index]["mse"]
        row["AR order"] = baselines["ar"][index]["lookback"]
        row["beats both"] = "yes" if row[f"{what}, look-back {longest:,}"] < min(row["seasonal naive"], row["AR"]) else "no"
        rows.append(row)
    mae_rows = [{"horizon": h, f"{what} ({longest:,})": model[longest][i]["mae"],
                 "seasonal naive": baselines["seasonal_naive"][i]["mae"], "AR": baselines["ar"][i]["mae"]}
                for i, h in enumerate(horizons)]
    env = describe_environment()
    results = {
        "environment": {**env, "command": command_line()}, "smoke": args.smoke, "config": str(CONFIG),
        "gpus": gpus, "seeds": seeds, "variants": sizing, "chosen": chosen, "steps_done": sizing[chosen]["steps_done"],
        "fit_seconds": fit_seconds, "checkpoint": checkpoints[seeds[0]].name, "model": {str(k): v for k, v in model.items()},
        "model_per_seed": {str(seed): {str(k): v for k, v in m.items()} for seed, m in per_seed_model.items()},
        "ensemble": args.ensemble, "ensemble_seeds": groups if args.ensemble > 1 else None,
        "single_models": {str(k): v for k, v in members_model.items()},
        "ensembles": {str(group): {str(k): v for k, v in e.items()} for group, e in ensembles.items()},
        "baselines": baselines, "baseline_details": baseline_details, "forecast_origin": origin,
        "error_by_step": step_rows,
        "total_seconds": time.perf_counter() - began,
    }
    write_json_file(out / "results.json", results)
    markdown = "\n\n".join([
        environment_markdown(env, command_line()),
        f"{len(variants)} variants of `{CONFIG}`, each with {len(seeds)} seed(s), trained at once on {max(gpus, 1)} "
        f"{'GPU(s)' if gpus else 'CPU'} for {fit_seconds / 60:.1f} min; the variant with the lowest validation MSE "
        f"(averaged over its seeds: `{chosen}`, at least {results['steps_done']:,} steps, checkpoint "
        f"`{checkpoints[seeds[0]].name}`) is evaluated, every seed's model, and the test MSE averaged over them"
        + (f"; then every {args.ensemble} consecutive seeds (trained on one GPU) as one ensemble (the mean of their "
           f"forecasts), the model of the tables" if args.ensemble > 1 else "") + ". Test MSE on "
        f"z-scored values, protocol split 70/10/20, stride-1 windows; periods of seasonal naive "
        f"{baseline_details['seasonal_naive']['periods']}.",
        markdown_table(rows),
        "Variants (chosen on validation MSE, the test part unseen):",
        markdown_table([{"variant": name, "overrides": " ".join(v["overrides"]) or "(the config)",
                         "steps (fewest of its seeds)": v["steps_done"],
                         "best validation MSE (mean over seeds)": v["best_val_mse"],
                         "per seed": ", ".join(f"{r['best_val_mse']:.4f}" for r in v["seeds"].values()),
                         "chosen": "yes" if name == chosen else ""} for name, v in sizing.items()]),
        "MAE:",
        markdown_table(mae_rows),
        f"Test MSE by part of the {max(horizons)}-step horizon (each forecaster's {max(horizons)}-step forecasts; AR's "
        f"order {baselines['ar'][-1]['lookback']}):",
        markdown_table(step_rows),
        "![forecast](forecast.png) ![look-back curve](lookback_curve.png) ![error by step](error_by_step.png)",
    ])
    write_atomically(out / "results.md", markdown + "\n")
    print(markdown_table(rows))
    print(f"total {results['total_seconds'] / 60:.1f} min; results in {out}")


if __name__ == "__main__":
    main()
