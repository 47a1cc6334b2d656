"""Fine-tuning: the pretrained genoformer (examples/genoformer_dna.ckpt) fine-tuned through
`genoformer finetune` on real labels, against the same architecture from scratch and (joined from
benchmarks/finetune_baselines.py) k-mer and one-hot logistic regression and pyrodigal.

- splice: StatLog primate splice junctions (3,186 x 60 nt; donor / acceptor / neither), fold 0 of
  `finetune_baselines.splice_folds` (identical sequences on one side); validation a leak-free
  tenth of the training part; test accuracy.
- tf: Oct4 (1) vs MafK (0) binding sites (200 bp), the package's own test split; test AUROC.
- genes: per-base gene classes learned on one annotated genome, then a whole genome of another
  phylum annotated with `GeneAnnotator`: per-base coding MCC, and the share of reference genes
  called with the right strand and stop (and start).
- cpu: the CPU targets through the command line: `finetune` of 100 x 60 nt for 300 steps, and
  `annotate` of 100,000 bases of E. coli K-12 with the shipped gene model.
Variants: full, LoRA (rank 8), linear probe, from scratch (and last-token pooling); genes: full at
an 8,192 and a 1,024 base window, from scratch at 8,192. One task per run; joined with --from.

    python -m benchmarks.finetune_bench prepare --data ../shared-extra --prepared .device/data   # needs scikit-learn
    python -m benchmarks.finetune_bench --out OUT --task splice --steps 1000      # a GPU (gpu_genome.sh finetune)
    python -m benchmarks.finetune_bench --out OUT --task cpu                      # the 2-core CPU
    python -m benchmarks.finetune_bench --out benchmarks/results --name finetune --from SPLICE.json TF.json \\
        GENES.json CPU.json BASELINES.json                                      # one table per task
"""

from __future__ import annotations

import csv
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    REPO_ROOT,
    Benchmark,
    Summary,
    argv,
    at_least,
    at_most,
    command_line,
    describe_environment,
    join,
    table,
)

PRETRAINED = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
GENE_MODEL = REPO_ROOT / "examples" / "genoformer_gene_annotator.ckpt"
SPLICE_TABLE = REPO_ROOT / "examples" / "splice_junctions_statlog.tsv"
GENOMES = {"ecoli_draft": "genomes/ecoli_draft_prokka.gff3.gz", "leptospira": "genomes/leptospira_kirschneri_h1.gbk.gz"}
SEQUENCE_VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"lora": 8, "learning_rate": 1e-3},
    "linear_probe": {"freeze_backbone": True},
    "from_scratch": {"from_scratch": True, "learning_rate": 5e-4},
    # the state that has read the whole sequence (both strands), for position-specific signals
    "full_last": {"pooling": "last"},
    "full_last_lr5e-4": {"pooling": "last", "learning_rate": 5e-4},
    "from_scratch_last": {"from_scratch": True, "learning_rate": 5e-4, "pooling": "last"},
}
GENE_VARIANTS: dict[str, dict[str, Any]] = {
    "full_8k": {"window": 8192, "batch_size": 8, "learning_rate": 3e-4},
    "full_1k": {"window": 1024, "batch_size": 64, "learning_rate": 3e-4},
    "from_scratch_8k": {"window": 8192, "batch_size": 8, "from_scratch": True, "learning_rate": 5e-4},
}


def write_table(path: Path, sequences, labels) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerows([("sequence", "label"), *zip(sequences, labels)])


def prepare(data: Path, prepared: Path) -> None:
    """The splits as files the `finetune` command reads, and the genomes (on the CPU machine: the
    split needs scikit-learn, which the GPU machine lacks)."""
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.inputs import read_sequences

    from benchmarks.finetune_baselines import read_splice_table, splice_folds

    seqs, labels = read_splice_table(SPLICE_TABLE)
    train, test = splice_folds(seqs, labels, folds=5, seed=0)[0]
    for part, rows in (("train", train), ("test", test)):
        write_table(prepared / f"splice_{part}.tsv", [seqs[i] for i in rows], [labels[i] for i in rows])
        pairs = [
            (decode(r.codes), label)
            for name, label in (("oct4", 1), ("mafk", 0))
            for r in read_sequences([data / "labeled" / "tf_binding" / f"{name}_{part}.fasta"])
        ]
        write_table(prepared / f"tf_{part}.tsv", *zip(*pairs))
    for relative in GENOMES.values():
        (prepared / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data / relative, prepared / relative)


