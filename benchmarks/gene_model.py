"""The gene model against pyrodigal on a genome held out whole (BENCHMARKS.md, "Gene model against pyrodigal").

One pipeline, through the `genoformer` commands a user types:

1. `genoformer fit --config configs/finetune_genes_gpu.yaml` on the training genomes (the
   recipe's early stopping keeps checkpoints/best.ckpt, the lowest validation loss);
2. `genoformer export` of best.ckpt (bfloat16, the shipped format) into OUT;
3. `genoformer annotate` of the held-out genome with it, and with the baseline model (the shipped
   examples/genoformer_gene_annotator.ckpt, measured in the same run);
4. pyrodigal in metagenomic mode on the same genome (one CPU thread), written as GFF3;
5. `genoformer compare_genes` of the three against the held-out genome's own annotation:
   OUT/genes_table.tsv, and the result file OUT/gene_model.json (the table, the targets: per-base
   coding MCC within 0.05 of pyrodigal's, at least 85% of the reference genes with the right
   strand and stop), printed.

    python -m benchmarks.gene_model --train ../shared-extra/genomes/ecoli_draft_prokka.gff3.gz \\
        --test ../shared-extra/genomes/leptospira_kirschneri_h1.gbk.gz --out /tmp/genes
    bash benchmarks/gpu_genome.sh gene_model   # the same on the GPU machine, within 8 minutes

The E. coli draft's annotation is Prodigal's (Prokka), so it trains and the Leptospira genome,
annotated by NCBI's pipeline, is the test: a test genome annotated by Prodigal would favour
pyrodigal. `--fit_option` passes further `genoformer fit` options (the CPU test runs the same
pipeline at tiny size with them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmarks.common import Benchmark, Summary, argv, at_least, last_logged_step, table

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "finetune_genes_gpu.yaml"
PRETRAINED = REPO / "examples" / "genoformer_dna.ckpt"
SHIPPED = REPO / "examples" / "genoformer_gene_annotator.ckpt"


def pyrodigal_gff3(genome: Path, out: Path) -> tuple[Path, float]:
    """pyrodigal (metagenomic mode, one thread) on every record of `genome`, as GFF3; the seconds
    it took."""
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.annotations import Gene, write_gff3
    from genoformer.data.genome.inputs import read_sequences

    from benchmarks.finetune_baselines import pyrodigal_genes

    contigs = [(record.name, decode(record.codes)) for record in read_sequences([genome])]
    run = pyrodigal_genes(contigs, meta=True)
    genes = [Gene(g.contig, g.start, g.end, g.strand, "CDS") for g in run.genes]
    return write_gff3(
        out, genes, contigs=[(name, len(sequence)) for name, sequence in contigs], source="pyrodigal", overwrite=True
    ), run.seconds


def measure(args: argparse.Namespace) -> dict:
    """The pipeline above; its data: the comparison's rows (one per GFF3) and the seconds."""
    from genoformer.cli import main

    out, run_dir = Path(args.out), Path(args.run)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    began = time.perf_counter()
    fit = "fit --config {config} --trainer.default_root_dir {run} --model.init_args.pretrained {model} "
    fit += "--data.init_args.train {train}" + " --trainer.max_steps {steps}" * bool(args.max_steps)
    fit += " --trainer.max_time {time}" * bool(args.max_time)
    main(
        argv(
            fit,
            config=args.config,
            run=run_dir,
            model=args.pretrained,
            train=json.dumps(args.train),
            steps=args.max_steps,
            time=args.max_time,
        )
        + args.fit_option
    )
    train_seconds = time.perf_counter() - began
    model = out / "genoformer_gene_annotator.ckpt"
    main(
        argv(
            "export --checkpoint {best} --out {model} --dtype bfloat16 --overwrite",
            best=run_dir / "checkpoints" / "best.ckpt",
            model=model,
        )
    )
    shutil.copyfile(run_dir / "metrics.csv", out / "metrics.csv")
    name = Path(args.test).name.split(".")[0]
    predicted = []
    for label, checkpoint in (("genoformer", model), ("shipped", args.baseline or None)):
        if checkpoint is None:
            continue
        gff3 = out / f"{name}_{label}.gff3"
        main(
            argv(
                "annotate --checkpoint {model} --inputs {test} --out {gff3} --overwrite",
                model=checkpoint,
                test=args.test,
                gff3=gff3,
            )
            + args.annotate_option
        )
        predicted.append(str(gff3))
    gff3, pyrodigal_seconds = pyrodigal_gff3(Path(args.test), out / f"{name}_pyrodigal.gff3")
    predicted.append(str(gff3))
    table_tsv = str(out / "genes_table.tsv")
    main(["compare_genes", "--reference", str(args.test), "--predicted", *predicted, "--out", table_tsv, "--overwrite"])
    print(f"training took {train_seconds:.0f} s; results in {out}", flush=True)
    return {
        "train": args.train,
        "test": args.test,
        "train_seconds": train_seconds,
        "steps": last_logged_step(out / "metrics.csv") + 1,  # logged 0-based
        "pyrodigal_seconds": pyrodigal_seconds,
        "rows": _rows(out / "genes_table.tsv"),
    }


