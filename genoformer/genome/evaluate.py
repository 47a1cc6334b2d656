"""`genoformer evaluate` and `genoformer score`: bits per base of a checkpoint on FASTA files or
genome stores, and the per-base log-likelihood as a bedGraph or bigWig track.

    genoformer evaluate --checkpoint CKPT --inputs genome.fa.gz --context 8192 --out eval.json
    genoformer evaluate --checkpoint CKPT --inputs genome.zarr --split test --split_config run/config.yaml
    genoformer score --checkpoint CKPT --inputs genome.fa.gz --regions chr1:1-100,000 --bin 10 --out chr1.bw
    genoformer evaluate --checkpoint CKPT --inputs strain.fa.gz --mix markov.npz --out eval.json

The JSON holds ``{"total": {"bits_per_base", "bases"}, "records": [{"name", "bits_per_base",
"bases", "source", "region"}, ...]}`` plus the settings and the speed (``bases_per_second``). Bits
per base are -mean log2 p(base) over the scored bases (see `genoformer.genome.scoring`): A/C/G/T
positions, less the first base of each record for causal models, which has no context (the
Markov `baseline` leaves it out too, so both count the same bases).

With ``--mix MODEL.npz`` (a Markov model from `genoformer baseline --save`) every base is also
scored by the Markov model and by the mixture of the two (`genoformer.genome.mixture`): each row
then holds ``markov_bits_per_base`` and ``mixture_bits_per_base`` beside the network's
``bits_per_base``, all three over the same bases, and ``mixture`` says which mixture was used.
`score` writes the mixture's log2 p instead of the network's.

The window: the default of every scoring command (`genoformer.genome.scoring.scoring_window`):
on a CPU, given neither --context nor --overlap, a model trained at a longer context than 2,048
is read at 2,048 tokens with an overlap of 512, about 3x faster than an 8,192 window with
half-window overlap for about 0.001 to 0.002 bits per base (benchmarks/results/scoring_speed.json,
docs/design/mixture.md); otherwise (and on a GPU) the trained context with overlap context // 2.

Regions (``--regions``, or one ``--split`` of a training data split): only their bases are
scored, and exactly as in the whole-record run: the windows of the record's tiling that keep them
are run, so a region's first bases see the bases before it as context (up to the context), and a
masked model sees the bases on both sides, as it would in the whole record. Results are in
record coordinates, under the records' names.

Shape legend: L bases of one record, I intervals of a track.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pyBigWig
import torch

from genoformer.core.checkpoints import resolve_checkpoint
from genoformer.data.genome.alphabet import T, reverse_complement
from genoformer.data.genome.inputs import NamedSequence, read_sequences
from genoformer.data.genome.regions import Region, record_regions
from genoformer.data.splits import SplitName, SplitSpec, read_split_spec
from genoformer.data.storage import atomic_build, refuse_existing, write_json, write_text
from genoformer.genome.mixture import (
    MarkovMixture,
    MixModeName,
    fit_weight,
    load_mixture,
    mix_with_weights,
    mixture_settings,
    require_causal,
)
from genoformer.genome.reports import comparison_rows, comparison_text, is_table, write_comparison
from genoformer.genome.scoring import Scorer, scoring_window
from genoformer.hints import option
from genoformer.kernels.dispatch import Backend

BEDGRAPH_SUFFIXES = (".bedgraph", ".bg", ".bdg")
BIGWIG_SUFFIXES = (".bw", ".bigwig")


def _strand_ranges(
    records: Sequence[NamedSequence], index: int, region: Region, both_strands: bool
) -> list[tuple[int, int, int]]:
    """(sequence, start, end) of a region of record `index` on each strand scored: the sequences
    are the records, then with `both_strands` their reverse complements, on which a region
    [s, e) of a record of L bases is [L - e, L - s)."""
    ranges = [(index, region.start, region.end)]
    if both_strands:
        length = records[index].codes.size
        ranges.append((len(records) + index, length - region.end, length - region.start))
    return ranges


def summarize(names: Sequence[str], sources: Sequence[str], log2p: Sequence[Sequence[np.ndarray]]) -> dict[str, Any]:
    """The JSON report's records and total from per-record lists of log2 p arrays (one per strand)."""
    records = []
    total_bits, total_bases = 0.0, 0
    for name, source, strands in zip(names, sources, log2p):
        scored = np.concatenate([values[np.isfinite(values)] for values in strands])
        bits, bases = float(-scored.sum()), int(scored.size)
        records.append(
            {"name": name, "source": source, "bits_per_base": bits / bases if bases else None, "bases": bases}
        )
        total_bits += bits
        total_bases += bases
    total = {"bits_per_base": total_bits / total_bases if total_bases else None, "bases": total_bases}
    return {"total": total, "records": records}