def test_metrics(run_dir: Path) -> dict[str, float]:
    """The last value of each test/ column of `<run>/test/metrics.csv`."""
    with open(run_dir / "test" / "metrics.csv", newline="") as handle:
        values = {k: float(v) for row in csv.DictReader(handle) for k, v in row.items() if v and k.startswith("test/")}
    return {key.removeprefix("test/"): value for key, value in values.items()}


def annotate_genome(checkpoint: Path, genome: Path, window: int) -> dict:
    """A whole genome annotated by a fine-tuned model, scored against its annotation."""
    from genoformer.data.genome.annotations import read_annotated_genomes

    from genoformer.genome.genecalls import call_genes, decode_labels, gene_agreement, per_base_coding_mcc
    from genoformer.genome.predict import GeneAnnotator

    annotator, labels, predicted, reference, called, seconds = (
        GeneAnnotator.from_checkpoint(checkpoint),
        [],
        [],
        [],
        [],
        0.0,
    )
    for contig in read_annotated_genomes([genome], progress=False):
        started = time.perf_counter()
        probabilities = annotator.probabilities(contig.codes, window=window, batch_size=16 if window > 2048 else 128)
        torch.cuda.synchronize() if annotator.device.type == "cuda" else None
        seconds += time.perf_counter() - started
        labels.append(contig.labels)
        predicted.append(decode_labels(probabilities))
        reference += [g for g in contig.genes if g.kind == "CDS"]
        called += [g for g in call_genes(contig.codes, probabilities, contig=contig.name) if g.kind == "CDS"]
    truth = np.concatenate(labels)
    return {
        "genome": genome.name,
        "bases": int(truth.size),
        "coding_mcc": per_base_coding_mcc(truth, np.concatenate(predicted)),
        "genes": gene_agreement(reference, called),
        "annotate_bases_per_second": truth.size / seconds,
    }


