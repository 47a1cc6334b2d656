"""Reading sequence files: FASTA, GenBank or GFF3 with a ##FASTA section, plain or gzip/xz/bzip2 compressed, streamed.

Compression is recognised from the file's first bytes (not its name). A compressed file is read
to its end: a gzip, xz or bzip2 stream that stops short is an error, and so is a BGZF (bgzip)
file without the empty end-of-file block every BGZF writer puts last (a file cut between two of
its blocks is otherwise a valid gzip file holding a shorter genome). A multi-member gzip file
that is not BGZF and was cut exactly between two members cannot be told from a whole one. The
raw bytes pass through a SHA-256 hasher on the way in, so the source checksum costs no second read.
Records come out one at a time (memory is bounded by the largest record). Errors name the file,
and where it matters the record and the 1-based base position.

FASTA is parsed with Biopython's ``SimpleFastaParser`` (universal newlines, so CRLF files read
the same as LF files); GenBank with ``Bio.SeqIO.parse(handle, "genbank")``; GFF3 (as Prokka and
Bakta write it) by skipping its annotation lines to the ``##FASTA`` line and parsing the rest as FASTA.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from Bio import SeqIO
from Bio.SeqIO.FastaIO import SimpleFastaParser

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_DECOMPRESSION_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")
"""The empty block that ends every BGZF file (SAM/BAM specification, section 4.1.2)."""


def is_bgzf(head: bytes) -> bool:
    """Whether a gzip file starting with `head` (at least 16 bytes) is BGZF: FEXTRA set and a
    first extra subfield "BC" of length 2."""
    return head[:4] == b"\x1f\x8b\x08\x04" and head[12:14] == b"BC" and head[14:16] == b"\x02\x00"


def check_bgzf_end(path: Path) -> None:
    """ValueError when `path` is a BGZF file that does not end with the BGZF end-of-file block."""
    with open(path, "rb") as f:
        head = f.read(16)
        if not is_bgzf(head):
            return
        f.seek(max(0, os.fstat(f.fileno()).st_size - len(BGZF_EOF)))
        if f.read() != BGZF_EOF:
            raise ValueError(
                f"{path}: the BGZF (bgzip) file ends without its end-of-file block, so it was cut short "
                "(an interrupted copy, download or compression); fetch or compress it again "
                "(it is truncated)"
            )


@dataclass(frozen=True)
class SequenceRecord:
    """One record of a sequence file: ``name`` is the first word of the header."""

    name: str
    description: str
    sequence: bytes  # ASCII letters as in the file (case kept), line breaks removed


class _HashingReader(io.RawIOBase):
    """Raw reader that hashes (SHA-256) and counts every byte read from the file below."""

    def __init__(self, raw: io.RawIOBase) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self.sha256.update(memoryview(buffer)[:n])
            self.bytes_read += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def detect_compression(path: Path) -> str:
    """'gzip', 'xz', 'bzip2' or 'none', from the first bytes of the file."""
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            if name == "zstd":
                raise ValueError(
                    f"{path}: zstd-compressed input is not supported; decompress it "
                    "(zstd -d) or recompress with gzip, xz or bzip2"
                )
            return name
    return "none"


class SequenceFileReader:
    """Iterate over the records of one FASTA/GenBank file, hashing the raw bytes as they are read.

    Use as a context manager; ``records()`` yields :class:`SequenceRecord`; after it is
    exhausted, ``sha256`` is the hex digest of the whole file and ``bytes_read`` its size.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"sequence file not found: {self.path}")
        if not self.path.is_file():
            raise ValueError(f"{self.path} is not a file")
        self.compression = detect_compression(self.path)
        if self.compression == "gzip":
            check_bgzf_end(self.path)
        self._hasher = _HashingReader(io.FileIO(self.path, "rb"))
        buffered = io.BufferedReader(self._hasher, buffer_size=1 << 20)
        if self.compression == "gzip":
            stream = gzip.GzipFile(fileobj=buffered, mode="rb")
        elif self.compression == "xz":
            stream = lzma.LZMAFile(buffered, mode="rb")
        elif self.compression == "bzip2":
            stream = bz2.BZ2File(buffered, mode="rb")
        else:
            stream = buffered
        self._binary = io.BufferedReader(stream, buffer_size=1 << 20) if stream is not buffered else stream
        self._buffered_raw = buffered

    def __enter__(self) -> SequenceFileReader:
        return self

    def __exit__(self, *exc) -> None:
        self._binary.close()
        self._buffered_raw.close()

    @property
    def bytes_read(self) -> int:
        """Bytes of the file (compressed) read so far."""
        return self._hasher.bytes_read

    @property
    def sha256(self) -> str:
        return self._hasher.sha256.hexdigest()

    def _sniff_format(self) -> str:
        try:
            head = self._binary.peek(4096)[:4096]
        except _DECOMPRESSION_ERRORS as exc:
            raise ValueError(
                f"{self.path}: cannot decompress {self.compression} data ({exc}); the file is truncated or corrupt"
            ) from exc
        text = head.lstrip()
        if not head:
            raise ValueError(f"{self.path}: the file is empty; expected FASTA records ('>name' lines)")
        if text.startswith(b">"):
            return "fasta"
        if text.startswith(b"LOCUS"):
            return "genbank"
        if text.startswith(b"##gff-version 3"):
            return "gff3"
        if not text:
            raise ValueError(f"{self.path}: the file holds only whitespace; expected FASTA records")
        if b"\x00" in head or any(b > 0x7F for b in head[:256]):
            raise ValueError(
                f"{self.path}: not a FASTA or GenBank file (binary data at the start); "
                "pass FASTA files, plain or gzip/xz/bzip2 compressed"
            )
        first_line = text.split(b"\n", 1)[0][:40].decode("latin-1")
        raise ValueError(
            f"{self.path}: not a FASTA file: the first line {first_line!r} is not a "
            "'>name' header (GenBank files must start with 'LOCUS', GFF3 files with '##gff-version 3')"
        )

    def records(self) -> Iterator[SequenceRecord]:
        """Yield records in file order; raises ValueError with the file name on malformed input."""
        fmt = self._sniff_format()
        text = io.TextIOWrapper(self._binary, encoding="latin-1", newline=None)
        try:
            if fmt == "gff3":  # the sequences are the FASTA records after the ##FASTA line
                for line in text:
                    if line.startswith("##FASTA"):
                        break
                else:
                    raise ValueError(
                        f"{self.path}: a GFF3 file without a ##FASTA section holds no sequences; "
                        "pass the genome's FASTA file instead (GFF3 from Prokka or Bakta embeds it)"
                    )
            if fmt in ("fasta", "gff3"):
                for title, seq in SimpleFastaParser(text):
                    name = title.split(None, 1)[0] if title.strip() else ""
                    if not name:
                        raise ValueError(
                            f"{self.path}: a record has an empty header line ('>' alone); every record needs a name"
                        )
                    yield SequenceRecord(name, title, seq.encode("latin-1"))
            else:
                try:
                    for rec in SeqIO.parse(text, "genbank"):
                        yield SequenceRecord(rec.id, rec.description, bytes(rec.seq))
                except ValueError as exc:
                    raise ValueError(f"{self.path}: malformed GenBank file ({exc})") from exc
            while self._buffered_raw.read(1 << 20):  # hash any bytes after the last record
                pass
        except _DECOMPRESSION_ERRORS as exc:
            raise ValueError(
                f"{self.path}: cannot decompress {self.compression} data ({exc}); the file is truncated or corrupt"
            ) from exc
        finally:
            text.detach()


def read_records(path: str | Path) -> Iterator[SequenceRecord]:
    """Convenience: yield the records of one file (see :class:`SequenceFileReader`)."""
    with SequenceFileReader(path) as reader:
        yield from reader.records()


SEQUENCE_FILE_SUFFIXES = (".fa", ".fasta", ".fna", ".ffn", ".fas", ".gb", ".gbk", ".genbank", ".gff3", ".gff")
"""A str input ending in one of these (optionally plus .gz/.xz/.bz2) is read as a file."""
_COMPRESSION_SUFFIXES = (".gz", ".xz", ".bz2")


def is_sequence_file_name(name: str) -> bool:
    """True for names like genes.fa, genome.fasta.gz, contigs.fna.xz, record.gbk."""
    lower = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    return lower.endswith(SEQUENCE_FILE_SUFFIXES)
