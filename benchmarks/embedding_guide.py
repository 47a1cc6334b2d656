"""Which pooling and which layer of `genoformer embed` tell genomes apart (docs/embed.md).

Pieces of real bacterial genomes (../shared/data/genomes: E. coli, S. aureus, H. pylori,
V. cholerae; PIECES per genome, LENGTH bases each, evenly spaced, without N) are embedded with the
shipped DNA model, at several layers, pooled several ways, raw and centred (the mean vector of
all pieces subtracted). Per variant:

- cosine between pieces of different genomes (median), and within a genome: how alike the vectors
  are (mean pooling of the last block: nearly 1 for everything);
- nearest-neighbour accuracy: the share of pieces whose most similar other piece (cosine) comes
  from the same genome;
- the same for 4-mer frequencies of the pieces, the baseline measured in the same run.

    python -m benchmarks.embedding_guide --genomes ../shared/data/genomes --pieces 12 --length 1000 --layers -1 4
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import REPO_ROOT, Benchmark, Summary, table

GENOMES = ("ecoli_k12_mg1655", "saureus_col", "hpylori_els37", "vcholerae_o395")
LAYERS = (-1, 4, 2)
"""The last block (after the final norm), the middle block and an early one of the 8-block model."""


def pieces(folder: Path, per_genome: int, length: int) -> tuple[list[np.ndarray], list[int]]:
    """`per_genome` pieces of `length` bases of each genome's first record, evenly spaced, each
    without N; and the genome index of each."""
    from genoformer.data.genome.alphabet import N
    from genoformer.data.genome.inputs import read_sequences

    codes, labels = [], []
    for index, name in enumerate(GENOMES):
        record = next(iter(read_sequences([folder / f"{name}.fasta.gz"])))
        starts = np.linspace(0, len(record.codes) - length, per_genome * 2).astype(int)
        kept = [record.codes[s : s + length] for s in starts if not (record.codes[s : s + length] >= N).any()][
            :per_genome
        ]
        codes += kept
        labels += [index] * len(kept)
    return codes, labels


def kmer_frequencies(codes: Sequence[np.ndarray], k: int = 4) -> np.ndarray:
    """(N, 4^k) frequencies of the k-mers of each piece."""
    rows = []
    for piece in codes:
        index = np.zeros(len(piece) - k + 1, dtype=np.int64)
        for offset in range(k):
            index = index * 4 + piece[offset : len(piece) - k + 1 + offset]
        counts = np.bincount(index, minlength=4**k).astype(np.float64)
        rows.append(counts / counts.sum())
    return np.stack(rows)


def scores(vectors: np.ndarray, labels: Sequence[int]) -> dict[str, float]:
    """Median cosine between and within genomes, and leave-one-out nearest-neighbour accuracy."""
    labels = np.asarray(labels)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosine = unit @ unit.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    nearest = np.where(off_diagonal, cosine, -np.inf).argmax(1)
    return {
        "cosine_between": float(np.median(cosine[~same])),
        "cosine_within": float(np.median(cosine[same & off_diagonal])),
        "nearest_neighbour_accuracy": float((labels[nearest] == labels).mean()),
    }


def pooled(tokens: Sequence[np.ndarray], pooling: str) -> np.ndarray:
    if pooling == "mean":
        return np.stack([t.mean(0) for t in tokens])
    if pooling == "max":
        return np.stack([t.max(0) for t in tokens])
    return np.stack([t[-1] for t in tokens])  # last: the state that has read the whole piece


def arguments(parser) -> None:
    parser.add_argument(
        "--genomes",
        type=Path,
        default=REPO_ROOT.parent / "shared" / "data" / "genomes",
        help="folder of the genomes' FASTA files (--smoke: examples/)",
    )
    parser.add_argument("--checkpoint", type=Path, default=REPO_ROOT / "examples" / "genoformer_dna.ckpt")
    parser.add_argument("--pieces", type=int, default=20, help="pieces per genome")
    parser.add_argument("--length", type=int, default=1500, help="bases per piece")
    parser.add_argument("--layers", type=int, nargs="+", default=list(LAYERS))
    parser.add_argument("--device", default="cpu", help="where the model embeds (default cpu)")


def measure(args) -> dict:
    from genoformer.core.pooling import Pooling
    from genoformer.genome.embeddings import Embedder

    if args.smoke:
        args.genomes, args.pieces, args.length, args.layers = REPO_ROOT / "examples", 2, 200, [-1]
    codes, labels = pieces(Path(args.genomes), args.pieces, args.length)
    embedder = Embedder.from_checkpoint(args.checkpoint, device=args.device)
    results: dict[str, dict] = {"4-mer frequencies (baseline)": {**scores(kmer_frequencies(codes), labels)}}
    results["4-mer frequencies (baseline)"]["centred"] = scores(
        kmer_frequencies(codes) - kmer_frequencies(codes).mean(0), labels
    )
    began = time.perf_counter()
    for layer in args.layers:
        for both in (False, True) if layer == -1 else (False,):
            tokens = embedder.embed(
                list(codes_as_text(codes)), pooling=Pooling.NONE, layer=layer, both_strands=both, progress=False
            ).arrays
            if layer == -1 and not both:  # correctness: the command's own mean pooling equals ours
                check = embedder.embed(
                    list(codes_as_text(codes[:3])), pooling=Pooling.MEAN, layer=layer, progress=False
                )
                assert np.allclose(np.stack(check.arrays), pooled(tokens[:3], "mean"), atol=1e-4)
            for pooling in ("mean", "max", "last"):
                vectors = pooled(tokens, pooling)
                name = f"layer {layer}, {pooling}" + (", both strands" if both else "")
                results[name] = {**scores(vectors, labels), "centred": scores(vectors - vectors.mean(0), labels)}
    checkpoint = Path(args.checkpoint).resolve()
    shown = checkpoint.relative_to(REPO_ROOT) if checkpoint.is_relative_to(REPO_ROOT) else checkpoint
    return {
        "checkpoint": str(shown),
        "genomes": list(GENOMES),
        "pieces": len(codes),
        "length": args.length,
        "seconds": time.perf_counter() - began,
        "results": results,
    }


def codes_as_text(codes: Sequence[np.ndarray]):
    from genoformer.data.genome.alphabet import decode

    return (decode(piece) for piece in codes)


def summarize(data: dict) -> Summary:
    rows = [
        {
            "embedding": name,
            "cosine between genomes": row["cosine_between"],
            "cosine within": row["cosine_within"],
            "nearest neighbour": row["nearest_neighbour_accuracy"],
            "centred: between": row["centred"]["cosine_between"],
            "centred: within": row["centred"]["cosine_within"],
            "centred: nearest neighbour": row["centred"]["nearest_neighbour_accuracy"],
        }
        for name, row in data["results"].items()
    ]
    caption = (
        f"{data['pieces']} pieces of {data['length']:,} bases from {len(data['genomes'])} genomes "
        f"({', '.join(data['genomes'])}); `{data['checkpoint']}`, float32, {data['seconds']:.0f} s"
    )
    return Summary(tables=[table(rows, caption)])


BENCHMARK = Benchmark(
    "embedding_guide",
    "Embeddings: which pooling and layer tell genomes apart",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="4-mer frequencies of the same pieces",
)

if __name__ == "__main__":
    BENCHMARK.main()
