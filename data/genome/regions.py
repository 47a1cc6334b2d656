"""Regions of a genome, as users write them: BED files or ``chrom:start-end`` strings.

Every command that takes ``--regions`` (`embed`, `evaluate`, `score`, `baseline`, and the variant
tools) reads them here, so they all accept the same things:

- a BED file (plain or gzip/xz/bzip2 compressed): tab-separated chrom, 0-based start, exclusive
  end and an optional name (4th column; ``.`` means none); blank lines and lines starting with
  ``#``, ``track`` or ``browser`` are skipped;
- one or more region strings in the samtools convention, 1-based and inclusive:
  ``chrom:start-end`` (commas in numbers allowed: ``NC_001416.1:1,001-2,000``), ``chrom:start``
  (from `start` to the end of the record) or ``chrom`` alone (the whole record). A string that is
  a record's full name is that whole record, so record names holding ``:`` work.

A :class:`Region` is 0-based half-open internally, as in Python slices: ``chrom:1-1000`` is
``Region(chrom, 0, 1000, ...)`` and covers ``codes[0:1000]``. Regions are validated against the
genome's record lengths; they keep the order given and may overlap (a command that cannot hold
overlapping regions says so itself).

:func:`record_regions` gives the commands what they process: the regions given, the intervals of
one split of a training data split (``train``/``val``/``test``, derived by
`genoformer.data.splits.split_intervals` exactly as the GenomeDataModule derives them from a
store), or every record whole.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from genoformer.data.genome.inputs import NamedSequence, is_genome_store
from genoformer.data.genome.labels import bare_suffix, bed_lines
from genoformer.data.genome.store import GenomeStore
from genoformer.data.splits import SPLITS, SequenceSource, SplitSpec, split_intervals

from genoformer.hints import option

_BED_SUFFIXES = (".bed",)
_REGION = re.compile(r"^(?P<chrom>.+):(?P<start>[0-9][0-9,]*)(?:-(?P<end>[0-9][0-9,]*))?$")
_FORMS = "chrom:start-end (1-based, inclusive), chrom:start, chrom, or a BED file"


@dataclass(frozen=True)
class Region:
    """A stretch ``[start, end)`` (0-based, half-open) of the record `chrom`, named `name`."""

    chrom: str
    start: int
    end: int
    name: str

    @property
    def length(self) -> int:
        """Bases in the region."""
        return self.end - self.start

    @property
    def label(self) -> str:
        """The region as a 1-based inclusive string, ``chrom:start-end``."""
        return region_label(self.chrom, self.start, self.end)


def region_label(chrom: str, start: int, end: int) -> str:
    """``chrom:start-end``, 1-based and inclusive, of the 0-based half-open ``[start, end)``."""
    return f"{chrom}:{start + 1}-{end}"


def _records(lengths: Mapping[str, int], limit: int = 10) -> str:
    names = list(lengths)
    shown = ", ".join(repr(name) for name in names[:limit])
    more = f" and {len(names) - limit:,} more" if len(names) > limit else ""
    return f"{shown}{more}"


def _unknown_record(chrom: str, lengths: Mapping[str, int], where: str) -> ValueError:
    return ValueError(
        f"{where}: record {chrom!r} is not in the genome, which holds {len(lengths):,} record(s): "
        f"{_records(lengths)}; name one of these records"
    )


def _check(region: Region, lengths: Mapping[str, int], where: str) -> Region:
    """`region` if it lies within its record and holds bases; else ValueError at `where`."""
    if region.chrom not in lengths:
        raise _unknown_record(region.chrom, lengths, where)
    if region.start == region.end:
        raise ValueError(f"{where}: the region is empty (0 bases); give an end past the start")
    length = lengths[region.chrom]
    if region.end > length:
        raise ValueError(
            f"{where}: the end ({region.end:,}) lies beyond the end of record {region.chrom!r} "
            f"({length:,} bases); give an end of at most {length:,}"
        )
    return region


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def parse_region(text: str, lengths: Mapping[str, int]) -> Region:
    """One region string (``chrom:start-end``, ``chrom:start`` or ``chrom``; 1-based, inclusive),
    checked against the record `lengths`. Named as typed (without commas); a whole record is named
    as the record."""
    text = text.strip()
    where = f"region {text!r}"
    if text in lengths:
        return Region(text, 0, lengths[text], text)
    match = _REGION.match(text)
    if match is None:
        if ":" in text:
            raise ValueError(f"{where}: cannot read it as {_FORMS}; write e.g. {next(iter(lengths), 'chr1')}:1-1000")
        raise _unknown_record(text, lengths, where)
    chrom, start = match["chrom"], _number(match["start"])
    if start < 1:
        raise ValueError(f"{where}: positions are 1-based (the first base is 1); give a start of at least 1")
    if chrom not in lengths:
        raise _unknown_record(chrom, lengths, where)
    end = lengths[chrom] if match["end"] is None else _number(match["end"])
    if end < start:
        raise ValueError(
            f"{where}: the start ({start:,}) lies after the end ({end:,}); give start <= end (both 1-based, inclusive)"
        )
    return _check(Region(chrom, start - 1, end, region_label(chrom, start - 1, end)), lengths, where)


def read_bed_regions(path: str | os.PathLike, lengths: Mapping[str, int]) -> list[Region]:
    """The regions of a BED file (chrom, 0-based start, exclusive end, optional name), in file
    order, checked against the record `lengths`. Unnamed regions (no 4th column, or ``.``) are
    named ``chrom:start-end`` (1-based, inclusive)."""
    path = Path(path)
    regions = []
    for number, fields in bed_lines(path):
        where = f"{path} line {number}"
        if len(fields) < 3:
            raise ValueError(
                f"{where}: {len(fields)} tab-separated field(s); BED lines are chrom, start, end "
                "(0-based, end exclusive) and an optional name, separated by tabs"
            )
        try:
            start, end = int(fields[1]), int(fields[2])
        except ValueError as exc:
            raise ValueError(f"{where}: start {fields[1]!r} and end {fields[2]!r} must be whole numbers") from exc
        if start < 0:
            raise ValueError(f"{where}: the start ({start}) is negative; BED starts are 0-based, the first base is 0")
        if start > end:
            raise ValueError(f"{where}: the start ({start:,}) lies after the end ({end:,}); give start <= end")
        chrom = fields[0]
        name = fields[3].strip() if len(fields) > 3 and fields[3].strip() not in ("", ".") else None
        region = Region(chrom, start, end, name or region_label(chrom, start, end))
        regions.append(_check(region, lengths, f"{where} ({chrom} {start} {end})"))
    if not regions:
        raise ValueError(f"{path}: no regions; a BED file needs lines of chrom, start, end (tab-separated)")
    return regions


def _is_bed(item: str) -> bool:
    return bare_suffix(item) in _BED_SUFFIXES or (os.path.isfile(item) and not _REGION.match(item))


def read_regions(spec: str | os.PathLike | Sequence[str | os.PathLike], lengths: Mapping[str, int]) -> list[Region]:
    """The regions `spec` names, in the order given, checked against the genome's record `lengths`
    (record name -> bases).

    `spec` is a BED file, a region string, or a list of them (see the module docstring). Raises
    FileNotFoundError for a missing BED file and ValueError naming the region or BED line for an
    unknown record (listing the genome's records), an end beyond its record, a start after the end,
    an empty region or text that is not a region.
    """
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    if not items:
        raise ValueError(f"no regions given; give {_FORMS}")
    if not lengths:
        raise ValueError("the genome holds no records, so no region can lie in it")
    regions: list[Region] = []
    for item in items:
        text = os.fspath(item)
        if isinstance(item, os.PathLike) or (_is_bed(text) and text not in lengths):
            if not os.path.isfile(text):
                raise FileNotFoundError(
                    f"BED file of regions not found: {text}; give an existing BED file or regions as {_FORMS}"
                )
            regions.extend(read_bed_regions(text, lengths))
        else:
            regions.append(parse_region(text, lengths))
    return regions


def _sources(records: Sequence[NamedSequence]) -> list[SequenceSource]:
    """What a split needs of each record; a store's contigs keep the file name they came from."""
    stores: dict[str, dict[str, str]] = {}
    sources = []
    for record in records:
        if record.source not in stores:
            path = Path(record.source)
            stores[record.source] = (
                {contig.name: contig.source_name for contig in GenomeStore(path, 0).contigs}
                if is_genome_store(path)
                else {}
            )
        source_name = stores[record.source].get(record.name, Path(record.source).name)
        sources.append(SequenceSource(record.name, record.codes.size, source_name))
    return sources


def record_regions(
    records: Sequence[NamedSequence],
    regions: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    split: str | None = None,
    split_spec: SplitSpec | None = None,
    split_option: str = "split",
) -> list[tuple[int, Region]]:
    """(index into `records`, region) of every stretch a command processes, in order.

    - `regions` (see :func:`read_regions`): those regions, looked up by record name;
    - `split` ("train", "val" or "test"): the intervals of that split under `split_spec`
      (default ``SplitSpec()``, the GenomeDataModule's default), over all `records` as the data
      module splits the contigs of a store (by region, contigs or source files); a whole record
      is named as the record, a part as ``chrom:start-end``;
    - neither: every record whole, named as the record.

    Raises ValueError for both at once, for regions on records whose names repeat, and for an
    empty split; `split_option` is the name of the command's option that chose the split.
    """
    if regions is not None and split is not None:
        raise ValueError(
            f"give {option('regions', metavar='REGIONS')} or {option(split_option, metavar='SPLIT')}, not both"
        )
    if split is not None:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}; pass {option(split_option, 'test')}")
        spec = SplitSpec() if split_spec is None else split_spec
        intervals = split_intervals(_sources(records), spec)[split]
        if not intervals:
            raise ValueError(
                f"the {split} split of these inputs is empty under {spec}; give the split of the "
                f"training run ({option('split_config', metavar='CONFIG')}) or another split"
            )
        chosen = []
        for index, start, end in intervals:
            record = records[index]
            whole = start == 0 and end == record.codes.size
            name = record.name if whole else region_label(record.name, start, end)
            chosen.append((index, Region(record.name, start, end, name)))
        return chosen
    if regions is None:
        return [(index, Region(record.name, 0, record.codes.size, record.name)) for index, record in enumerate(records)]
    index_of: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.name in index_of:
            raise ValueError(
                f"record {record.name!r} occurs twice in the inputs ({records[index_of[record.name]].source} "
                f"and {record.source}), so a region cannot tell which is meant; give one genome"
            )
        index_of[record.name] = index
    lengths = {record.name: record.codes.size for record in records}
    return [(index_of[region.chrom], region) for region in read_regions(regions, lengths)]
