"""The genome wing's data and embedding commands: `genoformer prepare` and `genoformer embed`.

(`evaluate`, `score`, `baseline` and `variant_effect` are defined beside what they compute:
genoformer.genome.evaluate, .markov and .variants.)

    genoformer prepare --fasta genome.fa.gz --out genome.zarr
    genoformer prepare --fasta genomes/*.fa.gz --out genomes.zarr       # or a folder, or "[a.fa,b.fa]"
    genoformer embed --checkpoint last.ckpt --inputs genome.fa.gz --out embeddings.npz
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from genoformer.core.inference import Pooling
from genoformer.data.genome.seqfiles import is_sequence_file_name
from genoformer.data.genome.store import DEFAULT_CHUNK_SIZE, prepare_genome_store
from genoformer.data.inputs import expand_inputs
from genoformer.data.storage import refuse_existing
from genoformer.genome.embeddings import Embedder, save_embeddings
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
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Embed sequences with a trained checkpoint and write them, with their names, to a file.

    The output is .npz (numpy.load) or .zarr (zarr.open_group): `names`, `embeddings` (N, E)
    when pooled, or all tokens (sum of lengths, E) with `offsets` when pooling is none.

    Args:
        checkpoint: A DNA language model's .ckpt file written by `genoformer fit` or `genoformer export`.
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
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device (on CUDA the model runs
            under bfloat16 autocast, which the Triton kernels need).
        overwrite: A flag: replace an existing `out`.
    """
    refuse_existing(out, overwrite)  # before the model runs, not after
    embedder = Embedder.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    options = dict(pooling=Pooling(pooling), layer=layer, batch_size=batch_size, window=window, overlap=overlap)
    result = embedder.embed(inputs, **options)
    path = save_embeddings(result, out, overwrite=overwrite)
    print(f"wrote {len(result)} embeddings to {path}")
    return path
