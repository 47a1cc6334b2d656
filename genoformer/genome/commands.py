"""The genome wing's data, embedding and prediction commands: `genoformer prepare`, `embed`,
`classify`, `annotate` and `compare_genes`.

(`evaluate`, `score`, `baseline` and `variant_effect` are defined beside what they compute:
genoformer.genome.evaluate, .markov and .variants; `finetune`, which runs the training command on a
shipped recipe, beside it in genoformer.training_cli.)

    genoformer prepare --fasta genome.fa.gz --out genome.zarr
    genoformer prepare --fasta genomes/*.fa.gz --out genomes.zarr       # or a folder, or "[a.fa,b.fa]"
    genoformer embed --checkpoint last.ckpt --inputs genome.fa.gz --out embeddings.npz
    genoformer finetune --pretrained examples/genoformer_dna.ckpt --task classify \
        --train examples/splice_junctions_statlog.tsv --out runs/splice
    genoformer classify --checkpoint runs/splice --inputs seqs.tsv --out predictions.tsv
    genoformer annotate --checkpoint examples/genoformer_gene_annotator.ckpt --inputs genome.fa.gz --out genes.gff3
    genoformer compare_genes --reference annotated.gbk --predicted genes.gff3 prodigal.gff3 --out comparison.tsv
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal, Optional, Union

from genoformer.core.inference import Pooling
from genoformer.data.genome.annotations import read_annotated_genomes, read_genes, write_gff3
from genoformer.data.genome.labels import read_unlabelled
from genoformer.data.genome.regions import read_regions
from genoformer.data.genome.seqfiles import is_sequence_file_name
from genoformer.data.genome.store import DEFAULT_CHUNK_SIZE, prepare_genome_store
from genoformer.data.inputs import expand_inputs
from genoformer.data.storage import refuse_existing, write_json, write_text
from genoformer.genome.embeddings import Embedder, save_embeddings
from genoformer.genome.genecalls import compare_gene_calls, write_tracks_bedgraph
from genoformer.genome.predict import GeneAnnotator, SequencePredictor
from genoformer.kernels.dispatch import Backend

# The command line takes the enums' values (mean, triton), as the Python API does.
PoolingName = Literal[tuple(member.value for member in Pooling)]


def prepare(
    *,
    fasta: Union[str, list[str]],
    out: Path,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    compressor: Literal["blosclz", "lz4", "zstd"] = "blosclz",
    compression_level: int = 3,
    keep_softmask: bool = True,
    overwrite: bool = False,
) -> Path:
    """Build a chunked zarr genome store from FASTA or GenBank files (plain, .gz, .xz, .bz2).

    The store is written under a temporary name, verified, then renamed: an interrupted run
    leaves nothing that reads as complete, and re-running with the same inputs is a no-op.

    Args:
        fasta: Input files: several after one flag (--fasta a.fa b.fa.gz, so a shell glob such as
            --fasta genomes/*.fa.gz works), a folder (every FASTA/GenBank file in it), or a list
            ("[a.fa,b.fa.gz]"). Record names must be unique across all files.
        out: Store directory to create, conventionally ending in .zarr.
        chunk_size: Bases per chunk, the unit of decoding and caching (16 Ki suits windows of
            8 Ki to 128 Ki bases).
        compressor: Blosc compressor after bit-shuffling: blosclz decodes fastest (about 0.27
            bytes per base); zstd is about 4% smaller and 2.5 times slower to decode.
        compression_level: Compression level, 1 (fastest) to 9 (smallest).
        keep_softmask: Keep lowercase (soft-masked) positions as a separate mask.
        overwrite: A flag: always rebuild. Without it, a complete store built from the same files
            with the same options is kept as it is, and any other existing `out` is an error.
    """
    path = prepare_genome_store(
        expand_inputs(fasta, is_input=is_sequence_file_name, kind="FASTA/GenBank", flag="--fasta"),
        out,
        chunk_size=chunk_size,
        compressor=compressor,
        compression_level=compression_level,
        keep_softmask=keep_softmask,
        overwrite=overwrite,
    )
    print(f"genome store ready: {path}")
    return path


def embed(
    *,
    checkpoint: Path,
    inputs: Union[str, list[str]],
    out: Path,
    pooling: PoolingName = "mean",
    layer: int = -1,
    batch_size: int = 8,
    window: Optional[int] = None,
    overlap: Optional[int] = None,
    regions: Optional[Union[str, list[str]]] = None,
    both_strands: bool = False,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Embed sequences with a trained checkpoint and write them, with their names, to a file.

    The output is .npz (numpy.load) or .zarr (zarr.open_group): `names`, `embeddings` (N, E)
    when pooled, or all tokens (sum of lengths, E) with `offsets` when pooling is none. With
    `regions`, each region is cut out of its record and embedded as a sequence of its own, named
    by the region.

    Args:
        checkpoint: A DNA language model: a .ckpt file (`genoformer fit` or `export`), a run directory
            (its best checkpoint), RUN_DIR/best or RUN_DIR/last, genoformer-dna, an exported folder or a Hub id.
        inputs: FASTA/GenBank files, genome stores (.zarr from `genoformer prepare`), folders,
            quoted globs, or literal DNA strings: several after one flag (--inputs a.fa ACGT
            b.zarr) or a list ("[a.fa,ACGT]"). Outputs keep the input order; a string is named
            seqI after its place I in the list, a record by its id; names must be unique.
        out: Output file, ending in .npz or .zarr; an existing one is an error without --overwrite.
        pooling: One vector per sequence (mean, max, first, last) or per token (none).
        layer: Hidden state to read: 0 is the token embeddings, -1 the last block.
        batch_size: Windows per forward pass.
        window: Window length for long sequences; default the trained context.
        overlap: Tokens shared by neighbouring windows; default window // 4.
        regions: Embed only these: a BED file (0-based; its 4th column names the outputs) or
            regions chrom:start-end (1-based, inclusive; named so), several after one flag.
        both_strands: A flag: average every token's vector with its vector on the reverse
            complement (read per window and flipped back onto the forward strand), so a sequence
            and its reverse complement embed alike; twice the work.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device (on CUDA the model runs
            under bfloat16 autocast, which the Triton kernels need); fp8 runs it in FP8 on Hopper
            (faster, at the error docs/inference.md measures).
        overwrite: A flag: replace an existing `out`.
    """
    refuse_existing(out, overwrite)  # before the model runs, not after
    embedder = Embedder.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    options = dict(
        pooling=Pooling(pooling),
        layer=layer,
        batch_size=batch_size,
        window=window,
        overlap=overlap,
        regions=regions,
        both_strands=both_strands,
    )
    result = embedder.embed(inputs, **options)
    path = save_embeddings(result, out, overwrite=overwrite)
    print(f"wrote {len(result)} embeddings to {path}")
    return path


def file_list(files: Union[str, list[str]]) -> list[str]:
    return [files] if isinstance(files, str) else list(files)


def classify(
    *,
    checkpoint: Path,
    inputs: Union[str, list[str]],
    out: Path,
    genome: Optional[str] = None,
    batch_size: int = 32,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Predict the class (or labels, or values) of every sequence with a fine-tuned model.

    Writes a TSV: the input's columns (or `name`), `prediction`, then `p_<class>` per class
    (regression: `y_<target>` per target).

    Args:
        checkpoint: A model of `genoformer finetune` (task classify or regress): its run directory
            (--out; its best checkpoint), RUN_DIR/best or RUN_DIR/last, or a .ckpt file.
        inputs: TSV/CSV files with a `sequence` column (label columns are ignored), FASTA/GenBank
            files, BED intervals (with --genome): several after one flag, or a list.
        out: The output TSV; an existing one is an error without --overwrite.
        genome: The genome that BED intervals refer to.
        batch_size: Sequences per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks per device.
        overwrite: A flag: replace an existing `out`.
    """
    refuse_existing(out, overwrite)
    predictor = SequencePredictor.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    sequences = read_unlabelled(file_list(inputs), genome=genome)
    result = predictor.predict(sequences, batch_size=batch_size)
    path = result.write_tsv(out, overwrite=overwrite)
    print(f"wrote predictions for {len(result.names):,} sequences to {path}")
    return path


def annotate(
    *,
    checkpoint: Path,
    inputs: Union[str, list[str]],
    out: Path,
    regions: Optional[Union[str, list[str]]] = None,
    tracks: Optional[Path] = None,
    window: Optional[int] = None,
    overlap: Optional[int] = None,
    batch_size: int = 8,
    min_gene_length: int = 90,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Call genes on whole genomes with a fine-tuned gene annotator; write them as GFF3.

    CDS features with strand, 1-based start and end, phase and score; long contigs are tiled.
    Coordinates are always those of the whole contig, with `regions` too.

    Args:
        checkpoint: A model of `genoformer finetune --task annotate`: the shipped
            genoformer-gene-annotator, a run directory (its best checkpoint), RUN_DIR/best or RUN_DIR/last,
            or a .ckpt file.
        inputs: FASTA/GenBank files or genome stores: several after one flag, or a list.
        out: The output GFF3; an existing one is an error without --overwrite.
        regions: Annotate only these: a BED file (0-based) or regions chrom:start-end (1-based,
            inclusive), several after one flag. Each is read with 3,000 bases on either side, and
            the genes that overlap it are written whole, in contig coordinates.
        tracks: Also write the per-base probabilities of coding on each strand as a bedGraph
            (of the regions only, with `regions`).
        window: Bases per window; default the model's context.
        overlap: Bases shared by neighbouring windows; default window // 4.
        batch_size: Windows per forward pass.
        min_gene_length: Shortest gene called, in bases (with the stop codon).
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks per device.
        overwrite: A flag: replace existing outputs.
    """
    refuse_existing(out, overwrite)
    if tracks is not None:
        refuse_existing(tracks, overwrite)
    annotator = GeneAnnotator.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    started = time.perf_counter()
    contigs = annotator.predict(
        file_list(inputs),
        regions=regions,
        window=window,
        overlap=overlap,
        batch_size=batch_size,
        min_gene_length=min_gene_length,
    )
    seconds = time.perf_counter() - started
    genes = list({(g.contig, g.start, g.end, g.strand, g.kind): g for c in contigs for g in c.genes}.values())
    lengths = {c.name: c.contig_length or c.length for c in contigs}  # whole contigs, once each
    path = write_gff3(out, genes, contigs=list(lengths.items()), overwrite=overwrite)
    if tracks is not None:
        write_tracks_bedgraph(
            tracks, [(c.name, c.probabilities) for c in contigs], starts=[c.start for c in contigs], overwrite=overwrite
        )
    bases = sum(c.length for c in contigs)
    where = (
        f"{len(contigs):,} regions of {len(lengths):,} contigs" if regions is not None else f"{len(contigs):,} contigs"
    )
    print(
        f"wrote {len(genes):,} genes on {where} ({bases:,} bases, {bases / max(seconds, 1e-9):,.0f} bases/s) to {path}"
    )
    return path


# ------------------------------------------------------------------------------- comparing gene calls
GENE_COMPARISON_COLUMNS = (
    ("coding_mcc", "coding MCC"),
    ("strand_coding_mcc", "strand MCC"),
    ("recall_stop", "recall"),
    ("precision_stop", "precision"),
    ("recall_start_stop", "start+stop"),
    ("predicted_genes", "genes"),
)
"""The columns of `compare_genes`' table: (key of a row, heading)."""


def compare_genes(
    *,
    reference: Path,
    predicted: Union[str, list[str]],
    genome: Optional[str] = None,
    regions: Optional[Union[str, list[str]]] = None,
    out: Optional[Path] = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Compare gene calls (GFF3) with a reference annotation: per-base coding MCC, gene recall and precision.

    One row per predicted file (so that `genoformer annotate` and another gene finder stand side by
    side), scored on the reference's contigs:
    coding MCC: Matthews correlation per base of coding (a CDS on either strand) against the rest;
    strand MCC: the same with the strands apart (CDS+, CDS-, rest); recall: the share of the
    reference's CDS genes that a called gene matches in strand and stop codon; precision: the share
    of called CDS genes that match a reference gene so; start+stop: the share of reference genes
    matched at both ends; genes: the CDS genes called.

    Args:
        reference: The reference annotation: GenBank with its sequence, or GFF3 (with a ##FASTA
            section, or with --genome).
        predicted: GFF3 files of gene calls on the reference's contigs (genoformer annotate,
            Prodigal, Prokka, ...): several after one flag, or a list.
        genome: The sequences (FASTA/GenBank or store) of a GFF3 reference without ##FASTA.
        regions: Compare only these: a BED file (0-based) or regions chrom:start-end (1-based,
            inclusive), several after one flag: their bases, and the genes whose stop codon
            ends in one.
        out: Also write the table: .tsv (one row per predicted file) or .json.
        overwrite: A flag: replace an existing `out`.
    """
    if out is not None:
        if Path(out).suffix not in (".tsv", ".json"):
            raise ValueError(f"--out {out}: write the table as .tsv or .json")
        refuse_existing(Path(out), overwrite)
    contigs = read_annotated_genomes(reference, genome=genome, progress=False)
    chosen = None if regions is None else read_regions(regions, {c.name: c.codes.size for c in contigs})
    rows = [
        {"predicted": str(path), **compare_gene_calls(contigs, read_genes(path), regions=chosen, source=str(path))}
        for path in file_list(predicted)
    ]
    print(
        gene_comparison_table(
            rows, f"gene calls against {reference}" + ("" if regions is None else f", in {len(chosen):,} region(s)")
        )
    )
    if out is not None:
        if Path(out).suffix == ".json":
            write_json(Path(out), {"reference": str(reference), "rows": rows}, overwrite=overwrite)
        else:
            keys = ["predicted", *(key for key, _ in GENE_COMPARISON_COLUMNS), "reference_genes", "bases"]
            lines = ["\t".join(keys)] + ["\t".join(_cell(row[key]) for key in keys) for row in rows]
            write_text(Path(out), "\n".join(lines) + "\n", overwrite=overwrite)
        print(f"wrote {out}")
    return rows


def _cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def gene_comparison_table(rows: list[dict[str, Any]], title: str) -> str:
    """`compare_genes` rows as aligned text, one line per predicted file."""
    names = [Path(row["predicted"]).name for row in rows]
    width = max(len(name) for name in [*names, "predicted"])
    heads = [head for _, head in GENE_COMPARISON_COLUMNS]
    lines = [title, f"{'predicted':<{width}}" + "".join(f"  {head:>10}" for head in heads)]
    for name, row in zip(names, rows):
        lines.append(f"{name:<{width}}" + "".join(f"  {_cell(row[key]):>10}" for key, _ in GENE_COMPARISON_COLUMNS))
    lines.append(f"reference: {rows[0]['reference_genes']:,} CDS genes, {rows[0]['bases']:,} bases" if rows else "")
    return "\n".join(lines)
