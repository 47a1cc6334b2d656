"""Saturation mutagenesis with the shipped causal model: what `genoformer mutagenesis` costs on a
CPU, and (--windows, on a GPU) how its llr depends on the window.

- default: the command of 200 lambda positions (600 SNVs) at the default window, timed as a user
  runs it (model load, scoring, TSV and PNG), --repeats times (target: at most 2 minutes on a
  2-core CPU);
- --windows: the same 200 positions at windows 128 to 8,192, in bfloat16 (the GPU's inference
  policy) and float32, against float32 at the longest window (Pearson r, mean |difference| in
  bits), and the seconds of a 1 kb region per precision, window and batch size.

    python -m benchmarks.mutagenesis_bench --out benchmarks/results              # 2-core CPU, ~5 min
    python -m benchmarks.mutagenesis_bench --out OUT --windows                    # a GPU, ~2 min
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.regions import read_regions

from benchmarks.common import REPO_ROOT, Benchmark, Summary, at_most, median, table
from genoformer.genome.mutagenesis import mutagenesis, saturation_mutagenesis
from genoformer.genome.scoring import CPU_WINDOW, Scorer

CHECKPOINT = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
GENOME = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
RECORD = "gi|9626243|ref|NC_001416.1|"
REGION = f"{RECORD}:20001-20200"  # mid-genome: windows up to 8192 fit without clipping
REGION_1KB = f"{RECORD}:20001-21000"


def on_cpu(args) -> dict:
    runs = []
    region = f"{RECORD}:20001-20003" if args.smoke else REGION
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(1 if args.smoke else args.repeats):
            load = os.getloadavg()[0]
            began = time.perf_counter()
            mutagenesis(
                checkpoint=CHECKPOINT,
                inputs=[str(GENOME)],
                regions=[region],
                out=Path(folder) / "m.tsv",
                window=128 if args.smoke else CPU_WINDOW,
                batch_size=8,
                device="cpu",
                overwrite=True,
            )
            runs.append({"seconds": time.perf_counter() - began, "load_average_before": load})
    return {"kind": "cpu", "region": region, "torch_threads": torch.get_num_threads(), "runs": runs}


def windows(args) -> dict:
    device = torch.device(args.device)
    genome = {record.name: record.codes for record in read_sequences([str(GENOME)])}
    lengths = {name: len(codes) for name, codes in genome.items()}
    policy = Scorer.from_checkpoint(CHECKPOINT, device=device)  # bfloat16 autocast on a GPU
    scorers = {
        "bfloat16": policy,
        "float32": Scorer(policy.model, context=policy.context, device=device, autocast_dtype=torch.float32),
    }
    sizes, batch_sizes = ([64, 128], [8]) if args.smoke else ([128, 256, 512, 1024, 2048, 4096, 8192], [8, 64, 256])
    region = read_regions(f"{RECORD}:20001-20020" if args.smoke else REGION, lengths)

    def run(precision: str, window: int, batch_size: int, regions=region) -> tuple[np.ndarray, float]:
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        began = time.perf_counter()
        matrices = saturation_mutagenesis(
            scorers[precision], genome, regions, window=window, batch_size=batch_size, progress=False
        )
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        return np.concatenate([m[np.isfinite(m)] for m in matrices]), time.perf_counter() - began

    for precision in scorers:
        run(precision, sizes[0], 32)  # warm-up: kernels, autotuning, allocator
    llr = {(p, w): run(p, w, 32) for w in sizes for p in scorers}
    reference = llr["float32", max(sizes)][0]
    rows = [
        {
            "window": w,
            "precision": p,
            "seconds": s,
            "pearson_r": float(np.corrcoef(v, reference)[0, 1]),
            "mean_abs_difference": float(np.abs(v - reference).mean()),
        }
        for (p, w), (v, s) in llr.items()
    ]
    kilobase = read_regions(REGION_1KB, lengths)
    timing = []
    for precision in scorers:
        for window in sizes[-2:] if args.smoke else [1024, 2048]:
            for batch_size in batch_sizes:
                run(precision, window, batch_size, kilobase)  # warm-up of this shape
                timing.append(
                    {
                        "precision": precision,
                        "window": window,
                        "batch_size": batch_size,
                        "seconds": run(precision, window, batch_size, kilobase)[1],
                    }
                )
    return {"kind": "windows", "variants": int(reference.size), "windows": rows, "region_1kb": timing}


def arguments(parser) -> None:
    parser.add_argument("--windows", action="store_true", help="llr against the window, and a 1 kb region's time")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the command on the CPU")
    parser.add_argument("--device", default="cpu", help="device of --windows (e.g. cuda)")


def measure(args) -> dict:
    return windows(args) if args.windows else on_cpu(args)


def summarize(data: dict) -> Summary:
    if data["kind"] == "windows":
        rows = [
            {
                "window": r["window"],
                "precision": r["precision"],
                "seconds": r["seconds"],
                "Pearson r": r["pearson_r"],
                "mean abs difference (bits)": r["mean_abs_difference"],
            }
            for r in data["windows"]
        ]
        return Summary(
            title="First-day tools: mutagenesis, the llr against the window",
            tables=[
                table(rows, f"{data['variants']} SNVs against float32 at the longest window"),
                table(data["region_1kb"], "A 1 kb region (3,000 SNVs)", headline=False),
            ],
        )
    seconds = [run["seconds"] for run in data["runs"]]
    return Summary(
        tables=[
            table(
                [
                    {"run": i + 1, "seconds": run["seconds"], "load average before": run["load_average_before"]}
                    for i, run in enumerate(data["runs"])
                ],
                f"`genoformer mutagenesis` of {data['region']}, {data['torch_threads']} torch threads",
            )
        ],
        targets=[at_most("the 200 positions in at most 2 minutes (median of the runs)", median(seconds), 120.0, " s")],
    )


BENCHMARK = Benchmark(
    "mutagenesis",
    "First-day tools: mutagenesis (CPU)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    module="benchmarks.mutagenesis_bench",
    name_of=lambda args: "mutagenesis_windows" if args.windows else "mutagenesis",
)

if __name__ == "__main__":
    BENCHMARK.main()
