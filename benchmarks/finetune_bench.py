"""Fine-tuning benchmarks (BENCHMARKS.md "Fine-tuning"): the pretrained genoformer fine-tuned
through `genoformer finetune` on real labels, against the same architecture trained from scratch,
and (beside it, from benchmarks/finetune_baselines.py) k-mer logistic regression and pyrodigal.

Three tasks, each measured on data the model never trained on:

- splice: StatLog primate splice junctions (3,186 x 60 nt; donor / acceptor / neither), the
  fixed 80/20 split of fold 0 of `finetune_baselines.splice_folds` (identical sequences on one
  side); validation is a leak-free tenth of the training part; test accuracy.
- tf: Oct4 (1) vs MafK (0) binding sites (200 bp), the package's own test split; test AUROC.
- genes: per-base gene classes learned on one annotated genome (a tenth held out as regions for
  validation), then a whole genome of another phylum annotated with `GeneAnnotator`: per-base
  coding MCC, and the share of reference genes called with the right strand and stop (and start).

Variants per sequence task: full fine-tuning, LoRA (rank 8), linear probe (frozen trunk) and
from scratch (the pretrained architecture, random weights), at the same number of steps; genes:
full fine-tuning at an 8,192 and a 1,024 base window, and from scratch at 8,192.

Two stages, because the split needs scikit-learn, which the GPU machine lacks:

    python -m benchmarks.finetune_bench prepare --data ../shared-extra --prepared .device/data
    python -m benchmarks.finetune_bench run --prepared .device/data --tasks splice tf --runs /tmp/ft \\
        --out benchmarks/results          # on the GPU (benchmarks/gpu_finetune.sh)
    python -m benchmarks.finetune_bench cpu      # the CPU targets: a small finetune, annotate speed
    python -m benchmarks.finetune_bench figure   # docs/gene_annotation_tracks.png
    python -m benchmarks.finetune_bench report --out benchmarks/results   # tables into BENCHMARKS.md

`run` writes finetune_<task>.json per task (merged over earlier runs of other variants) and, with
--export, the fine-tuned gene model in the shipped format.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table, publish, write_json_file

REPO = Path(__file__).resolve().parents[1]
PRETRAINED = REPO / "examples" / "genoformer_dna.ckpt"
SPLICE_TABLE = REPO / "examples" / "splice_junctions_statlog.tsv"
GENOMES = {
    "ecoli_draft": "genomes/ecoli_draft_prokka.gff3.gz",
    "leptospira": "genomes/leptospira_kirschneri_h1.gbk.gz",
}
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


# ------------------------------------------------------------------------------------ prepare
def _write_table(path: Path, sequences: Sequence[str], labels: Sequence[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["sequence", "label"])
        writer.writerows(zip(sequences, labels))


def prepare(data: Path, prepared: Path) -> None:
    """Write the splits as files the `finetune` command reads, and copy the genomes."""
    from benchmarks.finetune_baselines import read_splice_table, splice_folds
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.inputs import read_sequences

    seqs, labels = read_splice_table(SPLICE_TABLE)
    train, test = splice_folds(seqs, labels, folds=5, seed=0)[0]
    _write_table(prepared / "splice_train.tsv", [seqs[i] for i in train], [labels[i] for i in train])
    _write_table(prepared / "splice_test.tsv", [seqs[i] for i in test], [labels[i] for i in test])
    for part in ("train", "test"):
        rows = [(decode(r.codes), label) for name, label in (("oct4", 1), ("mafk", 0))
                for r in read_sequences([data / "labeled" / "tf_binding" / f"{name}_{part}.fasta"])]
        _write_table(prepared / f"tf_{part}.tsv", [s for s, _ in rows], [label for _, label in rows])
    for relative in GENOMES.values():
        (prepared / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data / relative, prepared / relative)
    print(f"prepared {prepared}: splice fold 0 ({len(train)} / {len(test)}), tf, {len(GENOMES)} genomes")


# ------------------------------------------------------------------------------------ run
def _test_metrics(run_dir: Path) -> dict[str, float]:
    """The last row of `<run>/test/metrics.csv` with a value, as floats."""
    with open(run_dir / "test" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    values: dict[str, float] = {}
    for row in rows:
        values.update({key: float(value) for key, value in row.items() if value not in ("", None) and key.startswith("test/")})
    return {key.removeprefix("test/"): value for key, value in values.items()}


def run_sequence_task(task: str, variant: str, prepared: Path, runs: Path, steps: int, batch_size: int) -> dict:
    from genoformer.genome.commands import finetune

    out = runs / f"{task}_{variant}"
    shutil.rmtree(out, ignore_errors=True)
    options = dict(SEQUENCE_VARIANTS[variant])
    started = time.perf_counter()
    finetune(pretrained=PRETRAINED, task="classify", train=[str(prepared / f"{task}_train.tsv")],
             test=[str(prepared / f"{task}_test.tsv")], out=out, max_steps=steps, batch_size=batch_size,
             val_every=max(1, steps // 4), **options)
    seconds = time.perf_counter() - started
    metrics = _test_metrics(out)
    print(f"{task} {variant}: {metrics} in {seconds:.0f} s", flush=True)
    return {"test": metrics, "steps": steps, "batch_size": batch_size, "seconds": seconds, "options": options}


def evaluate_annotator(checkpoint: Path, genome: Path, window: int) -> dict:
    """Annotate a whole genome with a fine-tuned model and score it against its annotation."""
    from genoformer.data.genome.annotations import read_annotated_genomes
    from genoformer.genome.genecalls import call_genes, decode_labels, gene_agreement, per_base_coding_mcc, strand_coding_mcc
    from genoformer.genome.predict import GeneAnnotator

    contigs = read_annotated_genomes([genome], progress=False)
    annotator = GeneAnnotator.from_checkpoint(checkpoint)
    labels, predicted, reference_genes, called = [], [], [], []
    seconds = 0.0
    for contig in contigs:
        if annotator.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        probabilities = annotator.probabilities(contig.codes, window=window, batch_size=16 if window > 2048 else 128)
        if annotator.device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - started
        labels.append(contig.labels)
        predicted.append(decode_labels(probabilities))
        reference_genes += [g for g in contig.genes if g.kind == "CDS"]
        called += [g for g in call_genes(contig.codes, probabilities, contig=contig.name) if g.kind == "CDS"]
    reference, prediction = np.concatenate(labels), np.concatenate(predicted)
    bases = int(reference.size)
    return {
        "genome": genome.name, "contigs": len(contigs), "bases": bases,
        "coding_mcc": per_base_coding_mcc(reference, prediction),
        "strand_coding_mcc": strand_coding_mcc(reference, prediction),
        "genes": gene_agreement(reference_genes, called),
        "annotate_bases_per_second": bases / seconds, "device": str(annotator.device),
    }


def run_genes(variant: str, train: str, test: str, prepared: Path, runs: Path, steps: int,
              export_to: Path | None) -> dict:
    from genoformer.core.export import export
    from genoformer.genome.commands import finetune

    out = runs / f"genes_{variant}_{train}"
    shutil.rmtree(out, ignore_errors=True)
    options = dict(GENE_VARIANTS[variant])
    window = options["window"]
    started = time.perf_counter()
    finetune(pretrained=PRETRAINED, task="annotate", train=[str(prepared / GENOMES[train])], out=out,
             max_steps=steps, val_every=max(1, steps // 4), **options)
    seconds = time.perf_counter() - started
    # the recipe keeps one checkpoint by validation loss (save_top_k: 1) beside last.ckpt
    (best,) = [p for p in (out / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    result = {"train": train, "test": test, "steps": steps, "train_seconds": seconds, "options": options,
              "evaluation": evaluate_annotator(best, prepared / GENOMES[test], window)}
    print(f"genes {variant} {train} -> {test}: {result['evaluation']}", flush=True)
    if export_to is not None:
        export(checkpoint=best, out=export_to, dtype="bfloat16", overwrite=True)
        result["exported"] = str(export_to)
    return result


def _merge(path: Path, key: str, result: dict, env: dict, command: str) -> None:
    summary = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    summary["runs"][key] = {**result, "environment": env, "command": command}
    write_json_file(path, summary)


def run(args: argparse.Namespace) -> None:
    env = describe_environment("cuda" if torch.cuda.is_available() else "cpu")
    command = command_line()
    args.out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        if task == "genes":
            for variant in args.gene_variants:
                for train, test in args.directions:
                    export_to = args.export if variant == "full_8k" and train == args.directions[0][0] else None
                    result = run_genes(variant, train, test, args.prepared, args.runs, args.gene_steps, export_to)
                    _merge(args.out / "finetune_genes.json", f"{variant}:{train}->{test}", result, env, command)
            continue
        for variant in args.variants:
            result = run_sequence_task(task, variant, args.prepared, args.runs, args.steps, args.batch_size)
            _merge(args.out / f"finetune_{task}.json", variant, result, env, command)


# ------------------------------------------------------------------------------------ cpu
GENE_MODEL = REPO / "examples" / "genoformer_gene_annotator.ckpt"


def cpu_targets(runs: Path, out: Path, steps: int, bases: int) -> dict:
    """The issue's CPU targets, timed here: `finetune` of 100 sequences of 60 nt for `steps`
    steps through the command line, and `annotate` throughput of the shipped gene model on the
    first `bases` bases of the shipped E. coli K-12 genome (both with their start-up)."""
    from genoformer.cli import main as genoformer

    runs.mkdir(parents=True, exist_ok=True)
    with open(SPLICE_TABLE) as handle:
        header, *rows = handle.read().splitlines()
    _write_table(runs / "small_train.tsv", *zip(*(row.split("\t") for row in rows[:100])))
    _write_table(runs / "small_val.tsv", *zip(*(row.split("\t") for row in rows[-100:])))
    shutil.rmtree(runs / "small", ignore_errors=True)
    started = time.perf_counter()
    genoformer(["finetune", "--pretrained", str(PRETRAINED), "--task", "classify", "--train", str(runs / "small_train.tsv"),
                "--val", str(runs / "small_val.tsv"), "--out", str(runs / "small"), "--max_steps", str(steps),
                "--device", "cpu", "--leaks", "drop"])
    finetune_seconds = time.perf_counter() - started
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.inputs import read_sequences

    (record,) = read_sequences(REPO / "examples" / "ecoli_k12_mg1655.fasta.gz")
    (runs / "ecoli_head.fasta").write_text(f">ecoli_head\n{decode(record.codes[:bases])}\n")
    started = time.perf_counter()
    genoformer(["annotate", "--checkpoint", str(GENE_MODEL), "--inputs", str(runs / "ecoli_head.fasta"),
                "--out", str(runs / "ecoli_head.gff3"), "--device", "cpu", "--overwrite"])
    annotate_seconds = time.perf_counter() - started
    result = {"environment": describe_environment("cpu"), "command": command_line(), "torch_threads": torch.get_num_threads(),
              "finetune": {"sequences": 100, "length": 60, "steps": steps, "seconds": finetune_seconds},
              "annotate": {"bases": bases, "seconds": annotate_seconds, "bases_per_second": bases / annotate_seconds}}
    write_json_file(out / "finetune_cpu.json", result)
    print(json.dumps(result, indent=1))
    return result


# ------------------------------------------------------------------------------------ figures
def _gene_boxes(ax: Any, genes: Sequence[Any], start: int, end: int, y: float, color: str) -> None:
    for gene in genes:
        if gene.kind == "CDS" and gene.end > start and gene.start < end:
            row = y + (0.12 if gene.strand > 0 else -0.12)
            ax.plot([max(gene.start, start) / 1e3, min(gene.end, end) / 1e3], [row, row], color=color, linewidth=5,
                    solid_capstyle="butt")


def gene_tracks_figure(genome: Path, path: Path, *, length: int = 30_000, window: int = 8192) -> Path:
    """The shipped gene model on the first `length` bases of the longest contig of an annotated
    genome it never saw: P(coding) on each strand, its gene calls, the reference genes and
    pyrodigal's (meta) calls, as a PNG."""
    import pyrodigal
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.annotations import CDS_MINUS, CDS_PLUS, Gene, read_annotated_genomes
    from genoformer.genome.genecalls import call_genes
    from genoformer.genome.predict import GeneAnnotator

    contig = max(read_annotated_genomes([genome], progress=False), key=lambda c: len(c.codes))
    codes = contig.codes[:length]
    probabilities = GeneAnnotator.from_checkpoint(GENE_MODEL).probabilities(codes, window=min(window, length))
    called = call_genes(codes, probabilities, contig=contig.name)
    finder = pyrodigal.GeneFinder(meta=True)
    prodigal = [Gene(contig.name, g.begin - 1, g.end, g.strand, "CDS") for g in finder.find_genes(decode(codes))]
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[2, 1.4])
    x = np.arange(length) / 1e3
    top.plot(x, probabilities[:, CDS_PLUS], color="tab:blue", linewidth=0.8, label="P(CDS+)")
    top.plot(x, -probabilities[:, CDS_MINUS], color="tab:red", linewidth=0.8, label="-P(CDS-)")
    top.set_ylabel("coding probability\n(+ strand up, - down)")
    top.legend(loc="upper right", ncol=2)
    top.grid(alpha=0.3)
    for y, genes, color in ((2, contig.genes, "black"), (1, called, "tab:green"), (0, prodigal, "tab:purple")):
        _gene_boxes(bottom, genes, 0, length, y, color)
    bottom.set_yticks([2, 1, 0], ["reference (NCBI PGAP)", "genoformer calls", "pyrodigal meta"])
    bottom.set_ylim(-0.5, 2.5)
    bottom.set_xlabel(f"{contig.name} (kb); genes above a row's line are on +, below on -")
    top.set_title(f"{GENE_MODEL.name} on {genome.name}, never seen in training")
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path


