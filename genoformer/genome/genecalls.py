"""Gene calls from per-base class probabilities, and their evaluation against a reference.

A fine-tuned model gives, for every base of a contig, probabilities over ``ANNOTATION_CLASSES``
("other", "CDS+", "CDS-", "rRNA", "tRNA"). :func:`call_genes` turns them into prokaryotic gene
calls. Every CDS call is a real open reading frame; the probabilities only choose among them:

1. **Open reading frames.** On each strand, every in-frame stop codon closes one ORF; its start
   options are the start codons in frame after the previous in-frame stop. An ORF with no
   upstream stop may also begin at the first whole codon of the contig (a 5' partial gene), and
   a frame with no stop before the contig end gives a 3' partial ORF that ends at its last whole
   codon. Partial genes carry ``partial=LR`` (Prodigal's convention, in contig coordinates:
   ``L``/``R`` is 1 where the gene runs off the left/right contig edge, e.g. ``partial=10``).
   A codon that holds an N is neither a start nor a stop.
2. **Evidence.** Let ``p`` be the coding probability of the ORF's strand: P(CDS+) on the +
   strand, P(CDS-) on the - strand. A gene's evidence is ``sum(p - 0.5)`` over its bases: positive where the model says
   coding, negative where it says not.
3. **Start per stop.** Of an ORF's start options that give at least ``min_length`` nt (stop
   codon included), the start with the most evidence: the gene extends upstream while the
   probability says coding (ties: the shorter gene). A gene is a candidate when its mean ``p``
   is at least ``min_score``.
4. **Selection.** Dynamic programming over the candidates (weighted interval scheduling) picks
   the set with the most evidence in which two genes overlap by at most ``max_overlap`` nt, on
   either strand; since ``min_length > max_overlap``, no gene lies inside another. Bases that
   two genes of one strand share count once, each overlapping base costs ``OVERLAP_COST`` and
   each gene ``GENE_COST``: of two starts that explain the same bases the one with less overlap
   wins, and a gene is not split in two for nothing. The probabilities do not show where one
   gene of a strand ends and the next begins when they touch, so besides its best start each
   ORF offers, for every other candidate of its strand that ends inside it, the latest start
   at most ``max_overlap`` nt before that end and the best start after it.

rRNA and tRNA calls are runs of at least ``min_rna_length`` bases where P(rRNA) or P(tRNA) is
above 0.5. The classes carry no strand, so these calls are written on the + strand (strand=+1).

Shapes: ``codes`` (L,) uint8 (A=0, C=1, G=2, T=3, N=4); ``probabilities`` (L, 5) float over
``ANNOTATION_CLASSES``; ``labels`` (L,) uint8 class indices. Gene coordinates are 0-based,
end-exclusive, as in `genoformer.data.genome.annotations.Gene`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genoformer.data.genome.alphabet import N, reverse_complement
from genoformer.data.genome.annotations import (
    ANNOTATION_CLASSES,
    CDS_MINUS,
    CDS_PLUS,
    RRNA,
    TRNA,
    AnnotatedContig,
    Gene,
    label_track,
)
from genoformer.data.genome.regions import Region
from genoformer.data.storage import write_text

#: translation table -> (stop codons, start codons).
GENETIC_CODES: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {
    11: (("TAA", "TAG", "TGA"), ("ATG", "GTG", "TTG")),  # bacteria, archaea, plastids
    4: (("TAA", "TAG"), ("ATG", "GTG", "TTG")),  # Mycoplasma, Spiroplasma: TGA is Trp
    25: (("TAA", "TAG"), ("ATG", "GTG", "TTG")),  # Gracilibacteria, SR1: TGA is Gly
}
#: Evidence taken off per base that two selected genes share: small beside the 0.5 that a
#: confidently coding base adds, so that it only decides between equally supported choices.
OVERLAP_COST = 0.01
#: Evidence taken off per selected gene (that of 4 bases at p = 1): without it, a gene split
#: into an off-frame ORF at its 5' end and the gene started behind that explains the same bases
#: as the whole gene, and noise decides between them. 2 did best on the E. coli check (0, 5, 10
#: tried: 0 called 0.5% more false stops, 10 lost a few genes).
GENE_COST = 2.0
_NO_CODON = 64  # codon index of a codon that holds an N


def _codon_table(codons: Sequence[str]) -> np.ndarray:
    """(65,) bool, True at the index ``16 * b0 + 4 * b1 + b2`` of each codon; index 64 (N) False."""
    table = np.zeros(_NO_CODON + 1, dtype=bool)
    for codon in codons:
        b0, b1, b2 = ("ACGT".index(base) for base in codon)
        table[16 * b0 + 4 * b1 + b2] = True
    return table


def _codon_indices(codes: np.ndarray) -> np.ndarray:
    """(L - 2,) int16: index of the codon that starts at each position (64 where it holds an N)."""
    c = codes.astype(np.int16)
    index = 16 * c[:-2] + 4 * c[1:-1] + c[2:]
    index[(c[:-2] == N) | (c[1:-1] == N) | (c[2:] == N)] = _NO_CODON
    return index


@dataclass
class _Orfs:
    """The candidate ORFs of one strand, in that strand's coordinates (5' to 3').

    ``end`` (K,): end of the stop codon, or of the last whole codon of a 3' partial ORF;
    ``options``: K ascending arrays of the starts that give a candidate (at least ``min_length``
    nt, mean probability at least ``min_score``); ``best`` (K,): index in ``options`` of the start
    with the most evidence; ``edge`` (K,): the start option at the contig edge (a 5' partial
    gene), or -1; ``open3`` (K,): the ORF runs off the 3' edge.
    """

    end: np.ndarray
    options: list[np.ndarray]
    best: np.ndarray
    edge: np.ndarray
    open3: np.ndarray

    def best_start(self, k: int) -> int:
        """The start of ORF ``k`` with the most evidence."""
        return int(self.options[k][self.best[k]])


def _strand_orfs(
    codes: np.ndarray,
    coding: np.ndarray,
    evidence: np.ndarray,
    *,
    stops: np.ndarray,
    starts: np.ndarray,
    min_length: int,
    min_score: float,
) -> _Orfs:
    """Candidate ORFs on the forward strand of ``codes`` (L,); ``coding`` (L,) is that strand's
    coding probability and ``evidence`` (L + 1,) the cumulative sum of ``coding - 0.5``."""
    length = codes.size
    codon = _codon_indices(codes) if length >= 3 else np.zeros(0, dtype=np.int16)
    mass = np.concatenate([[0.0], np.cumsum(coding, dtype=np.float64)])  # (L + 1,)
    end, options, best, edge, open3 = [], [], [], [], []
    for frame in range(min(3, codon.size)):
        positions = np.arange(frame, codon.size, 3)  # (F,) first base of each whole codon
        stop_at = positions[stops[codon[positions]]]  # (S,)
        start_at = positions[starts[codon[positions]]]
        # ORF k ends with stop k; ORF S, after the last stop, runs off the 3' edge.
        orf_end = np.concatenate([stop_at + 3, [positions[-1] + 3]])  # (S + 1,)
        option_at = start_at
        option_orf = np.searchsorted(stop_at, start_at)  # a start belongs to the next stop's ORF
        edge_at = -1 if starts[codon[frame]] else frame  # the first ORF may begin at the edge
        if edge_at >= 0:
            option_at = np.concatenate([[edge_at], option_at])
            option_orf = np.concatenate([[0], option_orf])
        span = orf_end[option_orf] - option_at
        mean = (mass[orf_end[option_orf]] - mass[option_at]) / np.maximum(span, 1)
        keep = (span >= min_length) & (mean >= min_score)
        option_at, option_orf = option_at[keep], option_orf[keep]  # both ascending
        orf_ids, first = np.unique(option_orf, return_index=True)
        for orf, group in zip(orf_ids.tolist(), np.split(option_at, first[1:])):
            # Most evidence over [start, end) = least cumulative evidence at the start; ties go
            # to the latest start (the shorter gene).
            end.append(int(orf_end[orf]))
            options.append(group)
            best.append(group.size - 1 - int(np.argmin(evidence[group][::-1])))
            edge.append(edge_at if orf == 0 else -1)
            open3.append(orf == stop_at.size)
    return _Orfs(
        np.asarray(end, dtype=np.int64),
        options,
        np.asarray(best, dtype=np.int64),
        np.asarray(edge, dtype=np.int64),
        np.asarray(open3, dtype=bool),
    )


def _start_variants(orfs: _Orfs, evidence: np.ndarray, max_overlap: int) -> list[list[int]]:
    """For each ORF, the starts the selection may use: the best one, and for every other ORF of
    the strand that ends after that start and before this ORF's end (a neighbour the gene would
    run into or swallow), the latest start at most ``max_overlap`` nt before that neighbour's end
    and the best start after it."""
    order = np.argsort(orfs.end, kind="stable")
    sorted_end = orfs.end[order]
    variants = []
    for k, opts in enumerate(orfs.options):
        start = orfs.best_start(k)
        chosen = {start}
        lo = np.searchsorted(sorted_end, start, side="right")
        hi = np.searchsorted(sorted_end, int(opts[-1]) + max_overlap, side="right")
        for j in order[lo:hi]:
            neighbour_end = int(orfs.end[j])
            if neighbour_end >= orfs.end[k]:
                continue
            split = int(np.searchsorted(opts, neighbour_end))  # opts[:split] start before it
            if split and opts[split - 1] >= neighbour_end - max_overlap:
                chosen.add(int(opts[split - 1]))
            if split < opts.size:
                after = opts[split:]
                chosen.add(int(after[after.size - 1 - int(np.argmin(evidence[after][::-1]))]))
        variants.append(sorted(chosen))
    return variants


@dataclass
class _Items:
    """Gene choices of both strands in contig coordinates, as the selection sees them: (M,)
    arrays ``start``, ``end``, ``strand`` (+1/-1), ``orf`` (index into that strand's ORFs) and
    ``option`` (the start in the strand's own coordinates)."""

    start: np.ndarray
    end: np.ndarray
    strand: np.ndarray
    orf: np.ndarray
    option: np.ndarray


def _items(length: int, plus: tuple[_Orfs, list[list[int]]], minus: tuple[_Orfs, list[list[int]]]) -> _Items:
    """Flatten both strands' start variants into contig coordinates; a - strand choice
    [c, e) of the reverse complement is [L - e, L - c) on the contig."""
    start, end, strand, orf, option = [], [], [], [], []
    for sign, (orfs, variants) in ((1, plus), (-1, minus)):
        for k, starts in enumerate(variants):
            e = int(orfs.end[k])
            for c in starts:
                start.append(c if sign == 1 else length - e)
                end.append(e if sign == 1 else length - c)
                strand.append(sign)
                orf.append(k)
                option.append(c)
    return _Items(*(np.asarray(values, dtype=np.int64) for values in (start, end, strand, orf, option)))


def _select(items: _Items, evidence_plus: np.ndarray, evidence_minus: np.ndarray, max_overlap: int) -> list[int]:
    """Indices of the items that the dynamic programme keeps (module docstring, rule 4).

    ``evidence_*`` (L + 1,) are cumulative sums of ``p - 0.5`` of each strand in contig
    coordinates. Items are taken in order of their end; ``best[q]`` is the most evidence of a
    set whose last item is the q-th. A predecessor either ends before the item starts (the best
    of all those, a running maximum) or overlaps it by at most ``max_overlap`` nt; shared bases
    of one strand are counted once (with the predecessor only: a third gene that reaches into
    both is rare and only miscounts, never breaks the overlap limit).
    """
    n = items.start.size
    order = np.lexsort((items.start, items.end))
    start, end = items.start[order].tolist(), items.end[order].tolist()
    strand = items.strand[order].tolist()
    cumulative = {1: evidence_plus, -1: evidence_minus}
    weight = [float(cumulative[s][e] - cumulative[s][b]) - GENE_COST for s, b, e in zip(strand, start, end)]
    best = [0.0] * n
    previous = [-1] * n
    running = [0.0] * n  # running[q]: max of best[:q + 1]
    running_at = [-1] * n
    for q in range(n):
        s = start[q]
        before = bisect.bisect_right(end, s, 0, q) - 1
        value, link = 0.0, -1  # an empty set before it, unless some set there has positive evidence
        if before >= 0 and running[before] > 0.0:
            value, link = running[before], running_at[before]
        for r in range(before + 1, bisect.bisect_right(end, s + max_overlap, 0, q)):
            shared = end[r] - s
            candidate = best[r] - OVERLAP_COST * shared
            if strand[r] == strand[q]:
                track = cumulative[strand[q]]
                candidate -= float(track[end[r]] - track[s])
            if candidate > value:
                value, link = candidate, r
        best[q] = weight[q] + value
        previous[q] = link
        if q and running[q - 1] >= best[q]:
            running[q], running_at[q] = running[q - 1], running_at[q - 1]
        else:
            running[q], running_at[q] = best[q], q
    chosen = []
    q = running_at[-1] if n and running[-1] > 0.0 else -1
    while q >= 0:
        chosen.append(int(order[q]))
        q = previous[q]
    return chosen[::-1]


def _check_inputs(codes: np.ndarray, probabilities: np.ndarray) -> None:
    if codes.ndim != 1:
        raise ValueError(f"codes must be 1-D (L,), got shape {codes.shape}")
    if codes.size and int(codes.max()) > N:
        raise ValueError(f"codes hold {int(codes.max())}, not a base (A=0 C=1 G=2 T=3 N=4); strip special tokens first")
    if probabilities.shape != (codes.size, len(ANNOTATION_CLASSES)):
        raise ValueError(
            f"probabilities must be (L, {len(ANNOTATION_CLASSES)}) = ({codes.size}, "
            f"{len(ANNOTATION_CLASSES)}) over {ANNOTATION_CLASSES}, got {probabilities.shape}"
        )


def call_genes(
    codes: np.ndarray,
    probabilities: np.ndarray,
    *,
    contig: str,
    min_length: int = 90,
    translation_table: int = 11,
    min_score: float = 0.5,
    max_overlap: int = 60,
    min_rna_length: int = 50,
) -> list[Gene]:
    """CDS, rRNA and tRNA calls on one contig from per-base class probabilities (rules in the
    module docstring), sorted by start.

    ``codes`` (L,) are base codes, ``probabilities`` (L, 5) follow ``ANNOTATION_CLASSES``. CDS
    calls are ORFs of at least ``min_length`` nt (stop codon included) whose mean coding
    probability of their strand is at least ``min_score`` (in [0.5, 1]: below 0.5 a gene adds
    negative evidence and is never chosen) and whose evidence exceeds ``GENE_COST``; ``score`` is
    that mean. Two calls overlap by at most ``max_overlap`` nt. rRNA/tRNA calls are runs of at least ``min_rna_length`` bases with
    probability above 0.5, on the + strand.
    """
    codes = np.asarray(codes)
    probabilities = np.asarray(probabilities)
    _check_inputs(codes, probabilities)
    if translation_table not in GENETIC_CODES:
        raise ValueError(f"translation_table {translation_table} is not supported; use one of {sorted(GENETIC_CODES)}")
    if not 0.5 <= min_score <= 1.0:
        raise ValueError(
            f"min_score must be in [0.5, 1], got {min_score}: a gene whose mean coding probability "
            "is below 0.5 adds negative evidence and is never chosen"
        )
    if not 0 <= max_overlap < min_length:
        raise ValueError(
            f"need 0 <= max_overlap < min_length (so that no gene fits inside another), "
            f"got max_overlap={max_overlap}, min_length={min_length}"
        )
    stop_codons, start_codons = GENETIC_CODES[translation_table]
    stops, starts = _codon_table(stop_codons), _codon_table(start_codons)
    length = codes.size
    p_plus = probabilities[:, CDS_PLUS].astype(np.float64)
    p_minus = probabilities[:, CDS_MINUS].astype(np.float64)
    evidence_plus = np.concatenate([[0.0], np.cumsum(p_plus - 0.5)])  # (L + 1,) contig coordinates
    evidence_minus = np.concatenate([[0.0], np.cumsum(p_minus - 0.5)])
    evidence_rc = np.concatenate([[0.0], np.cumsum(p_minus[::-1] - 0.5)])  # reverse-complement coordinates
    settings = dict(stops=stops, starts=starts, min_length=min_length, min_score=min_score)
    plus = _strand_orfs(codes, p_plus, evidence_plus, **settings)
    minus = _strand_orfs(reverse_complement(codes), p_minus[::-1], evidence_rc, **settings)
    items = _items(
        length,
        (plus, _start_variants(plus, evidence_plus, max_overlap)),
        (minus, _start_variants(minus, evidence_rc, max_overlap)),
    )
    genes = []
    for i in _select(items, evidence_plus, evidence_minus, max_overlap):
        b, e, strand = int(items.start[i]), int(items.end[i]), int(items.strand[i])
        orfs = plus if strand == 1 else minus
        k = int(items.orf[i])
        open5, open3 = bool(items.option[i] == orfs.edge[k]), bool(orfs.open3[k])
        left, right = (open5, open3) if strand == 1 else (open3, open5)
        mean = float(((p_plus if strand == 1 else p_minus)[b:e]).mean())
        attributes = (("partial", f"{int(left)}{int(right)}"),) if left or right else ()
        genes.append(
            Gene(contig=contig, start=b, end=e, strand=strand, kind="CDS", score=round(mean, 4), attributes=attributes)
        )
    genes += _rna_calls(probabilities, contig=contig, min_length=min_rna_length)
    return sorted(genes, key=lambda g: (g.start, g.end, g.strand))


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (exclusive) of the runs of True in ``mask`` (L,)."""
    step = np.diff(mask.astype(np.int8), prepend=0, append=0)
    return np.flatnonzero(step == 1), np.flatnonzero(step == -1)


def _rna_calls(probabilities: np.ndarray, *, contig: str, min_length: int) -> list[Gene]:
    """rRNA and tRNA features: runs of at least ``min_length`` bases with probability above 0.5
    (strand +1: the classes carry no strand)."""
    genes = []
    for column, kind in ((RRNA, "rRNA"), (TRNA, "tRNA")):
        p = probabilities[:, column]
        for b, e in zip(*_runs(p > 0.5)):
            if e - b >= min_length:
                genes.append(
                    Gene(
                        contig=contig,
                        start=int(b),
                        end=int(e),
                        strand=1,
                        kind=kind,
                        score=round(float(p[b:e].mean()), 4),
                    )
                )
    return genes


def decode_labels(probabilities: np.ndarray) -> np.ndarray:
    """(L,) uint8: the most probable class of each base, from probabilities (L, 5)."""
    probabilities = np.asarray(probabilities)
    if probabilities.ndim != 2 or probabilities.shape[1] != len(ANNOTATION_CLASSES):
        raise ValueError(
            f"probabilities must be (L, {len(ANNOTATION_CLASSES)}) over {ANNOTATION_CLASSES}, got {probabilities.shape}"
        )
    return probabilities.argmax(axis=1).astype(np.uint8)


def coding_mask(labels: np.ndarray) -> np.ndarray:
    """(L,) bool: True where the label is CDS+ or CDS-."""
    labels = np.asarray(labels)
    return (labels == CDS_PLUS) | (labels == CDS_MINUS)


def _check_pair(reference_labels: np.ndarray, predicted_labels: np.ndarray) -> None:
    if reference_labels.shape != predicted_labels.shape or reference_labels.ndim != 1:
        raise ValueError(
            f"reference and predicted labels must be 1-D arrays of one length, got "
            f"{reference_labels.shape} and {predicted_labels.shape}"
        )


def _multiclass_mcc(confusion: np.ndarray) -> float:
    """Matthews correlation of a (K, K) int64 confusion matrix (rows: reference, columns:
    prediction), Gorodkin's K-class form; 0.0 where it is undefined. Sums are taken as Python
    ints: the products of genome-sized counts overflow int64."""
    total = int(confusion.sum())
    correct = int(np.trace(confusion))
    true = [int(v) for v in confusion.sum(axis=1)]
    predicted = [int(v) for v in confusion.sum(axis=0)]
    numerator = correct * total - sum(t * p for t, p in zip(true, predicted))
    denominator = (total**2 - sum(p * p for p in predicted)) * (total**2 - sum(t * t for t in true))
    return float(numerator / denominator**0.5) if denominator else 0.0


def _confusion(reference: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    pairs = reference.astype(np.int64) * classes + predicted.astype(np.int64)
    return np.bincount(pairs, minlength=classes * classes).reshape(classes, classes)


def per_base_coding_mcc(reference_labels: np.ndarray, predicted_labels: np.ndarray) -> float:
    """Matthews correlation of coding (CDS+ or CDS-) against everything else, per base; labels
    (L,) are class indices. 0.0 when undefined (one side all one class)."""
    reference_labels, predicted_labels = np.asarray(reference_labels), np.asarray(predicted_labels)
    _check_pair(reference_labels, predicted_labels)
    return _multiclass_mcc(_confusion(coding_mask(reference_labels), coding_mask(predicted_labels), 2))


def strand_coding_mcc(reference_labels: np.ndarray, predicted_labels: np.ndarray) -> float:
    """Three-class Matthews correlation per base of CDS+ / CDS- / everything else; 0.0 when
    undefined."""
    reference_labels, predicted_labels = np.asarray(reference_labels), np.asarray(predicted_labels)
    _check_pair(reference_labels, predicted_labels)
    three = np.zeros(256, dtype=np.uint8)
    three[CDS_PLUS], three[CDS_MINUS] = 1, 2
    return _multiclass_mcc(
        _confusion(three[reference_labels.astype(np.uint8)], three[predicted_labels.astype(np.uint8)], 3)
    )


def _stop_key(gene: Gene) -> tuple[str, int, int]:
    """(contig, strand, 3' end): the end for + genes, the start for - genes."""
    return gene.contig, gene.strand, gene.end if gene.strand == 1 else gene.start


def _share(hits: int, total: int) -> float:
    return hits / total if total else 0.0


def gene_agreement(reference: Sequence[Gene], predicted: Sequence[Gene]) -> dict[str, float | int]:
    """How predicted CDS genes match reference CDS genes (other kinds are ignored), per contig.

    ``stop_and_strand``: share of reference genes whose strand and 3' end (stop) a predicted
    gene matches exactly; ``start_and_stop``: share matched exactly at both ends (and strand);
    ``precision_stop``: share of predicted genes whose strand and stop match a reference gene.
    A share of nothing is 0.0.
    """
    reference = [g for g in reference if g.kind == "CDS"]
    predicted = [g for g in predicted if g.kind == "CDS"]
    predicted_stops = {_stop_key(g) for g in predicted}
    predicted_spans = {(g.contig, g.strand, g.start, g.end) for g in predicted}
    reference_stops = {_stop_key(g) for g in reference}
    return {
        "n_reference": len(reference),
        "n_predicted": len(predicted),
        "stop_and_strand": _share(sum(_stop_key(g) in predicted_stops for g in reference), len(reference)),
        "start_and_stop": _share(
            sum((g.contig, g.strand, g.start, g.end) in predicted_spans for g in reference), len(reference)
        ),
        "precision_stop": _share(sum(_stop_key(g) in reference_stops for g in predicted), len(predicted)),
    }


def _stop_base(gene: Gene) -> int:
    """The last base of the stop codon (0-based): the end for + genes, the start for - genes."""
    return gene.end - 1 if gene.strand == 1 else gene.start


def compare_gene_calls(
    contigs: Sequence[AnnotatedContig],
    predicted: Sequence[Gene],
    *,
    regions: Sequence[Region] | None = None,
    source: str = "predicted",
) -> dict[str, float | int]:
    """How `predicted` gene calls agree with annotated `contigs` (their per-base labels and CDS
    genes), over every base, or over the bases of `regions` and the genes whose stop codon ends
    in one: ``coding_mcc`` and ``strand_coding_mcc`` per base (the predicted labels are
    `label_track` of the calls), ``recall_stop``, ``recall_start_stop`` and ``precision_stop`` of
    `gene_agreement`, ``reference_genes`` and ``predicted_genes`` (CDS genes compared) and
    ``bases``. ValueError, naming `source`, for calls on contigs the reference does not have."""
    lengths = {contig.name: contig.codes.size for contig in contigs}
    unknown = list(dict.fromkeys(g.contig for g in predicted if g.contig not in lengths))
    if unknown:
        raise ValueError(
            f"{source}: {len(unknown):,} contig(s) are not in the reference: {', '.join(map(repr, unknown[:3]))}; "
            f"its contigs are {', '.join(map(repr, list(lengths)[:3]))}{' ...' if len(lengths) > 3 else ''}; "
            "compare calls made on the reference's own sequences"
        )
    masks = {name: np.ones(length, dtype=bool) for name, length in lengths.items()}
    if regions is not None:
        masks = {name: np.zeros(length, dtype=bool) for name, length in lengths.items()}
        for region in regions:
            masks[region.chrom][region.start : region.end] = True
    by_contig: dict[str, list[Gene]] = {name: [] for name in lengths}
    for gene in predicted:
        by_contig[gene.contig].append(gene)
    reference_labels = np.concatenate([contig.labels[masks[contig.name]] for contig in contigs])
    predicted_labels = np.concatenate(
        [label_track(lengths[contig.name], by_contig[contig.name])[masks[contig.name]] for contig in contigs]
    )

    def compared(genes: Sequence[Gene]) -> list[Gene]:
        return [g for g in genes if g.kind == "CDS" and masks[g.contig][_stop_base(g)]]

    agreement = gene_agreement(compared([g for contig in contigs for g in contig.genes]), compared(predicted))
    return {
        "coding_mcc": per_base_coding_mcc(reference_labels, predicted_labels),
        "strand_coding_mcc": strand_coding_mcc(reference_labels, predicted_labels),
        "recall_stop": agreement["stop_and_strand"],
        "precision_stop": agreement["precision_stop"],
        "recall_start_stop": agreement["start_and_stop"],
        "reference_genes": agreement["n_reference"],
        "predicted_genes": agreement["n_predicted"],
        "bases": int(reference_labels.size),
    }


def write_tracks_bedgraph(
    path: Path,
    contigs: Sequence[tuple[str, np.ndarray]],
    classes: Sequence[str] = ("CDS+", "CDS-"),
    *,
    starts: Sequence[int] = (),
    overwrite: bool = False,
) -> Path:
    """Write per-base probabilities of ``classes`` as a bedGraph for a genome browser: for each
    class a ``track`` line, then ``contig  start  end  value`` lines over every contig of
    ``contigs`` ((name, probabilities (L, 5)) pairs), one line per run of bases whose value,
    rounded to 2 decimals, is the same. ``starts`` gives where each pair's probabilities start in
    its contig (a region of it; default 0 for all). Written atomically; an existing file is
    replaced only with ``overwrite``."""
    unknown = [c for c in classes if c not in ANNOTATION_CLASSES]
    if unknown:
        raise ValueError(f"unknown classes {unknown}; choose from {ANNOTATION_CLASSES}")
    for contig, probabilities in contigs:
        if np.ndim(probabilities) != 2 or np.shape(probabilities)[1] != len(ANNOTATION_CLASSES):
            raise ValueError(
                f"{contig}: probabilities must be (L, {len(ANNOTATION_CLASSES)}) over "
                f"{ANNOTATION_CLASSES}, got {np.shape(probabilities)}"
            )
    if starts and len(starts) != len(contigs):
        raise ValueError(f"starts= gives {len(starts)} starts for {len(contigs)} contigs; give one per contig")
    offsets = list(starts) or [0] * len(contigs)
    lines = []
    for name in classes:
        lines.append(
            f'track type=bedGraph name="{name}" description="genoformer P({name})" '
            "visibility=full autoScale=off viewLimits=0:1"
        )
        for (contig, probabilities), offset in zip(contigs, offsets):
            hundredths = np.rint(np.asarray(probabilities)[:, ANNOTATION_CLASSES.index(name)] * 100).astype(
                np.int64
            )  # (L,)
            if hundredths.size == 0:
                continue
            cuts = np.flatnonzero(np.diff(hundredths)) + 1
            run_start = np.concatenate([[0], cuts])
            run_end = np.concatenate([cuts, [hundredths.size]])
            values = hundredths[run_start]
            lines += [
                f"{contig}\t{b + offset}\t{e + offset}\t{v // 100}.{v % 100:02d}"
                for b, e, v in zip(run_start.tolist(), run_end.tolist(), values.tolist())
            ]
    return write_text(Path(path), "\n".join(lines) + "\n", overwrite=overwrite)