def run_variant(args, task: str, variant: str, work: Path) -> dict:
    from genoformer.training_cli import finetune

    out = work / f"{task}_{variant}"
    started = time.perf_counter()
    if task == "genes":
        options = GENE_VARIANTS[variant]
        train, test = args.direction.split(":")
        finetune(
            pretrained=PRETRAINED,
            task="annotate",
            train=[str(args.prepared / GENOMES[train])],
            out=out,
            max_steps=args.gene_steps,
            val_every=max(1, args.gene_steps // 4),
            **options,
        )
        (best,) = [p for p in (out / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]  # save_top_k: 1
        result = {
            "steps": args.gene_steps,
            "train": train,
            "evaluation": annotate_genome(best, args.prepared / GENOMES[test], options["window"]),
        }
        if args.export is not None and variant == "full_8k":
            from genoformer.core.export import export

            export(checkpoint=best, out=args.export, dtype="bfloat16", overwrite=True)
    else:
        options = SEQUENCE_VARIANTS[variant]
        finetune(
            pretrained=PRETRAINED,
            task="classify",
            train=[str(args.prepared / f"{task}_train.tsv")],
            test=[str(args.prepared / f"{task}_test.tsv")],
            out=out,
            max_steps=args.steps,
            batch_size=args.batch_size,
            val_every=max(1, args.steps // 4),
            **options,
        )
        result = {"steps": args.steps, "test": test_metrics(out)}
    return {
        **result,
        "seconds": time.perf_counter() - started,
        "environment": describe_environment(),
        "command": command_line(),
    }


def cpu_targets(work: Path, smoke: bool) -> dict:
    """`finetune` of 100 x 60 nt for 300 steps and `annotate` of 100,000 bases, as typed, start-up included."""
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.inputs import read_sequences

    from genoformer.cli import main as genoformer

    steps, bases, rows = (2, 2000, 8) if smoke else (300, 100_000, 100)
    header, *lines = SPLICE_TABLE.read_text().splitlines()
    write_table(work / "small_train.tsv", *zip(*(line.split("\t") for line in lines[:rows])))
    write_table(work / "small_val.tsv", *zip(*(line.split("\t") for line in lines[-rows:])))
    started = time.perf_counter()
    genoformer(
        argv(
            "finetune --pretrained {model} --task classify --train {train} --val {val} --out {out} "
            "--max_steps {steps} --device cpu --leaks drop" + (" --batch_size 4" if smoke else ""),
            model=PRETRAINED,
            train=work / "small_train.tsv",
            val=work / "small_val.tsv",
            out=work / "small",
            steps=steps,
        )
    )
    finetune_seconds = time.perf_counter() - started
    (record,) = read_sequences(REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz")
    (work / "head.fasta").write_text(f">ecoli_head\n{decode(record.codes[:bases])}\n")
    started = time.perf_counter()
    genoformer(
        argv(
            "annotate --checkpoint {model} --inputs {fasta} --out {gff3} --device cpu --overwrite",
            model=GENE_MODEL,
            fasta=work / "head.fasta",
            gff3=work / "head.gff3",
        )
    )
    return {
        "torch_threads": torch.get_num_threads(),
        "finetune_sequences": rows,
        "finetune_steps": steps,
        "finetune_seconds": finetune_seconds,
        "annotate_bases": bases,
        "annotate_bases_per_second": bases / (time.perf_counter() - started),
    }


def arguments(parser) -> None:
    parser.add_argument(
        "--task", choices=("splice", "tf", "genes", "cpu"), default="splice", help="what this run measures"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        help="variants of the task (default: full lora linear_probe from_scratch; "
        f"genes: full_8k); of {', '.join([*SEQUENCE_VARIANTS, *GENE_VARIANTS])}",
    )
    parser.add_argument("--prepared", type=Path, default=REPO_ROOT / ".device" / "data", help="what `prepare` wrote")
    parser.add_argument("--direction", default="ecoli_draft:leptospira", help="genes: TRAIN:TEST genomes")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--gene_steps", type=int, default=1000)
    parser.add_argument("--export", type=Path, help="genes: write the full_8k gene model here (the shipped format)")


def measure(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if args.task == "cpu" or args.smoke:
            return {
                "cpu": {
                    **cpu_targets(Path(tmp), args.smoke),
                    "environment": describe_environment("cpu"),
                    "command": command_line(),
                }
            }
        default = ["full_8k"] if args.task == "genes" else ["full", "lora", "linear_probe", "from_scratch"]
        return {
            args.task: {
                variant: run_variant(args, args.task, variant, Path(tmp)) for variant in args.variants or default
            }
        }


def _where(result: dict) -> str:
    return " (2-core CPU)" if result["environment"]["device_type"] == "cpu" else ""


def summarize(data: dict) -> Summary:
    baselines = (data.get("baselines") or {}).get("tasks", {})
    tables, targets = [], []
    for task, metric in (("splice", "accuracy"), ("tf", "auroc")):
        rows = [
            {
                "model": f"genoformer, {name.replace('_', ' ')}{_where(r)}",
                f"test {metric}": r["test"].get(metric),
                "test MCC": r["test"].get("mcc"),
                "steps": r["steps"],
            }
            for name, r in data.get(task, {}).items()
            if name != "full_last" or "full_last_lr5e-4" not in data[task]
        ]  # the same recipe at a tuned rate
        models = baselines.get(task, {}).get("models", {})
        rows += [
            {
                "model": f"{name.replace('_', ' ')} (CPU)",
                f"test {metric}": (m.get("fold0") or m)[metric],
                "test MCC": (m.get("fold0") or m)["mcc"],
            }
            for name, m in models.items()
        ]
        if rows:
            tables.append(
                table(
                    rows,
                    {
                        "splice": "Splice junctions (StatLog, fold 0 of 5: 2,549 train / 637 test)",
                        "tf": "TF binding (Oct4 vs MafK, the package's test split: 100 + 100)",
                    }[task],
                )
            )
    if data.get("genes"):
        rows = [
            {
                "model": f"genoformer {name}",
                "coding MCC": r["evaluation"]["coding_mcc"],
                "genes: strand + stop": r["evaluation"]["genes"]["stop_and_strand"],
                "genes: start + stop": r["evaluation"]["genes"]["start_and_stop"],
                "annotate bases/s": round(r["evaluation"]["annotate_bases_per_second"]),
            }
            for name, r in data["genes"].items()
        ]
        genome = next(iter(data["genes"].values()))["evaluation"]["genome"]
        for name, m in baselines.get("genes", {}).get("genomes", {}).get(genome, {}).get("models", {}).items():
            rows.append(
                {
                    "model": f"{name.replace('_', ' ')} (CPU, 1 thread)",
                    "coding MCC": m["per_base_coding_mcc"],
                    "genes: strand + stop": m["agreement"]["stop_and_strand"],
                    "genes: start + stop": m["agreement"]["start_and_stop"],
                    "annotate bases/s": round(m["bases_per_second"]),
                }
            )
        tables.append(table(rows, f"Gene annotation (trained on another genome, tested on the whole {genome})"))
    if "cpu" in data:
        cpu = data["cpu"]
        tables.append(
            table(
                [
                    {
                        "command": "finetune",
                        "input": f"{cpu['finetune_sequences']} x 60 nt, {cpu['finetune_steps']} steps",
                        "seconds": cpu["finetune_seconds"],
                    },
                    {
                        "command": "annotate",
                        "input": f"{cpu['annotate_bases']:,} bases",
                        "seconds": cpu["annotate_bases"] / cpu["annotate_bases_per_second"],
                    },
                ],
                f"The commands as typed on the CPU ({cpu['torch_threads']} threads, start-up included)",
            )
        )
        targets += [
            at_most(
                f"CPU: `finetune` of {cpu['finetune_sequences']} x 60 nt, {cpu['finetune_steps']} steps, in at "
                "most 10 min",
                cpu["finetune_seconds"] / 60,
                10.0,
                " min",
            ),
            at_least(
                f"CPU: `annotate` at least 1,000 bases/s ({cpu['torch_threads']} threads)",
                cpu["annotate_bases_per_second"],
                1000.0,
                " bases/s",
            ),
        ]
    for task, metric, classical in (
        ("tf", "auroc", "kmer_logistic_regression"),
        ("splice", "accuracy", "kmer_logistic_regression"),
    ):
        best = max((r["test"].get(metric, 0.0) for r in data.get(task, {}).values()), default=None)
        kmer = baselines.get(task, {}).get("models", {}).get(classical)
        if best is not None and kmer is not None:
            targets.append(
                at_least(
                    f"{task}: fine-tuned beats k-mer regression (best {metric} ÷ k-mer's)",
                    best / (kmer.get("fold0") or kmer)[metric],
                    1.0 + 1e-9,
                    "x",
                )
            )
    return Summary(tables=tables, targets=targets)


BENCHMARK = Benchmark(
    "finetune",
    "Fine-tuning: pretrained genoformer against classical tools and from scratch",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=join,
    module="benchmarks.finetune_bench",
    name_of=lambda args: f"finetune_{'cpu' if args.smoke else args.task}",
    baseline="the same architecture from scratch; k-mer and one-hot logistic regression and pyrodigal "
    "on the same splits (finetune_baselines, joined)",
)

if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"]:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m benchmarks.finetune_bench prepare")
        parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared-extra")
        parser.add_argument("--prepared", type=Path, default=REPO_ROOT / ".device" / "data")
        options = parser.parse_args(sys.argv[2:])
        prepare(options.data, options.prepared)
    else:
        BENCHMARK.main()
