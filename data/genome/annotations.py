"""Per-base gene annotation labels: genomes with their CDS, rRNA and tRNA features.

Inputs:

- GenBank (``.gbk``/``.gb``/``.genbank``, optionally compressed), read with Bio.SeqIO: each record
  is a contig with its sequence; its CDS, rRNA and tRNA features are the genes, a compound
  location (``join``) gives the segments, the strand comes from the location and ``/codon_start``
  gives the phase. Features marked ``/pseudo`` or ``/pseudogene`` are left out of the genes (so
  their bases are labelled "other"), as are features with parts on both strands.
- GFF3 (``.gff``/``.gff3``, optionally compressed), parsed here: 9 tab-separated columns with
  1-based inclusive coordinates and percent-encoded attributes; CDS, rRNA and tRNA lines are
  genes, and lines of one type sharing an ``ID`` (or, without one, a ``Parent``) on one contig
  form one gene with several segments. The sequences come from the file's ``##FASTA`` section,
  else from ``genome``; a seqid names the genome record of the same name, or failing that the one
  whose name holds it as a token when split on ``:`` or ``|`` (``Umaydis:chr01:1-100`` for
  ``chr01``).

Each base gets one class of ``ANNOTATION_CLASSES``: coding bases of a gene on the forward strand
are CDS+, on the reverse strand CDS-, rRNA and tRNA bases (either strand) rRNA/tRNA, the rest
(introns, intergenic, other features) "other". Under reverse complement a label track maps
through ``STRAND_SWAP`` and reverses.

Coordinates in :class:`Gene` are 0-based half-open, as in Python slices; GFF3 files hold
1-based inclusive ones (``start + 1 .. end``).

Shapes: L bases of a contig; ``codes`` and ``labels`` are 1-D ``np.uint8`` arrays (L,),
``values`` of a signal track float32 (L,).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO, Union
from urllib.parse import unquote

import numpy as np
from Bio import SeqIO
from Bio.Seq import UndefinedSequenceError
from Bio.SeqIO.FastaIO import SimpleFastaParser
from genoformer.data.genome.alphabet import ALLOWED, NotDNAError, encode_bytes
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.labels import bare_suffix, bed_lines, open_text, read_genome_contigs
from genoformer.data.inputs import expand_inputs
from genoformer.data.storage import write_text

from genoformer.progress import tqdm

log = logging.getLogger(__name__)

PathLike = Union[str, Path]

ANNOTATION_CLASSES: tuple[str, ...] = ("other", "CDS+", "CDS-", "rRNA", "tRNA")
OTHER, CDS_PLUS, CDS_MINUS, RRNA, TRNA = range(5)
#: The class of each class under reverse complement (CDS+ <-> CDS-).
STRAND_SWAP = (0, 2, 1, 3, 4)
GENE_KINDS = ("CDS", "rRNA", "tRNA")

_GENBANK_SUFFIXES = (".gbk", ".gb", ".genbank")
_GFF_SUFFIXES = (".gff", ".gff3")
_KIND = "GenBank (.gbk) or GFF3 (.gff3)"
_SEQID_TOKENS = re.compile(r"[:|]")
# GFF3 reserves these in attribute keys and values (and tab/newline everywhere): write them as %XX.
# Commas stay: they separate the values of a multi-value attribute.
_GFF_RESERVED = {"%": "%25", ";": "%3B", "=": "%3D", "&": "%26", "\t": "%09", "\n": "%0A", "\r": "%0D"}
_SEQID_ALLOWED = re.compile(r"[^a-zA-Z0-9.:^*$@!+_?|-]")


@dataclasses.dataclass(frozen=True)
class Gene:
    """One CDS, rRNA or tRNA feature of a contig.

    Attributes:
        contig: The contig (GFF3 seqid, GenBank record id).
        start: 0-based, inclusive start of the whole feature (all segments).
        end: 0-based, exclusive end of the whole feature.
        strand: +1 or -1.
        kind: "CDS", "rRNA" or "tRNA".
        segments: (start, end) 0-based half-open pieces of a joined feature, sorted by start;
            () means one piece [start, end).
        phase: GFF3 phase of the first segment in transcription order (0 for rRNA/tRNA).
        score: The GFF3 score, None for none.
        attributes: (key, value) pairs in file order, e.g. (("ID", "gene1"), ("product", ...)).
    """

    contig: str
    start: int
    end: int
    strand: int
    kind: str
    segments: tuple[tuple[int, int], ...] = ()
    phase: int = 0
    score: float | None = None
    attributes: tuple[tuple[str, str], ...] = ()

    def pieces(self) -> tuple[tuple[int, int], ...]:
        """The segments, or the one piece (start, end)."""
        return self.segments or ((self.start, self.end),)

    def attribute(self, key: str) -> str | None:
        """The first value of attribute `key`, or None."""
        return next((value for k, value in self.attributes if k == key), None)


@dataclasses.dataclass(frozen=True)
class AnnotatedContig:
    """A contig with its per-base labels: codes and labels (L,) uint8, genes, source file."""

    name: str
    codes: np.ndarray
    labels: np.ndarray
    genes: list[Gene]
    source: str


def label_track(length: int, genes: Sequence[Gene]) -> np.ndarray:
    """The class of every base (L,) uint8 of a contig of `length` bases with `genes`.

    Only segments are labelled (introns stay "other"). rRNA and tRNA win over CDS; where genes of
    the same priority overlap (a CDS+ and a CDS-, or an rRNA and a tRNA) the gene with the later
    start wins the shared bases (on equal starts, the later one in `genes`).
    """
    labels = np.zeros(length, dtype=np.uint8)
    for gene in genes:
        if gene.kind not in GENE_KINDS:
            raise ValueError(f"gene {_describe(gene)} has kind {gene.kind!r}; use one of {GENE_KINDS}")
        if gene.end > length or gene.start < 0:
            raise ValueError(
                f"gene {_describe(gene)} lies outside the contig of {length:,} bases; pass the genes of "
                "this contig only"
            )
    cds = sorted((g for g in genes if g.kind == "CDS"), key=lambda g: g.start)
    rna = sorted((g for g in genes if g.kind != "CDS"), key=lambda g: g.start)
    for gene in cds + rna:
        if gene.kind == "CDS":
            label = CDS_PLUS if gene.strand > 0 else CDS_MINUS
        else:
            label = RRNA if gene.kind == "rRNA" else TRNA
        for start, end in gene.pieces():
            labels[start:end] = label
    return labels


def _describe(gene: Gene) -> str:
    name = gene.attribute("ID")
    return f"{gene.kind} {gene.contig}:{gene.start}-{gene.end}" + (f" ({name})" if name else "")


def _make_gene(
    contig: str,
    pieces: list[tuple[int, int]],
    strand: int,
    kind: str,
    phase: int,
    score: float | None,
    attributes: tuple[tuple[str, str], ...],
) -> Gene:
    pieces = sorted(pieces)
    return Gene(
        contig,
        pieces[0][0],
        max(end for _, end in pieces),
        strand,
        kind,
        tuple(pieces) if len(pieces) > 1 else (),
        phase,
        score,
        attributes,
    )


def _is_annotation_file(name: str) -> bool:
    return bare_suffix(name) in _GENBANK_SUFFIXES + _GFF_SUFFIXES


def _format(path: Path) -> str:
    suffix = bare_suffix(path)
    if suffix in _GENBANK_SUFFIXES:
        return "genbank"
    if suffix in _GFF_SUFFIXES:
        return "gff3"
    raise ValueError(f"{path}: unknown annotation format; give {_KIND} files, optionally .gz")


# --- GenBank ------------------------------------------------------------------------------------


def _genbank_genes(record, path: Path) -> tuple[list[Gene], int, int]:
    """The genes of one record, and how many pseudo and mixed-strand features were left out."""
    genes, pseudo, mixed = [], 0, 0
    for feature in record.features:
        if feature.type not in GENE_KINDS:
            continue
        if "pseudo" in feature.qualifiers or "pseudogene" in feature.qualifiers:
            pseudo += 1
            continue
        parts = feature.location.parts
        strands = {part.strand for part in parts}
        if len(strands) != 1 or strands == {None}:
            mixed += 1
            continue
        pieces = [(int(part.start), int(part.end)) for part in parts]
        if max(end for _, end in pieces) > len(record):
            raise ValueError(
                f"{path}: record {record.id!r}: {feature.type} at {feature.location} runs past the end "
                f"of the record ({len(record):,} bases); fix the feature"
            )
        codon_start = feature.qualifiers.get("codon_start", ["1"])[0] if feature.type == "CDS" else "1"
        if codon_start not in ("1", "2", "3"):
            raise ValueError(
                f"{path}: record {record.id!r}: CDS at {feature.location} has /codon_start={codon_start!r}; "
                "use 1, 2 or 3"
            )
        phase = int(codon_start) - 1
        attributes = []
        for key, qualifier in (("ID", "locus_tag"), ("gene", "gene"), ("product", "product")):
            if qualifier in feature.qualifiers:
                attributes.append((key, feature.qualifiers[qualifier][0]))
        genes.append(_make_gene(record.id, pieces, strands.pop(), feature.type, phase, None, tuple(attributes)))
    return genes, pseudo, mixed


def _genbank_records(handle: TextIO, path: Path) -> Iterator:
    """Bio's GenBank records, with its parse errors naming the file."""
    records = SeqIO.parse(handle, "genbank")
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except ValueError as exc:
            raise ValueError(f"{path}: malformed GenBank file ({exc})") from exc
        yield record