# ------------------------------------------------------------------------------------ report
def _runs(out: Path, task: str) -> dict:
    path = out / f"finetune_{task}.json"
    return json.loads(path.read_text())["runs"] if path.is_file() else {}


def _commands(runs: dict) -> str:
    """The distinct commands behind a table's rows."""
    return "Commands: " + "; ".join(f"`{c}`" for c in dict.fromkeys(r["command"] for r in runs.values())) + "\n\n"


def _sequence_table(runs: dict, metric: str, classical: list[list[Any]]) -> str:
    rows = [[f"genoformer, {name.replace('_', ' ')}" + (" (2-core CPU)" if result["environment"]["device_type"] == "cpu" else ""),
             result["test"].get(metric), result["test"].get("mcc"), result["steps"], result["seconds"]]
            for name, result in runs.items()]
    return _table(["model", f"test {metric}", "test MCC", "steps", "seconds (with start-up)"], rows + classical)


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    return markdown_table([dict(zip(columns, row)) for row in rows], columns)


def report(out: Path, markdown: Path | None) -> None:
    """BENCHMARKS.md "Fine-tuning" from the result files of `run` and of finetune_baselines."""
    measured = json.loads((out / "finetune_baselines.json").read_text())
    baselines, baselines_date = measured["tasks"], measured["environment"]["date_utc"]
    splice, tf, genes = _runs(out, "splice"), _runs(out, "tf"), _runs(out, "genes")
    if not (splice or tf or genes):
        raise FileNotFoundError(f"no finetune_*.json in {out}: run `python -m benchmarks.finetune_bench run` first")
    first = next(iter({**splice, **tf, **genes}.values()))
    sections = [environment_markdown(first["environment"], "python -m benchmarks.finetune_bench report")
                + "; the classical rows: `python -m benchmarks.finetune_baselines --tasks splice tf genes` on the "
                f"2-core CPU ({baselines_date}). The GPU rows' commands are given per table."]
    if splice:
        models = baselines["splice"]["models"]
        classical = [[f"{name.replace('_', ' ')} (CPU)", models[name]["fold0"]["accuracy"], models[name]["fold0"]["mcc"],
                      None, models[name]["fold0"]["fit_seconds"]]
                     for name in ("kmer_logistic_regression", "stranded_kmer_logistic_regression", "onehot_logistic_regression")]
        sections.append("**Splice junctions** (StatLog, fold 0 of 5: 2,549 train / 637 test, grouped by sequence)\n\n"
                        + _commands(splice) + _sequence_table(splice, "accuracy", classical))
    if tf:
        kmer = baselines["tf"]["models"]["kmer_logistic_regression"]
        classical = [["k-mer logistic regression (CPU)", kmer["auroc"], kmer["mcc"], None, kmer["fit_seconds"]]]
        sections.append("**TF binding** (Oct4 vs MafK, the package's test split: 100 + 100)\n\n"
                        + _commands(tf) + _sequence_table(tf, "auroc", classical))
    if genes:
        rows = []
        for name, result in genes.items():
            evaluation = result["evaluation"]
            rows.append([f"genoformer {name}", evaluation["coding_mcc"], evaluation["genes"]["stop_and_strand"],
                         evaluation["genes"]["start_and_stop"], evaluation["genes"]["n_predicted"],
                         evaluation["annotate_bases_per_second"]])
            test_genome = Path(GENOMES[result["test"]]).name
        for model, scores in baselines["genes"]["genomes"][test_genome]["models"].items():
            agreement = scores["agreement"]
            rows.append([f"{model.replace('_', ' ')} (CPU, 1 thread)", scores["per_base_coding_mcc"],
                         agreement["stop_and_strand"], agreement["start_and_stop"], agreement["n_predicted"],
                         scores["bases_per_second"]])
        n_reference = next(iter(genes.values()))["evaluation"]["genes"]["n_reference"]
        sections.append(f"**Gene annotation** (trained on the E. coli draft, tested on the whole {test_genome}, "
                        f"{n_reference:,} reference CDS)\n\n" + _commands(genes) + _table(
                            ["model", "per-base coding MCC", "genes: strand + stop", "genes: start + stop",
                             "genes called", "annotate bases/s"], rows))
    cpu_path = out / "finetune_cpu.json"
    if cpu_path.is_file():
        cpu = json.loads(cpu_path.read_text())
        sections.append(
            f"**CPU targets** (`{cpu['command']}`, {cpu['environment']['cpu']}, {cpu['torch_threads']} threads, "
            f"{cpu['environment']['date_utc']}; both through the command line, start-up included)\n\n" + _table(
                ["what", "measured", "target"],
                [[f"`finetune`, {cpu['finetune']['sequences']} sequences of {cpu['finetune']['length']} nt, "
                  f"{cpu['finetune']['steps']} steps (with validation)", f"{cpu['finetune']['seconds'] / 60:.1f} min", "<= 10 min"],
                 [f"`annotate`, {cpu['annotate']['bases']:,} bases of E. coli K-12, 8,192-base windows",
                  f"{cpu['annotate']['bases_per_second']:,.0f} bases/s", ">= 1,000 bases/s"]]))
    sections.append("![the shipped gene model on the first 30 kb of an unseen genome](docs/gene_annotation_tracks.png)")
    text = "\n\n".join(sections)
    publish(out, "finetune", {"tasks": [t for t, r in (("splice", splice), ("tf", tf), ("genes", genes)) if r]},
            text, markdown, "finetune")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stages = parser.add_subparsers(dest="stage", required=True)
    p = stages.add_parser("prepare", help="write the splits (needs scikit-learn)")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared-extra")
    p.add_argument("--prepared", type=Path, default=REPO / ".device" / "data")
    r = stages.add_parser("run", help="fine-tune and evaluate")
    r.add_argument("--prepared", type=Path, default=REPO / ".device" / "data")
    r.add_argument("--tasks", nargs="+", choices=["splice", "tf", "genes"], default=["splice", "tf", "genes"])
    r.add_argument("--variants", nargs="+", choices=list(SEQUENCE_VARIANTS), default=list(SEQUENCE_VARIANTS))
    r.add_argument("--gene_variants", nargs="+", choices=list(GENE_VARIANTS), default=["full_8k"])
    r.add_argument("--directions", nargs="+", type=lambda text: tuple(text.split(":")),
                   default=[("ecoli_draft", "leptospira")], help="TRAIN:TEST genome pairs")
    r.add_argument("--steps", type=int, default=1000)
    r.add_argument("--batch_size", type=int, default=64)
    r.add_argument("--gene_steps", type=int, default=1000)
    r.add_argument("--runs", type=Path, default=Path("/tmp/finetune_runs"))
    r.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    r.add_argument("--export", type=Path, default=None, help="write the first direction's full_8k gene model here")
    c = stages.add_parser("cpu", help="the CPU targets: a small finetune and annotate throughput")
    c.add_argument("--runs", type=Path, default=Path("/tmp/finetune_cpu"))
    c.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    c.add_argument("--steps", type=int, default=300)
    c.add_argument("--bases", type=int, default=100_000)
    f = stages.add_parser("figure", help="the gene-track picture of the shipped gene model (needs pyrodigal)")
    f.add_argument("--genome", type=Path, default=REPO / ".device" / "data" / GENOMES["leptospira"])
    f.add_argument("--png", type=Path, default=REPO / "docs" / "gene_annotation_tracks.png")
    m = stages.add_parser("report", help="write BENCHMARKS.md's Fine-tuning section")
    m.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    m.add_argument("--markdown", type=Path, default=REPO / "BENCHMARKS.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.stage == "prepare":
        prepare(args.data, args.prepared)
    elif args.stage == "run":
        run(args)
    elif args.stage == "cpu":
        cpu_targets(args.runs, args.out, args.steps, args.bases)
    elif args.stage == "figure":
        gene_tracks_figure(args.genome, args.png)
    else:
        report(args.out, args.markdown)


if __name__ == "__main__":
    main()
