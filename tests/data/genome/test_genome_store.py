"""Genome stores: round trips against Biopython, compressed and multi-record inputs, bad inputs,
atomic and repeatable builds."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import zarr
from Bio import SeqIO
from data_helpers import EXAMPLES, random_bases, write_fasta
from genoformer.data import GenomeStore, encode, prepare_genome_store
from genoformer.data.genome import store as genome_store_module
from genoformer.data.storage import CorruptStoreError


def biopython_records(path: Path) -> list[tuple[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [(r.id, str(r.seq)) for r in SeqIO.parse(handle, "fasta")]


def assert_nothing_complete(out: Path) -> None:
    assert not out.exists(), f"{out} exists after a failed prepare"
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "temporary store left behind"


def _assert_round_trip(out: Path, paths: list[Path]) -> GenomeStore:
    store = GenomeStore(out)
    expected = [(name, seq, path) for path in paths for name, seq in biopython_records(path)]
    assert [c.name for c in store.contigs] == [name for name, _, _ in expected]
    for contig, (name, seq, path) in zip(store.contigs, expected):
        assert contig.length == len(seq) and contig.source_name == path.name
        assert np.array_equal(store.read(name, 0, contig.length), encode(seq)), name
    return store


@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> tuple[Path, list[Path]]:
    """The genomes that ship in examples/ (no skip in a user's clone)."""
    paths = sorted(EXAMPLES.glob("*.fasta.gz"))
    out = tmp_path_factory.mktemp("real") / "genomes.zarr"
    return prepare_genome_store(paths, out, progress=False), paths


def test_real_genomes_every_base_round_trips(real_store):
    out, paths = real_store
    store = _assert_round_trip(out, paths)
    vcholerae = [c for c in store.contigs if c.source_name.startswith("vcholerae")]
    assert len(vcholerae) == 2 and vcholerae[0].source_sha256 == vcholerae[1].source_sha256


def test_real_random_windows_equal_fasta_slices(real_store):
    out, paths = real_store
    store = GenomeStore(out, cache_bytes=1 << 20)  # small cache: exercise eviction
    seqs = {name: seq for path in paths for name, seq in biopython_records(path)}
    rng = np.random.default_rng(0)
    for _ in range(200):
        contig = store.contigs[rng.integers(len(store.contigs))]
        length = int(rng.integers(1, 300_000))
        start = int(rng.integers(0, max(contig.length - length, 1)))
        end = min(start + length, contig.length)
        assert np.array_equal(store.read(contig.index, start, end), encode(seqs[contig.name][start:end]))


def test_real_store_is_compact(real_store):
    out, _ = real_store
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert size / GenomeStore(out).total_length <= 0.30


def test_metadata_records_everything(small_store):
    store = GenomeStore(small_store)
    meta = store.metadata
    for key in ("format", "format_version", "tool_version", "created", "command", "arguments", "alphabet"):
        assert key in meta
    assert meta["complete"] is True and meta["alphabet"]["N"] == 4
    contig = store.contig("chrC")
    assert contig.n_count == 3000 and len(contig.source_sha256) == 64
    assert store.contig("chrB").softmasked == 20_000


def test_softmask_kept_and_sharded_contigs_read(small_store, small_records):
    store = GenomeStore(small_store)
    mask = store.read_softmask("chrB", 19_990, 20_010)
    assert mask[:10].all() and not mask[10:].any()
    assert not store.read_softmask("chrA", 0, 100).any()
    # chrA (50,000 bases) is longer than 4 chunks of 4096: it is sharded
    meta = zarr.open_group(small_store, mode="r")["contigs/0"].metadata.to_dict()
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert np.array_equal(store.read("chrA", 0, 50_000), encode(small_records[0][1]))


@pytest.mark.parametrize("compress", ["plain", "gz", "xz", "bz2"])
def test_compressed_multi_record_inputs(tmp_path, compress):
    rng = np.random.default_rng(1)
    records = [("r1 first", random_bases(rng, 3000)), ("r2", random_bases(rng, 777)), ("r3", "acgtacgtRYN" * 10)]
    plain = write_fasta(tmp_path / "x.fa", records, width=70).read_bytes()
    writers = {"plain": lambda b: b, "gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}
    path = tmp_path / f"input.{compress}"  # the name does not say the format: magic bytes do
    path.write_bytes(writers[compress](plain))
    store = GenomeStore(prepare_genome_store([path], tmp_path / "s.zarr", progress=False))
    assert [c.name for c in store.contigs] == ["r1", "r2", "r3"]
    assert store.contigs[0].description == "r1 first"
    for contig, (_, seq) in zip(store.contigs, records):
        assert np.array_equal(store.read(contig.index, 0, contig.length), encode(seq))


def test_many_files_and_crlf(tmp_path):
    rng = np.random.default_rng(2)
    a, b = random_bases(rng, 5000), random_bases(rng, 4000)
    f1 = write_fasta(tmp_path / "a.fa", [("a", a)], newline="\r\n")
    f2 = write_fasta(tmp_path / "b.fa.gz", [("b", b)])
    store = GenomeStore(prepare_genome_store([f1, f2], tmp_path / "s.zarr", progress=False))
    assert store.read("a", 0, 5000).tolist() == encode(a).tolist()
    assert store.read("b", 0, 4000).tolist() == encode(b).tolist()


def test_genbank_input(tmp_path):
    from Bio.Seq import Seq
    from Bio.SeqRecord import SeqRecord

    seq = random_bases(np.random.default_rng(3), 1234)
    record = SeqRecord(Seq(seq), id="GB1", name="GB1", description="test", annotations={"molecule_type": "DNA"})
    path = tmp_path / "x.gb"
    SeqIO.write([record], path, "genbank")
    store = GenomeStore(prepare_genome_store([path], tmp_path / "s.zarr", progress=False))
    assert store.contigs[0].name == "GB1" and np.array_equal(store.read(0, 0, 1234), encode(seq))


def _truncated_gzip() -> bytes:
    data = gzip.compress((">r1\n" + random_bases(np.random.default_rng(4), 100_000) + "\n").encode())
    return data[: len(data) // 2]


BAD_INPUTS = {
    "empty file": (b"", "empty"),
    "no header": (b"ACGTACGT\nACGT\n", "not a FASTA file"),
    "binary garbage": (bytes(range(256)) * 4, "binary data"),
    "invalid base": (b">r1\nACGT\n>r2 x\nACGTAC*T\n", r"record 'r2', base 7 \(1-based\).*'\*'"),
    "duplicate names": (b">r1\nACGT\n>r1\nACGT\n", "duplicate record name 'r1'"),
    "empty record": (b">r1\n>r2\nACGT\n", "'r1' has no sequence"),
    "header only name": (b">\nACGT\n", "empty header"),
    "non-FASTA text": (b"#!/bin/sh\necho hello\n", "not a FASTA file"),
    "truncated gzip": (_truncated_gzip(), "truncated or corrupt"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_fail_clearly_and_leave_nothing(tmp_path, case):
    data, message = BAD_INPUTS[case]
    path = tmp_path / "bad.fa"
    path.write_bytes(data)
    out = tmp_path / "s.zarr"
    with pytest.raises(ValueError, match=message) as info:
        prepare_genome_store([path], out, progress=False)
    assert str(path) in str(info.value)
    assert_nothing_complete(out)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.fa"):
        prepare_genome_store([tmp_path / "nope.fa"], tmp_path / "s.zarr", progress=False)
    assert_nothing_complete(tmp_path / "s.zarr")


def test_duplicate_names_across_files(tmp_path):
    f1 = write_fasta(tmp_path / "a.fa", [("x", "ACGT")])
    f2 = write_fasta(tmp_path / "b.fa", [("x", "ACGT")])
    with pytest.raises(ValueError, match="duplicate record name 'x'"):
        prepare_genome_store([f1, f2], tmp_path / "s.zarr", progress=False)


def test_all_n_record_is_stored(tmp_path):
    path = write_fasta(tmp_path / "n.fa", [("gap", "N" * 5000), ("ok", "ACGT" * 1000)])
    store = GenomeStore(prepare_genome_store([path], tmp_path / "s.zarr", progress=False))
    assert store.contig("gap").n_count == 5000 and (store.read("gap", 0, 5000) == 4).all()


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    path = write_fasta(tmp_path / "a.fa", [("a", "ACGT" * 1000)])
    out = tmp_path / "s.zarr"

    def fail(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(genome_store_module, "_verify", fail)
    with pytest.raises(KeyboardInterrupt):
        prepare_genome_store([path], out, progress=False)
    assert_nothing_complete(out)


def test_incomplete_store_refuses_to_open_and_stale_temporaries_go(tmp_path):
    path = write_fasta(tmp_path / "a.fa", [("a", "ACGT" * 1000)])
    out = prepare_genome_store([path], tmp_path / "s.zarr", progress=False)
    group = zarr.open_group(out, mode="r+")
    meta = dict(group.attrs["genoformer"])
    meta["complete"] = False
    group.attrs["genoformer"] = meta
    with pytest.raises(ValueError, match="incomplete"):
        GenomeStore(out)
    # a crashed build (dead pid) leaves a temporary: the next prepare removes it
    dead = max(int(p) for p in os.listdir("/proc") if p.isdigit()) + 10_000 if os.path.isdir("/proc") else 999_999
    stale = tmp_path / f".s.zarr.tmp-{dead}@{socket.gethostname()}-new-deadbeef"
    other_host = tmp_path / f".s.zarr.tmp-{dead}@another-host.example-new-deadbeef"
    other_host.mkdir()
    stale.mkdir()
    prepare_genome_store([path], out, overwrite=True, progress=False)
    assert not stale.exists() and GenomeStore(out).contigs[0].length == 4000
    assert other_host.exists(), "another host's build in progress must survive"


def test_rerun_skips_identical_and_refuses_different(tmp_path):
    path = write_fasta(tmp_path / "a.fa", [("a", "ACGT" * 1000)])
    out = prepare_genome_store([path], tmp_path / "s.zarr", progress=False)
    created = GenomeStore(out).metadata["created"]
    zarr_json = (out / "zarr.json").stat().st_mtime_ns
    prepare_genome_store([path], out, progress=False)  # identical: kept
    assert (out / "zarr.json").stat().st_mtime_ns == zarr_json
    write_fasta(path, [("a", "TTTT" * 1000)])
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare_genome_store([path], out, progress=False)
    assert GenomeStore(out).metadata["created"] == created
    prepare_genome_store([path], out, overwrite=True, progress=False)
    assert (GenomeStore(out).read("a", 0, 4) == 3).all()


def test_opening_non_stores(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare"):
        GenomeStore(tmp_path / "missing.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a genoformer store"):
        GenomeStore(tmp_path / "empty")


def test_read_bounds(small_store):
    store = GenomeStore(small_store)
    with pytest.raises(IndexError, match="outside contig 'chrA'"):
        store.read("chrA", 49_990, 50_001)
    with pytest.raises(KeyError, match="no contig named"):
        store.read("chrZ", 0, 1)


def test_direct_chunk_reads_equal_zarr_reads(small_store, real_store):
    for path in (small_store, real_store[0]):
        direct, reference = GenomeStore(path), GenomeStore(path, direct_reads=False)
        for contig in direct.contigs:
            for chunk in range(-(-contig.length // direct.chunk_size)):
                lo = chunk * direct.chunk_size
                hi = min(lo + direct.chunk_size, contig.length)
                assert np.array_equal(direct.read(contig.index, lo, hi), reference.read(contig.index, lo, hi))


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory, small_records) -> Path:
    """zstd, 1,536-base chunks (not a power of two), 3 chunks per shard, a contig shorter than
    one chunk: the reader must follow whatever geometry the metadata says."""
    root = tmp_path_factory.mktemp("odd_store")
    records = small_records + [("tiny", "ACGTN" * 100)]
    fasta = write_fasta(root / "odd.fa", records)
    return prepare_genome_store(
        [fasta], root / "odd.zarr", chunk_size=1536, shard_chunks=3, compressor="zstd", progress=False
    )


@pytest.mark.parametrize("cache_bytes", [0, 8192, 1 << 20])
def test_windows_equal_plain_zarr_for_every_cache_size(small_store, odd_store, cache_bytes):
    """Uncached (cache_bytes=0 or smaller than a chunk), thrashing and roomy caches all return the
    slice a plain ``zarr.open_array`` returns: windows inside one chunk, across two, across many,
    at both ends and of length 1."""
    rng = np.random.default_rng(cache_bytes)
    for path in (small_store, odd_store):
        store = GenomeStore(path, cache_bytes=cache_bytes)
        cs = store.chunk_size
        for contig in store.contigs:
            codes = zarr.open_array(path / "contigs" / str(contig.index), mode="r")[:]
            n = contig.length
            windows = [
                (0, n),
                (0, 1),
                (n - 1, n),
                (0, min(cs, n)),
                (max(n - cs - 7, 0), n),
                (min(cs - 3, n - 1), min(cs + 5, n)),
                (min(cs, n - 1), min(3 * cs + 1, n)),
            ]
            for _ in range(30):
                start = int(rng.integers(n))
                windows.append((start, min(n, start + int(rng.integers(1, 4 * cs)))))
            for start, end in windows:
                window = store.read(contig.index, start, end)
                assert window.flags.writeable and window.dtype == np.uint8
                assert np.array_equal(window, codes[start:end]), (path.name, contig.name, start, end)
            assert store.read(contig.index, n, n).shape == (0,)


def test_softmask_direct_reads_equal_zarr(small_store, small_records):
    store = GenomeStore(small_store, cache_bytes=0)
    mask = zarr.open_array(small_store / "softmask" / "1", mode="r")[:]
    expected = np.array([ch.islower() for ch in small_records[1][1]])
    assert np.array_equal(mask, expected)
    for start, end in [(0, 33_000), (19_990, 20_010), (4095, 4097), (5, 5)]:
        assert np.array_equal(store.read_softmask("chrB", start, end), expected[start:end])


def test_chunks_are_encoded_as_the_metadata_says(small_store, odd_store):
    """Each chunk's Blosc header (byte 3: typesize) matches the array metadata plain zarr reads."""
    for path in (small_store, odd_store):
        array = zarr.open_array(path / "contigs" / "0", mode="r")
        blosc = array.metadata.codecs[0].codecs[1]
        shard = (path / "contigs" / "0" / "c" / "0").read_bytes()
        assert shard[3] == blosc.typesize == 2 and blosc.shuffle.value == "bitshuffle"


def test_short_contigs_get_a_shard_of_their_own_size(odd_store):
    tiny = zarr.open_array(odd_store / "contigs" / "3", mode="r")
    assert tiny.shape == (500,) and tiny.shards == (1536,) and tiny.chunks == (1536,)
    # chrA: 50,000 bases in 33 chunks of 1,536: 11 full shards of 3 chunks
    assert len(list((odd_store / "contigs" / "0" / "c").iterdir())) == 11


_INHERITED: list[GenomeStore] = []  # a store a forked child finds in its copy of our memory


def _read_in_child(store: GenomeStore | None = None) -> bytes:
    store = _INHERITED[0] if store is None else store
    return store.read("chrA", 4000, 13_000).tobytes() + store.read("chrB", 0, 9000).tobytes()


def test_reads_after_fork_and_pickle(small_store):
    import multiprocessing
    import pickle

    store = GenomeStore(small_store, cache_bytes=0)
    expected = _read_in_child(store)  # maps chrA's and chrB's first shards in this process
    _INHERITED[:] = [store]
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:  # the child reuses the mappings
            assert pool.apply(_read_in_child) == expected
    finally:
        _INHERITED.clear()
    assert _read_in_child(pickle.loads(pickle.dumps(store))) == expected  # spawn: maps afresh


def test_corrupt_shard_fails_clearly(tmp_path, small_store):
    import shutil

    copy = tmp_path / "copy.zarr"
    shutil.copytree(small_store, copy)
    shard = copy / "contigs" / "0" / "c" / "0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the index
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="copy.zarr is damaged.*genoformer prepare .*--overwrite.*shard index"):
        GenomeStore(copy, cache_bytes=0).read("chrA", 0, 10)


def test_unknown_compressor(tmp_path):
    path = write_fasta(tmp_path / "a.fa", [("a", "ACGT" * 1000)])
    with pytest.raises(ValueError, match="compressor='gzip'"):
        prepare_genome_store([path], tmp_path / "s.zarr", compressor="gzip", progress=False)


def test_every_chunk_carries_its_crc32c(small_store):
    """Format 2: each chunk's last 4 bytes are the CRC32C of the rest, as zarr's crc32c codec writes."""
    import google_crc32c

    array = zarr.open_array(small_store / "contigs" / "0", mode="r")
    assert [type(c).__name__ for c in array.metadata.codecs[0].codecs] == ["BytesCodec", "BloscCodec", "Crc32cCodec"]
    shard = (small_store / "contigs" / "0" / "c" / "0").read_bytes()
    index = np.frombuffer(shard[-4 - 16 * 4 : -4], dtype="<u8").reshape(-1, 2)
    for offset, nbytes in index.tolist():
        chunk = shard[offset : offset + nbytes]
        assert google_crc32c.value(chunk[:-4]) == int.from_bytes(chunk[-4:], "little")


def test_a_format_1_store_reads_with_a_warning_and_prepare_upgrades_it(tmp_path, monkeypatch, caplog):
    """A store of the format before chunk checksums still reads (what it holds is unchanged),
    says once how to rebuild it, and `prepare` with the same inputs rebuilds it with checksums."""
    from zarr.codecs import BloscCodec

    path = write_fasta(tmp_path / "a.fa", [("a", random_bases(np.random.default_rng(1), 5000))])
    with monkeypatch.context() as patch:
        patch.setattr(genome_store_module, "GENOME_FORMAT_VERSION", 1)
        patch.setattr(
            genome_store_module,
            "_codecs",
            lambda name, level: (BloscCodec(cname=name, clevel=level, shuffle="bitshuffle", typesize=2),),
        )
        out = prepare_genome_store([path], tmp_path / "old.zarr", progress=False)
    with caplog.at_level("WARNING"):
        old = GenomeStore(out, cache_bytes=0)
        assert old.read("a", 0, 5000).tolist() == encode(SeqIO.read(path, "fasta").seq).tolist()
    assert "without chunk checksums" in caplog.text and "--overwrite" in caplog.text
    old.verify()  # the SHA-256 of every contig, recorded since format 1
    prepare_genome_store([path], out, progress=False)
    assert GenomeStore(out).metadata["format_version"] == 2