def _read_genbank(
    path: Path, progress: bool, with_sequence: bool
) -> Iterator[tuple[str, np.ndarray | None, list[Gene]]]:
    pseudo = mixed = 0
    with open_text(path, encoding="latin-1") as handle:
        for record in tqdm(_genbank_records(handle, path), desc=path.name, unit=" records", disable=not progress):
            genes, p, m = _genbank_genes(record, path)
            pseudo, mixed = pseudo + p, mixed + m
            yield record.id, _genbank_codes(record, path) if with_sequence else None, genes
    if pseudo or mixed:
        log.info("%s: left out %d pseudo feature(s) and %d with parts on both strands", path, pseudo, mixed)


def _genbank_codes(record, path: Path) -> np.ndarray:
    try:
        sequence = bytes(record.seq)
    except UndefinedSequenceError as exc:
        raise ValueError(
            f"{path}: record {record.id!r} has no sequence (no ORIGIN section); download the GenBank "
            "file with its sequence"
        ) from exc
    if not sequence:
        raise ValueError(f"{path}: record {record.id!r} is empty (no bases); remove it from the file")
    try:
        return encode_bytes(sequence)
    except NotDNAError as exc:
        raise ValueError(f"{path}: record {record.id!r}, {exc.found}; {ALLOWED}; fix or remove the record") from exc