EVALUATE_COLUMNS = {"model": "bits_per_base", "markov": "markov_bits_per_base", "mixture": "mixture_bits_per_base"}
"""Where a report's rows hold each method's bits per base (the Markov model's and the mixture's
with --mix only), for the comparison table (genoformer.genome.reports)."""


def evaluate(
    *,
    checkpoint: Path,
    inputs: list[str],
    context: Optional[int] = None,
    overlap: Optional[int] = None,
    both_strands: bool = False,
    regions: Optional[Union[str, list[str]]] = None,
    split: Optional[SplitName] = None,
    split_config: Optional[Path] = None,
    out: Optional[Path] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    mix: Optional[Path] = None,
    mix_mode: Optional[MixModeName] = None,
    mix_weight: Optional[float] = None,
    mix_switch_rate: Optional[float] = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Bits per base of a trained checkpoint on DNA, per record (or region) and in total.

    Long records are tiled: every scored base sees up to `context` preceding bases (at least
    `overlap` once past the first window); the first bases of a record are scored with the context
    that exists, and its first base, which has none, is not scored by a causal model (nor by
    `genoformer baseline`). Masked models are scored by pseudo-likelihood. N bases are not scored.
    With `regions` or `split`, only those bases are scored, each exactly as in the whole-record
    run (the bases before a region are its context), one row per region. With `mix`, the same
    bases are also scored by a Markov model and by the mixture of the two, side by side; the
    mixture starts afresh on every record, strand and region.

    Args:
        checkpoint: A DNA language model: a .ckpt file of `genoformer fit`, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last, genoformer-dna, an exported folder or a Hub id.
        inputs: FASTA/GenBank files (plain, .gz, .xz, .bz2) or genome stores (.zarr folders).
        context: Tokens of context per window; default the context the model was trained at (on a
            CPU, with no overlap given, at most 2,048 with overlap 512: 3x faster for about 0.002
            bits per base).
        overlap: Tokens shared by neighbouring windows; default context // 2.
        both_strands: Also score the reverse complement of every record (bits per base over both).
        regions: Score only these: a BED file (0-based, optional name column) or regions
            chrom:start-end (1-based, inclusive; chrom alone is the whole record), several after
            one flag. Rows are named by the BED name, else chrom:start-end.
        split: Score only this split (train, val or test) of the inputs, as `genoformer fit`
            holds it out of a store built from them (see split_config).
        split_config: The training config whose data split `split` follows (a fit config, or
            config.yaml of its run); default the data module's default split (the last 5% of
            every record is val).
        out: Write the report here: .json (total, records, settings, speed, and the comparison
            table as "table") or .tsv (the comparison table: model, and with --mix Markov and
            mixture bits per base, per record and in total; genoformer.genome.reports).
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device; fp8 runs it in FP8 on
            Hopper (faster, at the error docs/inference.md measures).
        mix: A Markov model (.npz from `genoformer baseline --save`) to mix with the network: each
            base's probability is w p_network + (1 - w) p_markov with w chosen from the bases
            before it only (a proper model: exact bits). Causal models only.
        mix_mode: switching (the default): w follows whichever blend of the two models predicted
            the recent bases best (fixed share over weights 0, 0.25, 0.5, 0.75, 1), so that a
            strain of a trained species gets the Markov model's memory and a new genus the
            network; fixed: one weight, --mix_weight (the default when that is given).
        mix_weight: The network's weight at every base of a fixed mixture, 0 to 1; the report's
            mixture.best_fixed_weight is the best one for the bases scored (fit it on validation data).
        mix_switch_rate: Switching mixture: the chance of a switch of blend before each base
            (default 0.001).
        overwrite: Replace an existing `out`.
    """
    if out is not None:
        refuse_existing(Path(out), overwrite)
    mixture = mixture_settings(mix, mix_mode, mix_weight, mix_switch_rate)
    split_spec = read_split_spec(split_config)
    records = list(read_sequences(inputs))
    chosen = record_regions(records, regions, split=split, split_spec=split_spec)
    checkpoint = resolve_checkpoint(checkpoint)  # the file itself, for the report and titles
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    window = scoring_window(scorer.context, scorer.device, context, overlap, name="context")
    context, overlap = window.length, scorer.check_context(window.length, window.overlap)
    if window.note:
        print(window.note)
    if mixture is not None:
        require_causal(scorer.causal, checkpoint)
        mixing = load_mixture(mix, mixture)
    sequences = [r.codes for r in records]
    if both_strands:
        sequences += [reverse_complement(r.codes) for r in records]
    ranges = [_strand_ranges(records, index, region, both_strands) for index, region in chosen]
    spans: list[list[tuple[int, int]]] = [[] for _ in sequences]
    for i, lo, hi in (part for parts in ranges for part in parts):
        spans[i].append((lo, hi))
    if scorer.device.type == "cuda":
        torch.cuda.synchronize(scorer.device)
    began = time.perf_counter()
    log2p = scorer.score_many(
        sequences, context=context, overlap=overlap, batch_size=batch_size, description="evaluating", spans=spans
    )
    if scorer.device.type == "cuda":
        torch.cuda.synchronize(scorer.device)
    seconds = time.perf_counter() - began
    strands = [[log2p[i][lo:hi] for i, lo, hi in parts] for parts in ranges]
    non_acgt = sum(int((sequences[i][lo:hi] > T).sum()) for parts in ranges for i, lo, hi in parts)
    report = summarize([region.name for _, region in chosen], [records[index].source for index, _ in chosen], strands)
    for row, (_, region) in zip(report["records"], chosen):
        row["region"] = region.label
    positions = sum(values.size for parts in strands for values in parts)
    report.update(
        {
            "checkpoint": str(checkpoint),
            "objective": "CAUSAL_LM" if scorer.causal else "MASKED_LM",
            "context": context,
            "overlap": overlap,
            "both_strands": both_strands,
            "unscored": {"non_acgt": non_acgt, "first_base": positions - report["total"]["bases"] - non_acgt},
            "device": str(scorer.device)
            + (f" ({torch.cuda.get_device_name(scorer.device)})" if scorer.device.type == "cuda" else ""),
            "seconds": seconds,
            "bases_per_second": positions / seconds,
        }
    )
    if split is not None:
        report["split"] = {
            "name": split,
            "spec": dataclasses.asdict(split_spec or SplitSpec()),
            "config": None if split_config is None else str(split_config),
        }
    if mixture is not None:
        report["mixture"] = _mixture_report(report, mixing, sequences, log2p, ranges)
    strand_note = " (both strands)" if both_strands else ""
    what = "record" if regions is None and split is None else "region"
    columns = EVALUATE_COLUMNS if mixture is not None else {"model": EVALUATE_COLUMNS["model"]}
    report["table"] = comparison_rows(report["records"], report["total"], columns)
    print(
        comparison_text(
            report["table"], f"bits per base at a {context:,}-token context{strand_note}: {checkpoint}", what
        )
    )
    print(f"{positions:,} positions in {seconds:.1f} s ({positions / seconds:,.0f} bases/s on {report['device']})")
    if mixture is not None:
        mixed = report["mixture"]
        best = (
            ""
            if mixed["best_fixed_weight"] is None
            else (
                f"; the best fixed weight for these bases would be {mixed['best_fixed_weight']:.3f} "
                f"({mixed['best_fixed_bits_per_base']:.4f} bits/base, fitted on them)"
            )
        )
        weight = (
            ""
            if mixed["mean_network_weight"] is None
            else f"; mean weight on the network {mixed['mean_network_weight']:.3f}"
        )
        print(f"mixture: {mixing.label()}{weight}{best}")
    if mixture is None and scorer.causal:
        inputs_given = " ".join(map(str, inputs if isinstance(inputs, list) else [inputs]))
        print(
            "to set a Markov baseline and the mixture of both beside the model in this table, fit the baseline on "
            f"the model's training genomes and add --mix markov.npz to this command:\n  genoformer baseline --train "
            f"TRAINING_GENOMES --inputs {inputs_given} --save markov.npz --out markov.tsv"
        )
    if out is not None:
        path = (
            write_comparison(Path(out), report["table"], overwrite=True)
            if is_table(out)
            else write_json(out, report, overwrite=True)
        )
        print(f"wrote {path}")
    return report


def _mixture_report(
    report: dict[str, Any],
    mixing: MarkovMixture,
    sequences: Sequence[np.ndarray],
    log2p: Sequence[np.ndarray],
    ranges: Sequence[Sequence[tuple[int, int, int]]],
) -> dict[str, Any]:
    """Add the Markov model's and the mixture's bits per base to every row and the total of a
    report (each region and strand one stream of the mixture); return what the report's
    "mixture" holds: the settings, the mean weight of the network, the best fixed weight for these
    bases and its bits per base (fitted on them: a bound, not a result), the seconds it took."""
    began = time.perf_counter()
    scored = [
        list(zip(*(mixing.score(sequences[i], log2p[i][lo:hi], lo, hi) for i, lo, hi in parts))) for parts in ranges
    ]
    seconds = time.perf_counter() - began
    for key, which in (("markov_bits_per_base", 0), ("mixture_bits_per_base", 1)):
        other = summarize(
            [row["name"] for row in report["records"]],
            [row["source"] for row in report["records"]],
            [parts[which] for parts in scored],
        )
        for row, row_other in zip([*report["records"], report["total"]], [*other["records"], other["total"]]):
            row[key] = row_other["bits_per_base"]
    network_L = np.concatenate([log2p[i][lo:hi] for parts in ranges for i, lo, hi in parts])
    markov_L = np.concatenate([values for parts in scored for values in parts[0]])
    weights_L = np.concatenate([values for parts in scored for values in parts[2]])
    both_L = np.isfinite(network_L) & np.isfinite(markov_L)
    best = fit_weight(network_L, markov_L) if both_L.any() else None
    return {
        **mixing.describe(),
        "mean_network_weight": float(weights_L[both_L].mean()) if both_L.any() else None,
        "best_fixed_weight": best,
        "best_fixed_bits_per_base": None
        if best is None
        else -float(np.mean(mix_with_weights(network_L[both_L], markov_L[both_L], best))),
        "seconds": seconds,
    }


# ------------------------------------------------------------------------------------- tracks
def _check_bin(bin: int) -> None:
    if bin < 1:
        raise ValueError(
            f"{option('bin', bin)}: a bin holds at least 1 base; pass {option('bin', 1)} for one value per base"
        )


def track_bins(log2p_L: np.ndarray, start: int, end: int, bin: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The track intervals of bases [start, end) of one record: (starts (I,) int64, ends (I,)
    int64, values (I,) float32). Bins are `bin` bases long, aligned to multiples of `bin` in record
    coordinates and clipped to [start, end); each holds the mean of its scored (finite) values, and
    a bin without a scored base is left out."""
    _check_bin(bin)
    values_L = log2p_L[start:end]
    scored_L = np.isfinite(values_L)
    if bin == 1:
        starts = start + np.flatnonzero(scored_L)
        return starts, starts + 1, values_L[scored_L].astype(np.float32)
    cuts = np.r_[start, np.arange((start // bin + 1) * bin, end, bin)].astype(np.int64)
    ends = np.r_[cuts[1:], end].astype(np.int64)
    sums = np.add.reduceat(np.where(scored_L, values_L, 0.0), cuts - start)
    counts = np.add.reduceat(scored_L, cuts - start)
    keep = counts > 0
    return cuts[keep], ends[keep], (sums[keep] / counts[keep]).astype(np.float32)


def merge_runs(
    starts_I: np.ndarray, ends_I: np.ndarray, keys_I: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adjacent intervals (one's end is the next one's start) with equal keys made one: the
    (starts, ends, index of each run's first interval)."""
    if starts_I.size == 0:
        return starts_I, ends_I, np.empty(0, np.int64)
    new = np.r_[True, (starts_I[1:] != ends_I[:-1]) | (keys_I[1:] != keys_I[:-1])]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, starts_I.size - 1]
    return starts_I[first], ends_I[last], first


def significant(values_I: np.ndarray, digits: int = 5) -> np.ndarray:
    """`values_I` rounded to `digits` significant digits (float64), as a bedGraph writes them."""
    values_I = np.asarray(values_I, dtype=np.float64)
    magnitude_I = np.floor(np.log10(np.abs(values_I), out=np.zeros_like(values_I), where=values_I != 0))
    scale_I = 10.0 ** (digits - 1 - magnitude_I)
    return np.round(values_I * scale_I) / scale_I


def bedgraph_lines(name: str, starts_I: np.ndarray, ends_I: np.ndarray, values_I: np.ndarray) -> Iterator[str]:
    """bedGraph rows (0-based, half-open) of intervals of one record, values written to 5
    significant digits; adjacent intervals whose written values are equal share a row."""
    rounded_I = significant(values_I)
    starts, ends, first = merge_runs(starts_I, ends_I, rounded_I)
    for start, end, value in zip(starts.tolist(), ends.tolist(), rounded_I[first].tolist()):
        yield f"{name}\t{start}\t{end}\t{value:.5g}"


def _merged_spans(chosen: Sequence[tuple[int, Region]], count: int) -> list[list[tuple[int, int]]]:
    """Per record, its regions sorted and with overlapping or touching ones joined."""
    spans: list[list[tuple[int, int]]] = [[] for _ in range(count)]
    for index, region in sorted(chosen, key=lambda item: (item[0], item[1].start)):
        ranges = spans[index]
        if ranges and region.start <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], region.end))
        else:
            ranges.append((region.start, region.end))
    return spans


def _track_format(out: Path) -> str:
    suffix = out.suffix.lower()
    if suffix in BEDGRAPH_SUFFIXES:
        return "bedGraph"
    if suffix in BIGWIG_SUFFIXES:
        return "bigWig"
    raise ValueError(f"cannot tell the track format of {out}: name it *.bedgraph (text) or *.bw (bigWig)")


def write_bigwig(
    out: Path,
    records: Sequence[NamedSequence],
    intervals: Sequence[Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]],
    *,
    overwrite: bool,
) -> Path:
    """Write a bigWig (pyBigWig) of the intervals of each record (in record order, sorted), with
    every record in its header; float32 values, written under a temporary name and renamed. Runs
    of adjacent intervals of one length are written as fixed-step sections (3x faster than one
    entry per interval, and a third smaller)."""
    with atomic_build(out, overwrite) as tmp:
        track = pyBigWig.open(str(tmp), "w")
        if track is None:
            raise OSError(f"pyBigWig could not open {tmp} for writing; check that its folder is writable")
        try:
            track.addHeader([(record.name, int(record.codes.size)) for record in records], maxZooms=10)
            for record, parts in zip(records, intervals):
                for starts_I, ends_I, values_I in parts:
                    run_starts, _, first = merge_runs(starts_I, ends_I, ends_I - starts_I)
                    for start, lo, hi in zip(run_starts.tolist(), first.tolist(), [*first[1:].tolist(), starts_I.size]):
                        span = int(ends_I[lo] - starts_I[lo])
                        track.addEntries(
                            record.name, start, values=values_I[lo:hi].astype(np.float64), span=span, step=span
                        )
        finally:
            track.close()
    return out


