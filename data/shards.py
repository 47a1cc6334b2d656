"""Writing and reading zarr v3 shards directly: the fast paths of genome store building and reading.

zarr's own ``array[:] = codes`` costs about 2 ms of event-loop and file overhead per chunk on
top of compression (measured: 0.25 s for 13 Mbases in 128 Ki chunks, against 0.05 s for the
Blosc calls alone), which alone would cap ``prepare`` near 50 MB/s. So the writer encodes the
shards itself, in the format zarr's ``sharding_indexed`` codec defines (spec: zarr v3
sharding extension), for an array whose metadata zarr created:

    shard file = encoded inner chunk 0 | chunk 1 | ... | index | crc32c(index)
    index      = (chunks_per_shard, 2) little-endian uint64 (offset, nbytes); 2**64 - 1 marks
                 an absent chunk
    inner chunk = Blosc-compressed bytes of ``chunk_size`` uint8 codes (the edge chunk padded
                 with the fill value, as zarr stores edge chunks at full shape), then the
                 CRC32C of those bytes (4 bytes, little-endian: zarr's ``crc32c`` codec) when
                 the array's inner codecs end with it (genome stores of format 2 on)

Every read checks a chunk's CRC32C before decoding it (about 0.3 us for a 4 KB chunk, against
5.5 us to decode it), so a changed byte anywhere in a chunk is an error
(:class:`~genoformer.data.storage.CorruptStoreError`), never other bases.

The reference is zarr itself: the store builder reads every array back through zarr and
compares checksums before it marks the store complete, and the tests do the same.

:class:`ShardedArrayReader` reads these shards back without zarr (the hot path of random
window reads; zarr's synchronous API costs about 1 ms per chunk). Measured on one core for an
8 Ki-base window over 16 Ki-base chunks (1.5 chunks per window on average): about 5.5 us per
chunk in ``blosc.decompress`` and 2-3 us of Python per window. Opening the shard file per read,
re-building paths and decoding into a given array (numcodecs checks the destination in Python,
1.5 us) cost more than that and are gone.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import google_crc32c
import numpy as np
import zarr
from genoformer.data.storage import CorruptStoreError
from numcodecs import Blosc, blosc

_ABSENT = np.uint64(2**64 - 1)
_ABSENT_INT = 2**64 - 1


def blosc_for(array: zarr.Array) -> tuple[Blosc, bool]:
    """The numcodecs Blosc that encodes inner chunks the way ``array``'s metadata says, and
    whether a CRC32C follows each chunk."""
    sharding = array.metadata.codecs[0]
    names = [type(c).__name__ for c in sharding.codecs]
    if (
        names not in (["BytesCodec", "BloscCodec"], ["BytesCodec", "BloscCodec", "Crc32cCodec"])
        or sharding.index_location.value != "end"
    ):
        raise ValueError(
            f"{array.path}: expected sharding_indexed with one Blosc codec (and a CRC32C after it) and "
            "the index at the end"
        )
    cfg = sharding.codecs[1].to_dict()["configuration"]
    shuffle = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}[cfg["shuffle"]]
    return Blosc(
        cname=cfg["cname"], clevel=cfg["clevel"], shuffle=shuffle, blocksize=cfg["blocksize"], typesize=cfg["typesize"]
    ), len(names) == 3


def encode_shard(
    codes: np.ndarray, chunk_size: int, chunks_per_shard: int, codec: Blosc, fill: int, checksummed: bool = True
) -> bytes:
    """One shard file's bytes for ``codes`` (at most chunk_size * chunks_per_shard values), each
    chunk followed by its CRC32C when ``checksummed``."""
    index = np.full((chunks_per_shard, 2), _ABSENT, dtype="<u8")  # (chunks, [offset, nbytes])
    parts = []
    offset = 0
    for k in range(min(chunks_per_shard, -(-len(codes) // chunk_size))):
        chunk = codes[k * chunk_size : (k + 1) * chunk_size]
        if len(chunk) < chunk_size:
            chunk = np.concatenate([chunk, np.full(chunk_size - len(chunk), fill, dtype=codes.dtype)])
        data = codec.encode(np.ascontiguousarray(chunk))
        if checksummed:
            data += google_crc32c.value(data).to_bytes(4, "little")
        index[k] = (offset, len(data))
        offset += len(data)
        parts.append(data)
    index_bytes = index.tobytes()
    parts.append(index_bytes)
    parts.append(google_crc32c.value(index_bytes).to_bytes(4, "little"))
    return b"".join(parts)


def write_sharded(array: zarr.Array, root: Path, values: np.ndarray, fill: int) -> None:
    """Write all of ``values`` (1-D) into the sharded zarr ``array`` of the local store at ``root``."""
    (shard_len,) = array.metadata.chunk_grid.chunk_shape
    (chunk_size,) = array.metadata.codecs[0].chunk_shape
    codec, checksummed = blosc_for(array)
    for s, lo in enumerate(range(0, len(values), shard_len)):
        path = root / array.path / array.metadata.encode_chunk_key((s,))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(
            encode_shard(values[lo : lo + shard_len], chunk_size, shard_len // chunk_size, codec, fill, checksummed)
        )


def _check_layout(meta: dict, where: Path) -> None:
    """Check that a sharded 1-D array's ``zarr.json`` describes the layout ``write_sharded``
    writes (the only one the reader understands)."""
    codecs = meta.get("codecs", [])
    sharding = (
        codecs[0].get("configuration", {}) if len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed" else {}
    )
    inner = [c.get("name") for c in sharding.get("codecs", [])]
    index = [c.get("name") for c in sharding.get("index_codecs", [])]
    endian = [
        c.get("configuration", {}).get("endian", "little")
        for c in sharding.get("codecs", []) + sharding.get("index_codecs", [])
        if c.get("name") == "bytes"
    ]
    key = meta.get("chunk_key_encoding", {})
    if (
        len(meta.get("shape", [])) != 1
        or meta.get("data_type") not in ("uint8", "bool")
        or inner not in (["bytes", "blosc"], ["bytes", "blosc", "crc32c"])
        or index != ["bytes", "crc32c"]
        or sharding.get("index_location") != "end"
        or set(endian) - {"little"}
        or key.get("name") != "default"
        or key.get("configuration", {}).get("separator", "/") != "/"
    ):
        raise CorruptStoreError(
            f"{where}: not a 1-D uint8/bool array sharded as genoformer writes it "
            "(sharding_indexed with bytes + blosc (+ crc32c) inner codecs and a crc32c index "
            "at the end)"
        )


class ShardedArrayReader:
    """Reads ranges of a sharded 1-D uint8/bool array written by :func:`write_sharded` without
    zarr: the fast path of genome store reads. ``zarr.Array`` slicing is its reference
    (``GenomeStore(direct_reads=False)`` reads through zarr; the tests compare both).

    The array's ``zarr.json`` is parsed once. Each shard file is memory-mapped read-only on
    first use (its descriptor closed at once, so a genome of thousands of shards holds no open
    files) and its index checked against its CRC32C and kept as a list of (offset, nbytes).
    A chunk read is then a slice of the mapping (no system call, no copy), checked against its
    CRC32C when the array has them and handed to numcodecs' ``blosc.decompress``, and the part of
    the decoded chunk a window needs is copied into the result once. A chunk that fails either is
    a :class:`~genoformer.data.storage.CorruptStoreError` naming the shard file and the chunk
    (the store adds the command that rebuilds it). Mappings survive fork,
    so DataLoader workers forked from a process that already read keep using them; pickling
    (spawn) drops them. Stores are never modified in place (``prepare`` builds a new directory
    and renames it), so a mapping never sees its file shrink.
    """

    def __init__(self, array_dir: Path) -> None:
        meta = json.loads((array_dir / "zarr.json").read_bytes())
        _check_layout(meta, array_dir)
        (self.length,) = meta["shape"]
        (self.shard_len,) = meta["chunk_grid"]["configuration"]["chunk_shape"]
        (self.chunk_size,) = meta["codecs"][0]["configuration"]["chunk_shape"]
        self.chunks_per_shard = self.shard_len // self.chunk_size
        self.checksummed = meta["codecs"][0]["configuration"]["codecs"][-1]["name"] == "crc32c"
        self.dtype = np.dtype(meta["data_type"])
        self.fill = meta["fill_value"]
        self._dir = array_dir
        # per shard: the mapping as a memoryview (Blosc reads it fastest), as a uint8 array (what
        # google_crc32c reads without a copy), and the index
        self._shards: list[tuple[memoryview, np.ndarray, list[tuple[int, int]]] | None] = [None] * -(
            -self.length // self.shard_len
        )

    def _open_shard(self, shard: int) -> tuple[memoryview, np.ndarray, list[tuple[int, int]]]:
        path = self._dir / "c" / str(shard)
        size = self.chunks_per_shard * 16
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < size + 4:
                raise CorruptStoreError(f"{path}: the shard file is too short for its index")
            data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        tail = bytes(data[len(data) - size - 4 :])
        if google_crc32c.value(tail[:size]) != int.from_bytes(tail[size:], "little"):
            raise CorruptStoreError(f"{path}: the shard index does not match its checksum")
        index = [(o, n) for o, n in np.frombuffer(tail[:size], dtype="<u8").reshape(-1, 2).tolist()]
        for k, (offset, nbytes) in enumerate(index):  # Blosc header bytes 4-8: the decoded size
            if offset != _ABSENT_INT and (
                offset + nbytes > len(data) - size - 4
                or nbytes < 16
                or int.from_bytes(data[offset + 4 : offset + 8], "little") != self.chunk_size
            ):
                raise CorruptStoreError(f"{path}: chunk {k} is not a Blosc buffer of {self.chunk_size} values")
        self._shards[shard] = data, np.frombuffer(data, dtype=np.uint8), index
        return self._shards[shard]

    def _decode(self, chunk: int) -> bytes:
        """The decoded bytes of inner chunk ``chunk`` (chunk_size values; the edge chunk includes
        its padding). numcodecs' ``decompress`` without a destination: about 1.5 us faster per
        call than decoding into a given array (its destination checks are Python code)."""
        shard, k = divmod(chunk, self.chunks_per_shard)
        data, data_u8, index = self._shards[shard] or self._open_shard(shard)
        offset, nbytes = index[k]
        if offset == _ABSENT_INT:
            return np.full(self.chunk_size, self.fill, dtype=self.dtype).tobytes()
        if self.checksummed:
            nbytes -= 4
            stored = int.from_bytes(data[offset + nbytes : offset + nbytes + 4], "little")
            if google_crc32c.value(data_u8[offset : offset + nbytes]) != stored:
                raise CorruptStoreError(f"{self._dir / 'c' / str(shard)}: chunk {k} does not match its checksum")
        try:
            return blosc.decompress(data[offset : offset + nbytes])
        except RuntimeError as error:  # numcodecs: "error during blosc decompression: -1"
            raise CorruptStoreError(f"{self._dir / 'c' / str(shard)}: chunk {k} cannot be decoded ({error})") from error

    def read_chunk(self, chunk: int) -> np.ndarray:
        """Decoded inner chunk ``chunk`` as a read-only array (chunk_size,)."""
        return np.frombuffer(self._decode(chunk), dtype=self.dtype)

    def read(self, start: int, end: int) -> np.ndarray:
        """Values [start, end) (0 <= start < end <= length, unchecked) as a new writable array
        (end - start,): each chunk the range touches is decoded once and its part copied in."""
        cs = self.chunk_size
        dtype = self.dtype
        first, last = start // cs, (end - 1) // cs
        if first == last:
            return np.frombuffer(self._decode(first), dtype, end - start, start - first * cs).copy()
        out = np.empty(end - start, dtype=dtype)
        lo = start - first * cs
        out[: cs - lo] = np.frombuffer(self._decode(first), dtype, cs - lo, lo)
        pos = cs - lo
        for chunk in range(first + 1, last):
            out[pos : pos + cs] = np.frombuffer(self._decode(chunk), dtype)
            pos += cs
        out[pos:] = np.frombuffer(self._decode(last), dtype, end - start - pos)
        return out