# --- GFF3 ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Gff:
    """What a GFF3 file holds: genes with the line of their last-ending segment, the seqids in
    order of first mention, ##sequence-region ends, and the ##FASTA records (None: no section)."""

    genes: list[tuple[Gene, int]]
    seqids: list[str]
    regions: dict[str, int]
    fasta: list[tuple[str, np.ndarray]] | None


def _attributes(text: str, where: str) -> tuple[tuple[str, str], ...]:
    if text.strip() in ("", "."):
        return ()
    pairs = []
    for item in text.strip().split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(
                f"{where}: attribute {item.strip()!r} has no '='; GFF3 attributes are key=value pairs "
                "separated by ';' (is this a GTF file? convert it to GFF3)"
            )
        pairs.append((unquote(key.strip()), unquote(value)))
    return tuple(pairs)


def _parse_gff(path: Path, progress: bool) -> _Gff:
    groups: dict[tuple, list[tuple]] = {}
    seqids: dict[str, None] = {}
    regions: dict[str, int] = {}
    fasta = None
    with open_text(path) as handle:
        for number, line in enumerate(tqdm(handle, desc=path.name, unit=" lines", disable=not progress), start=1):
            where = f"{path} line {number}"
            if line.startswith("##FASTA"):
                fasta = _gff_fasta(handle, path)
                break
            if line.startswith("##sequence-region"):
                fields = line.split()
                if len(fields) != 4 or not fields[2].isdigit() or not fields[3].isdigit():
                    raise ValueError(f"{where}: expected '##sequence-region seqid start end', got {line.strip()!r}")
                seqids.setdefault(unquote(fields[1]))
                regions[unquote(fields[1])] = int(fields[3])
                continue
            if line.startswith("#") or not line.strip():
                continue
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 9:
                raise ValueError(
                    f"{where}: {len(fields)} tab-separated column(s); a GFF3 feature line has 9 "
                    "(seqid, source, type, start, end, score, strand, phase, attributes)"
                )
            seqid = unquote(fields[0])
            seqids.setdefault(seqid)
            kind = fields[2]
            if kind not in GENE_KINDS:
                continue
            try:
                start, end = int(fields[3]), int(fields[4])
            except ValueError as exc:
                raise ValueError(f"{where}: start {fields[3]!r} and end {fields[4]!r} must be whole numbers") from exc
            if start < 1 or end < start:
                raise ValueError(
                    f"{where}: {kind} from {start} to {end}; GFF3 coordinates are 1-based with start <= end"
                )
            if fields[6] not in ("+", "-"):
                raise ValueError(f"{where}: {kind} with strand {fields[6]!r}; a gene needs '+' or '-'")
            try:
                score = None if fields[5] == "." else float(fields[5])
                phase = 0 if fields[7] == "." else int(fields[7])
            except ValueError as exc:
                raise ValueError(
                    f"{where}: score {fields[5]!r} must be a number or '.', phase {fields[7]!r} 0, 1, 2 or '.'"
                ) from exc
            if phase not in (0, 1, 2):
                raise ValueError(f"{where}: phase {phase}; use 0, 1 or 2")
            attributes = _attributes(fields[8], where)
            keys = dict(attributes)
            if "ID" in keys:
                key: tuple = (seqid, kind, "ID", keys["ID"])
            elif "Parent" in keys:
                key = (seqid, kind, "Parent", keys["Parent"])
            else:
                key = (number,)
            groups.setdefault(key, []).append(
                (seqid, kind, start - 1, end, 1 if fields[6] == "+" else -1, phase, score, attributes, number)
            )
    genes = []
    for lines in groups.values():
        seqid, kind, _, _, strand, _, score, attributes, first = lines[0]
        other = next((line for line in lines if line[4] != strand), None)
        if other is not None:
            raise ValueError(
                f"{path} lines {first} and {other[8]}: one {kind} (same ID/Parent) on both strands; give "
                "the parts distinct IDs or fix the strand"
            )
        pieces = [(line[2], line[3]) for line in lines]
        first_in_transcription = (
            min(lines, key=lambda line: line[2]) if strand > 0 else max(lines, key=lambda line: line[3])
        )
        last_ending = max(lines, key=lambda line: line[3])
        gene = _make_gene(
            seqid, pieces, strand, kind, first_in_transcription[5] if kind == "CDS" else 0, score, attributes
        )
        genes.append((gene, last_ending[8]))
    return _Gff(genes, list(seqids), regions, fasta)


