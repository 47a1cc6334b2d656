"""The one reader of DNA inputs: files, folders, globs, genome stores, records and literal strings.

Every genome command and API that takes sequences (`embed`, `evaluate`, `score`, `baseline`,
`variant_effect`, `Embedder.embed`) reads them here, so they all accept the same things:

- FASTA or GenBank files, plain or gzip/xz/bzip2 compressed (read as `genoformer prepare` reads
  them), record by record;
- genome stores (`*.zarr` folders written by `genoformer prepare`), contig by contig;
- folders (every FASTA/GenBank file in them, sorted by name) and quoted globs (sorted);
- Bio.SeqRecord objects, named by their id;
- where the caller allows literals (`embed`, `Embedder.embed`), DNA strings, named seqI after
  their place I in the input list.

Every sequence comes out as a :class:`NamedSequence` holding its codes (A0 C1 G2 T3 N4, see
``alphabet.py``); records are read one at a time, so memory holds one record at a time unless
the caller keeps them.

Shapes: ``codes`` is a 1-D ``np.uint8`` array (L,) of one record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
from Bio.SeqRecord import SeqRecord
from genoformer.data.genome.alphabet import ALLOWED, NotDNAError, encode, encode_bytes
from genoformer.data.genome.seqfiles import SEQUENCE_FILE_SUFFIXES, is_sequence_file_name, read_records
from genoformer.data.genome.store import GenomeStore
from genoformer.data.inputs import expand_inputs, is_glob, missing_input_error
from genoformer.data.storage import read_metadata

SequenceInputs = Union[str, Path, SeqRecord, Sequence[Union[str, Path, SeqRecord]]]
"""What `read_sequences` takes: one item or a list of them (see the module docstring)."""

_KIND = "a FASTA/GenBank file, plain or gzip/xz/bzip2 compressed, or a genome store folder from `genoformer prepare`"


@dataclass(frozen=True)
class NamedSequence:
    """One record: its name, the file or store it came from, and its codes (L,) uint8."""

    name: str
    source: str
    codes: np.ndarray


def is_genome_store(path: Path) -> bool:
    """Whether `path` is a store folder written by genoformer."""
    return path.is_dir() and read_metadata(path) is not None


def _names_a_path(item: str) -> bool:
    # os.path.exists says False for a string too long to be a path (a long literal sequence)
    return is_sequence_file_name(item) or os.path.exists(item) or is_glob(item)


def _entries(inputs: SequenceInputs, literals: bool, flag: str) -> list[tuple[int, Union[Path, str, SeqRecord]]]:
    """(place in the input list, item) with every path entry expanded and checked to exist."""
    items = [inputs] if isinstance(inputs, (str, Path, SeqRecord)) else list(inputs)
    if not items:
        raise ValueError(f"no input given; pass {_KIND} ({flag})")
    entries: list[tuple[int, Union[Path, str, SeqRecord]]] = []
    for index, item in enumerate(items):
        if isinstance(item, SeqRecord):
            entries.append((index, item))
        elif isinstance(item, Path) or (isinstance(item, str) and (_names_a_path(item) or not literals)):
            if not os.path.exists(item) and not is_glob(str(item)):
                raise missing_input_error(str(item), flag, _KIND)
            for name in expand_inputs(
                str(item), is_input=is_sequence_file_name, kind="FASTA/GenBank", keep_folder=is_genome_store, flag=flag
            ):
                entries.append((index, Path(name)))
        elif isinstance(item, str):
            entries.append((index, item))
        else:
            raise TypeError(
                f"item {index} of the inputs is a {type(item).__name__}; pass file paths, genome stores, "
                "Bio.SeqRecord objects or DNA strings."
            )
    return entries


def check_sequence_inputs(inputs: SequenceInputs, *, literals: bool = False, flag: str = "--inputs") -> None:
    """FileNotFoundError naming the first input that does not exist, before any is read."""
    _entries(inputs, literals, flag)


def read_sequences(
    inputs: SequenceInputs, *, literals: bool = False, flag: str = "--inputs"
) -> Iterator[NamedSequence]:
    """Yield every sequence of every input in order: files record by record, stores contig by
    contig, records and literal strings (with `literals`) one each.

    Every input is checked to exist before the first is read. Raises FileNotFoundError for a
    missing input, and ValueError naming the file and record for an empty record, an invalid
    character (with its 1-based position), a malformed or truncated file, or a name that an
    earlier record of the inputs has (results are keyed by record name).
    """
    seen: dict[str, str] = {}
    for sequence in _read_all(inputs, literals, flag):
        first = seen.get(sequence.name)
        if first is not None:
            where = f"twice in {first}" if first == sequence.source else f"in {first} and again in {sequence.source}"
            raise ValueError(
                f"{sequence.source}: the record name {sequence.name!r} appears {where}; results are keyed "
                "by record name, so give every record its own name (or read the files one at a time)"
            )
        seen[sequence.name] = sequence.source
        yield sequence


def _read_all(inputs: SequenceInputs, literals: bool, flag: str) -> Iterator[NamedSequence]:
    for index, item in _entries(inputs, literals, flag):
        if isinstance(item, SeqRecord):
            yield NamedSequence(item.id, "SeqRecord", _encode_literal(item.id, str(item.seq)))
        elif isinstance(item, str):
            yield NamedSequence(f"seq{index}", "string", _encode_literal(f"seq{index}", item))
        elif item.is_dir():
            yield from _read_store(item)
        else:
            yield from _read_file(item)


def _read_store(path: Path) -> Iterator[NamedSequence]:
    store = GenomeStore(path, cache_bytes=0)
    for contig in store.contigs:
        if contig.length == 0:
            raise ValueError(f"{path}: contig {contig.name!r} is empty (no bases); rebuild the store without it")
        yield NamedSequence(contig.name, str(path), store.read(contig.index, 0, contig.length))


def _read_file(path: Path) -> Iterator[NamedSequence]:
    for record in read_records(path):
        if not record.sequence:
            raise ValueError(f"{path}: record {record.name!r} is empty (no bases); remove it from the file")
        try:
            codes = encode_bytes(record.sequence)
        except NotDNAError as exc:
            raise ValueError(
                f"{path}: record {record.name!r}, {exc.found}; {ALLOWED}; fix or remove the record"
            ) from exc
        yield NamedSequence(record.name, str(path), codes)


def _encode_literal(name: str, sequence: str) -> np.ndarray:
    try:
        codes = encode(sequence)
    except NotDNAError as exc:
        hint = ""
        if "/" in sequence or "." in sequence:
            hint = (
                f" (a string is read as a sequence unless it names an existing file or store, or ends in "
                f"{', '.join(SEQUENCE_FILE_SUFFIXES)}, optionally plus .gz/.xz/.bz2; pass a pathlib.Path for "
                "other file names)"
            )
        raise ValueError(f"sequence {name!r}, {exc.found}; {ALLOWED}{hint}") from exc
    if codes.size == 0:
        raise ValueError(f"sequence {name!r} is empty; remove it from the inputs.")
    return codes
