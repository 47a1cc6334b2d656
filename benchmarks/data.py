"""Data pipeline on the CPU: random-window reads, prepare throughput, store size, DataLoader rate.

Measures, with the genomes of ../shared/data/genomes (or --genomes):
  * random 8,192-base windows per second, as uint8 codes, one core, from our genome store
    (`GenomeStore.read`, all genomes in one store) uncached (`cache_bytes=0`: what a genome much
    larger than the cache costs), with a small cache (1/48 of the decoded store: the default
    64 MiB against a 3 Gb human genome), and with a cache that holds the store (cold: the first
    pass; warm: the same windows again); against pyfaidx on the uncompressed FASTA and a numpy
    memmap of the raw bytes, encoded the fastest way we know. Every reader reads the same
    windows after the same warm-up, in interleaved rounds, its best round counting;
  * `prepare_genome_store` in MB of FASTA per CPU-second on one core, from .fasta.gz and plain;
  * store bytes per base of each genome (metadata included);
  * tokens per second through a DataLoader with 2 fork workers, batches of 32 x 8,192.

    python -m benchmarks.data --out benchmarks/results      # about 3 minutes on 2 cores
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyfaidx
from Bio.SeqIO.FastaIO import SimpleFastaParser
from genoformer.data import GenomeStore, RandomWindowDataset, ShardSampler, prepare_genome_store
from genoformer.data.genome.alphabet import ENCODE_TABLE, encode_bytes
from genoformer.data.genome.store import DEFAULT_CACHE_BYTES
from torch.utils.data import DataLoader

from benchmarks.common import REPO_ROOT, Benchmark, Summary, at_least, at_most, interleaved_rounds, table

_LUT = np.frombuffer(ENCODE_TABLE, dtype=np.uint8)
READERS = {
    "store_uncached": "store, uncached",
    "store_small_cache": "store, small cache",
    "store_cold": "store, cold cache (first pass)",
    "store_warm": "store, warm cache",
    "pyfaidx": "pyfaidx + translate",
    "memmap": "numpy memmap of raw bytes",
}


def unpack_genomes(genomes: list[Path], work: Path) -> tuple[list[Path], dict[str, Path], dict[str, int]]:
    """Plain FASTA copies (pyfaidx, plain prepare), raw per-contig byte files (memmap), lengths."""
    plain, raw, lengths = [], {}, {}
    for path in genomes:
        target = work / path.name.removesuffix(".gz")
        target.write_bytes(gzip.decompress(path.read_bytes()))
        plain.append(target)
        with open(target) as handle:
            for title, seq in SimpleFastaParser(handle):
                name = title.split()[0]
                raw[name] = work / f"raw_{len(raw)}.bin"
                raw[name].write_bytes(seq.encode("ascii"))
                lengths[name] = len(seq)
    return plain, raw, lengths


def window_list(lengths: dict[str, int], window: int, count: int, seed: int) -> list[tuple[str, int]]:
    names = list(lengths)
    starts = np.array([lengths[n] - window + 1 for n in names], dtype=np.float64)
    rng = np.random.default_rng(seed)
    return [
        (names[i], int(rng.integers(starts[i]))) for i in rng.choice(len(names), size=count, p=starts / starts.sum())
    ]


def time_reads(read, windows: list[tuple[str, int]], window: int, warmup: list[tuple[str, int]]) -> float:
    for name, start in warmup:
        read(name, start, start + window)
    t0 = time.perf_counter()
    for name, start in windows:
        read(name, start, start + window)
    return len(windows) / (time.perf_counter() - t0)


def measure_reads(
    store_path: Path, plain: list[Path], raw: dict[str, Path], windows, window: int, warmup, rounds: int
) -> dict:
    """Windows/s of every reader, best of `rounds` interleaved rounds."""
    probe = GenomeStore(store_path)
    index = {c.name: c.index for c in probe.contigs}
    decoded = sum(-(-c.length // probe.chunk_size) * probe.chunk_size for c in probe.contigs)
    fastas = [pyfaidx.Fasta(str(p), as_raw=True) for p in plain]
    owner = {name: fa for fa in fastas for name in fa.keys()}
    maps = {name: np.memmap(path, dtype=np.uint8, mode="r") for name, path in raw.items()}

    def store_reader(cache_bytes: int):
        store = GenomeStore(store_path, cache_bytes=cache_bytes)
        for name, start in warmup:  # maps the shards and parses their indexes
            store.read(index[name], start, start + window)
        store.cache.clear()
        return lambda n, s, e: store.read(index[n], s, e)

    def cached_twice() -> dict[str, float]:
        read = store_reader(DEFAULT_CACHE_BYTES + decoded)  # holds every chunk
        return {
            "store_cold": time_reads(read, windows, window, []),
            "store_warm": time_reads(read, windows, window, []),
        }

    def reads_of(make):
        return lambda: time_reads(make(), windows, window, warmup)

    best = interleaved_rounds(
        {
            "store_uncached": reads_of(lambda: store_reader(0)),
            "store_small_cache": reads_of(lambda: store_reader(decoded // 48)),
            "pyfaidx": reads_of(lambda: lambda n, s, e: encode_bytes(owner[n][n][s:e].encode("ascii"))),
            "memmap_translate": reads_of(lambda: lambda n, s, e: encode_bytes(maps[n][s:e].tobytes())),
            "memmap_lookup": reads_of(lambda: lambda n, s, e: _LUT[maps[n][s:e]]),
            "store_cached": cached_twice,
        },
        rounds,
    )
    for fa in fastas:
        fa.close()
    sharding = json.loads((store_path / "contigs" / "0" / "zarr.json").read_text())["codecs"][0]["configuration"]
    return {
        **best,
        "memmap": max(best["memmap_translate"], best["memmap_lookup"]),
        "decoded_mib": decoded / 2**20,
        "chunk_size": probe.chunk_size,
        "compressor": sharding["codecs"][1]["configuration"]["cname"],
    }


def measure_prepare(gz: list[Path], plain: list[Path], work: Path, repeats: int) -> dict:
    """Best-of-`repeats` wall and process CPU time of prepare_genome_store; the target is judged
    on CPU time, since the wall time counts other processes' turns on a shared machine."""
    fasta_bytes = sum(p.stat().st_size for p in plain)
    out = {"fasta_mb": fasta_bytes / 1e6}
    for label, paths in (("gz", gz), ("plain", plain)):
        wall, cpu = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            prepare_genome_store(paths, work / f"prep_{label}.zarr", overwrite=True, progress=False)
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        out[label] = {"cpu_s": min(cpu), "wall_s": min(wall), "mb_s": fasta_bytes / min(cpu) / 1e6}
    return out