def _gff_fasta(handle: TextIO, path: Path) -> list[tuple[str, np.ndarray]]:
    records = []
    for title, sequence in SimpleFastaParser(handle):
        name = title.split(None, 1)[0] if title.strip() else ""
        if not name or not sequence:
            raise ValueError(f"{path}: a record of the ##FASTA section has no name or no bases ({title!r}); fix it")
        try:
            records.append((name, encode_bytes(sequence.encode("latin-1"))))
        except NotDNAError as exc:
            raise ValueError(
                f"{path}: ##FASTA record {name!r}, {exc.found}; {ALLOWED}; fix or remove the record"
            ) from exc
    return records


def read_genes(path: PathLike) -> list[Gene]:
    """The CDS, rRNA and tRNA features of a GFF3 or GenBank file (see the module docstring), in
    file order (a joined GFF3 gene at its first line). For GFF3, a gene ending past its
    ``##sequence-region`` is an error."""
    path = Path(path)
    if _format(path) == "genbank":
        return [gene for _, _, genes in _read_genbank(path, progress=False, with_sequence=False) for gene in genes]
    gff = _parse_gff(path, progress=False)
    for gene, line in gff.genes:
        _check_end(path, gene, line, gff.regions.get(gene.contig))
    return [gene for gene, _ in gff.genes]


def _check_end(path: Path, gene: Gene, line: int, length: int | None) -> None:
    if length is not None and gene.end > length:
        raise ValueError(
            f"{path} line {line}: {gene.kind} ends at {gene.end:,} (1-based, inclusive), past the end of "
            f"{gene.contig!r} ({length:,} bases); check that the annotation and the sequences are of the "
            "same assembly"
        )


