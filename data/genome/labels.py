"""Labelled sequences for fine-tuning: classification (binary, multi-class, multi-label) and regression.

`read_labelled` reads one path or a list of them and concatenates what they hold, in order:

- a TSV/CSV table (``.tsv``/``.txt`` tab-separated, ``.csv`` comma-separated, optionally
  gzip/xz/bzip2 compressed) with a header row holding a ``sequence`` column and label columns;
- a FASTA (or GenBank) file next to a table without a ``sequence`` column but with a ``name``
  column: the table labels the records by id, and every record needs exactly one row;
- a BED file (chrom, 0-based start, end, label, optional score, optional strand; ``-`` takes the
  reverse complement) whose intervals are cut from ``genome`` (FASTA/GenBank file or store).

Label columns are one column named ``label`` or several named ``label_<name>``. For
``task="classify"`` one ``label`` column gives class names (``TargetKind.SEQUENCE_CLASSES``) and
``label_*`` columns give 0/1 flags (``TargetKind.SEQUENCE_LABELS``); for ``task="regress"`` every label
column is a numeric target (``TargetKind.SEQUENCE_VALUES``). Every other column is kept as text in
``columns`` so that prediction files can carry it through.

Held-out sets must not share sequences with the training set: two sequences are the same when
their codes or the codes of one and the reverse complement of the other are equal (the
*canonical* sequence is the smaller of the two as bytes). `leak_check` refuses such overlap,
`split_leak_free` and `kfold_leak_free` keep each canonical sequence on one side.

Shapes: N sequences; K label columns of a multi-label set; T regression targets. ``codes[i]``
is a 1-D ``np.uint8`` array (L_i,) (A0 C1 G2 T3 N4, see ``alphabet.py``); ``targets`` is int64
(N,) for SEQUENCE_CLASSES, float32 (N, K) for SEQUENCE_LABELS and float32 (N, T) for SEQUENCE_VALUES.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import io
import lzma
import math
import typing
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Union

import numpy as np
from genoformer.data.genome.alphabet import ALLOWED, NotDNAError, encode, reverse_complement
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.seqfiles import detect_compression, is_sequence_file_name
from genoformer.data.genome.targets import TargetKind, Task
from genoformer.data.inputs import expand_inputs, missing_input_error

PathLike = Union[str, Path]
Paths = Union[PathLike, Sequence[PathLike]]

_COMPRESSION_SUFFIXES = (".gz", ".xz", ".bz2")
_DELIMITERS = {".tsv": "\t", ".txt": "\t", ".csv": ","}
_BED_SUFFIXES = (".bed",)
_KIND = "TSV/CSV tables, FASTA/GenBank or BED"
_TRUE = frozenset({"1", "1.0", "true", "yes"})
_FALSE = frozenset({"0", "0.0", "false", "no"})
#: The smallest class below this share of the largest makes `class_balance` warn.
IMBALANCE_RATIO = 0.1


@dataclasses.dataclass(frozen=True)
class LabelledSequences:
    """N sequences with their targets.

    Attributes:
        names: One per sequence: the ``name`` column, the FASTA record id, the BED interval as
            ``chrom:start-end(strand)`` (BED coordinates; no ``(strand)`` without a strand
            column), else ``seqI`` with I the 0-based place among all sequences read.
        codes: The codes (L_i,) uint8 of each sequence.
        targets: SEQUENCE_CLASSES: int64 (N,) index into ``label_names`` (-1 for unlabelled sequences);
            SEQUENCE_LABELS: float32 (N, K) of 0/1; SEQUENCE_VALUES: float32 (N, T).
        kind: What the targets are.
        label_names: SEQUENCE_CLASSES: the classes in index order; the others: one name per
            target column.
        columns: The inputs' other columns (name, id, any extra; chrom/start/end/score/strand
            for BED) in input order, as text; "" where an input lacks a column others have.
    """

    names: list[str]
    codes: list[np.ndarray]
    targets: np.ndarray
    kind: TargetKind
    label_names: list[str]
    columns: dict[str, list[str]]

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.codes) != n or len(self.targets) != n:
            raise ValueError(
                f"{n} names, {len(self.codes)} sequences and {len(self.targets)} targets: give one of each per sequence"
            )
        for column, values in self.columns.items():
            if len(values) != n:
                raise ValueError(f"column {column!r} has {len(values)} values for {n} sequences")

    def __len__(self) -> int:
        return len(self.names)

    def subset(self, indices: Sequence[int] | np.ndarray) -> LabelledSequences:
        """The sequences at `indices` (integer positions, in the order given; or a boolean mask)."""
        index = np.asarray(indices)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        index = index.astype(np.int64, copy=False)
        if index.size and (index.min() < -len(self) or index.max() >= len(self)):
            raise IndexError(f"indices reach {int(index.max())} but there are {len(self)} sequences")
        return LabelledSequences(
            names=[self.names[i] for i in index],
            codes=[self.codes[i] for i in index],
            targets=self.targets[index],
            kind=self.kind,
            label_names=list(self.label_names),
            columns={column: [values[i] for i in index] for column, values in self.columns.items()},
        )


# --- files ------------------------------------------------------------------------------------


def open_text(path: PathLike, *, encoding: str = "utf-8", newline: str | None = None) -> io.TextIOBase:
    """Open a text file for reading, plain or gzip/xz/bzip2 compressed (told by its first bytes)."""
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise ValueError(f"{path} is not a file")
        raise missing_input_error(str(path), "paths", _KIND)
    compression = detect_compression(path)
    opener = {"gzip": gzip.open, "xz": lzma.open, "bzip2": bz2.open}.get(compression)
    if opener is None:
        return open(path, encoding=encoding, newline=newline)
    return opener(path, "rt", encoding=encoding, newline=newline)


def bare_suffix(path: PathLike) -> str:
    """The lowercase suffix of `path` without a compression suffix: ``a.tsv.gz`` -> ``.tsv``."""
    name = Path(path).name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return Path(name).suffix


def _is_labelled_input(name: str) -> bool:
    return bare_suffix(name) in _DELIMITERS or bare_suffix(name) in _BED_SUFFIXES or is_sequence_file_name(name)


def bed_lines(path: PathLike) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, tab-separated fields) of each data line of a BED/bedGraph file;
    blank lines and lines starting with ``#``, ``track`` or ``browser`` are skipped."""
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith(("#", "track", "browser")):
                continue
            yield number, line.split("\t")


