"""The fine-tuning benchmark renders BENCHMARKS.md's section from its committed results, and its
variants are options that `genoformer finetune` takes."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

from benchmarks import finetune_bench
from genoformer.genome.commands import finetune

RESULTS = Path(finetune_bench.__file__).resolve().parent / "results"


def test_report_renders_every_table_from_the_committed_results(tmp_path):
    for name in ("finetune_splice.json", "finetune_tf.json", "finetune_genes.json", "finetune_baselines.json",
                 "finetune_cpu.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# b\n\n<!-- finetune:start -->\n<!-- finetune:end -->\n")
    finetune_bench.report(tmp_path, markdown)
    text = markdown.read_text()
    for heading in ("**Splice junctions**", "**TF binding**", "**Gene annotation**", "**CPU targets**"):
        assert heading in text
    assert "pyrodigal meta" in text and "k-mer logistic regression" in text


def test_variants_are_finetune_options():
    options = set(inspect.signature(finetune).parameters)
    for variants in (finetune_bench.SEQUENCE_VARIANTS, finetune_bench.GENE_VARIANTS):
        for name, values in variants.items():
            assert set(values) <= options, name