def _match_seqids(seqids: Sequence[str], names: Sequence[str], path: Path, source: str) -> dict[str, str]:
    """seqid -> record name: the same name, else the one record holding the seqid as a token."""
    exact = set(names)
    by_token: dict[str, list[str]] = {}
    for name in names:
        for token in set(_SEQID_TOKENS.split(name)):
            by_token.setdefault(token, []).append(name)
    matched, missing = {}, []
    for seqid in seqids:
        if seqid in exact:
            matched[seqid] = seqid
        elif len(by_token.get(seqid, [])) == 1:
            matched[seqid] = by_token[seqid][0]
        elif seqid in by_token:
            raise ValueError(
                f"{path}: seqid {seqid!r} matches several sequences of {source} "
                f"({', '.join(map(repr, by_token[seqid][:5]))}); name the sequences as the seqids"
            )
        else:
            missing.append(seqid)
    if missing:
        shown = ", ".join(map(repr, missing[:5]))
        raise ValueError(
            f"{path}: {len(missing):,} seqid(s) have no sequence in {source}: {shown}; its sequences are "
            f"named {', '.join(map(repr, list(names)[:5]))}; use the genome of this annotation, named by "
            "the seqids (or holding them as a ':'/'|'-separated part of the name)"
        )
    return matched


def _gff_contigs(path: Path, genome: PathLike | None, progress: bool) -> list[AnnotatedContig]:
    gff = _parse_gff(path, progress)
    if gff.fasta is not None:
        records = dict(gff.fasta)
        seqids = list(dict.fromkeys(gff.seqids + [name for name, _ in gff.fasta]))
        matched = _match_seqids(seqids, list(records), path, "its ##FASTA section")
    else:
        if genome is None:
            raise ValueError(
                f"{path} has no ##FASTA section; pass genome= (the FASTA/GenBank file or genome store "
                "with the sequences of its seqids)"
            )
        wanted = set(gff.seqids)
        records, names = {}, []
        for record in read_sequences(Path(genome), flag="genome"):
            names.append(record.name)
            if record.name in wanted or wanted.intersection(_SEQID_TOKENS.split(record.name)):
                records[record.name] = record.codes
        matched = _match_seqids(gff.seqids, names, path, str(genome))
        seqids = gff.seqids
    genes_of: dict[str, list[Gene]] = {seqid: [] for seqid in seqids}
    for gene, line in gff.genes:
        _check_end(path, gene, line, records[matched[gene.contig]].size)
        genes_of[gene.contig].append(gene)
    return [
        AnnotatedContig(
            seqid,
            records[matched[seqid]],
            label_track(records[matched[seqid]].size, genes_of[seqid]),
            genes_of[seqid],
            str(path),
        )
        for seqid in seqids
    ]


def read_annotated_genomes(
    paths: PathLike | Sequence[PathLike], *, genome: PathLike | None = None, progress: bool = True
) -> list[AnnotatedContig]:
    """Every contig of every GenBank/GFF3 file (folders and quoted globs expanded), with its labels.

    A GenBank file gives all its records. A GFF3 file gives the contigs of its ##FASTA section,
    or without one the seqids it mentions (in a feature or a ##sequence-region line), with
    sequences from `genome`: a contig the GFF3 never mentions is left out, since nothing says it
    was annotated. `progress` shows a progress bar per file (records or lines).
    """
    files = [
        Path(p)
        for p in expand_inputs(
            paths if isinstance(paths, (str, Path)) else list(paths),
            is_input=_is_annotation_file,
            kind=_KIND,
            flag="paths",
        )
    ]
    contigs: list[AnnotatedContig] = []
    for path in files:
        if _format(path) == "genbank":
            for name, codes, genes in _read_genbank(path, progress, with_sequence=True):
                contigs.append(AnnotatedContig(name, codes, label_track(codes.size, genes), genes, str(path)))
        else:
            contigs += _gff_contigs(path, genome, progress)
    return contigs


# --- writing GFF3 ------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return "".join(_GFF_RESERVED.get(char, char) for char in text)


def _escape_seqid(seqid: str) -> str:
    return _SEQID_ALLOWED.sub(lambda m: "".join(f"%{byte:02X}" for byte in m.group().encode("utf-8")), seqid)


def segment_phases(gene: Gene) -> list[int]:
    """The GFF3 phase of each piece (in `Gene.pieces` order), from the phase of the first piece
    in transcription order: each piece's phase completes the codon the pieces before left open."""
    pieces = list(gene.pieces())
    order = range(len(pieces)) if gene.strand > 0 else range(len(pieces) - 1, -1, -1)
    phases = [0] * len(pieces)
    done = 0  # coding bases in the pieces before
    for i in order:
        phases[i] = (gene.phase - done) % 3
        done += pieces[i][1] - pieces[i][0]
    return phases


