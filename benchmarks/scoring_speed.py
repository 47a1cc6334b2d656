"""CPU scoring speed of the shipped model: `genoformer evaluate` (the function, in this process) on the
48.5 kb lambda genome at several context:overlap:batch settings and torch thread counts, rounds
interleaved (the CPU is shared: each rate is its best round), with bits per base against the
trained window (8,192 tokens, overlap 4,096): what the CPU default window of `evaluate` and
`score` rests on (genoformer.genome.evaluate).

    python -m benchmarks.scoring_speed --out benchmarks/results --threads 2 --rounds 2 \\
        --settings 8192:4096:8 8192:1024:8 2048:512:8          # the 2-core CPU, about 5 minutes
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from genoformer.data.genome.alphabet import decode
from genoformer.data.genome.inputs import read_sequences

from benchmarks.common import REPO_ROOT, Benchmark, Summary, table

MODEL = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


def arguments(parser) -> None:
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["8192:4096:8", "8192:1024:8", "2048:512:8"],
        help="CONTEXT:OVERLAP:BATCH each; the first is the reference of bits per base",
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="torch thread counts")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each rate: its best)")
    parser.add_argument("--inputs", type=Path, default=LAMBDA, help="the genome scored")


def measure(args) -> dict:
    from genoformer.genome.evaluate import evaluate

    settings = [
        tuple(int(x) for x in text.split(":")) for text in (["256:128:2", "128:64:2"] if args.smoke else args.settings)
    ]
    runs: dict[tuple, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = args.inputs
        if args.smoke:  # the first 1,000 bases
            record = next(iter(read_sequences([str(args.inputs)])))
            inputs = Path(tmp) / "short.fa"
            inputs.write_text(f">{record.name}\n{decode(record.codes[:1000])}\n")
        for _ in range(1 if args.smoke else args.rounds):
            for threads in [1] if args.smoke else args.threads:
                torch.set_num_threads(threads)
                for context, overlap, batch in settings:
                    load = os.getloadavg()[0]
                    report = evaluate(
                        checkpoint=MODEL,
                        inputs=[str(inputs)],
                        context=context,
                        overlap=overlap,
                        batch_size=batch,
                        device="cpu",
                    )
                    key = (context, overlap, batch, threads)
                    if key not in runs or report["bases_per_second"] > runs[key]["bases_per_second"]:
                        runs[key] = {
                            "context": context,
                            "overlap": overlap,
                            "batch_size": batch,
                            "threads": threads,
                            "bases_per_second": report["bases_per_second"],
                            "load_average_before": load,
                            "bits_per_base": report["total"]["bits_per_base"],
                        }
    return {"inputs": args.inputs.name, "rounds": args.rounds, "runs": list(runs.values())}


def summarize(data: dict) -> Summary:
    reference = data["runs"][0]
    rows = [
        {
            "context": r["context"],
            "overlap": r["overlap"],
            "batch": r["batch_size"],
            "threads": r["threads"],
            "bases/s": round(r["bases_per_second"]),
            "x first": r["bases_per_second"] / reference["bases_per_second"],
            "bits/base": f"{r['bits_per_base']:.4f}",
            "vs first": f"{r['bits_per_base'] - reference['bits_per_base']:+.4f}",
            "load before": r["load_average_before"],
        }
        for r in data["runs"]
    ]
    return Summary(
        tables=[
            table(
                rows,
                f"`genoformer evaluate` of {data['inputs']} with examples/genoformer_dna.ckpt; "
                f"best of {data['rounds']} interleaved rounds",
            )
        ]
    )


BENCHMARK = Benchmark(
    "scoring_speed",
    "CPU scoring speed of the shipped model",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="the trained window (the first setting) on the same genome",
)

if __name__ == "__main__":
    BENCHMARK.main()
