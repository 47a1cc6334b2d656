"""Generation speed on a CPU (issue 31's targets): the shipped causal model,
examples/genoformer_dna.ckpt, generating with its key/value cache against recomputing the
whole prefix at every base.

For each prompt length P (the first P bases of the lambda genome):

- cached: `Generator.generate(prompt, 500)`, a prefill of the prompt and 500 one-token steps,
  wall clock (target at P = 1,000: 500 bases in at most 30 s);
- recomputed: `Generator.generate(..., use_cache=False)`, the full forward pass over the window
  at every base, timed for a few bases at `points` prefix lengths spread evenly over the cached
  run's (P .. P + 499); their mean is the per-base time of a recomputed run over the same
  prefixes (a pass costs in proportion to its prefix). It runs once on one thread and once on
  torch's threads, and the faster counts (for the best and for the median apart), so the ratio
  never flatters the cache;
- the ratio: recomputed ms per base over cached ms per base, the cached time including its
  prefill (target at P = 1,000: at least 20);
- that both give the same bases: greedy (top_k 1) continuations, cached and recomputed.

Other processes share the machine: every measurement runs once per round, in turn, for
`rounds` rounds; the tables give the best and the median, with the load average before and after.

    python -m benchmarks.generate_bench               # benchmarks/results/generate_cpu.{json,md}
    python -m benchmarks.generate_bench --markdown BENCHMARKS.md    # and its "generate" section
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table, median, publish
from genoformer.data.genome.inputs import read_sequences
from genoformer.genome.generate import Generator

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "examples" / "genoformer_dna.ckpt"
GENOME = ROOT / "examples" / "lambda_phage.fasta.gz"
TARGET_PROMPT, TARGET_SECONDS, TARGET_RATIO = 1000, 30.0, 20.0


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seconds(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def prefix_points(prompt: int, length: int, points: int) -> list[int]:
    """`points` prefix lengths spread evenly over prompt .. prompt + length - 1."""
    return sorted({int(round(p)) for p in np.linspace(prompt, prompt + length - 1, points)})


def measures(generator: Generator, genome: np.ndarray, prompt: int, length: int, points: int, steps: int,
             threads: list[int]) -> dict[str, Callable[[], dict[str, float]]]:
    """Named measurements of one prompt length; each returns named values in seconds."""
    codes = genome[:prompt]

    def cached() -> dict[str, float]:
        return {"cached_s": seconds(lambda: generator.generate(codes, length, seed=0)),
                "prefill_s": seconds(lambda: generator.generate(codes, 1, seed=0))}

    def recomputed(count: int) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            with torch_threads(count):
                return {f"recomputed_{count}t_at_{p}_s": seconds(
                    lambda: generator.generate(genome[:p], steps, seed=0, use_cache=False)) / steps
                        for p in prefix_points(prompt, length, points)}
        return run

    return {"cached": cached, **{f"recomputed_{count}t": recomputed(count) for count in threads}}


def measure(generator: Generator, genome: np.ndarray, prompt: int, args: argparse.Namespace,
            threads: list[int]) -> dict:
    named = measures(generator, genome, prompt, args.length, args.points, args.steps, threads)
    generator.generate(genome[:prompt], 2)  # warm-up: first-call allocations and kernel set-up
    generator.generate(genome[:prompt], 2, use_cache=False)
    runs: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for measure_fn in named.values():
            for key, value in measure_fn().items():
                runs.setdefault(key, []).append(value)
    points = prefix_points(prompt, args.length, args.points)
    recomputed = {}
    for count in threads:
        best = [min(runs[f"recomputed_{count}t_at_{p}_s"]) for p in points]
        middle = [median(runs[f"recomputed_{count}t_at_{p}_s"]) for p in points]
        recomputed[str(count)] = {"ms_per_base_best": 1e3 * statistics.fmean(best),
                                  "ms_per_base_median": 1e3 * statistics.fmean(middle),
                                  "ms_per_base_at_prefix_best": {str(p): 1e3 * b for p, b in zip(points, best)}}
    faster = min(recomputed, key=lambda count: recomputed[count]["ms_per_base_best"])
    faster_median = min(recomputed, key=lambda count: recomputed[count]["ms_per_base_median"])
    cached_best, cached_median = min(runs["cached_s"]), median(runs["cached_s"])
    prefill_best = min(runs["prefill_s"])
    greedy = generator.generate(genome[:prompt], args.check, top_k=1)
    greedy_recomputed = generator.generate(genome[:prompt], args.check, top_k=1, use_cache=False)
    result = {
        "prompt_bases": prompt,
        "prefix_points": points,
        "cached_seconds": {"best": cached_best, "median": cached_median, "all": runs["cached_s"]},
        "prefill_seconds_best": prefill_best,
        "cached_ms_per_base_best": 1e3 * cached_best / args.length,
        "cached_ms_per_base_median": 1e3 * cached_median / args.length,
        "step_ms_per_base_best": 1e3 * max(cached_best - prefill_best, 0.0) / (args.length - 1),
        "recomputed": recomputed,
        "recomputed_threads_counted": {"best": int(faster), "median": int(faster_median)},
        "greedy_bases_checked": args.check,
        "greedy_same_bases": bool(np.array_equal(greedy, greedy_recomputed)),
    }
    result["ratio_best"] = recomputed[faster]["ms_per_base_best"] / result["cached_ms_per_base_best"]
    result["ratio_median"] = recomputed[faster_median]["ms_per_base_median"] / result["cached_ms_per_base_median"]
    return result


def report(summary: dict) -> str:
    length = summary["length"]
    rows = []
    for r in summary["results"]:
        best_threads, median_threads = r["recomputed_threads_counted"]["best"], r["recomputed_threads_counted"]["median"]
        rows.append({
            "prompt bases": f"{r['prompt_bases']:,}",
            f"cached, {length} bases (s)": f"{r['cached_seconds']['best']:.2f} / {r['cached_seconds']['median']:.2f}",
            "cached ms/base": f"{r['cached_ms_per_base_best']:.1f} / {r['cached_ms_per_base_median']:.1f}",
            "of it prefill (s)": f"{r['prefill_seconds_best']:.2f}",
            "recomputed ms/base": f"{r['recomputed'][str(best_threads)]['ms_per_base_best']:.0f} / "
                                  f"{r['recomputed'][str(median_threads)]['ms_per_base_median']:.0f} "
                                  f"({best_threads} / {median_threads} threads)",
            "ratio": f"{r['ratio_best']:.0f}x / {r['ratio_median']:.0f}x",
            "same greedy bases": "yes" if r["greedy_same_bases"] else "NO",
        })
    target = next((r for r in summary["results"] if r["prompt_bases"] == TARGET_PROMPT), None)
    verdict = ""
    if target is not None:
        verdict = (
            f"Targets at a {TARGET_PROMPT:,}-base prompt: {length} bases in at most {TARGET_SECONDS:.0f} s "
            f"(measured {target['cached_seconds']['best']:.1f} s best, {target['cached_seconds']['median']:.1f} s median: "
            f"{'met' if target['cached_seconds']['median'] <= TARGET_SECONDS else 'NOT met'}); at least "
            f"{TARGET_RATIO:.0f}x faster per base than recomputing (measured {target['ratio_best']:.0f}x best, "
            f"{target['ratio_median']:.0f}x median: {'met' if target['ratio_median'] >= TARGET_RATIO else 'NOT met'})."
        )
    load = summary["load_average"]
    return "\n\n".join(part for part in [
        environment_markdown(summary["environment"], summary["command"]),
        f"`Generator.generate` with examples/genoformer_dna.ckpt (float32) from the first P bases of "
        f"{GENOME.name}: {length} bases with the key/value cache (prefill included) against recomputing the "
        f"window at every base ({summary['steps']} bases at each of {summary['points']} prefix lengths over the same "
        f"P .. P + {length - 1}; the faster of 1 and {summary['torch_threads']} torch threads counts, for the best and "
        f"for the median apart). Best / median "
        f"of {summary['rounds']} interleaved rounds; load average {load[0]:.1f} before, {load[1]:.1f} after, on "
        f"{summary['cpu_count']} cores shared with other processes.",
        markdown_table(rows),
        verdict,
    ] if part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[100, 1000, 4000], help="prompt lengths (bases)")
    parser.add_argument("--length", type=int, default=500, help="bases generated per cached run")
    parser.add_argument("--points", type=int, default=4, help="prefix lengths the recomputed path is timed at")
    parser.add_argument("--steps", type=int, default=2, help="bases generated at each of those prefix lengths")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (best and median reported)")
    parser.add_argument("--check", type=int, default=40, help="greedy bases compared between cached and recomputed")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the 'generate' section of this file")
    args = parser.parse_args()
    generator = Generator.from_checkpoint(SHIPPED, device="cpu")
    genome = next(read_sequences([str(GENOME)])).codes
    threads = sorted({1, torch.get_num_threads()})
    load_before = os.getloadavg()[0]
    results = [measure(generator, genome, prompt, args, threads) for prompt in args.prompts]
    summary = {
        "environment": describe_environment("cpu"), "command": command_line(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "load_average": [load_before, os.getloadavg()[0]],
        "checkpoint": SHIPPED.name, "genome": GENOME.name, "length": args.length, "points": args.points,
        "steps": args.steps, "rounds": args.rounds, "results": results,
    }
    publish(args.out, "generate_cpu", summary, report(summary), args.markdown, "generate")


if __name__ == "__main__":
    main()