def write_gff3(
    path: PathLike,
    genes: Sequence[Gene],
    *,
    contigs: Sequence[tuple[str, int]],
    source: str = "genoformer",
    overwrite: bool = False,
) -> Path:
    """Write `genes` as GFF3 (atomically) and return the path.

    The file has a ``##gff-version 3`` line, one ``##sequence-region`` line per contig of
    `contigs` ((name, length) pairs), then the genes by contig and start, in 1-based inclusive
    coordinates: a joined gene as one line per segment with the same ID and the attributes
    repeated, CDS lines with their phase, rRNA/tRNA with phase '.'. A gene without an ``ID`` or
    ``Parent`` attribute gets ``ID=<contig>.<kind>.<n>`` (n counts from 1 per file), so that its
    segments stay one gene when read back; `read_genes` gives back the genes written otherwise.
    An existing file is replaced only with `overwrite`.
    """
    lengths = dict(contigs)
    order = {name: i for i, (name, _) in enumerate(contigs)}
    lines = ["##gff-version 3"] + [f"##sequence-region {_escape_seqid(name)} 1 {length}" for name, length in contigs]
    keys: set[tuple] = set()
    generated = 0
    for gene in sorted(genes, key=lambda g: (order.get(g.contig, -1), g.start, g.end)):
        if gene.contig not in lengths:
            raise ValueError(
                f"gene {_describe(gene)} is on contig {gene.contig!r}, which is not in contigs= "
                f"({', '.join(map(repr, list(lengths)[:5]))}); pass every contig with its length"
            )
        inside = 0 <= gene.start < gene.end <= lengths[gene.contig]
        if gene.kind not in GENE_KINDS or gene.strand not in (1, -1) or not inside:
            raise ValueError(
                f"gene {_describe(gene)} (strand {gene.strand}) is not a {'/'.join(GENE_KINDS)} on strand "
                f"+1/-1 within the {lengths[gene.contig]:,} bases of {gene.contig!r}; fix it"
            )
        attributes = list(gene.attributes)
        keyed = dict(attributes)
        if "ID" not in keyed and "Parent" not in keyed:
            generated += 1
            attributes.insert(0, ("ID", f"{gene.contig}.{gene.kind}.{generated}"))
            keyed = dict(attributes)
        by = "ID" if "ID" in keyed else "Parent"
        key = (gene.contig, gene.kind, by, keyed[by])
        if key in keys:
            raise ValueError(
                f"two {gene.kind} genes on {gene.contig!r} have the {key[2]} {key[3]!r}; a reader would "
                "join them into one gene, so give each gene its own ID"
            )
        keys.add(key)
        column9 = ";".join(f"{_escape(k)}={_escape(v)}" for k, v in attributes)
        score = "." if gene.score is None else repr(float(gene.score))
        strand = "+" if gene.strand > 0 else "-"
        phases = segment_phases(gene) if gene.kind == "CDS" else None
        for i, (start, end) in enumerate(gene.pieces()):
            phase = str(phases[i]) if phases is not None else "."
            lines.append(
                "\t".join(
                    [
                        _escape_seqid(gene.contig),
                        source,
                        gene.kind,
                        str(start + 1),
                        str(end),
                        score,
                        strand,
                        phase,
                        column9,
                    ]
                )
            )
    return write_text(Path(path), "\n".join(lines) + "\n", overwrite=overwrite)


# --- held-out regions and signal tracks -------------------------------------------------------


def _piece(contig: AnnotatedContig, start: int, end: int) -> AnnotatedContig:
    """Bases [start, end) of `contig` as a contig of its own: genes inside it shifted, genes
    crossing its ends dropped (their labels stay)."""
    if start == 0 and end == contig.codes.size:
        return contig
    name = f"{contig.name}:{start}-{end}"
    genes = [
        dataclasses.replace(
            g,
            contig=name,
            start=g.start - start,
            end=g.end - start,
            segments=tuple((a - start, b - start) for a, b in g.segments),
        )
        for g in contig.genes
        if g.start >= start and g.end <= end
    ]
    return AnnotatedContig(name, contig.codes[start:end], contig.labels[start:end], genes, contig.source)


