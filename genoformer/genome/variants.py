"""Single-nucleotide variant effects from a trained model: the log-likelihood ratio of the
alternative against the reference sequence.

    scorer = Scorer.from_checkpoint("examples/genoformer_bacteria_8k.ckpt")
    effects = variant_effects(scorer, reference, variants, window=2048)

- causal models: the window of `window` bases around the variant (clipped at the contig ends) is
  scored with the reference base and with the alternative base; llr is the difference of the
  summed log2-likelihoods of the window's bases (bases before the variant cancel).
- masked models: the masked marginal: the variant position is masked in the reference window and
  llr = log2 p(alt) - log2 p(ref) there.
llr is in bits: negative means the model finds the alternative less likely.

Variants come from a VCF (read with vcfpy) or a TSV of `chrom pos ref alt` (1-based positions;
a header line starting with `chrom` is allowed and further columns are kept). Every input line
gives at least one output row (a VCF line gives one per ALT allele): a variant that cannot be
scored keeps its row, with an empty llr and the reason in `note`.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import vcfpy
from tqdm.auto import tqdm

from genoformer.data.genome.alphabet import MASK, T, encode
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.storage import refuse_existing, write_text
from genoformer.data.tiling import Tile, same_length_batches
from genoformer.kernels.dispatch import Backend
from genoformer.genome.scoring import Scorer


@dataclass
class Variant:
    """One alternative allele at one position, with the input columns it came from."""

    line: int
    chrom: str
    pos: int  # 1-based
    ref: str
    alt: str
    columns: dict[str, str]
    llr: Optional[float] = None
    note: str = ""


def read_variants(path: Path) -> tuple[list[str], list[Variant]]:
    """(the input's column names, one Variant per allele) from a VCF or a chrom/pos/ref/alt TSV."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"variants file not found: {path}; pass a VCF or a TSV of chrom pos ref alt.")
    name = path.name.lower()
    if name.endswith((".vcf", ".vcf.gz", ".vcf.bgz")):
        return _read_vcf(path)
    return _read_tsv(path)


def _read_vcf(path: Path) -> tuple[list[str], list[Variant]]:
    columns = ["CHROM", "POS", "ID", "REF", "ALT"]
    variants = []
    try:
        reader = vcfpy.Reader.from_path(str(path))
    except (vcfpy.exceptions.VCFPyException, ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a readable VCF: {exc}") from exc
    with reader:
        header_lines = 1 + len(reader.header.lines)  # meta lines and the #CHROM line
        for index, record in enumerate(reader):
            line = header_lines + index + 1
            for alt in record.ALT or [None]:
                value = getattr(alt, "value", None)
                row = {"CHROM": record.CHROM, "POS": str(record.POS), "ID": ";".join(record.ID) or ".",
                       "REF": record.REF, "ALT": "." if value is None else str(value)}
                variants.append(Variant(line, record.CHROM, record.POS, record.REF, row["ALT"], row))
    return columns, variants


def _read_tsv(path: Path) -> tuple[list[str], list[Variant]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as handle:
        rows = [(number, row) for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1)
                if row and not row[0].startswith("#")]
    if not rows:
        raise ValueError(f"{path} holds no variants; expected tab-separated lines of chrom, pos, ref, alt (1-based pos).")
    first = rows[0][1]
    if first[0].strip().lower() in ("chrom", "chr", "chromosome", "contig"):
        columns = [c.strip() for c in first]
        rows = rows[1:]
    else:
        columns = ["chrom", "pos", "ref", "alt"] + [f"column{i + 1}" for i in range(4, len(first))]
    variants = []
    for number, row in rows:
        values = dict(zip(columns, row))
        if len(row) < 4:
            variant = Variant(number, row[0], 0, "", "", values, note="fewer than 4 columns (chrom pos ref alt)")
        else:
            try:
                pos = int(row[1])
                note = ""
            except ValueError:
                pos, note = 0, f"position {row[1]!r} is not a whole number"
            variant = Variant(number, row[0], pos, row[2].strip(), row[3].strip(), values, note=note)
        variants.append(variant)
    return columns, variants


def check_variants(variants: list[Variant], reference: dict[str, np.ndarray]) -> None:
    """Set `note` on every variant that cannot be scored, naming why."""
    for v in variants:
        if v.note:
            continue
        if v.chrom not in reference:
            v.note = f"contig {v.chrom!r} is not in the reference"
        elif not 1 <= v.pos <= len(reference[v.chrom]):
            v.note = f"position {v.pos} is outside contig {v.chrom!r} (1..{len(reference[v.chrom])})"
        elif len(v.ref) != 1 or len(v.alt) != 1 or v.ref.upper() not in "ACGT" or v.alt.upper() not in "ACGT":
            v.note = f"not a single-nucleotide variant of A/C/G/T ({v.ref}>{v.alt})"
        elif v.ref.upper() == v.alt.upper():
            v.note = "ref and alt are the same base"
        else:
            base = "ACGTN"[reference[v.chrom][v.pos - 1]] if reference[v.chrom][v.pos - 1] <= 4 else "?"
            if base != v.ref.upper():
                v.note = f"ref {v.ref} does not match the reference base {base} at {v.chrom}:{v.pos}"


@torch.inference_mode()
def variant_effects(
    scorer: Scorer,
    reference: dict[str, np.ndarray],
    variants: list[Variant],
    *,
    window: int,
    batch_size: int = 8,
    progress: bool = True,
) -> list[Variant]:
    """Fill `llr` of every scorable variant (see the module docstring); others keep their note."""
    scorer.check_context(window, 0)
    check_variants(variants, reference)
    todo = []
    for v in variants:
        if v.note:
            continue
        codes = reference[v.chrom]
        start = min(max(0, v.pos - 1 - window // 2), max(0, len(codes) - window))
        end = min(len(codes), start + window)
        todo.append((v, Tile(start, end, start, end)))
    todo.sort(key=lambda item: -item[1].length)
    with tqdm(total=len(todo), unit="variant", desc="variant effects", disable=not progress, leave=False) as bar:
        for batch in same_length_batches(todo, batch_size):
            ref_BW = torch.from_numpy(np.stack([reference[v.chrom][t.start:t.end] for v, t in batch])).long()
            offset_B = torch.tensor([v.pos - 1 - t.start for v, t in batch])
            alt_B = torch.from_numpy(encode("".join(v.alt for v, _ in batch)).astype(np.int64))
            ref_B = ref_BW[torch.arange(len(batch)), offset_B]
            if scorer.causal:
                alt_BW = ref_BW.clone()
                alt_BW[torch.arange(len(batch)), offset_B] = alt_B
                llr_B = _window_log2_likelihood(scorer, alt_BW) - _window_log2_likelihood(scorer, ref_BW)
            else:
                masked_BW = ref_BW.clone()
                masked_BW[torch.arange(len(batch)), offset_B] = MASK
                log2p_BV = scorer.log2_probabilities(masked_BW)[torch.arange(len(batch)), offset_B].double()
                llr_B = log2p_BV.gather(-1, alt_B[:, None])[:, 0] - log2p_BV.gather(-1, ref_B[:, None])[:, 0]
            for (v, _), llr in zip(batch, llr_B.tolist()):
                v.llr = llr
            bar.update(len(batch))
    return variants


def _window_log2_likelihood(scorer: Scorer, tokens_BW: torch.Tensor) -> torch.Tensor:
    """Sum over each window of log2 p(base | preceding bases of the window), A/C/G/T targets only:
    float64 (B,)."""
    targets_BW = tokens_BW[:, 1:]
    log2p_BW = scorer.log2_probabilities(tokens_BW)[:, :-1].gather(-1, targets_BW.clamp(max=T)[..., None])[..., 0].double()
    return torch.where(targets_BW <= T, log2p_BW, 0.0).sum(-1)


def write_effects(columns: list[str], variants: list[Variant], path: Path) -> Path:
    """TSV: the input's columns, then llr (bits; empty when not scored) and note."""
    lines = ["\t".join([*columns, "llr", "note"])]
    for v in variants:
        llr = "" if v.llr is None else f"{v.llr:.6g}"
        lines.append("\t".join([*(v.columns.get(c, "") for c in columns), llr, v.note]))
    return write_text(path, "\n".join(lines) + "\n", overwrite=True)


def variant_effect(
    *,
    checkpoint: Path,
    reference: list[str],
    variants: Path,
    out: Path,
    window: Optional[int] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Score single-nucleotide variants by the log-likelihood ratio (bits) of alt against ref.

    Causal models sum the log-likelihood over a window around the variant; masked models take the
    masked marginal at the variant. Variants that cannot be scored (unknown contig, position
    outside it, ref not matching the reference, not an SNV) keep their row with the reason.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit`.
        reference: The reference genome: FASTA/GenBank files or a genome store (.zarr).
        variants: A VCF (.vcf, .vcf.gz) or a TSV of chrom, pos (1-based), ref, alt.
        out: The output TSV: the input's columns, then llr and note.
        window: Bases around each variant; default the model's trained context.
        batch_size: Windows per forward pass.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: Replace an existing `out`.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    genome = {record.name: record.codes for record in read_sequences(reference)}
    columns, rows = read_variants(variants)
    variant_effects(scorer, genome, rows, window=scorer.context if window is None else window, batch_size=batch_size)
    failed = [v for v in rows if v.llr is None]
    for v in failed[:20]:
        print(f"{variants}:{v.line}: not scored: {v.note}")
    if len(failed) > 20:
        print(f"... and {len(failed) - 20} more not scored (see the note column)")
    path = write_effects(columns, rows, out)
    print(f"scored {len(rows) - len(failed)} of {len(rows)} variants; wrote {path}")
    return path
