"""Generation speed on a CPU: the shipped causal model (examples/genoformer_dna.ckpt) generating with
its key/value cache against recomputing the whole prefix at every base.

For each prompt length P (the first P bases of the lambda genome):
- cached: `Generator.generate(prompt, 500)`, a prefill and 500 one-token steps, wall clock
  (target at P = 1,000: 500 bases in at most 30 s);
- recomputed: `generate(..., use_cache=False)`, timed for 2 bases at 4 prefix lengths spread over
  P .. P + 499 (a pass costs in proportion to its prefix), on 1 thread and on torch's threads,
  the faster counting, so that the ratio never flatters the cache (target at P = 1,000: the
  cache at least 20x faster per base, its prefill included);
- greedy continuations (top_k 1), cached and recomputed, must be the same bases.
Every measurement runs once per round, in turn (the CPU is shared); best and median are kept.

    python -m benchmarks.generate_bench --out benchmarks/results     # about 5 minutes on 2 cores
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np
import torch
from genoformer.data.genome.inputs import read_sequences

from benchmarks.common import REPO_ROOT, Benchmark, Summary, at_least, at_most, median, table, verdict
from genoformer.genome.generate import Generator

SHIPPED = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
GENOME = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seconds(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def measure_prompt(
    generator: Generator, genome: np.ndarray, prompt: int, length: int, rounds: int, threads: list[int], check: int
) -> dict:
    points = sorted({int(round(p)) for p in np.linspace(prompt, prompt + length - 1, 4)})
    generator.generate(genome[:prompt], 2)  # warm-up: first-call allocations
    generator.generate(genome[:prompt], 2, use_cache=False)
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        runs.setdefault("cached", []).append(seconds(lambda: generator.generate(genome[:prompt], length, seed=0)))
        runs.setdefault("prefill", []).append(seconds(lambda: generator.generate(genome[:prompt], 1, seed=0)))
        for count in threads:
            with torch_threads(count):
                per_base = [
                    seconds(lambda p=p: generator.generate(genome[:p], 2, seed=0, use_cache=False)) / 2 for p in points
                ]
            runs.setdefault(f"recomputed_{count}", []).append(1e3 * statistics.fmean(per_base))
    greedy = [generator.generate(genome[:prompt], check, top_k=1, use_cache=cache) for cache in (True, False)]
    return {
        "prompt": prompt,
        "length": length,
        "cached_s": runs["cached"],
        "prefill_s_best": min(runs["prefill"]),
        "recomputed_ms_per_base": {
            str(c): {"best": min(runs[f"recomputed_{c}"]), "median": median(runs[f"recomputed_{c}"])} for c in threads
        },
        "greedy_same_bases": bool(np.array_equal(*greedy)),
    }


def arguments(parser) -> None:
    parser.add_argument("--prompts", type=int, nargs="+", default=[100, 1000, 4000], help="prompt lengths (bases)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (best and median reported)")


def measure(args) -> dict:
    generator = Generator.from_checkpoint(SHIPPED, device="cpu")
    genome = next(read_sequences([str(GENOME)])).codes
    threads = [1] if args.smoke else sorted({1, torch.get_num_threads()})
    load = os.getloadavg()[0]
    prompts, length, rounds, check = ([20], 8, 1, 4) if args.smoke else (args.prompts, 500, args.rounds, 40)
    cases = [measure_prompt(generator, genome, p, length, rounds, threads, check) for p in prompts]
    return {"load_average": [load, os.getloadavg()[0]], "cases": cases}


def summarize(data: dict) -> Summary:
    rows, targets = [], []
    for case in data["cases"]:
        cached = {"best": min(case["cached_s"]), "median": median(case["cached_s"])}
        recomputed = {how: min(v[how] for v in case["recomputed_ms_per_base"].values()) for how in cached}
        speedup = {how: recomputed[how] / (1e3 * cached[how] / case["length"]) for how in cached}
        rows.append(
            {
                "prompt bases": case["prompt"],
                f"cached, {case['length']} bases (s)": cached["best"],
                "cached ms/base": 1e3 * cached["best"] / case["length"],
                "of it prefill (s)": case["prefill_s_best"],
                "recomputed ms/base": recomputed["best"],
                "x faster (best / median)": f"{speedup['best']:.0f} / {speedup['median']:.0f}",
                "same greedy bases": "yes" if case["greedy_same_bases"] else "NO",
            }
        )
        if case["prompt"] == 1000:
            targets += [
                at_most("500 bases from a 1,000-base prompt in at most 30 s (median)", cached["median"], 30.0, " s"),
                at_least(
                    "the cache at least 20x faster per base than recomputing (median)", speedup["median"], 20.0, "x"
                ),
            ]
    same = [c["greedy_same_bases"] for c in data["cases"]]
    targets.append(
        verdict("greedy bases the same, cached and recomputed", f"{sum(same)} of {len(same)} prompts", all(same))
    )
    load = data["load_average"]
    return Summary(
        tables=[table(rows, f"Best of the rounds; load average {load[0]:.1f} before, {load[1]:.1f} after")],
        targets=targets,
        failed=not all(same),
    )


BENCHMARK = Benchmark(
    "generate",
    "First-day tools: generate (CPU)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    module="benchmarks.generate_bench",
    baseline="the same model recomputing the window at every base (use_cache=False)",
)

if __name__ == "__main__":
    BENCHMARK.main()
