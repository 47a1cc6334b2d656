"""ECG forecasting: does a transformer with an 8,192-sample look-back, trained for a few minutes on
one GPU, beat the classical baselines under the long-horizon protocol, and does the look-back help?

All through the real commands (`cli.py ...`): `prepare_timeseries` of the MIT-BIH record 208
excerpt in examples/ (108,000 samples at 360 Hz); `evaluate_forecast --baseline seasonal_naive`
and `--baseline ar` on the CPU while the GPUs train; a few timed steps of each variant of
configs/ecg_8k_gpu.yaml to size its run (max_steps fills --minutes, never past the config's); `fit`
of every variant and seed at once, spread over the GPUs (the best validation MSE kept); the variant
with the lowest validation MSE (mean over its seeds; the test part unseen) evaluated with
look-backs 8,192, 2,048 and 512 at horizons 96 to 720 (stride-1 test windows, about 21,000 per
horizon), every seed's model and, with --ensemble K, every K consecutive seeds (trained on one GPU)
as one forecaster (the mean of their forecasts), the model of the tables.

    python -m benchmarks.ecg --out OUT --minutes 5 --seeds 8 --ensemble 4 --variants config  # one H200 call
    python -m benchmarks.ecg --out benchmarks/results --from SEEDS_0-7.json SEEDS_8-15.json  # joined
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import (
    REPO_ROOT,
    Benchmark,
    Summary,
    TrainStep,
    argv,
    last_logged_step,
    table,
    time_calls,
    verdict,
)

ECG_CSV = REPO_ROOT / "examples" / "ecg_mitbih208_360hz.csv"
CONFIG = REPO_ROOT / "configs" / "ecg_8k_gpu.yaml"
VARIANTS: dict[str, list[str]] = {"config": [], "no-linear": ["--model.init_args.forecast.linear_order", "0"]}
"""name -> overrides of the config: as shipped (decoder-style, with its least-squares linear path), the transformer alone."""
STEP_PARTS = ((1, 96), (97, 192), (193, 336), (337, 720))


def start_cli(*args: str, log: Path, threads: int, gpu: int | None = None) -> tuple[subprocess.Popen, object]:
    """`python cli.py ARGS` in the background with at most `threads` BLAS threads (cores left to the
    training's data loaders), on GPU `gpu` alone when given."""
    handle = open(log, "w")
    env = {
        **os.environ,
        **{name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return subprocess.Popen(
        [sys.executable, "cli.py", *args], cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env
    ), handle


def wait_all(running: list, what: str) -> None:
    failed = [handle.name for process, handle in running if process.wait() != 0]
    for _, handle in running:
        handle.close()
    if failed:
        raise SystemExit(f"{what} failed; see {', '.join(failed)}")


def step_seconds(overrides: list[str], steps: int) -> float:
    """Seconds per optimizer step of the configured model on its own batches, in this process."""
    import torch

    from genoformer.training_cli import training_cli

    built = training_cli(["--config", str(CONFIG), *overrides], run=False)
    module, data = built.model, built.datamodule
    data.prepare_data()
    data.setup("fit")
    device = built.trainer.strategy.root_device
    module.to(device).train()
    batches = iter(data.train_dataloader())

    def loss():
        batch = next(batches)
        return module.losses(batch["context"].to(device), batch["target"].to(device))["loss"]

    step = TrainStep(
        loss,
        torch.optim.AdamW(module.parameters(), lr=1e-4),
        device,
        torch.bfloat16 if device.type == "cuda" else torch.float32,
    )
    return sum(time_calls(step.step, device, warmup=3, calls=steps)) / steps / 1e3


def by_part(curve: list[float]) -> dict[str, float]:
    """Mean MSE over each part of the horizon (STEP_PARTS, cut to its length)."""
    return {
        f"{a}-{min(b, len(curve))}": sum(curve[a - 1 : b]) / len(curve[a - 1 : b])
        for a, b in STEP_PARTS
        if a <= len(curve)
    }


def arguments(parser) -> None:
    parser.add_argument("--minutes", type=float, default=5.0, help="training wall-clock budget")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per variant (the variant is chosen on their mean)")
    parser.add_argument("--first_seed", type=int, default=0, help="the seeds are first_seed, first_seed + 1, ...")
    parser.add_argument("--ensemble", type=int, default=1, help="evaluate every K consecutive seeds as one forecaster")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--num_workers", type=int, help="data-loader workers of each run (default: the config's)")


def measure(args) -> dict:
    import torch

    with tempfile.TemporaryDirectory(prefix="ecg_bench_") as tmp:
        return _measure(args, Path(tmp), torch.cuda.device_count())


def _measure(args, work: Path, gpus: int) -> dict:
    store, logs, source = work / "ecg.zarr", work / "logs", ECG_CSV
    logs.mkdir()
    horizons, lookbacks, ar_orders, variants = (96, 192, 336, 720), (512, 2048, 8192), None, args.variants
    overrides = ["--data.init_args.store", str(store)]
    overrides += ["--data.init_args.num_workers", str(args.num_workers)] if args.num_workers is not None else []
    if args.smoke:  # the first 20 s of the record, a tiny model, short horizons and look-backs
        source = work / "ecg_head.csv"
        source.write_text("".join(ECG_CSV.read_text().splitlines(keepends=True)[:7201]))
        horizons, lookbacks, ar_orders, variants = (16, 48), (256,), (8, 32), ["config"]
        overrides += argv(
            "--data.init_args.sources {sources} --trainer.accelerator cpu --trainer.precision 32-true "
            "--trainer.val_check_interval 4 --trainer.limit_val_batches 2 --data.init_args.num_workers 0 "
            "--data.init_args.batch_size 8 --data.init_args.eval_stride 64 --model.init_args.forecast.context 256 "
            "--model.init_args.forecast.horizon 48 --model.init_args.transformer.d_model 32 "
            "--model.init_args.transformer.n_layers 1 --model.init_args.transformer.max_seq_len 32 "
            "--model.init_args.warmup_steps 2 --model.init_args.forecast.linear_order 32 "
            "--model.init_args.linear_fit_batches 2",
            sources=f"[{source}]",
        )
    horizon_list = f"[{', '.join(map(str, horizons))}]"
    wait_all(
        [
            start_cli(
                "prepare_timeseries",
                "--inputs",
                str(source),
                "--out",
                str(store),
                "--time_column",
                "t_seconds",
                log=logs / "prepare.log",
                threads=4,
            )
        ],
        "prepare_timeseries",
    )
    baselines_running = [
        start_cli(
            "evaluate_forecast",
            "--store",
            str(store),
            "--baseline",
            name,
            "--horizons",
            horizon_list,
            "--out",
            str(work / f"baseline_{name}.json"),
            *(["--ar_orders", f"[{', '.join(map(str, ar_orders))}]"] if ar_orders and name == "ar" else []),
            log=logs / f"baseline_{name}.log",
            threads=4,
        )
        for name in ("seasonal_naive", "ar")
    ]
    slots = list(range(gpus)) or [None]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.ensemble < 1 or len(seeds) % args.ensemble:
        raise SystemExit(f"--seeds ({args.seeds}) must be a multiple of --ensemble ({args.ensemble})")
    groups = [seeds[i : i + args.ensemble] for i in range(0, len(seeds), args.ensemble)]
    place = {
        (v, s): slots[(i * len(groups) + seeds.index(s) // args.ensemble) % len(slots)]  # an ensemble on one GPU
        for i, v in enumerate(variants)
        for s in seeds
    }
    per_slot = max(list(place.values()).count(slot) for slot in slots)
    train_seconds, cap = (  # a smoke run trains 10 steps however fast the machine is
        6.0 if args.smoke else args.minutes * 60,
        10 if args.smoke else yaml.safe_load(CONFIG.read_text())["trainer"]["max_steps"],
    )
    sizing = {}
    for name in variants:  # validation and checkpoints take a few percent: 0.9 of the budget
        seconds = step_seconds(
            [*overrides, "--trainer.default_root_dir", str(work / name), *VARIANTS[name]], 3 if args.smoke else 20
        )
        sizing[name] = {
            "step_seconds_alone": seconds,
            "max_steps": max(10, min(cap, int(0.9 * train_seconds / (seconds * per_slot)))),
        }
    began = time.perf_counter()
    wait_all(
        [
            start_cli(
                "fit",
                "--config",
                str(CONFIG),
                *overrides,
                "--trainer.default_root_dir",
                str(work / f"{v}-{s}"),
                *VARIANTS[v],
                "--seed_everything",
                str(s),
                "--model.init_args.seed",
                str(s),
                "--trainer.max_steps",
                str(sizing[v]["max_steps"]),
                "--model.init_args.total_steps",
                str(sizing[v]["max_steps"]),
                "--trainer.max_time",
                f"00:00:{int(args.minutes + 1):02d}:00",
                "--trainer.enable_progress_bar",
                "false",
                log=logs / f"fit_{v}_{s}.log",
                threads=2,
                gpu=place[v, s],
            )
            for v in variants
            for s in seeds
        ],
        "a fit",
    )
    fit_seconds = time.perf_counter() - began
    for v in variants:
        best = []
        for s in seeds:
            with open(work / f"{v}-{s}" / "metrics.csv") as handle:
                best.append(
                    min((float(r["val/mse"]) for r in csv.DictReader(handle) if r.get("val/mse")), default=math.inf)
                )
        sizing[v].update(
            best_val_mse=sum(best) / len(best),
            steps_done=min(last_logged_step(work / f"{v}-{s}" / "metrics.csv") for s in seeds),
        )
    chosen = min(variants, key=lambda v: sizing[v]["best_val_mse"])
    ckpt = {
        s: next(
            p for p in (work / f"{chosen}-{s}" / "checkpoints" / n for n in ("best.ckpt", "last.ckpt")) if p.is_file()
        )
        for s in seeds
    }
    members = {(f"seed{s}",): [str(ckpt[s])] for s in seeds}
    members.update({tuple(f"seed{s}" for s in g): [str(ckpt[s]) for s in g] for g in groups if len(g) > 1})
    jobs = [(key, lb) for key in members for lb in lookbacks]
    wait_all(
        [
            start_cli(
                "evaluate_forecast",
                "--store",
                str(store),
                "--checkpoint",
                f"[{', '.join(members[key])}]",
                "--baseline",
                "[]",
                "--horizons",
                horizon_list,
                "--lookback",
                str(lb),
                "--out",
                str(work / f"{'+'.join(key)}_{lb}.json"),
                log=logs / f"evaluate_{'+'.join(key)}_{lb}.log",
                threads=2,
                gpu=slots[i % len(slots)],
            )
            for i, (key, lb) in enumerate(jobs)
        ],
        "an evaluation",
    )
    wait_all(baselines_running, "a baseline")

    def read(path: Path, method: str) -> list[dict]:  # the longest horizon's MSE by step, by part of the horizon
        rows = [r for r in json.loads(path.read_text())["results"] if r["method"] == method]
        return [
            {k: v for k, v in r.items() if k != "mse_by_step"}
            | ({"mse_by_part": by_part(r["mse_by_step"])} if r is rows[-1] else {})
            for r in rows
        ]

    return {
        "seeds": seeds,
        "ensemble": args.ensemble,
        "variants": sizing,
        "chosen": chosen,
        "fit_seconds": fit_seconds,
        "gpus": gpus,
        "lookbacks": list(lookbacks),
        "models": {
            "+".join(key): {str(lb): read(work / f"{'+'.join(key)}_{lb}.json", "forecaster") for lb in lookbacks}
            for key in members
        },
        "baselines": {n: read(work / f"baseline_{n}.json", n) for n in ("seasonal_naive", "ar")},
    }


def merge(runs: list[dict]) -> dict:
    """Calls with other seeds joined: their models side by side, the baselines of the first."""
    return {
        **runs[0],
        "seeds": [s for run in runs for s in run["seeds"]],
        "models": {key: value for run in runs for key, value in run["models"].items()},
    }


def summarize(data: dict) -> Summary:
    longest = str(max(data["lookbacks"]))
    ensembles = {k: v for k, v in data["models"].items() if "+" in k} or {k: v for k, v in data["models"].items()}
    singles = [v for k, v in data["models"].items() if "+" not in k]
    label = {k: ("seeds " + k.replace("seed", "").replace("+", ",")) for k in ensembles}
    rows = []
    for i, base in enumerate(data["baselines"]["ar"]):
        row = {"horizon": base["horizon"], **{label[k]: v[longest][i]["mse"] for k, v in ensembles.items()}}
        if len(singles) > 1:
            row[f"single models (mean of {len(singles)})"] = sum(s[longest][i]["mse"] for s in singles) / len(singles)
        row.update({"AR": base["mse"], "seasonal naive": data["baselines"]["seasonal_naive"][i]["mse"]})
        rows.append(row)
    best_ar = [min(r["AR"], r["seasonal naive"]) for r in rows]
    beats = all(row[label[k]] < b for row, b in zip(rows, best_ar) for k in ensembles)
    what = f"ensembles of {data['ensemble']}" if data["ensemble"] > 1 else "models"
    lookback_rows = [
        {
            "look-back": int(lb),
            **{
                f"horizon {b['horizon']}": sum(v[lb][i]["mse"] for v in ensembles.values()) / len(ensembles)
                for i, b in enumerate(data["baselines"]["ar"])
            },
        }
        for lb in map(str, data["lookbacks"])
    ]
    parts = next(iter(ensembles.values()))[longest][-1].get("mse_by_part", {})
    return Summary(
        tables=[
            table(
                rows,
                f"Test MSE (z-scored) at a look-back of {int(longest):,}; {what} of `configs/ecg_8k_gpu.yaml` "
                f"({data['chosen']}), trained {data['fit_seconds'] / 60:.1f} min",
                digits=4,
            ),
            table(lookback_rows, f"Test MSE against the look-back ({what}, mean)", headline=False),
            table(
                [
                    {"forecast steps": p, "model": m, "AR": data["baselines"]["ar"][-1]["mse_by_part"][p]}
                    for p, m in parts.items()
                ],
                "By part of the longest horizon",
                headline=False,
            ),
        ],
        targets=[
            verdict(
                f"{what} beat both baselines in MSE at every horizon (look-back {int(longest):,})",
                f"{sum(r[label[k]] < b for r, b in zip(rows, best_ar) for k in ensembles)} of "
                f"{len(rows) * len(ensembles)}",
                beats,
            )
        ],
    )


BENCHMARK = Benchmark(
    "ecg",
    "Time series: ECG forecasting against classical baselines",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=merge,
    baseline="seasonal naive and least-squares AR (order chosen on validation) under the same protocol",
)

if __name__ == "__main__":
    BENCHMARK.main()
