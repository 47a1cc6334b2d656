"""Genome stores: FASTA/GenBank files -> zarr v3 group with one uint8 array of codes per contig.

Layout (zarr v3 group)::

    <store>/zarr.json          attributes["genoformer"]: store metadata (see storage.py) plus
                               "alphabet", "chunk_size" and "contigs": a list of
                               {name, description, length, source, source_name, source_sha256,
                                n_count, softmasked, codes_sha256}
    <store>/contigs/<i>        (length,) uint8 codes A0 C1 G2 T3 N4, i = contig index
    <store>/softmask/<i>       (length,) bool, True = lowercase in the source; only for contigs
                               that had lowercase bases and when keep_softmask=True

Arrays are chunked along the sequence (``chunk_size`` bases, default 16 Ki) and compressed with
Blosc(blosclz, bit-shuffle): the bit-shuffle puts the two low bits of every code into bit planes
of their own and the always-zero high bits into planes the compressor removes, so ACGT sequence
costs just over 2 bits per base (about 0.265 B/base; zstd instead of blosclz: 0.255 B/base,
decoding 2.5x slower) with standard codecs any zarr reader can decode. Each compressed chunk is
followed by its CRC32C (zarr's ``crc32c`` codec; format 2 on), which every read checks. Chunks
are grouped into shards (zarr's sharding codec) of ``shard_chunks`` chunks (8 Mi bases by
default), one file each, so a large genome does not become hundreds of thousands of files. The shards are encoded by
``shards.write_sharded`` (zarr's per-chunk write overhead would dominate ``prepare``), and every
array is read back through zarr and checked before the store is marked complete.

Reading (:class:`GenomeStore`): ``shards.ShardedArrayReader`` memory-maps each shard file on
first use, keeps its parsed index, and decodes the chunks a window touches with one Blosc call
each, no zarr call and no system call on the way. Chunks are small because a random read
decodes about ``window + chunk_size`` bases: 16 Ki-base chunks make an uncached 8 Ki-base window
cost about 11 us on one core, faster than pyfaidx on the plain FASTA (benchmarks/data.py). On top, each
process keeps an LRU cache of decoded chunks (``cache_bytes``); a cached window is a slice copy.
The cache only helps while the decoded genome (1 byte/base) mostly fits; ``cache_bytes=0`` skips
it.

Integrity: a chunk whose bytes changed after the build (a disk, copy or transfer error) fails its
CRC32C on the first read, raising :class:`~genoformer.data.storage.CorruptStoreError` with one
line that names the store and the exact `genoformer prepare ... --overwrite` that rebuilds it;
`genoformer verify STORE` reads every chunk and compares every contig with the SHA-256 recorded at
the build. Stores of format 1 (no chunk checksums) are still read, with a warning that says how to
rebuild them; `prepare` with the same inputs rebuilds them in place.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr
from genoformer.data.genome.alphabet import ALLOWED, TOKEN_CODES, N, NotDNAError, encode_bytes, softmask_bytes
from genoformer.data.genome.seqfiles import SequenceFileReader, SequenceRecord
from genoformer.data.shards import ShardedArrayReader, write_sharded
from genoformer.data.storage import (
    METADATA_KEY,
    ChunkCache,
    CorruptStoreError,
    atomic_build,
    base_metadata,
    damaged_store,
    open_store_group,
    rebuild_command,
    reusable_store,
    sha256_files,
    warn_unchecked_store,
)
from zarr.codecs import BloscCodec, Crc32cCodec

from genoformer.progress import tqdm

log = logging.getLogger(__name__)

GENOME_FORMAT = "genoformer.genome"
GENOME_FORMAT_VERSION = 2
"""2: every chunk followed by its CRC32C; 1 (still read, with a warning): no chunk checksums."""
DEFAULT_CHUNK_SIZE = 1 << 14
DEFAULT_SHARD_CHUNKS = 512
COMPRESSORS = ("blosclz", "lz4", "zstd")
DEFAULT_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class ContigInfo:
    """One contig of a genome store (a record of a source file)."""

    index: int
    name: str
    description: str
    length: int
    source: str  # absolute path of the source file at prepare time
    source_name: str  # its file name
    source_sha256: str
    n_count: int  # bases coded N
    softmasked: int  # lowercase bases in the source (0 when not kept)
    codes_sha256: str  # SHA-256 of the uint8 codes, checked when the store is verified


def _codecs(compressor: str, level: int) -> tuple[BloscCodec, Crc32cCodec]:
    # typesize 2 on 1-byte codes: Blosc bit-shuffles pairs of bases (16 bit planes instead of 8)
    # and splits each block into two streams; any reader decodes it the same way (the typesize is
    # in every chunk's header), and decoding runs 1.5x faster than with typesize 1 (c-blosc
    # 1.21, numcodecs 0.16; docs/design/data.md) for 0.3% more bytes.
    return BloscCodec(cname=compressor, clevel=level, shuffle="bitshuffle", typesize=2), Crc32cCodec()


def rebuild(path: Path, arguments: dict) -> str:
    """The `genoformer prepare` command that builds the store at ``path`` again from its inputs
    (``arguments`` as recorded in its metadata), replacing it."""
    defaults = {
        "chunk_size": DEFAULT_CHUNK_SIZE,
        "compressor": "blosclz",
        "compression_level": 3,
        "keep_softmask": True,
    }
    options = {
        name: arguments.get(name, default)
        for name, default in defaults.items()
        if arguments.get(name, default) != default
    }
    if options.get("keep_softmask") is False:
        options["keep_softmask"] = "false"
    return rebuild_command("prepare", "--fasta", arguments.get("fasta_paths", ["GENOME.fa"]), path, options)


def _encode_record(path: Path, record: SequenceRecord) -> np.ndarray:
    try:
        return encode_bytes(record.sequence)
    except NotDNAError as exc:
        raise ValueError(f"{path}: record {record.name!r}, {exc.found}; {ALLOWED}; fix or remove the record") from exc


def prepare_genome_store(
    fasta_paths: Sequence[str | Path],
    out: str | Path,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    shard_chunks: int = DEFAULT_SHARD_CHUNKS,
    compressor: str = "blosclz",
    compression_level: int = 3,
    keep_softmask: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> Path:
    """Build a genome store at ``out`` from FASTA or GenBank files and return its path.

    Args:
        fasta_paths: Input files, FASTA (or GenBank), plain or gzip/xz/bzip2 compressed, each
            with one or more records. Record names (first word of the header) must be unique
            across all files.
        out: Directory of the zarr store to create (conventionally ``*.zarr``).
        chunk_size: Bases per chunk, the unit of decoding and caching. An uncached read of L
            bases decodes about L + chunk_size bases in L / chunk_size + 1 Blosc calls; the
            default 16 Ki is close to the fastest for 8 Ki..128 Ki-base windows.
        shard_chunks: Chunks per shard file (default 512: 8 Mi bases per file at the default
            chunk size); a contig shorter than a shard gets one shard of just its chunks.
        compressor: Blosc compressor behind the bit-shuffle: "blosclz" (default: fastest to
            decode, about 0.265 bytes/base on bacterial genomes), "lz4" or "zstd" (about 4%
            smaller, 2.5x slower to decode at 16 Ki chunks).
        compression_level: Blosc compression level (1 fastest .. 9 smallest).
        keep_softmask: Keep lowercase (soft-masked) positions as a ``softmask/<i>`` bool array.
        overwrite: Rebuild and replace an existing store. Without it, a complete store built
            from the same files (same SHA-256) with the same options is kept as it is (the call
            returns at once) and any other existing ``out`` is an error.
        progress: Show a tqdm progress bar (bytes read, bases per second).
        command: Command line recorded in the metadata (default: ``sys.argv``).

    The store is built under a temporary name beside ``out``, every array is read back and
    checked against the SHA-256 of the codes written, and only then is it marked complete and
    renamed to ``out``. Raises FileNotFoundError for a missing input, ValueError naming the
    file, record and position for malformed input, FileExistsError when ``out`` holds a
    different store and ``overwrite`` is False.
    """
    out = Path(out)
    paths = [Path(p) for p in ([fasta_paths] if isinstance(fasta_paths, (str, Path)) else fasta_paths)]
    if not paths:
        raise ValueError("no input files given; pass one or more FASTA paths")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"input file not found: {path}")
    if len({p.resolve() for p in paths}) != len(paths):
        raise ValueError(f"the same input file is given twice: {[str(p) for p in paths]}")
    if shard_chunks < 1:
        raise ValueError(f"shard_chunks={shard_chunks} must be >= 1")
    if compressor not in COMPRESSORS:
        raise ValueError(f"compressor={compressor!r}; choose one of {COMPRESSORS}")
    if chunk_size < 1024:
        raise ValueError(f"chunk_size={chunk_size} is too small; use >= 1024 bases (default {DEFAULT_CHUNK_SIZE})")
    arguments = {
        "fasta_paths": [str(p.resolve()) for p in paths],
        "chunk_size": chunk_size,
        "shard_chunks": shard_chunks,
        "compressor": compressor,
        "compression_level": compression_level,
        "keep_softmask": keep_softmask,
    }

    existing = None if overwrite else reusable_store(out, GENOME_FORMAT, arguments, "fasta_paths")
    if existing is not None:
        stored = list(dict.fromkeys(c["source_sha256"] for c in existing["contigs"]))
        if stored == sha256_files(paths):
            if existing.get("format_version") == GENOME_FORMAT_VERSION:
                log.info("%s is up to date (same input checksums and options); keeping it", out)
                return out
            log.warning(
                "%s was built from the same files by an older genoformer (format %s): rebuilding it with "
                "chunk checksums (format %d)",
                out,
                existing.get("format_version"),
                GENOME_FORMAT_VERSION,
            )
            overwrite = True

    with atomic_build(out, overwrite) as tmp:
        _write_genome(
            tmp,
            paths,
            arguments,
            command,
            chunk_size,
            shard_chunks,
            _codecs(compressor, compression_level),
            keep_softmask,
            progress,
        )
    log.info("wrote genome store %s", out)
    return out


def _write_genome(
    tmp: Path,
    paths: list[Path],
    arguments: dict,
    command: str | None,
    chunk_size: int,
    shard_chunks: int,
    codecs: tuple[BloscCodec, Crc32cCodec],
    keep_softmask: bool,
    progress: bool,
) -> None:
    group = zarr.open_group(tmp, mode="w-")
    meta = base_metadata(GENOME_FORMAT, GENOME_FORMAT_VERSION, arguments, command)
    meta["alphabet"] = TOKEN_CODES
    meta["chunk_size"] = chunk_size
    group.attrs[METADATA_KEY] = meta
    contigs_group = group.create_group("contigs")
    mask_group = group.create_group("softmask")
    contigs: list[dict] = []
    seen: dict[str, Path] = {}
    total = sum(p.stat().st_size for p in paths)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="prepare", disable=not progress)
    t0 = time.perf_counter()
    bases = 0
    for path in paths:
        first_of_file = len(contigs)
        with SequenceFileReader(path) as reader:
            done_bytes = 0
            for record in reader.records():
                if record.name in seen:
                    raise ValueError(
                        f"{path}: duplicate record name {record.name!r} (first seen in "
                        f"{seen[record.name]}); record names must be unique across inputs"
                    )
                seen[record.name] = path
                if not record.sequence:
                    raise ValueError(f"{path}: record {record.name!r} has no sequence")
                codes = _encode_record(path, record)
                index = len(contigs)
                n = codes.shape[0]
                shard = chunk_size * min(shard_chunks, -(-n // chunk_size))  # short contig: one small shard
                array = contigs_group.create_array(
                    str(index),
                    shape=(n,),
                    dtype="uint8",
                    chunks=(chunk_size,),
                    shards=(shard,),
                    compressors=codecs,
                    fill_value=N,
                )
                write_sharded(array, tmp, codes, N)
                softmasked = 0
                if keep_softmask and not record.sequence.isupper():  # isupper: one C pass, exits early
                    mask = softmask_bytes(record.sequence).view(np.bool_)
                    softmasked = int(np.count_nonzero(mask))
                    mask_array = mask_group.create_array(
                        str(index),
                        shape=(n,),
                        dtype="bool",
                        chunks=(chunk_size,),
                        shards=(shard,),
                        compressors=codecs,
                        fill_value=False,
                    )
                    write_sharded(mask_array, tmp, mask, False)
                contigs.append(
                    {
                        "name": record.name,
                        "description": record.description,
                        "length": n,
                        "source": str(path.resolve()),
                        "source_name": path.name,
                        "source_sha256": "",
                        "n_count": int(np.count_nonzero(codes == N)),
                        "softmasked": softmasked,
                        "codes_sha256": hashlib.sha256(codes).hexdigest(),
                    }
                )
                bases += n
                bar.update(reader.bytes_read - done_bytes)
                done_bytes = reader.bytes_read
                bar.set_postfix(bases_per_s=f"{bases / max(time.perf_counter() - t0, 1e-9):.3g}")
            if len(contigs) == first_of_file:
                raise ValueError(f"{path}: no sequence records found; expected FASTA ('>name' lines)")
            bar.update(reader.bytes_read - done_bytes)
            for contig in contigs[first_of_file:]:
                contig["source_sha256"] = reader.sha256
    bar.close()
    _verify(tmp, contigs)
    meta["contigs"] = contigs
    meta["complete"] = True
    group.attrs[METADATA_KEY] = meta


def _verify(tmp: Path, contigs: list[dict]) -> None:
    """Re-read every array from disk and compare its length and SHA-256 with what was written."""
    group = zarr.open_group(tmp, mode="r")
    for index, contig in enumerate(contigs):
        codes = group[f"contigs/{index}"][:]
        mask_ok = (
            not contig["softmasked"] or int(np.count_nonzero(group[f"softmask/{index}"][:])) == contig["softmasked"]
        )
        if (
            codes.shape[0] != contig["length"]
            or hashlib.sha256(codes).hexdigest() != contig["codes_sha256"]
            or not mask_ok
        ):
            raise OSError(
                f"verification failed for contig {contig['name']!r} in {tmp}: the data read back "
                "differs from what was written (disk full or faulty storage?)"
            )


class GenomeStore:
    """Read-only access to a genome store, with a per-process LRU cache of decoded chunks.

    Chunks are decoded straight from their shard files (``direct_reads=True``, see
    ``shards.ShardedArrayReader``) or through zarr (``direct_reads=False``, the reference the
    tests compare with). With ``cache_bytes`` smaller than one chunk (e.g. 0) reads skip the
    cache entirely; that is the fastest setting when the decoded genome is much larger than
    any cache one would give it and windows are random.

    ``GenomeStore(path)`` checks that the store is complete and reads its metadata. Shards are
    mapped lazily on first read; mappings made before a fork stay valid in the child; pickling
    (for DataLoader workers under spawn) drops the mappings and the cache, so each worker maps
    the store itself. Not thread-safe (one store per thread).
    """

    def __init__(self, path: str | Path, cache_bytes: int = DEFAULT_CACHE_BYTES, direct_reads: bool = True) -> None:
        self.path = Path(path)
        self.cache_bytes = cache_bytes
        self.direct_reads = direct_reads
        group, self.metadata = open_store_group(self.path, GENOME_FORMAT, (1, GENOME_FORMAT_VERSION))
        self.rebuild = rebuild(self.path, self.metadata.get("arguments", {}))
        """The command that builds this store again from its inputs, replacing it."""
        if self.metadata["format_version"] < 2:
            warn_unchecked_store(self.path, self.rebuild)
        self.chunk_size: int = int(self.metadata["chunk_size"])
        self.contigs: tuple[ContigInfo, ...] = tuple(
            ContigInfo(index=i, **c) for i, c in enumerate(self.metadata["contigs"])
        )
        self._by_name = {c.name: c for c in self.contigs}
        self._lengths = [c.length for c in self.contigs]
        self._reset_handles()

    def _reset_handles(self) -> None:
        self._group: zarr.Group | None = None
        self._arrays: dict[int, zarr.Array] = {}
        self._readers: dict[int, ShardedArrayReader] = {}
        self._cache = ChunkCache(self.cache_bytes)
        # The cache can hold no chunk at all: read straight from the shards, no cache calls.
        self._uncached = self.direct_reads and self.cache_bytes < self.chunk_size

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_group", "_arrays", "_readers", "_cache"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset_handles()

    def __repr__(self) -> str:
        return f"GenomeStore({str(self.path)!r}, contigs={len(self.contigs)}, bases={self.total_length:,})"

    @property
    def total_length(self) -> int:
        return sum(self._lengths)

    @property
    def cache(self) -> ChunkCache:
        return self._cache

    def contig(self, key: str | int) -> ContigInfo:
        """The contig with this name or index."""
        if isinstance(key, str):
            try:
                return self._by_name[key]
            except KeyError:
                raise KeyError(
                    f"no contig named {key!r} in {self.path}; it has "
                    f"{[c.name for c in self.contigs[:10]]}{'...' if len(self.contigs) > 10 else ''}"
                ) from None
        return self.contigs[key]

    def _array(self, index: int, kind: str = "contigs") -> zarr.Array:
        key = index if kind == "contigs" else -1 - index
        array = self._arrays.get(key)
        if array is None:
            if self._group is None:
                self._group = zarr.open_group(self.path, mode="r")
            array = self._group[f"{kind}/{index}"]
            self._arrays[key] = array
        return array

    def _reader(self, index: int, kind: str = "contigs") -> ShardedArrayReader:
        key = index if kind == "contigs" else -1 - index
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = ShardedArrayReader(self.path / kind / str(index))
        return reader

    def _chunk(self, index: int, chunk: int) -> np.ndarray:
        key = (index, chunk)
        data = self._cache.lookup(key)
        if data is None:
            if self.direct_reads:
                data = self._reader(index).read_chunk(chunk)
            else:
                data = self._zarr_read(index, "contigs", chunk * self.chunk_size, (chunk + 1) * self.chunk_size)
            self._cache.put(key, data)
        return data

    def _zarr_read(self, index: int, kind: str, start: int, end: int) -> np.ndarray:
        try:
            return self._array(index, kind)[start:end]
        except (ValueError, RuntimeError) as error:  # zarr's crc32c codec: "Stored and computed checksum do not match"
            raise CorruptStoreError(f"{self.path / kind / str(index)}: {error}") from error

    def _damaged(self, error: CorruptStoreError, contig: int) -> CorruptStoreError:
        return damaged_store(self.path, self.rebuild, f"contig {self.contigs[contig].name!r}: {error}")

    def read(self, contig: str | int, start: int, end: int) -> np.ndarray:
        """Codes of ``contig`` in [start, end) as a new writable ``np.uint8`` array (end - start,);
        :class:`~genoformer.data.storage.CorruptStoreError` when the chunks read do not match
        their checksums."""
        index = self.contig(contig).index if isinstance(contig, str) else contig
        try:
            return self._read(index, start, end)
        except CorruptStoreError as error:
            raise self._damaged(error, index) from error

    def _read(self, index: int, start: int, end: int) -> np.ndarray:
        length = self._lengths[index]
        if not 0 <= start < end <= length:
            if start == end and 0 <= start <= length:
                return np.empty(0, dtype=np.uint8)
            raise IndexError(
                f"window [{start}, {end}) is outside contig {self.contigs[index].name!r} of length {length}"
            )
        if self._uncached:
            return (self._readers.get(index) or self._reader(index)).read(start, end)
        cs = self.chunk_size
        first, last = start // cs, (end - 1) // cs
        if first == last:
            return self._chunk(index, first)[start - first * cs : end - first * cs].copy()
        if last == first + 1:
            return np.concatenate(
                (self._chunk(index, first)[start - first * cs :], self._chunk(index, last)[: end - last * cs])
            )
        out = np.empty(end - start, dtype=np.uint8)
        lo = start - first * cs
        out[: cs - lo] = self._chunk(index, first)[lo:]
        pos = cs - lo
        for chunk in range(first + 1, last + 1):
            data = self._chunk(index, chunk)
            n = min(end - start - pos, cs)
            out[pos : pos + n] = data[:n]
            pos += n
        return out

    def read_softmask(self, contig: str | int, start: int, end: int) -> np.ndarray:
        """(end - start,) bool: True where the source had a lowercase base (all False when the
        contig had none or the store was built with keep_softmask=False)."""
        info = self.contig(contig)
        if not 0 <= start <= end <= info.length:
            raise IndexError(f"window [{start}, {end}) is outside contig {info.name!r} of length {info.length}")
        if not info.softmasked or end == start:
            return np.zeros(end - start, dtype=bool)
        try:
            if not self.direct_reads:
                return self._zarr_read(info.index, "softmask", start, end)
            return self._reader(info.index, "softmask").read(start, end)
        except CorruptStoreError as error:
            raise self._damaged(error, info.index) from error

    def verify(self) -> None:
        """Read every chunk of every contig (and soft-mask) and compare each contig with the
        SHA-256 and the length recorded at the build; CorruptStoreError naming the first contig
        that differs."""
        for info in self.contigs:
            codes = self.read(info.index, 0, info.length) if info.length else np.empty(0, np.uint8)
            found = None
            if hashlib.sha256(codes).hexdigest() != info.codes_sha256:
                found = "its bases differ from the SHA-256 recorded when the store was built"
            elif (
                info.softmasked and np.count_nonzero(self.read_softmask(info.index, 0, info.length)) != info.softmasked
            ):
                found = "its soft-mask differs from the count recorded when the store was built"
            if found is not None:
                raise damaged_store(self.path, self.rebuild, f"contig {info.name!r}: {found}")
