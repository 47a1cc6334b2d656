"""Sequences to score or count, from FASTA/GenBank files or genome stores, as code arrays.

Commands that read whole records (``genoformer baseline``) take a mix of sequence files
(FASTA or GenBank, plain or gzip/xz/bzip2 compressed, read as ``genoformer prepare`` reads them)
and genome stores (``*.zarr`` folders written by ``genoformer prepare``, read contig by contig).
Every record comes out as a :class:`NamedSequence` holding its codes (A0 C1 G2 T3 N4, see
``alphabet.py``); records are read one at a time, so memory holds one record at a time unless
the caller keeps them.

Shapes: ``codes`` is a 1-D ``np.uint8`` array (L,) of one record.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genoformer.data.alphabet import InvalidBaseError, encode_bytes
from genoformer.data.genome_store import GenomeStore
from genoformer.data.seqfiles import is_sequence_file_name, read_records
from genoformer.data.storage import read_metadata


@dataclass(frozen=True)
class NamedSequence:
    """One record: its name, the file or store it came from, and its codes (L,) uint8."""

    name: str
    source: str
    codes: np.ndarray


def check_sequence_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """The inputs as Path objects, each a sequence file or a genome store; FileNotFoundError
    naming the first that does not exist.

    A genome store folder stays as it is; any other folder stands for every FASTA/GenBank file in
    it (sorted by name).
    """
    if not paths:
        raise ValueError("no input given; pass FASTA/GenBank files or genome stores (.zarr folders)")
    checked: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"input not found: {path} (expected a FASTA/GenBank file, plain or "
                                    "gzip/xz/bzip2 compressed, or a genome store folder from `genoformer prepare`)")
        if path.is_dir() and read_metadata(path) is None:
            files = sorted(child for child in path.iterdir() if child.is_file() and is_sequence_file_name(child.name))
            if not files:
                raise FileNotFoundError(f"folder {path} is neither a genome store nor holds FASTA/GenBank files")
            checked += files
        else:
            checked.append(path)
    return checked


def read_sequences(paths: Sequence[str | Path]) -> Iterator[NamedSequence]:
    """Yield every record of every input in order: files record by record, stores contig by contig.

    Raises FileNotFoundError for a missing input, and ValueError naming the file and record for
    an empty record, an invalid character (with its 1-based position) or a malformed file.
    """
    for path in check_sequence_inputs(paths):
        if path.is_dir():
            store = GenomeStore(path, cache_bytes=0)
            for contig in store.contigs:
                if contig.length == 0:
                    raise ValueError(f"{path}: contig {contig.name!r} is empty (no bases); rebuild the store "
                                     "without it")
                yield NamedSequence(contig.name, str(path), store.read(contig.index, 0, contig.length))
            continue
        for record in read_records(path):
            if not record.sequence:
                raise ValueError(f"{path}: record {record.name!r} is empty (no bases); remove it from the file")
            try:
                codes = encode_bytes(record.sequence)
            except InvalidBaseError as exc:
                raise ValueError(f"{path}: record {record.name!r}, base {exc.position + 1:,} (1-based): invalid "
                                 f"character {exc.char!r}; allowed are A C G T N (any case) and IUPAC ambiguity "
                                 "codes (read as N); fix or remove the record") from exc
            yield NamedSequence(record.name, str(path), codes)