def score(
    *,
    checkpoint: Path,
    inputs: list[str],
    out: Path,
    regions: Optional[Union[str, list[str]]] = None,
    bin: int = 1,
    context: Optional[int] = None,
    overlap: Optional[int] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    mix: Optional[Path] = None,
    mix_mode: Optional[MixModeName] = None,
    mix_weight: Optional[float] = None,
    mix_switch_rate: Optional[float] = None,
    overwrite: bool = False,
) -> Path:
    """Write the per-base log-likelihood (log2 p, in bits) of every record as a bedGraph or bigWig track.

    Bases are scored as `genoformer evaluate` scores them (tiled, with up to `context` bases of
    preceding context for causal models, pseudo-likelihood for masked ones); unscored bases (N,
    and the first base of a record for causal models) have no value. Values are <= 0; lower means
    less expected by the model. With `regions`, only their bases are scored, each exactly as in
    the whole-record run, and the track keeps record coordinates and names (overlapping regions
    are joined). bedGraph rows are 0-based, half-open; adjacent bases or bins whose values are
    equal share a row. With `mix`, the values are the mixture's log2 p (`genoformer evaluate
    --help`), on the bases the network scores; the mixture starts afresh on every stretch.

    Args:
        checkpoint: A DNA language model: a .ckpt file of `genoformer fit`, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last, genoformer-dna, an exported folder or a Hub id.
        inputs: FASTA/GenBank files (plain, .gz, .xz, .bz2) or genome stores (.zarr folders).
        out: The track to write: *.bedgraph (text, values to 5 significant digits) or *.bw
            (bigWig, float32 values, every record in its header).
        regions: Score only these: a BED file (0-based) or regions chrom:start-end (1-based,
            inclusive; chrom alone is the whole record), several after one flag.
        bin: Bases per value: the mean of the scored bases of each bin of this many bases (bins
            start at multiples of it in record coordinates, clipped to the regions); 1: every base.
        context: Tokens of context per window; default the context the model was trained at (on a
            CPU, with no overlap given, at most 2,048 with overlap 512: 3x faster for about 0.002
            bits per base).
        overlap: Tokens shared by neighbouring windows; default context // 2.
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device; fp8 runs it in FP8 on
            Hopper (faster, at the error docs/inference.md measures).
        mix: A Markov model (.npz from `genoformer baseline --save`) to mix with the network, as in
            `genoformer evaluate` (causal models only).
        mix_mode: switching (default) or fixed (the default when --mix_weight is given).
        mix_weight: The network's weight at every base of a fixed mixture, 0 to 1.
        mix_switch_rate: Switching mixture: the chance of a switch of blend before each base
            (default 0.001).
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    kind = _track_format(out)
    _check_bin(bin)
    mixture = mixture_settings(mix, mix_mode, mix_weight, mix_switch_rate)
    records = list(read_sequences(inputs))
    spans = _merged_spans(record_regions(records, regions), len(records))
    checkpoint = resolve_checkpoint(checkpoint)  # the file itself, for the report and titles
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    if mixture is not None:
        require_causal(scorer.causal, checkpoint)
        mixing = load_mixture(mix, mixture)
    window = scoring_window(scorer.context, scorer.device, context, overlap, name="context")
    context, overlap = window.length, scorer.check_context(window.length, window.overlap, command="score")
    if window.note:
        print(window.note)
    sequences = [r.codes for r in records]
    log2p = scorer.score_many(sequences, context=context, overlap=overlap, batch_size=batch_size, spans=spans)
    if mixture is not None:
        for codes_L, log2p_L, ranges in zip(sequences, log2p, spans):
            for start, end in ranges:
                log2p_L[start:end] = mixing.score(codes_L, log2p_L[start:end], start, end)[1]
    intervals = [[track_bins(values, start, end, bin) for start, end in ranges] for values, ranges in zip(log2p, spans)]
    if kind == "bigWig":
        path = write_bigwig(out, records, intervals, overwrite=True)
    else:
        what = "" if mixture is None else f", mixed with {Path(mix).name}: {mixture.label()}"
        lines = [f'track type=bedGraph name="{Path(checkpoint).stem}" description="log2 p(base), bits{what}"']
        for record, parts in zip(records, intervals):
            for starts_I, ends_I, values_I in parts:
                lines.extend(bedgraph_lines(record.name, starts_I, ends_I, values_I))
        path = write_text(out, "\n".join(lines) + "\n", overwrite=True)
    scored = sum(int(np.isfinite(v).sum()) for v in log2p)
    per = f", {bin}-base bins" if bin > 1 else ""
    per += "" if mixture is None else f"; mixture: {mixing.label()}"
    print(
        f"wrote {path} ({kind}{per}; {scored:,} scored bases in {sum(map(len, spans))} stretch(es) of "
        f"{sum(1 for ranges in spans if ranges)} record(s))"
    )
    return path