def read_genome_contigs(
    genome: PathLike | None, wanted: set[str], *, needed_by: str
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The codes of the contigs of `genome` named in `wanted`, and the names of all its contigs.

    `genome` is a FASTA/GenBank file or a genome store; `needed_by` names what needs it (for the
    error when no genome is given).
    """
    if genome is None:
        raise ValueError(
            f"{needed_by} needs the genome its coordinates refer to; pass genome= "
            "(a FASTA/GenBank file or a genome store from `genoformer prepare`)"
        )
    kept: dict[str, np.ndarray] = {}
    names: list[str] = []
    for record in read_sequences(Path(genome), flag="genome"):
        names.append(record.name)
        if record.name in wanted:
            kept[record.name] = record.codes
    return kept, names


def _examples(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(name) for name in list(names)[:limit])
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def _encode_row(sequence: str, where: str) -> np.ndarray:
    sequence = sequence.strip()
    if not sequence:
        raise ValueError(f"{where}: the sequence is empty; remove the row or give its sequence")
    try:
        return encode(sequence)
    except NotDNAError as exc:
        raise ValueError(f"{where}: the sequence, {exc.found}; {ALLOWED}; fix or remove the row") from exc


@dataclasses.dataclass
class _Part:
    """What one input (or one FASTA+table pairing) gives: names (None: seqI), codes, raw label
    text per label column with the place of each row, and the other columns."""

    source: str
    names: list[str | None]
    codes: list[np.ndarray]
    label_columns: list[str]  # label names: "label" for a `label` column, else the part after `label_`
    plain_label: bool  # the labels come from one `label` column (or a BED 4th column)
    labels: list[list[str]]  # per row, one text per label column
    where: list[str]  # per row: "file row 12" / "file line 12"
    columns: dict[str, list[str]]


@dataclasses.dataclass
class _Table:
    path: Path
    header: list[str]
    rows: list[list[str]]
    lines: list[int]

    def column(self, name: str) -> int | None:
        return self.header.index(name) if name in self.header else None

    def label_columns(self) -> tuple[list[int], list[str], bool]:
        """Indices and label names of the label columns, and whether it is one `label` column."""
        plain = [i for i, column in enumerate(self.header) if column.lower() == "label"]
        prefixed = [i for i, column in enumerate(self.header) if column.lower().startswith("label_")]
        if plain and prefixed:
            raise ValueError(
                f"{self.path}: has both a `label` column and `label_<name>` columns "
                f"({', '.join(self.header[i] for i in prefixed)}); use one `label` column or only "
                "`label_<name>` columns"
            )
        if plain:
            return plain, ["label"], True
        return prefixed, [self.header[i][len("label_") :] for i in prefixed], False


def _read_table(path: Path) -> _Table:
    delimiter = _DELIMITERS[bare_suffix(path)]
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # sequences can be long fields
    with open_text(path, newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader, None)
            while header is not None and not any(field.strip() for field in header):
                header = next(reader, None)
            if header is None:
                raise ValueError(
                    f"{path}: the file is empty; expected a header row with `sequence` (or `name`) and label columns"
                )
            header = [field.strip() for field in header]
            duplicated = sorted({column for column in header if header.count(column) > 1})
            if duplicated:
                raise ValueError(
                    f"{path}: the header repeats the column(s) {duplicated}; give every column a distinct name"
                )
            rows, lines = [], []
            for row in reader:
                if not any(field.strip() for field in row):
                    continue
                if len(row) != len(header):
                    raise ValueError(
                        f"{path} row {reader.line_num}: {len(row)} fields but the header has "
                        f"{len(header)} ({', '.join(header)}); check the delimiter "
                        f"({'tab' if delimiter == chr(9) else 'comma'} for this suffix) and quoting"
                    )
                rows.append(row)
                lines.append(reader.line_num)
        except csv.Error as exc:
            raise ValueError(
                f"{path} row {reader.line_num}: malformed {bare_suffix(path)[1:].upper()} ({exc})"
            ) from exc
    if not rows:
        raise ValueError(f"{path}: the table has a header but no rows; add the labelled sequences")
    return _Table(path, header, rows, lines)


def _table_part(table: _Table, labelled: bool, with_sequence: bool) -> _Part:
    """A table's part; with `with_sequence` its `sequence` column is encoded, else its rows name
    FASTA records (left for the pairing)."""
    header = table.header
    label_index, label_names, plain = table.label_columns() if labelled else ([], [], True)
    if labelled and not label_index:
        raise ValueError(
            f"{table.path}: no label column; found the columns {header}; add a column named `label` "
            "(class names, or the value to regress) or several named `label_<name>`"
        )
    sequence_index = table.column("sequence") if with_sequence else None
    name_index = table.column("name")
    ignored = set(label_index) | {
        i for i, c in enumerate(header) if c.lower() == "label" or c.lower().startswith("label_")
    }
    # read for prediction, every column is carried into the output, labels and sequence included
    other = (
        [i for i in range(len(header)) if i != sequence_index and i not in ignored]
        if labelled
        else list(range(len(header)))
    )
    where = [f"{table.path} row {line}" for line in table.lines]
    codes = (
        [_encode_row(row[sequence_index], place) for row, place in zip(table.rows, where)]
        if sequence_index is not None
        else []
    )
    names: list[str | None] = (
        [row[name_index].strip() for row in table.rows] if name_index is not None else [None] * len(table.rows)
    )
    return _Part(
        source=str(table.path),
        names=names,
        codes=codes,
        label_columns=label_names,
        plain_label=plain,
        labels=[[row[i].strip() for i in label_index] for row in table.rows],
        where=where,
        columns={header[i]: [row[i] for row in table.rows] for i in other},
    )


@dataclasses.dataclass
class _BedInterval:
    chrom: str
    start: int
    end: int
    strand: str
    fields: list[str]
    where: str


def _read_bed(path: Path, labelled: bool) -> list[_BedInterval]:
    intervals = []
    for number, fields in bed_lines(path):
        where = f"{path} line {number}"
        if len(fields) < 3:
            raise ValueError(
                f"{where}: {len(fields)} tab-separated field(s); BED needs chrom, start, end and the "
                "label (4th column), separated by tabs"
            )
        try:
            start, end = int(fields[1]), int(fields[2])
        except ValueError as exc:
            raise ValueError(
                f"{where}: start {fields[1]!r} and end {fields[2]!r} must be whole numbers (0-based "
                "start, exclusive end)"
            ) from exc
        if start < 0 or start >= end:
            raise ValueError(
                f"{where}: interval {fields[0]}:{start}-{end} is empty or negative (start must be >= 0 "
                "and < end; BED starts are 0-based, ends exclusive)"
            )
        if labelled and (len(fields) < 4 or not fields[3].strip()):
            raise ValueError(f"{where}: no label; give the label in the 4th column")
        strand = fields[5].strip() if len(fields) >= 6 else ""
        if strand not in ("", "+", "-", "."):
            raise ValueError(f"{where}: strand {strand!r} in the 6th column; use '+', '-' or '.'")
        intervals.append(_BedInterval(fields[0], start, end, strand, fields, where))
    if not intervals:
        raise ValueError(f"{path}: no intervals; a BED file needs lines of chrom, start, end, label")
    return intervals


def _bed_part(
    path: Path, intervals: list[_BedInterval], contigs: dict[str, np.ndarray], known: list[str], labelled: bool
) -> _Part:
    names, codes, labels, where = [], [], [], []
    has_score = any(len(iv.fields) >= 5 for iv in intervals)
    has_strand = any(len(iv.fields) >= 6 for iv in intervals)
    columns: dict[str, list[str]] = {"chrom": [], "start": [], "end": []}
    if has_score:
        columns["score"] = []
    if has_strand:
        columns["strand"] = []
    for iv in intervals:
        contig = contigs.get(iv.chrom)
        if contig is None:
            raise ValueError(
                f"{iv.where}: chromosome {iv.chrom!r} is not in the genome, which holds "
                f"{_examples(known)}; use the genome the BED file was made for"
            )
        if iv.end > contig.size:
            raise ValueError(
                f"{iv.where}: interval {iv.chrom}:{iv.start}-{iv.end} runs past the end of {iv.chrom!r} "
                f"({contig.size:,} bases); use the genome the BED file was made for"
            )
        piece = contig[iv.start : iv.end]
        codes.append(reverse_complement(piece) if iv.strand == "-" else piece.copy())
        names.append(f"{iv.chrom}:{iv.start}-{iv.end}" + (f"({iv.strand})" if iv.strand in ("+", "-") else ""))
        labels.append([iv.fields[3].strip()] if labelled else [])
        where.append(iv.where)
        columns["chrom"].append(iv.chrom)
        columns["start"].append(str(iv.start))
        columns["end"].append(str(iv.end))
        if has_score:
            columns["score"].append(iv.fields[4] if len(iv.fields) >= 5 else "")
        if has_strand:
            columns["strand"].append(iv.strand)
    return _Part(str(path), names, codes, ["label"] if labelled else [], True, labels, where, columns)


def _fasta_part(paths: list[Path]) -> _Part:
    names, codes, sources = [], [], []
    for path in paths:
        for record in read_sequences(path, flag="paths"):
            names.append(record.name)
            codes.append(record.codes)
            sources.append(str(path))
    return _Part(
        ", ".join(map(str, paths)),
        names,
        codes,
        [],
        True,
        [[] for _ in names],
        [f"{source} record {name!r}" for source, name in zip(sources, names)],
        {},
    )


def _paired_part(tables: list[_Part], fastas: list[Path]) -> _Part:
    """The rows of the name tables, in their order, with the sequences of the FASTA records they name."""
    fasta = _fasta_part(fastas)
    records = dict(zip(fasta.names, fasta.codes))  # names are unique: read_sequences refuses repeats
    first = tables[0]
    if any(t.label_columns != first.label_columns or t.plain_label != first.plain_label for t in tables[1:]):
        raise ValueError(
            f"the label tables {', '.join(t.source for t in tables)} have different label columns; "
            "give them the same ones"
        )
    names = [name for table in tables for name in table.names]
    duplicated = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicated:
        raise ValueError(
            f"the `name` column of {', '.join(t.source for t in tables)} repeats {len(duplicated):,} "
            f"name(s): {_examples(duplicated)}; every FASTA record needs exactly one row"
        )
    named = set(names)
    unlabelled = [name for name in records if name not in named]
    if unlabelled:
        raise ValueError(
            f"{len(unlabelled):,} FASTA record(s) of {fasta.source} have no row in "
            f"{', '.join(t.source for t in tables)}: {_examples(unlabelled)}; add a row for each record "
            "(or remove the records)"
        )
    missing = [name for name in names if name not in records]
    if missing:
        raise ValueError(
            f"{len(missing):,} name(s) in {', '.join(t.source for t in tables)} are not records of "
            f"{fasta.source}: {_examples(missing)}; the `name` column must hold the FASTA record ids "
            "(the first word of each '>' line)"
        )
    columns = _merge_columns(tables)
    return _Part(
        source=", ".join([t.source for t in tables] + [fasta.source]),
        names=list(names),
        codes=[records[name] for name in names],
        label_columns=first.label_columns,
        plain_label=first.plain_label,
        labels=[row for table in tables for row in table.labels],
        where=[place for table in tables for place in table.where],
        columns=columns,
    )


def _merge_columns(parts: Sequence[_Part]) -> dict[str, list[str]]:
    order: list[str] = []
    for part in parts:
        order += [column for column in part.columns if column not in order]
    return {
        column: [value for part in parts for value in part.columns.get(column, [""] * len(part.names))]
        for column in order
    }


def _read_parts(paths: Paths, genome: PathLike | None, labelled: bool) -> list[_Part]:
    """One part per input in order; a FASTA+table pairing is one part at the place of its first table."""
    files = [
        Path(p)
        for p in expand_inputs(
            paths if isinstance(paths, (str, Path)) else list(paths),
            is_input=_is_labelled_input,
            kind=_KIND,
            flag="paths",
        )
    ]
    slots: list[tuple[str, object]] = []  # ("part", _Part) | ("names", _Part) | ("fasta", Path) | ("bed", Path)
    beds: dict[Path, list[_BedInterval]] = {}
    for path in files:
        suffix = bare_suffix(path)
        if suffix in _DELIMITERS:
            table = _read_table(path)
            if table.column("sequence") is not None:
                slots.append(("part", _table_part(table, labelled, with_sequence=True)))
            elif table.column("name") is not None:
                slots.append(("names", _table_part(table, labelled, with_sequence=False)))
            else:
                raise ValueError(
                    f"{path}: no `sequence` column; found the columns {table.header}; add a `sequence` "
                    "column, or a `name` column with the record ids of a FASTA file given next to it"
                )
        elif suffix in _BED_SUFFIXES:
            beds[path] = _read_bed(path, labelled)
            slots.append(("bed", path))
        elif is_sequence_file_name(path.name):
            slots.append(("fasta", path))
        else:
            raise ValueError(
                f"{path}: unknown input type; give {_KIND} files (.tsv, .txt, .csv, .bed, .fa, .fasta, "
                "... optionally .gz)"
            )
    contigs: dict[str, np.ndarray] = {}
    known: list[str] = []
    if beds:
        wanted = {iv.chrom for intervals in beds.values() for iv in intervals}
        contigs, known = read_genome_contigs(genome, wanted, needed_by=f"the BED file {next(iter(beds))}")
    name_tables = [item for kind, item in slots if kind == "names"]
    fastas = [item for kind, item in slots if kind == "fasta"]
    if labelled and fastas and not name_tables:
        raise ValueError(
            f"{fastas[0]}: a FASTA file holds no labels; give a TSV/CSV with a `name` column (the record "
            "ids) and label columns next to it, or a table with `sequence` and label columns"
        )
    if name_tables and not fastas:
        raise ValueError(
            f"{name_tables[0].source}: no `sequence` column, and no FASTA file is given with it to take "
            "the sequences of the `name` column from; add the FASTA file to the inputs"
        )
    parts: list[_Part] = []
    for kind, item in slots:
        if kind == "part":
            parts.append(item)
        elif kind == "bed":
            parts.append(_bed_part(item, beds[item], contigs, known, labelled))
        elif kind == "names" and item is name_tables[0]:
            parts.append(_paired_part(name_tables, fastas))
        elif kind == "fasta" and not name_tables:
            parts.append(_fasta_part([item]))
    return parts


def _names(parts: Sequence[_Part]) -> list[str]:
    names = [name for part in parts for name in part.names]
    return [name if name is not None else f"seq{index}" for index, name in enumerate(names)]


# --- targets ----------------------------------------------------------------------------------


def _natural_order(values: set[str]) -> list[str]:
    try:
        return sorted(values, key=int)
    except ValueError:
        return sorted(values)


def _flag(text: str, where: str, column: str) -> float:
    lower = text.lower()
    if lower in _TRUE:
        return 1.0
    if lower in _FALSE:
        return 0.0
    raise ValueError(
        f"{where}, column 'label_{column}': {text!r} is not 0/1; multi-label columns hold 0 or 1 "
        "(also true/false, yes/no)"
    )


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise ValueError(
            f"{where}, column {column!r}: {text!r} is not a number; regression targets must be numeric "
            "(use task='classify' for class names)"
        ) from exc
    if not math.isfinite(value):
        raise ValueError(
            f"{where}, column {column!r}: {text!r} is not a finite number; remove the row or give its value"
        )
    return value


def _targets(
    parts: Sequence[_Part], task: str, classes: Sequence[str] | None
) -> tuple[np.ndarray, TargetKind, list[str]]:
    first = parts[0]
    for part in parts[1:]:
        if part.label_columns != first.label_columns or part.plain_label != first.plain_label:
            raise ValueError(
                f"{part.source} has the label columns {part.label_columns} but {first.source} has "
                f"{first.label_columns}; give every input the same label columns"
            )
    labels = [row for part in parts for row in part.labels]
    where = [place for part in parts for place in part.where]
    sources = ", ".join(part.source for part in parts)
    if task == "classify" and first.plain_label:
        for row, place in zip(labels, where):
            if not row[0]:
                raise ValueError(f"{place}: the label is empty; give every row a label (or remove the row)")
        if classes is not None:
            names = [str(c) for c in classes]
            if len(names) < 2 or len(set(names)) != len(names):
                raise ValueError(f"classes {names}: give at least 2 distinct class names")
        else:
            names = _natural_order({row[0] for row in labels})
            if len(names) < 2:
                raise ValueError(
                    f"{sources}: every label is {names[0]!r}; classification needs at least 2 classes, so "
                    "add sequences of the other class(es) (or use task='regress' for numeric targets)"
                )
        index = {name: i for i, name in enumerate(names)}
        targets = np.empty(len(labels), dtype=np.int64)
        for i, (row, place) in enumerate(zip(labels, where)):
            if row[0] not in index:
                raise ValueError(
                    f"label {row[0]!r} in {place} is not one of the training classes {names}; fix the "
                    "label or remove the row"
                )
            targets[i] = index[row[0]]
        return targets, TargetKind.SEQUENCE_CLASSES, names
    columns = list(first.label_columns)
    order = list(range(len(columns)))
    if classes is not None:
        wanted = [str(c) for c in classes]
        if sorted(wanted) != sorted(columns):
            raise ValueError(
                f"{sources}: the label columns {columns} differ from the training labels {wanted}; give "
                "the same label columns as in training"
            )
        order = [columns.index(name) for name in wanted]
        columns = wanted
    if task == "classify":
        values = [[_flag(row[j], place, first.label_columns[j]) for j in order] for row, place in zip(labels, where)]
        kind = TargetKind.SEQUENCE_LABELS
    else:
        label = (lambda j: "label") if first.plain_label else (lambda j: f"label_{first.label_columns[j]}")
        values = [[_number(row[j], place, label(j)) for j in order] for row, place in zip(labels, where)]
        kind = TargetKind.SEQUENCE_VALUES
    return np.asarray(values, dtype=np.float32).reshape(len(labels), len(columns)), kind, columns


def read_labelled(
    paths: Paths,
    *,
    task: Task,
    genome: PathLike | None = None,
    classes: Sequence[str] | None = None,
) -> LabelledSequences:
    """Read labelled sequences from TSV/CSV tables, FASTA+table pairings and BED files (see the
    module docstring), concatenated in input order.

    Args:
        paths: One path or a list (folders and quoted globs are expanded, sorted).
        task: "classify": one `label` column gives classes (sorted in natural order: numerically
            when all are integers), `label_<name>` columns give 0/1 flags (multi-label).
            "regress": every label column is a numeric target.
        genome: The FASTA/GenBank file or genome store that BED intervals are cut from.
        classes: The training classes (or label names), for validation and test sets: their
            order fixes the target indices, and a label outside them is an error.

    Raises FileNotFoundError for a missing input and ValueError naming the file and row for
    missing columns, bad labels, empty or non-DNA sequences, unmatched names and bad intervals.
    """
    tasks = [name for name in typing.get_args(Task) if name != "annotate"]  # annotations are read per base
    if task not in tasks:
        raise ValueError(f"task={task!r}: use {' or '.join(map(repr, tasks))}")
    parts = _read_parts(paths, genome, labelled=True)
    targets, kind, label_names = _targets(parts, task, classes)
    return LabelledSequences(
        _names(parts), [c for part in parts for c in part.codes], targets, kind, label_names, _merge_columns(parts)
    )


def read_unlabelled(paths: Paths, *, genome: PathLike | None = None) -> LabelledSequences:
    """Read sequences from the same inputs as `read_labelled`, for prediction: label columns may
    be absent and are ignored, and FASTA files need no table. Gives kind CLASSES, targets -1
    (int64 (N,)) and no label names."""
    parts = _read_parts(paths, genome, labelled=False)
    names = _names(parts)
    return LabelledSequences(
        names,
        [c for part in parts for c in part.codes],
        np.full(len(names), -1, dtype=np.int64),
        TargetKind.SEQUENCE_CLASSES,
        [],
        _merge_columns(parts),
    )


# --- summaries and leak-free splits -------------------------------------------------------------


def class_balance(seqs: LabelledSequences) -> str:
    """One line on the targets: counts and shares per class, the positive share per label, or
    mean and sd per target; with a warning when the set is strongly imbalanced (the smallest
    class, or a label's rarer value, below a tenth of the largest)."""
    n = len(seqs)
    if seqs.kind == TargetKind.SEQUENCE_CLASSES:
        if not seqs.label_names:
            return f"{n:,} unlabelled sequences"
        counts = np.bincount(seqs.targets[seqs.targets >= 0], minlength=len(seqs.label_names))
        line = f"{len(seqs.label_names)} classes: " + ", ".join(
            f"{name} {count:,} ({100 * count / max(n, 1):.1f}%)" for name, count in zip(seqs.label_names, counts)
        )
        smallest, largest = int(np.argmin(counts)), int(np.argmax(counts))
        if counts[smallest] < IMBALANCE_RATIO * counts[largest]:
            line += (
                f"; imbalanced: {seqs.label_names[smallest]} has {counts[smallest] / counts[largest]:.1%} as many "
                f"sequences as {seqs.label_names[largest]} (consider class weights or resampling)"
            )
        return line
    if seqs.kind == TargetKind.SEQUENCE_LABELS:
        positives = seqs.targets.sum(axis=0)
        line = f"{len(seqs.label_names)} labels over {n:,} sequences, positive: " + ", ".join(
            f"{name} {int(p):,} ({100 * p / max(n, 1):.1f}%)" for name, p in zip(seqs.label_names, positives)
        )
        rare = [name for name, p in zip(seqs.label_names, positives) if min(p, n - p) < IMBALANCE_RATIO * max(p, n - p)]
        if rare:
            line += f"; imbalanced: {', '.join(rare)} (one value under 10% of the other; consider positive weights)"
        return line
    mean, sd = seqs.targets.mean(axis=0), seqs.targets.std(axis=0)
    return f"{len(seqs.label_names)} target(s) over {n:,} sequences: " + ", ".join(
        f"{name} mean {m:.4g} sd {s:.4g}" for name, m, s in zip(seqs.label_names, mean, sd)
    )


def canonical_key(codes: np.ndarray) -> bytes:
    """The smaller of the codes and of their reverse complement, as bytes: equal for a sequence
    and its reverse complement."""
    return min(np.ascontiguousarray(codes).tobytes(), reverse_complement(codes).tobytes())


def leak_check(train: LabelledSequences, other: LabelledSequences, other_name: str) -> None:
    """Raise ValueError when a sequence of `other` (or its reverse complement) is also in `train`."""
    seen: dict[bytes, str] = {}
    for name, codes in zip(train.names, train.codes):
        seen.setdefault(canonical_key(codes), name)
    shared = [
        (name, seen[key]) for name, codes in zip(other.names, other.codes) if (key := canonical_key(codes)) in seen
    ]
    if shared:
        other_example, train_example = shared[0]
        raise ValueError(
            f"{len(shared):,} of the {len(other):,} {other_name} sequences also occur in the training set "
            f"(the same sequence or its reverse complement), e.g. {other_name} {other_example!r} = train "
            f"{train_example!r}; deduplicate the files or split one set with split_leak_free"
        )


def _groups(seqs: LabelledSequences) -> list[np.ndarray]:
    """Indices of the sequences of each canonical sequence, in first-appearance order."""
    groups: dict[bytes, list[int]] = {}
    for index, codes in enumerate(seqs.codes):
        groups.setdefault(canonical_key(codes), []).append(index)
    return [np.asarray(members, dtype=np.int64) for members in groups.values()]


def split_leak_free(seqs: LabelledSequences, fraction: float, seed: int) -> tuple[LabelledSequences, LabelledSequences]:
    """(kept, held out): about `fraction` of the sequences held out, with identical sequences
    and reverse complements on the same side. Groups are drawn in a random order (from `seed`)
    and held out while they fit in round(fraction * N); both sides keep the input order."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction={fraction}: give the share to hold out, between 0 and 1")
    groups = _groups(seqs)
    target = round(fraction * len(seqs))
    held: list[np.ndarray] = []
    size = 0
    for g in np.random.default_rng(seed).permutation(len(groups)):
        if size + groups[g].size <= target:
            held.append(groups[g])
            size += groups[g].size
        if size == target:
            break
    mask = np.zeros(len(seqs), dtype=bool)
    if held:
        mask[np.concatenate(held)] = True
    if size == 0 or size == len(seqs):
        raise ValueError(
            f"cannot hold out {fraction:.0%} of {len(seqs):,} sequences: they are {len(groups):,} distinct "
            "sequences (up to reverse complement) and none fits; give more sequences or a larger fraction"
        )
    return seqs.subset(np.flatnonzero(~mask)), seqs.subset(np.flatnonzero(mask))


def kfold_leak_free(seqs: LabelledSequences, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train indices, test indices) per fold, int64 and sorted; identical sequences and reverse
    complements share a fold. Groups are shuffled (from `seed`), then placed largest first into
    the fold with the fewest sequences so far."""
    groups = _groups(seqs)
    if folds < 2:
        raise ValueError(f"folds={folds}: give at least 2 folds")
    if len(groups) < folds:
        raise ValueError(
            f"{len(groups):,} distinct sequences (up to reverse complement) cannot fill {folds} folds; use fewer folds"
        )
    order = np.random.default_rng(seed).permutation(len(groups))
    order = sorted(order, key=lambda g: -groups[g].size)  # stable: ties stay in the shuffled order
    fold_of = np.empty(len(seqs), dtype=np.int64)
    sizes = np.zeros(folds, dtype=np.int64)
    for g in order:
        fold = int(np.argmin(sizes))
        fold_of[groups[g]] = fold
        sizes[fold] += groups[g].size
    return [
        (np.flatnonzero(fold_of != k).astype(np.int64), np.flatnonzero(fold_of == k).astype(np.int64))
        for k in range(folds)
    ]
