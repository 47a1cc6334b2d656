"""`genoformer evaluate`: bits per base of a checkpoint on FASTA files or genome stores.

    genoformer evaluate --checkpoint CKPT --inputs genome.fa.gz --context 8192 --out eval.json

The JSON holds ``{"total": {"bits_per_base", "bases"}, "records": [{"name", "bits_per_base",
"bases", "source"}, ...]}`` plus the settings and the speed (``bases_per_second``). Bits per base
are -mean log2 p(base) over the scored bases (see `genoformer.genome.scoring`): A/C/G/T positions, less the
first base of each record for causal models, which has no context.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from genoformer.data.genome.alphabet import T, reverse_complement
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.storage import refuse_existing, write_json, write_text
from genoformer.kernels.dispatch import Backend
from genoformer.genome.scoring import Scorer



def summarize(names: Sequence[str], sources: Sequence[str], log2p: Sequence[Sequence[np.ndarray]]) -> dict[str, Any]:
    """The JSON report's records and total from per-record lists of log2 p arrays (one per strand)."""
    records = []
    total_bits, total_bases = 0.0, 0
    for name, source, strands in zip(names, sources, log2p):
        scored = np.concatenate([values[np.isfinite(values)] for values in strands])
        bits, bases = float(-scored.sum()), int(scored.size)
        records.append({"name": name, "source": source, "bits_per_base": bits / bases if bases else None, "bases": bases})
        total_bits += bits
        total_bases += bases
    total = {"bits_per_base": total_bits / total_bases if total_bases else None, "bases": total_bases}
    return {"total": total, "records": records}


def format_table(report: dict[str, Any], title: str) -> str:
    """The per-record and total rows of a report as aligned text."""
    rows = [(r["name"], r["bases"], r["bits_per_base"]) for r in report["records"]]
    rows.append(("total", report["total"]["bases"], report["total"]["bits_per_base"]))
    width = max(len(name) for name, _, _ in rows)
    lines = [title, f"{'record':<{width}}  {'bases':>12}  {'bits/base':>9}"]
    for name, bases, bpb in rows:
        lines.append(f"{name:<{width}}  {bases:>12,}  {'-' if bpb is None else f'{bpb:9.4f}':>9}")
    return "\n".join(lines)


def evaluate(
    *,
    checkpoint: Path,
    inputs: list[str],
    context: Optional[int] = None,
    overlap: Optional[int] = None,
    both_strands: bool = False,
    out: Optional[Path] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Bits per base of a trained checkpoint on DNA, per record and in total.

    Long records are tiled: every scored base sees up to `context` preceding bases (at least
    `overlap` once past the first window); the first bases of a record are scored with the context
    that exists. Masked models are scored by pseudo-likelihood. N bases are not scored.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit`.
        inputs: FASTA/GenBank files (plain, .gz, .xz, .bz2) or genome stores (.zarr folders).
        context: Tokens of context per window; default the context the model was trained at.
        overlap: Tokens shared by neighbouring windows; default context // 2.
        both_strands: Also score the reverse complement of every record (bits per base over both).
        out: Write the report as JSON here (total, records, settings, speed).
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: Replace an existing `out`.
    """
    if out is not None:
        refuse_existing(Path(out), overwrite)
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    context = scorer.context if context is None else context
    overlap = scorer.check_context(context, overlap)
    records = list(read_sequences(inputs))
    sequences = [r.codes for r in records]
    if both_strands:
        sequences += [reverse_complement(r.codes) for r in records]
    if scorer.device.type == "cuda":
        torch.cuda.synchronize(scorer.device)
    began = time.perf_counter()
    log2p = scorer.score_many(sequences, context=context, overlap=overlap, batch_size=batch_size, description="evaluating")
    if scorer.device.type == "cuda":
        torch.cuda.synchronize(scorer.device)
    seconds = time.perf_counter() - began
    strands = [log2p[i::len(records)] for i in range(len(records))]
    report = summarize([r.name for r in records], [r.source for r in records], strands)
    positions = sum(len(s) for s in sequences)
    report.update({
        "checkpoint": str(checkpoint),
        "objective": "CAUSAL_LM" if scorer.causal else "MASKED_LM",
        "context": context,
        "overlap": overlap,
        "both_strands": both_strands,
        "unscored": {
            "non_acgt": int(sum((s > T).sum() for s in sequences)),
            "first_base": len(sequences) if scorer.causal else 0,
        },
        "device": str(scorer.device) + (f" ({torch.cuda.get_device_name(scorer.device)})" if scorer.device.type == "cuda" else ""),
        "seconds": seconds,
        "bases_per_second": positions / seconds,
    })
    strand_note = " (both strands)" if both_strands else ""
    print(format_table(report, f"bits per base at a {context:,}-token context{strand_note}: {checkpoint}"))
    print(f"{positions:,} positions in {seconds:.1f} s ({positions / seconds:,.0f} bases/s on {report['device']})")
    if out is not None:
        print(f"wrote {write_json(out, report, overwrite=True)}")
    return report


def bedgraph_lines(name: str, log2p_L: np.ndarray) -> Iterator[str]:
    """bedGraph rows (0-based, half-open) of the scored bases of one record; runs of equal values
    share a row."""
    scored_L = np.isfinite(log2p_L)
    values = np.where(scored_L, log2p_L, 0.0)
    # a new row starts where scoring starts, stops or the value changes
    change = np.flatnonzero((np.diff(values) != 0) | (np.diff(scored_L) != 0)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(log2p_L)]])
    for start, end in zip(starts, ends):
        if scored_L[start]:
            yield f"{name}\t{start}\t{end}\t{values[start]:.5g}"


def score(
    *,
    checkpoint: Path,
    inputs: list[str],
    out: Path,
    context: Optional[int] = None,
    overlap: Optional[int] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Write the per-base log-likelihood (log2 p, in bits) of every record as a bedGraph track.

    Bases are scored as `genoformer evaluate` scores them (tiled, with up to `context` bases of
    preceding context for causal models, pseudo-likelihood for masked ones); unscored bases (N,
    and the first base of a record for causal models) have no row. Values are <= 0; lower means
    less expected by the model.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit`.
        inputs: FASTA/GenBank files (plain, .gz, .xz, .bz2) or genome stores (.zarr folders).
        out: The bedGraph file to write (e.g. track.bedgraph).
        context: Tokens of context per window; default the context the model was trained at.
        overlap: Tokens shared by neighbouring windows; default context // 2.
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    records = list(read_sequences(inputs))
    log2p = scorer.score_many([r.codes for r in records], context=context, overlap=overlap, batch_size=batch_size)
    header = f'track type=bedGraph name="{Path(checkpoint).stem}" description="log2 p(base), bits"'
    lines = [header]
    for record, values in zip(records, log2p):
        lines.extend(bedgraph_lines(record.name, values))
    path = write_text(out, "\n".join(lines) + "\n", overwrite=True)
    print(f"wrote {path} ({sum(int(np.isfinite(v).sum()) for v in log2p):,} scored bases in {len(records)} records)")
    return path