def _rows(table: Path) -> list[dict[str, str]]:
    header, *lines = [line.split("\t") for line in table.read_text().splitlines()]
    return [dict(zip(header, line)) for line in lines]


def summarize(data: dict) -> Summary:
    """The comparison table, and the two targets of the new model against pyrodigal (meta)."""
    rows = [
        {
            "calls": Path(row["predicted"]).stem.rsplit("_", 1)[-1],
            **{
                key: float(row[key])
                for key in ("coding_mcc", "strand_coding_mcc", "recall_stop", "precision_stop", "recall_start_stop")
            },
            "genes called": int(row["predicted_genes"]),
            "reference genes": int(row["reference_genes"]),
        }
        for row in data["rows"]
    ]
    by_calls = {row["calls"]: row for row in rows}
    new, pyrodigal = by_calls.get("genoformer"), by_calls.get("pyrodigal")
    gap = None if new is None or pyrodigal is None else new["coding_mcc"] - pyrodigal["coding_mcc"]
    return Summary(
        tables=[
            table(
                rows,
                caption=f"{Path(data['test']).name} held out whole; trained on "
                f"{', '.join(Path(t).name for t in data['train'])}",
            )
        ],
        targets=[
            at_least(
                "genes: per-base coding MCC within 0.05 of pyrodigal (meta)",
                gap,
                -0.05,
                measured=None if gap is None else f"{new['coding_mcc']:.3f} vs {pyrodigal['coding_mcc']:.3f}",
            ),
            at_least(
                "genes: at least 85% of reference genes with the right strand and stop",
                None if new is None else new["recall_stop"],
                0.85,
            ),
        ],
        notes=[
            f"fine-tuned {data['steps']} steps in {data['train_seconds']:.0f} s; pyrodigal took "
            f"{data['pyrodigal_seconds']:.1f} s on one thread"
        ],
    )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--train", nargs="+", required=True, help="annotated genomes to train on (GFF3 with ##FASTA, GenBank)"
    )
    parser.add_argument(
        "--test", required=True, help="the annotated genome held out whole (GenBank, or GFF3 with ##FASTA)"
    )
    parser.add_argument("--run", default="/tmp/gene_model_run", help="the training run directory (left out of OUT)")
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--pretrained", default=str(PRETRAINED))
    parser.add_argument("--baseline", default=str(SHIPPED), help="a gene model to set beside the new one ('' for none)")
    parser.add_argument("--max_steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--max_time", default=None, help="a bound on training time, DD:HH:MM:SS (Lightning's max_time)")
    parser.add_argument(
        "--fit_option",
        nargs=argparse.REMAINDER,
        default=[],
        help="further `genoformer fit` options (last on the command line)",
    )
    parser.add_argument("--annotate_option", action="append", default=[], help="a further `genoformer annotate` option")


BENCHMARK = Benchmark(
    "gene_model",
    "Gene model against pyrodigal on a genome held out whole",
    __doc__,
    measure,
    summarize,
    baseline="pyrodigal (meta) and the shipped gene model on the same genome, same run",
    arguments=arguments,
)

if __name__ == "__main__":
    BENCHMARK.main()