def store_sizes(gz: list[Path], work: Path) -> list[dict]:
    rows = []
    for path in gz:
        out = prepare_genome_store([path], work / f"size_{path.name}.zarr", progress=False)
        nbytes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        bases = GenomeStore(out).total_length
        rows.append(
            {
                "genome": path.name.removesuffix(".fasta.gz"),
                "bases": bases,
                "store_bytes": nbytes,
                "bytes_per_base": nbytes / bases,
                "gzip_bytes_per_base": path.stat().st_size / bases,
            }
        )
    return rows


def measure_loader(store_path: Path, window: int, batch_size: int, batches: int) -> dict:
    dataset = RandomWindowDataset(store_path, window, batch_size * (batches + 1), reverse_complement=True)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ShardSampler(len(dataset), rank=0, world_size=1),
        num_workers=2,
        multiprocessing_context="fork",
    )
    iterator = iter(loader)
    next(iterator)  # workers started and warm
    t0 = time.perf_counter()
    tokens = sum(batch["tokens"].numel() for batch in iterator)
    return {"tokens_s": tokens / (time.perf_counter() - t0), "batch_size": batch_size}


def arguments(parser) -> None:
    parser.add_argument(
        "--genomes",
        type=Path,
        default=REPO_ROOT.parent / "shared" / "data" / "genomes",
        help="folder of *.fasta.gz genomes (--smoke: the lambda genome of examples/)",
    )
    parser.add_argument("--windows", type=int, default=20_000, help="random 8,192-base windows per reader")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the reads (best counts)")