def region_holdout(
    contigs: Sequence[AnnotatedContig], fraction: float, *, gap: int = 1000, seed: int = 0
) -> tuple[list[AnnotatedContig], list[AnnotatedContig]]:
    """(train, held out): about `fraction` of all bases held out as contiguous regions.

    A contig whose held-out share, round(fraction * L) bases, is at least `gap` (and 1) is cut:
    one region of that length at a random place (from `seed`) is held out, and `gap` bases on
    each side of it are dropped, so that no window sees both sides; the pieces are named
    ``name:start-end`` (0-based, end exclusive). Shorter contigs go whole (names unchanged) to
    one side, in a random order, held out while the held-out share of their bases stays within
    `fraction`. Genes crossing a cut are dropped from ``genes``; their labels stay.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction={fraction}: give the share of bases to hold out, between 0 and 1")
    if gap < 0:
        raise ValueError(f"gap={gap}: give the number of bases to drop between the sides, >= 0")
    rng = np.random.default_rng(seed)
    train: list[AnnotatedContig] = []
    held: list[AnnotatedContig] = []
    whole: list[AnnotatedContig] = []
    for contig in contigs:
        length = contig.codes.size
        size = round(fraction * length)
        if size < max(gap, 1):
            whole.append(contig)
            continue
        start = int(rng.integers(0, length - size + 1))
        held.append(_piece(contig, start, start + size))
        if start - gap > 0:
            train.append(_piece(contig, 0, start - gap))
        if start + size + gap < length:
            train.append(_piece(contig, start + size + gap, length))
    budget = fraction * sum(c.codes.size for c in whole)
    taken = 0
    for i in rng.permutation(len(whole)):
        contig = whole[i]
        if taken + contig.codes.size <= budget:
            held.append(contig)
            taken += contig.codes.size
        else:
            train.append(contig)
    if not held or not train:
        raise ValueError(
            f"holding out {fraction:.0%} of {len(contigs):,} contig(s) leaves one side empty (gap {gap:,}); "
            "give longer or more contigs, a smaller gap, or another fraction"
        )
    return train, held


def read_signal_tracks(bedgraph: PathLike, *, genome: PathLike) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, codes (L,) uint8, values (L,) float32) of every contig of `genome` that the
    bedGraph file covers, in genome order; NaN where it gives no value.

    The bedGraph lines are chrom, 0-based start, exclusive end and value (``#``, ``track`` and
    ``browser`` lines are skipped); intervals must lie within their contig and not overlap.
    """
    path = Path(bedgraph)
    intervals: dict[str, list[tuple[int, int, float, int]]] = {}
    for number, fields in bed_lines(path):
        where = f"{path} line {number}"
        if len(fields) < 4:
            raise ValueError(
                f"{where}: {len(fields)} tab-separated field(s); bedGraph lines are chrom, start, end, value"
            )
        try:
            start, end, value = int(fields[1]), int(fields[2]), float(fields[3])
        except ValueError as exc:
            raise ValueError(
                f"{where}: start {fields[1]!r}, end {fields[2]!r} and value {fields[3]!r} must be numbers"
            ) from exc
        if start < 0 or start >= end:
            raise ValueError(f"{where}: interval {fields[0]}:{start}-{end} is empty or negative (0-based start < end)")
        intervals.setdefault(fields[0], []).append((start, end, value, number))
    if not intervals:
        raise ValueError(f"{path}: no intervals; a bedGraph file needs lines of chrom, start, end, value")
    contigs, names = read_genome_contigs(genome, set(intervals), needed_by=f"the bedGraph file {path}")
    unknown = [chrom for chrom in intervals if chrom not in contigs]
    if unknown:
        raise ValueError(
            f"{path}: chromosome(s) {', '.join(map(repr, unknown[:5]))} are not in {genome}, which holds "
            f"{', '.join(map(repr, names[:5]))}; use the genome the bedGraph was made for"
        )
    tracks = []
    for name in names:
        if name not in intervals:
            continue
        codes = contigs[name]
        values = np.full(codes.size, np.nan, dtype=np.float32)
        previous_end, previous_line = 0, 0
        for start, end, value, number in sorted(intervals[name]):
            if end > codes.size:
                raise ValueError(
                    f"{path} line {number}: interval {name}:{start}-{end} runs past the end of {name!r} "
                    f"({codes.size:,} bases); use the genome the bedGraph was made for"
                )
            if start < previous_end:
                raise ValueError(
                    f"{path} lines {previous_line} and {number}: intervals on {name!r} overlap; give each "
                    "base one value"
                )
            values[start:end] = value
            previous_end, previous_line = end, number
        tracks.append((name, codes, values))
    return tracks
