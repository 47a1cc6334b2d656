"""The Markov baseline on exactly the training data of a model: the bar its bits per base must beat.

Reads the genome store and the split of a training config (`data.init_args.store` and
`data.init_args.split`), counts the train intervals (orders 0..max_order and the smoothing chosen
on the last 10% of every train interval, then counted on all of them, both strands), scores
every interval of the evaluated split on its own (the first bases with the context that
exists), and reports bits per base per genome (source file) and in total. One CPU core.

    # a region at the end of every genome held out
    python -m benchmarks.markov_baseline --store genomes.zarr --name region \\
        --split '{by: region, val_fraction: 0.05, test_fraction: 0.05}' --evaluate test
    # one whole genome held out
    python -m benchmarks.markov_baseline --store genomes.zarr --name genome \\
        --split '{by: files, val: [saureus_col.fasta.gz], test: [vcholerae_o395.fasta.gz]}' --evaluate test

Writes `<out>/markov_<name>.json` (the shape of `genoformer baseline`'s JSON, plus "genomes")
and `<out>/markov_<name>.md`, puts the table into the `markov-<name>` section of `--markdown`
when given, and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import yaml

from benchmarks.common import (
    command_line,
    describe_environment,
    environment_markdown,
    markdown_table,
    replace_markdown_section,
)
from genoformer.data.alphabet import reverse_complement
from genoformer.data.genome_store import GenomeStore
from genoformer.data.splits import SPLITS, SequenceSource, SplitSpec, split_intervals
from genoformer.markov import DEFAULT_MAX_ORDER, fit_markov_model

REPO = Path(__file__).resolve().parents[1]


def run(store_path: Path, spec: SplitSpec, evaluate: str, max_order: int, both_strands: bool) -> dict:
    """Fit on the train intervals of the store, score the `evaluate` intervals; the result dict."""
    store = GenomeStore(store_path, cache_bytes=0)
    intervals = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in store.contigs], spec)
    if not intervals[evaluate]:
        raise ValueError(f"the split {spec} leaves nothing in {evaluate!r} to score; hold out a region or a file")
    train = [store.read(iv.index, iv.start, iv.end) for iv in intervals["train"]]
    start, start_cpu = time.perf_counter(), time.process_time()
    model, selection = fit_markov_model(train, max_order=max_order, progress=True)
    fit_seconds, fit_cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu

    strands = 2 if both_strands else 1
    records = []
    per_genome: dict[str, dict] = defaultdict(lambda: {"bits": 0.0, "bases": 0, "skipped": 0})
    for interval in intervals[evaluate]:
        contig = store.contigs[interval.index]
        codes = store.read(interval.index, interval.start, interval.end)
        scores = [model.score(strand) for strand in ((codes, reverse_complement(codes)) if both_strands else (codes,))]
        bits = sum(score.bits for score in scores) / strands
        records.append({"name": f"{contig.name}:{interval.start}-{interval.end}", "genome": contig.source_name,
                        "bits_per_base": bits / scores[0].bases if scores[0].bases else float("nan"),
                        "bases": scores[0].bases, "skipped": scores[0].skipped})
        genome = per_genome[contig.source_name]
        genome["bits"] += bits
        genome["bases"] += scores[0].bases
        genome["skipped"] += scores[0].skipped
    genomes = [{"genome": name, "bits_per_base": g["bits"] / g["bases"], "bases": g["bases"], "skipped": g["skipped"]}
               for name, g in per_genome.items()]
    bases = sum(g["bases"] for g in per_genome.values())
    return {
        "total": {"bits_per_base": sum(g["bits"] for g in per_genome.values()) / bases, "bases": bases,
                  "skipped": sum(g["skipped"] for g in per_genome.values())},
        "records": records,
        "genomes": genomes,
        "model": {
            "order": model.order,
            "discount": model.discount,
            "concentration": model.concentration,
            "selection": selection.table,
            "held_out_bases": selection.held_out_bases,
            "train_files": sorted({store.contigs[iv.index].source_name for iv in intervals["train"]}),
            "train_bases": sum(iv.length for iv in intervals["train"]),
            "fit_seconds": fit_seconds,
            "fit_cpu_seconds": fit_cpu_seconds,
            "memory_bytes": model.nbytes,
        },
        "skipped_bases": sum(g["skipped"] for g in per_genome.values()),
        "strands": strands,
        "store": str(store_path),
        "split": vars(spec),
        "evaluate": evaluate,
    }


def markdown(result: dict, name: str, command: str) -> str:
    model = result["model"]
    rows = [{"genome": g["genome"], "Markov k": model["order"], "bits per base": f"{g['bits_per_base']:.4f}",
             "bases scored": f"{g['bases']:,}", "skipped (N)": f"{g['skipped']:,}"} for g in result["genomes"]]
    rows.append({"genome": "total", "Markov k": model["order"], "bits per base": f"{result['total']['bits_per_base']:.4f}",
                 "bases scored": f"{result['total']['bases']:,}", "skipped (N)": f"{result['total']['skipped']:,}"})
    split = ", ".join(f"{key}={value}" for key, value in result["split"].items() if value not in ([], None))
    return "\n\n".join([
        f"### Markov baseline: {name} ({result['evaluate']} split; {split})",
        environment_markdown(describe_environment("cpu"), command),
        f"Order {model['order']}, discount {model['discount']}, concentration {model['concentration']}, chosen on "
        f"{model['held_out_bases']:,} held-out training bases; counted on {model['train_bases']:,} training bases "
        f"(both strands) from {', '.join(model['train_files'])} in {model['fit_seconds']:.0f} s "
        f"({model['fit_cpu_seconds']:.0f} s CPU). Scored on {result['strands']} strand(s).",
        markdown_table(rows, align={"Markov k": "right", "bits per base": "right", "bases scored": "right",
                                    "skipped (N)": "right"}),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="genome store of the training config (data.init_args.store)")
    parser.add_argument("--split", required=True, help="the config's data.init_args.split, as YAML or JSON")
    parser.add_argument("--evaluate", choices=[s for s in SPLITS if s != "train"], default="test")
    parser.add_argument("--name", default="region", help="names the output files and the BENCHMARKS.md section")
    parser.add_argument("--max-order", type=int, default=DEFAULT_MAX_ORDER)
    parser.add_argument("--both-strands", action="store_true", help="score the reverse complement too (the mean)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--markdown", type=Path, help="also write the table into this file's markov-<name> section")
    args = parser.parse_args()
    spec = SplitSpec(**yaml.safe_load(args.split))
    result = run(args.store, spec, args.evaluate, args.max_order, args.both_strands)
    command = command_line()
    result["command"] = command
    text = markdown(result, args.name, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"markov_{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"markov_{args.name}.md").write_text(text + "\n")
    if args.markdown is not None:
        replace_markdown_section(args.markdown, f"markov-{args.name}", text)
    print(text)


if __name__ == "__main__":
    main()