def measure(args) -> dict:
    gz = [REPO_ROOT / "examples" / "lambda_phage.fasta.gz"] if args.smoke else sorted(args.genomes.glob("*.fasta.gz"))
    if not gz:
        raise SystemExit(f"no *.fasta.gz genomes in {args.genomes}; pass --genomes DIR")
    window, count, repeats = (1024, 200, 1) if args.smoke else (8192, args.windows, 3)
    all_cpus = os.sched_getaffinity(0)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="genoformer-bench-") as tmp:
        work = Path(tmp)
        plain, raw, lengths = unpack_genomes(gz, work)
        os.sched_setaffinity(0, {min(all_cpus)})  # one core for reads and prepare
        prepare = measure_prepare(gz, plain, work, repeats)
        sizes = store_sizes(gz, work)
        store_path = prepare_genome_store(gz, work / "all.zarr", progress=False)
        for fasta in plain:  # the .fai indexes, before timing
            pyfaidx.Fasta(str(fasta)).close()
        reads = measure_reads(
            store_path,
            plain,
            raw,
            window_list(lengths, window, count, seed=0),
            window,
            window_list(lengths, window, count // 10, seed=1),
            1 if args.smoke else args.rounds,
        )
        os.sched_setaffinity(0, all_cpus)
        loader = measure_loader(store_path, window, 4 if args.smoke else 32, 3 if args.smoke else 200)
        shutil.rmtree(work / "all.zarr")
    return {
        "window": window,
        "windows": count,
        "load_average": [load_start, os.getloadavg()[0]],
        "size_target_min_bases": 0 if args.smoke else 1_000_000,
        "reads": reads,
        "prepare": prepare,
        "sizes": sizes,
        "loader": loader,
    }


def summarize(data: dict) -> Summary:
    reads, prepare = data["reads"], data["prepare"]
    read_rows = [
        {
            "reader": label,
            "windows/s": reads[key],
            "x pyfaidx": reads[key] / reads["pyfaidx"],
            "x memmap": reads[key] / reads["memmap"],
        }
        for key, label in READERS.items()
    ]
    store = ("store_uncached", "store_small_cache", "store_warm")
    slowest = min(store, key=lambda key: reads[key])
    targets = [
        at_least(
            "store windows/s >= pyfaidx, uncached, small and warm cache (worst)",
            reads[slowest] / reads["pyfaidx"],
            1.0,
            f"x ({READERS[slowest]})",
        ),
        at_least(
            "store windows/s >= 0.5 x memmap, the same three (worst)",
            reads[slowest] / reads["memmap"],
            0.5,
            f"x ({READERS[slowest]})",
        ),
        at_least(
            "prepare >= 30 MB of FASTA per CPU-second on one core (gz and plain, worst)",
            min(prepare["gz"]["mb_s"], prepare["plain"]["mb_s"]),
            30.0,
            " MB/s",
        ),
    ]
    large = [r for r in data["sizes"] if r["bases"] >= data["size_target_min_bases"]]
    worst = max(large, key=lambda r: r["bytes_per_base"])
    targets += [
        at_most(
            "store <= 0.30 bytes/base (genomes of >= 1 Mbp)",
            worst["bytes_per_base"],
            0.30,
            measured=f"worst {worst['bytes_per_base']:.4f} ({worst['genome']})",
        ),
        at_least("2-worker DataLoader >= 2M tokens/s", data["loader"]["tokens_s"] / 1e6, 2.0, "M tokens/s"),
    ]
    return Summary(
        tables=[
            table(
                read_rows,
                f"Random {data['window']:,}-base windows, one core, {data['windows']:,} per reader "
                f"over {prepare['fasta_mb']:.1f} MB of FASTA in {len(data['sizes'])} genomes; load average "
                f"{data['load_average'][0]:.1f} / {data['load_average'][1]:.1f} (start / end)",
            ),
            table(
                [
                    {
                        "genome": r["genome"],
                        "bases": r["bases"],
                        "bytes/base": f"{r['bytes_per_base']:.4f}",
                        "gzip bytes/base": f"{r['gzip_bytes_per_base']:.4f}",
                    }
                    for r in data["sizes"]
                ],
                "Store size (metadata included)",
                headline=False,
            ),
        ],
        targets=targets,
        notes=[
            f"Chunks of {reads['chunk_size'] // 1024} Ki bases, Blosc {reads['compressor']} + bit-shuffle; these "
            f"genomes decode to {reads['decoded_mib']:.0f} MiB, a human genome to about 2,900 MiB (cache: 64 MiB)."
        ],
    )


BENCHMARK = Benchmark(
    "data",
    "Data pipeline (CPU)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="pyfaidx on the uncompressed FASTA and a numpy memmap of the raw bytes",
)

if __name__ == "__main__":
    BENCHMARK.main()
