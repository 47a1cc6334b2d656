"""Saturation mutagenesis with the shipped causal model: what it costs, and how its llr depends on
the window.

    # on the 2-core CPU: `genoformer mutagenesis` of 200 lambda positions at the default window,
    # timed as a user runs it (model load, scoring, TSV and PNG), several times (the CPU is shared)
    python -m benchmarks.mutagenesis_bench cpu --repeats 3
    # on a GPU: the same 200 positions at windows 128 to 8192, in bfloat16 and float32, against
    # float32 at 8192; and the time of a 1 kb region at several windows and batch sizes
    python -m benchmarks.mutagenesis_bench windows

`cpu` writes benchmarks/results/mutagenesis_cpu.json: every repeat's seconds, their median, the
load average before each (other programs share the CPU) and the command. `windows` writes
benchmarks/results/mutagenesis_windows.json: per window and precision (bfloat16 autocast, the
GPU's inference policy, and float32) the seconds of the 200 positions and the agreement of their
600 llr with float32 at the longest window: Pearson r, the mean and 95th percentile of
|difference| (bits), and how often the sign agrees where the reference |llr| > 0.5 bit; per
window, bfloat16 against float32 (the noise of the precision alone); and the seconds of a 1 kb
region per precision, window and batch size.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import command_line, describe_environment, median, write_json_file
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.regions import read_regions
from genoformer.genome.mutagenesis import DEFAULT_WINDOW, mutagenesis, saturation_mutagenesis
from genoformer.genome.scoring import Scorer

CHECKPOINT = Path("examples/genoformer_dna.ckpt")
GENOME = Path("examples/lambda_phage.fasta.gz")
RECORD = "gi|9626243|ref|NC_001416.1|"
REGION = f"{RECORD}:20001-20200"  # mid-genome: windows up to 8192 fit without clipping
REGION_1KB = f"{RECORD}:20001-21000"
RESULTS = Path("benchmarks/results")


def cpu(args: argparse.Namespace) -> None:
    """Time the command on the CPU, `repeats` times."""
    torch.set_num_threads(args.threads or torch.get_num_threads())
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            load = os.getloadavg()[0]
            began = time.perf_counter()
            mutagenesis(checkpoint=CHECKPOINT, inputs=[str(GENOME)], regions=[REGION], out=Path(folder) / "m.tsv",
                        window=args.window, batch_size=args.batch_size, device="cpu", overwrite=True)
            runs.append({"seconds": time.perf_counter() - began, "load_average_1min_before": load})
            print(f"{runs[-1]['seconds']:.1f} s (load average before: {load:.2f})", flush=True)
    seconds = [run["seconds"] for run in runs]
    summary = {
        "environment": describe_environment("cpu"),
        "command": command_line(),
        "torch_threads": torch.get_num_threads(),
        "checkpoint": str(CHECKPOINT),
        "region": REGION,
        "positions": 200,
        "variants": 600,
        "window": args.window,
        "batch_size": args.batch_size,
        "runs": runs,
        "median_seconds": median(seconds),
        "target_seconds": 120,
    }
    print(f"median {median(seconds):.1f} s of {seconds}; wrote {write_json_file(args.out, summary)}")


def _agreement(llr: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """How closely `llr` follows `reference` (both over the same variants, bits)."""
    difference = np.abs(llr - reference)
    strong = np.abs(reference) > 0.5
    return {
        "pearson_r": float(np.corrcoef(llr, reference)[0, 1]),
        "mean_abs_difference": float(difference.mean()),
        "p95_abs_difference": float(np.percentile(difference, 95)),
        "sign_agreement_where_abs_llr_over_0.5": float((np.sign(llr[strong]) == np.sign(reference[strong])).mean()),
    }


def windows(args: argparse.Namespace) -> None:
    """llr against the window in both precisions on a GPU, and the time of a 1 kb region."""
    device = torch.device(args.device)
    genome = {record.name: record.codes for record in read_sequences([str(GENOME)])}
    lengths = {name: len(codes) for name, codes in genome.items()}
    region = read_regions(REGION, lengths)
    policy = Scorer.from_checkpoint(CHECKPOINT, device=device)  # bfloat16 autocast on a GPU
    scorers = {"bfloat16": policy,
               "float32": Scorer(policy.model, context=policy.context, device=device, autocast_dtype=torch.float32)}

    def run(precision: str, window: int, batch_size: int, regions=region) -> tuple[np.ndarray, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        matrices = saturation_mutagenesis(scorers[precision], genome, regions, window=window, batch_size=batch_size,
                                          progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        llr = np.concatenate([m[np.isfinite(m)] for m in matrices])
        return llr, time.perf_counter() - began

    for precision in scorers:
        run(precision, 256, args.batch_size)  # warm-up: kernels, autotuning, allocator
    longest = max(args.windows)
    llr = {(precision, window): run(precision, window, args.batch_size) for window in args.windows for precision in scorers}
    reference = llr["float32", longest][0]
    rows = []
    for (precision, window), (values, seconds) in llr.items():
        rows.append({"window": window, "precision": precision, "seconds_200_positions": seconds,
                     "against_float32_at_longest": _agreement(values, reference), "llr_sd": float(values.std())})
        print(rows[-1], flush=True)
    noise = [{"window": window, "bfloat16_against_float32": _agreement(llr["bfloat16", window][0], llr["float32", window][0])}
             for window in args.windows]
    for row in noise:
        print(row, flush=True)
    kilobase = read_regions(REGION_1KB, lengths)
    timing = []
    for precision in scorers:
        for window in args.timing_windows:
            for batch_size in args.timing_batch_sizes:
                run(precision, window, batch_size, kilobase)  # warm-up of this shape
                _, seconds = run(precision, window, batch_size, kilobase)
                timing.append({"region": REGION_1KB, "precision": precision, "window": window, "batch_size": batch_size,
                               "seconds": seconds})
                print(timing[-1], flush=True)
    summary = {
        "environment": describe_environment(device),
        "command": command_line(),
        "checkpoint": str(CHECKPOINT),
        "region": REGION,
        "variants": int(reference.size),
        "reference": f"float32 at window {longest}",
        "mean_abs_llr_of_reference": float(np.abs(reference).mean()),
        "batch_size": args.batch_size,
        "windows": rows,
        "precision_noise": noise,
        "region_1kb": timing,
    }
    print(f"wrote {write_json_file(args.out, summary)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    on_cpu = commands.add_parser("cpu", help="time the command on the CPU")
    on_cpu.add_argument("--repeats", type=int, default=3)
    on_cpu.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    on_cpu.add_argument("--batch_size", type=int, default=8)
    on_cpu.add_argument("--threads", type=int, default=None, help="torch threads; default torch's")
    on_cpu.add_argument("--out", type=Path, default=RESULTS / "mutagenesis_cpu.json")
    on_cpu.set_defaults(run=cpu)
    on_gpu = commands.add_parser("windows", help="llr against the window, and the time of a 1 kb region")
    on_gpu.add_argument("--windows", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    on_gpu.add_argument("--batch_size", type=int, default=32)
    on_gpu.add_argument("--timing_windows", type=int, nargs="+", default=[1024, 2048])
    on_gpu.add_argument("--timing_batch_sizes", type=int, nargs="+", default=[8, 64, 256])
    on_gpu.add_argument("--device", default="cuda")
    on_gpu.add_argument("--out", type=Path, default=RESULTS / "mutagenesis_windows.json")
    on_gpu.set_defaults(run=windows)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
