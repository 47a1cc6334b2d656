"""The gene model against pyrodigal on a genome held out whole (BENCHMARKS.md, "Fine-tuning").

One pipeline, through the `genoformer` commands a user types:

1. `genoformer fit --config configs/finetune_genes_gpu.yaml` on the training genomes (the
   recipe's early stopping keeps checkpoints/best.ckpt, the lowest validation loss);
2. `genoformer export` of best.ckpt (bfloat16, the shipped format) into OUT;
3. `genoformer annotate` of the held-out genome with it, and with the baseline model (the shipped
   examples/genoformer_gene_annotator.ckpt, measured in the same run);
4. pyrodigal in metagenomic mode on the same genome (one CPU thread), written as GFF3;
5. `genoformer compare_genes` of the three against the held-out genome's own annotation:
   OUT/genes_table.tsv and .json, printed.

    python -m benchmarks.gene_model --train ../shared-extra/genomes/ecoli_draft_prokka.gff3.gz \\
        --test ../shared-extra/genomes/leptospira_kirschneri_h1.gbk.gz --out /tmp/genes
    bash benchmarks/gpu_gene_model.sh          # the same on the GPU machine, within 8 minutes

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
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "finetune_genes_gpu.yaml"
PRETRAINED = REPO / "examples" / "genoformer_dna.ckpt"
SHIPPED = REPO / "examples" / "genoformer_gene_annotator.ckpt"


def pyrodigal_gff3(genome: Path, out: Path) -> tuple[Path, float]:
    """pyrodigal (metagenomic mode, one thread) on every record of `genome`, as GFF3; the seconds
    it took."""
    from benchmarks.finetune_baselines import pyrodigal_genes
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.annotations import Gene, write_gff3
    from genoformer.data.genome.inputs import read_sequences

    contigs = [(record.name, decode(record.codes)) for record in read_sequences([genome])]
    run = pyrodigal_genes(contigs, meta=True)
    genes = [Gene(g.contig, g.start, g.end, g.strand, "CDS") for g in run.genes]
    return write_gff3(out, genes, contigs=[(name, len(sequence)) for name, sequence in contigs],
                      source="pyrodigal", overwrite=True), run.seconds


def run(args: argparse.Namespace) -> dict:
    from genoformer.cli import main

    out, run_dir = Path(args.out), Path(args.run)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    began = time.perf_counter()
    main(["fit", "--config", str(args.config), "--trainer.default_root_dir", str(run_dir),
          "--model.init_args.pretrained", str(args.pretrained), "--data.init_args.train", json.dumps(args.train),
          *(["--trainer.max_steps", str(args.max_steps)] if args.max_steps else []),
          *(["--trainer.max_time", args.max_time] if args.max_time else []), *args.fit_option])
    train_seconds = time.perf_counter() - began
    model = out / "genoformer_gene_annotator.ckpt"
    main(["export", "--checkpoint", str(run_dir / "checkpoints" / "best.ckpt"), "--out", str(model),
          "--dtype", "bfloat16", "--overwrite"])
    shutil.copyfile(run_dir / "metrics.csv", out / "metrics.csv")
    name = Path(args.test).name.split(".")[0]
    predicted = []
    for label, checkpoint in (("genoformer", model), ("shipped", args.baseline)):
        if checkpoint is None:
            continue
        gff3 = out / f"{name}_{label}.gff3"
        main(["annotate", "--checkpoint", str(checkpoint), "--inputs", str(args.test), "--out", str(gff3),
              "--overwrite", *args.annotate_option])
        predicted.append(str(gff3))
    gff3, pyrodigal_seconds = pyrodigal_gff3(Path(args.test), out / f"{name}_pyrodigal.gff3")
    predicted.append(str(gff3))
    main(["compare_genes", "--reference", str(args.test), "--predicted", *predicted,
          "--out", str(out / "genes_table.tsv"), "--overwrite"])
    rows = _rows(out / "genes_table.tsv")
    summary = {"train": args.train, "test": args.test, "train_seconds": train_seconds,
               "pyrodigal_seconds": pyrodigal_seconds, "rows": rows}
    (out / "genes_table.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"training took {train_seconds:.0f} s; results in {out}")
    return summary


def _rows(table: Path) -> list[dict[str, str]]:
    header, *lines = [line.split("\t") for line in table.read_text().splitlines()]
    return [dict(zip(header, line)) for line in lines]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", required=True, help="annotated genomes to train on (GFF3 with ##FASTA, GenBank)")
    parser.add_argument("--test", required=True, help="the annotated genome held out whole (GenBank, or GFF3 with ##FASTA)")
    parser.add_argument("--out", required=True, help="folder for the table, the exported model and the GFF3 files")
    parser.add_argument("--run", default="/tmp/gene_model_run", help="the training run directory (left out of OUT)")
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--pretrained", default=str(PRETRAINED))
    parser.add_argument("--baseline", default=str(SHIPPED), help="a gene model to set beside the new one ('' for none)")
    parser.add_argument("--max_steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--max_time", default=None, help="a bound on training time, DD:HH:MM:SS (Lightning's max_time)")
    parser.add_argument("--fit_option", nargs=argparse.REMAINDER, default=[],
                        help="further `genoformer fit` options (last on the command line)")
    parser.add_argument("--annotate_option", action="append", default=[], help="a further `genoformer annotate` option")
    args = parser.parse_args(argv)
    args.baseline = args.baseline or None
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
