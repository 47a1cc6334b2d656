"""Variant effects from a trained model: the log-likelihood ratio (llr, in bits) of the sequence
with the alternative allele against the reference sequence.

    scorer = Scorer.from_checkpoint("examples/genoformer_dna.ckpt")
    effects = variant_effects(scorer, reference, variants, window=2048)

The window. A variant whose reference allele REF starts at the 0-based position p of a contig of
L bases is scored in the reference stretch [s, e) of at most `window` bases around it:
s = p - window // 2 moved inside the contig (s = max(0, min(s, L - window))) and
e = min(L, s + window - max(0, len(ALT) - len(REF))), so that an insertion shortens the
downstream flank and no window holds more than `window` tokens. Two windows are run:

    reference window    x[s:p] + REF + x[p + len(REF):e]
    alternative window  x[s:p] + ALT + x[p + len(REF):e]

They share the prefix x[s:p] and the downstream flank x[p + len(REF):e], which sits
len(ALT) - len(REF) tokens further right in the alternative window.

- Causal models: llr = S(alternative window) - S(reference window), where S sums
  log2 p(base | the window's bases before it) over the window's A/C/G/T bases from the variant
  (window offset p - s) to the window's end, each window in its own coordinates: the allele, then
  every base of the shared flank, compared with itself. The bases before the variant see the same
  prefix in both windows, so their terms cancel and are not computed; the first base of a window
  has no context and is never scored (a variant at the first base of a contig counts only through
  the bases after it). For a single-nucleotide variant (SNV) this is the difference of the
  windows' summed log-likelihoods. Indels, MNVs and SNVs all follow this one definition; VCF's
  anchor base (REF=AT, ALT=A) is a shared base and cancels. An allele must fit its window: a
  deletion longer than the flank after it (about window // 2) gets a note instead of an llr.
- Masked models: the masked marginal: the variant position is masked in the reference window
  and llr = log2 p(ALT) - log2 p(REF) there. It scores one base, so masked models score SNVs only;
  an indel or MNV gets a note.
- Both strands (`both_strands`): the llr is the mean of the forward-strand llr and the llr of the
  reverse-complemented windows, scored the same way on that strand (for causal models: from the
  variant to the end of the reversed window, whose prefix is then the reversed downstream flank).

llr is in bits: negative means the model finds the alternative less likely.

Shared prefixes. The windows of one variant position and strand share every base before the
allele; with a causal model of dense attention that prefix runs once (a prefill into a key/value
cache, `Scorer.continued_log2_probabilities`) and each window continues it from the allele on.
The sums are those of the whole windows up to float rounding; windows of other lengths in the
group (indels) run whole.

With a Markov model mixed in (`--mix`, causal models only; `genoformer.genome.mixture`), S sums
the mixture's log2 p instead: each window is one stream of the mixture, scored by the Markov
model from the window's own bases as the network is, so the weights before the variant are the
same in both windows and the llr compares the mixture's predictions from the variant on.

Variants come from a VCF (read with vcfpy) or a TSV of `chrom pos ref alt` (1-based positions;
a header line starting with `chrom` is allowed and further columns are kept). Every input line
gives at least one output row (a VCF line gives one per ALT allele): a variant that cannot be
scored keeps its row, with an empty llr and the reason in `note`. A VCF output (`.vcf`,
`.vcf.gz`) copies the input VCF's records with the llr in INFO (`GF_LLR`, one value per ALT,
`.` where not scored); it needs a VCF input.

Shape legend: B batch of windows, W window length (tokens), V vocabulary.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
import vcfpy
from vcfpy import bgzf

from genoformer.core.checkpoints import resolve_checkpoint
from genoformer.data.genome.alphabet import COMPLEMENT, MASK, T, encode, reverse_complement
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.regions import read_regions
from genoformer.data.storage import atomic_build, refuse_existing, write_text
from genoformer.data.tiling import Tile, same_length_batches
from genoformer.genome.mixture import MarkovMixture, MixModeName, load_mixture, mixture_settings, require_causal
from genoformer.genome.scoring import Scorer, scoring_window
from genoformer.hints import option
from genoformer.kernels.dispatch import Backend
from genoformer.progress import tqdm

VCF_SUFFIXES = (".vcf", ".vcf.gz", ".vcf.bgz")
INFO_KEY = "GF_LLR"
"""The INFO field of a VCF output: the llr of each ALT allele (bits)."""


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


@dataclass(frozen=True)
class Allele:
    """One alternative allele on a contig: the bases `ref` from the 0-based `start` on are
    replaced by `alt` (upper-case A/C/G/T strings)."""

    chrom: str
    start: int
    ref: str
    alt: str


def is_vcf(path: Path) -> bool:
    """Whether `path` names a VCF file (.vcf, .vcf.gz, .vcf.bgz)."""
    return Path(path).name.lower().endswith(VCF_SUFFIXES)


def read_variants(path: Path) -> tuple[list[str], list[Variant]]:
    """(the input's column names, one Variant per allele) from a VCF or a chrom/pos/ref/alt TSV."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"variants file not found: {path}; pass a VCF or a TSV of chrom pos ref alt.")
    if is_vcf(path):
        return _read_vcf(path)
    return _read_tsv(path)


def _vcf_records(path: Path) -> tuple[vcfpy.Reader, int]:
    """An open vcfpy reader of `path` and the number of its header lines (meta lines and #CHROM):
    record i (0-based) is on line header_lines + i + 1."""
    try:
        reader = vcfpy.Reader.from_path(str(path))
    except (vcfpy.exceptions.VCFPyException, ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a readable VCF: {exc}") from exc
    return reader, 1 + len(reader.header.lines)


def _read_vcf(path: Path) -> tuple[list[str], list[Variant]]:
    columns = ["CHROM", "POS", "ID", "REF", "ALT"]
    variants = []
    reader, header_lines = _vcf_records(path)
    with reader:
        for index, record in enumerate(reader):
            line = header_lines + index + 1
            for alt in record.ALT or [None]:
                value = getattr(alt, "value", None)
                allele = "." if value is None else str(value)
                if isinstance(alt, vcfpy.SymbolicAllele):
                    allele = f"<{value}>"
                row = {
                    "CHROM": record.CHROM,
                    "POS": str(record.POS),
                    "ID": ";".join(record.ID) or ".",
                    "REF": record.REF,
                    "ALT": allele,
                }
                variants.append(Variant(line, record.CHROM, record.POS, record.REF, allele, row))
    return columns, variants


def _read_tsv(path: Path) -> tuple[list[str], list[Variant]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as handle:
        rows = [
            (number, row)
            for number, row in enumerate(csv.reader(handle, delimiter="\t"), 1)
            if row and not row[0].startswith("#")
        ]
    if not rows:
        raise ValueError(
            f"{path} holds no variants; expected tab-separated lines of chrom, pos, ref, alt (1-based pos)."
        )
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


# ------------------------------------------------------------------------------- the windows
def variant_window(length: int, start: int, ref_length: int, alt_length: int, window: int) -> tuple[int, int]:
    """The reference stretch [s, e) scored around an allele at the 0-based `start` of a contig of
    `length` bases (see the module docstring)."""
    s = min(max(0, start - window // 2), max(0, length - window))
    return s, min(length, s + window - max(0, alt_length - ref_length))


def _bases(codes: np.ndarray) -> str:
    """Codes as letters (N for N, ? for a special token)."""
    return "".join("ACGTN"[c] if c <= 4 else "?" for c in codes)


def _is_dna(text: str) -> bool:
    return bool(text) and all(base in "ACGT" for base in text.upper())


def check_variants(variants: list[Variant], reference: Mapping[str, np.ndarray], *, window: int, causal: bool) -> None:
    """Set `note` on every variant that cannot be scored with this window and kind of model,
    naming why."""
    for v in variants:
        if v.note:
            continue
        if v.chrom not in reference:
            v.note = f"contig {v.chrom!r} is not in the reference"
            continue
        codes = reference[v.chrom]
        if not 1 <= v.pos <= len(codes):
            v.note = f"position {v.pos} is outside contig {v.chrom!r} (1..{len(codes)})"
        elif not (_is_dna(v.ref) and _is_dna(v.alt)):
            v.note = f"not a sequence variant of A/C/G/T bases ({v.ref}>{v.alt})"
        elif v.ref.upper() == v.alt.upper():
            v.note = "ref and alt are the same"
        elif v.pos - 1 + len(v.ref) > len(codes):
            v.note = f"ref {v.ref} runs past the end of contig {v.chrom!r} ({len(codes)} bases)"
        elif _bases(codes[v.pos - 1 : v.pos - 1 + len(v.ref)]) != v.ref.upper():
            v.note = f"ref {v.ref} does not match the reference {_bases(codes[v.pos - 1 : v.pos - 1 + len(v.ref)])} at {v.chrom}:{v.pos}"
        elif not causal and (len(v.ref) != 1 or len(v.alt) != 1):
            v.note = "masked models score single-nucleotide variants only (the masked marginal scores one base)"
        else:
            _, end = variant_window(len(codes), v.pos - 1, len(v.ref), len(v.alt), window)
            if v.pos - 1 + len(v.ref) > end:
                v.note = (
                    f"the {len(v.ref)}-base ref and {len(v.alt)}-base alt do not fit a window of {window} "
                    f"bases around the variant; pass a {option('window', metavar='LARGER')}"
                )


def allele_of(variant: Variant) -> Allele:
    """The allele of a variant that `check_variants` left without a note."""
    return Allele(variant.chrom, variant.pos - 1, variant.ref.upper(), variant.alt.upper())


# -------------------------------------------------------------------------------- the scoring
@dataclass(frozen=True)
class _Job:
    """One window to run: the reference stretch [start, end) of `chrom`, with `alt` in place of
    the `ref_length` bases from `pos` (None: the reference window), on the forward strand or
    reverse-complemented. Equal jobs run once."""

    chrom: str
    start: int
    end: int
    pos: int
    ref_length: int
    alt: Optional[str]
    reverse: bool

    @property
    def length(self) -> int:
        return self.end - self.start + (0 if self.alt is None else len(self.alt) - self.ref_length)

    @property
    def offset(self) -> int:
        """The window offset where the allele starts: the first scored base of a causal model,
        the masked position of a masked model."""
        return self.end - self.pos - self.ref_length if self.reverse else self.pos - self.start

    def tokens(self, codes_L: np.ndarray) -> np.ndarray:
        """The window's codes (W,)."""
        if self.alt is None:
            window_W = codes_L[self.start : self.end]
        else:
            window_W = np.concatenate(
                [codes_L[self.start : self.pos], encode(self.alt), codes_L[self.pos + self.ref_length : self.end]]
            )
        return reverse_complement(window_W) if self.reverse else window_W


def _strand_jobs(allele: Allele, length: int, window: int, both_strands: bool) -> list[tuple[_Job, _Job]]:
    """(reference job, alternative job) of each strand scored."""
    s, e = variant_window(length, allele.start, len(allele.ref), len(allele.alt), window)
    strands = (False, True) if both_strands else (False,)
    return [
        (
            _Job(allele.chrom, s, e, allele.start, len(allele.ref), None, reverse),
            _Job(allele.chrom, s, e, allele.start, len(allele.ref), allele.alt, reverse),
        )
        for reverse in strands
    ]


@torch.inference_mode()
def allele_effects(
    scorer: Scorer,
    reference: Mapping[str, np.ndarray],
    alleles: Sequence[Allele],
    *,
    window: int,
    both_strands: bool = False,
    batch_size: int = 8,
    progress: bool = True,
    description: str = "variant effects",
    mixing: Optional[MarkovMixture] = None,
) -> np.ndarray:
    """The llr (bits) of each allele, float64 (len(alleles),), as the module docstring defines it
    (of the mixture with `mixing`'s Markov model when given: causal models only).

    The alleles must be scorable (`check_variants` says why one is not). Equal windows run once:
    the alleles at one position share the reference window of a causal model and the one masked
    window of a masked model. Windows of one length share batches of `batch_size`.
    """
    if mixing is not None:
        require_causal(scorer.causal, "the model")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}; pass {option('batch_size', 8)}.")
    strands = [_strand_jobs(a, len(reference[a.chrom]), window, both_strands) for a in alleles]
    if scorer.causal:
        needed = [job for pairs in strands for pair in pairs for job in pair]
    else:
        needed = [ref_job for pairs in strands for ref_job, _ in pairs]
    jobs = sorted(dict.fromkeys(needed), key=lambda job: -job.length)  # stable: equal lengths keep their order
    results = _run_jobs(
        scorer, reference, jobs, batch_size=batch_size, progress=progress, description=description, mixing=mixing
    )
    llr = np.empty(len(alleles))
    for i, (allele, pairs) in enumerate(zip(alleles, strands)):
        values = []
        for ref_job, alt_job in pairs:
            if scorer.causal:
                values.append(results[alt_job] - results[ref_job])
            else:
                alt, ref = encode(allele.alt)[0], encode(allele.ref)[0]
                if ref_job.reverse:
                    alt, ref = COMPLEMENT[alt], COMPLEMENT[ref]
                values.append(results[ref_job][alt] - results[ref_job][ref])
        llr[i] = np.mean(values)
    return llr


def _run_jobs(
    scorer: Scorer,
    reference: Mapping[str, np.ndarray],
    jobs: list[_Job],
    *,
    batch_size: int,
    progress: bool,
    description: str,
    mixing: Optional[MarkovMixture] = None,
) -> dict[_Job, Union[float, np.ndarray]]:
    """Causal models: each job's summed log2 p (the mixture's with `mixing`) from its offset on
    (float); masked models: the log2 probabilities (V,) at its masked offset.

    Causal dense models without a mixture run the windows that share their bases before the
    allele (the reference window and the alternatives of one position and strand) as one prefill
    of that prefix and one continuation per window (`_run_continued`); the rest run whole."""
    results: dict[_Job, Union[float, np.ndarray]] = {}
    if scorer.causal and mixing is None and scorer.can_continue:
        jobs = _run_continued(
            scorer, reference, jobs, results, batch_size=batch_size, progress=progress, description=description
        )
    items = [(job, Tile(0, job.length, 0, job.length)) for job in jobs]
    with tqdm(total=len(items), unit="window", desc=description, disable=not progress, leave=False) as bar:
        for batch in same_length_batches(items, batch_size):
            tokens_BW = torch.from_numpy(np.stack([job.tokens(reference[job.chrom]) for job, _ in batch])).long()
            offset_B = torch.tensor([job.offset for job, _ in batch])
            if mixing is not None:
                values = _mixed_log2_likelihood_from(scorer, mixing, tokens_BW, offset_B)
            elif scorer.causal:
                values = _log2_likelihood_from(scorer, tokens_BW, offset_B).tolist()
            else:
                rows_B = torch.arange(len(batch))
                tokens_BW[rows_B, offset_B] = MASK
                values = list(scorer.log2_probabilities(tokens_BW)[rows_B, offset_B].double().numpy())
            results.update(zip((job for job, _ in batch), values))
            bar.update(len(batch))
    return results


def _prefix_key(job: _Job) -> tuple:
    """Jobs with one key share their tokens before `offset` (the window's bases before the allele:
    x[start:pos] forward, the reversed downstream flank on the reverse strand) and their offset."""
    return job.chrom, job.start, job.end, job.pos, job.ref_length, job.reverse


def _run_continued(
    scorer: Scorer,
    reference: Mapping[str, np.ndarray],
    jobs: list[_Job],
    results: dict[_Job, Union[float, np.ndarray]],
    *,
    batch_size: int,
    progress: bool,
    description: str,
) -> list[_Job]:
    """Score every group of jobs that share a prefix of at least one base and one window length
    by one prefill of the prefix and the continuation of each job's window from its offset
    (`Scorer.continued_log2_probabilities`), filling `results`; returns the jobs left to run whole.

    Groups of one kind (prefix length, window length, jobs per group) share batches of
    `batch_size` prefixes. The sums are those of whole windows up to float rounding: the same
    log2 p(base | the window's bases before it), from the same causal model."""
    groups: dict[tuple, list[_Job]] = {}
    for job in jobs:
        groups.setdefault(_prefix_key(job), []).append(job)
    left, kinds = [], {}
    for members in groups.values():
        offset, length = members[0].offset, members[0].length
        if offset < 1 or any(job.length != length for job in members):
            left += members
        else:
            kinds.setdefault((offset, length, len(members)), []).append(members)
    batches = [
        (kind, chunk[i : i + batch_size]) for kind, chunk in kinds.items() for i in range(0, len(chunk), batch_size)
    ]
    with tqdm(
        total=sum(len(g) * kind[2] for kind, g in batches),
        unit="window",
        desc=description,
        disable=not progress,
        leave=False,
    ) as bar:
        for (offset, _, per_group), batch in batches:
            tokens_GnW = torch.from_numpy(
                np.stack([[job.tokens(reference[job.chrom]) for job in members] for members in batch])
            ).long()
            tokens_BW = tokens_GnW.flatten(0, 1)  # group g's jobs on rows g * per_group ...
            log2p_BS = scorer.continued_log2_probabilities(tokens_GnW[:, 0, :offset], tokens_BW[:, offset:])
            # row b's log2 p of its bases offset .. W - 1, each from the bases before it
            target_BS1 = tokens_BW[:, offset:, None]
            log2p_BS = log2p_BS[:, :-1].gather(-1, target_BS1.clamp(max=T))[..., 0].double()
            sums_B = torch.where(target_BS1[..., 0] <= T, log2p_BS, 0.0).sum(-1)
            results.update(zip((job for members in batch for job in members), sums_B.tolist()))
            bar.update(len(tokens_BW))
    return left


def _log2p_of_bases(scorer: Scorer, tokens_BW: torch.Tensor) -> torch.Tensor:
    """log2 p(base | the window's bases before it) of every base of each window: float64 (B, W),
    NaN at the first base (no context) and where the base is not A/C/G/T."""
    targets_BW = tokens_BW[:, 1:]  # logits at offset i predict the base at offset i + 1
    log2p_BW = (
        scorer.log2_probabilities(tokens_BW)[:, :-1].gather(-1, targets_BW.clamp(max=T)[..., None])[..., 0].double()
    )
    first_B1 = torch.full((tokens_BW.shape[0], 1), torch.nan, dtype=torch.float64)
    return torch.cat([first_B1, torch.where(targets_BW <= T, log2p_BW, torch.nan)], dim=1)


def _log2_likelihood_from(scorer: Scorer, tokens_BW: torch.Tensor, offset_B: torch.Tensor) -> torch.Tensor:
    """Sum over each window of log2 p(base | preceding bases of the window) over the A/C/G/T bases
    at offsets >= offset_B (never the first base): float64 (B,)."""
    log2p_BW = _log2p_of_bases(scorer, tokens_BW)
    from_BW = torch.arange(tokens_BW.shape[1])[None, :] >= offset_B[:, None]
    return torch.where(from_BW, log2p_BW, torch.nan).nansum(-1)


def _mixed_log2_likelihood_from(
    scorer: Scorer, mixing: MarkovMixture, tokens_BW: torch.Tensor, offset_B: torch.Tensor
) -> list[float]:
    """`_log2_likelihood_from` of the mixture, each window one stream of it from its first base."""
    sums = []
    for codes_W, log2p_W, offset in zip(
        tokens_BW.numpy().astype(np.uint8), _log2p_of_bases(scorer, tokens_BW).numpy(), offset_B.tolist()
    ):
        sums.append(float(np.nansum(mixing.score(codes_W, log2p_W)[1][offset:])))
    return sums


def variant_effects(
    scorer: Scorer,
    reference: Mapping[str, np.ndarray],
    variants: list[Variant],
    *,
    window: int,
    both_strands: bool = False,
    batch_size: int = 8,
    progress: bool = True,
    mixing: Optional[MarkovMixture] = None,
) -> list[Variant]:
    """Fill `llr` of every scorable variant (see the module docstring); others keep their note."""
    scorer.check_context(window, 0, name="window", command="variant_effect")
    check_variants(variants, reference, window=window, causal=scorer.causal)
    todo = [v for v in variants if not v.note]
    llr = allele_effects(
        scorer,
        reference,
        [allele_of(v) for v in todo],
        window=window,
        both_strands=both_strands,
        batch_size=batch_size,
        progress=progress,
        mixing=mixing,
    )
    for v, value in zip(todo, llr.tolist()):
        v.llr = value
    return variants


# ---------------------------------------------------------------------------------- outputs
def write_effects(columns: list[str], variants: list[Variant], path: Path) -> Path:
    """TSV: the input's columns, then llr (bits; empty when not scored) and note."""
    lines = ["\t".join([*columns, "llr", "note"])]
    for v in variants:
        llr = "" if v.llr is None else f"{v.llr:.6g}"
        lines.append("\t".join([*(v.columns.get(c, "") for c in columns), llr, v.note]))
    return write_text(path, "\n".join(lines) + "\n", overwrite=True)


def write_vcf(source: Path, variants: list[Variant], path: Path, description: str) -> Path:
    """The records of the VCF `source` that hold `variants`, as they were, with the llr of each
    ALT in INFO `GF_LLR` (`.` where not scored; an INFO GF_LLR of the input is replaced), and the
    INFO header line saying what it holds (`description`)."""
    by_line: dict[int, list[Variant]] = {}
    for v in variants:
        by_line.setdefault(v.line, []).append(v)
    reader, header_lines = _vcf_records(source)
    with reader:
        kept = [
            line
            for line in reader.header.lines
            if not (line.key == "INFO" and getattr(line, "mapping", {}).get("ID") == INFO_KEY)
        ]
        header = vcfpy.Header(kept, reader.header.samples)
        header.add_info_line({"ID": INFO_KEY, "Number": "A", "Type": "Float", "Description": description})
        with atomic_build(Path(path), overwrite=True) as tmp:
            compressed = Path(path).name.lower().endswith((".gz", ".bgz"))  # BGZF: gzip that tabix indexes
            stream = bgzf.BgzfWriter(filename=str(tmp)) if compressed else open(tmp, "wt")
            with vcfpy.Writer.from_stream(stream, header, str(tmp), use_bgzf=False) as writer:
                for index, record in enumerate(reader):
                    alleles = by_line.get(header_lines + index + 1)
                    if alleles is None:
                        continue  # outside the regions
                    record.INFO.pop(INFO_KEY, None)
                    if record.ALT:
                        record.INFO[INFO_KEY] = [None if v.llr is None else float(f"{v.llr:.6g}") for v in alleles]
                    writer.write_record(record)
    return Path(path)


def in_regions(variants: list[Variant], regions: Union[str, list[str]], lengths: Mapping[str, int]) -> list[Variant]:
    """The variants whose position (their first ref base) lies in one of `regions` (see
    `genoformer.data.genome.regions.read_regions`), in input order."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for region in read_regions(regions, lengths):
        spans.setdefault(region.chrom, []).append((region.start, region.end))
    return [v for v in variants if any(start < v.pos <= end for start, end in spans.get(v.chrom, ()))]


def _listed(names: list[str], at_most: int = 8) -> str:
    """`names` for a message: the first `at_most`, then how many there are in all."""
    shown = ", ".join(names[:at_most])
    return shown if len(names) <= at_most else f"{shown}, ... ({len(names):,} in all)"


def _nothing_scored(
    variants: Path, out: Path, rows: list[Variant], genome: Mapping[str, np.ndarray], regions: bool
) -> str:
    """Why not one variant could be scored, and what the user can check."""
    if not rows:
        where = "in the regions" if regions else "in the file"
        return f"{variants}: no variants {where}, so nothing was scored and {out} was not written"
    reasons: dict[str, int] = {}
    for v in rows:
        reason = "on a contig not in the reference" if v.chrom not in genome else v.note.split(" (")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    counted = "; ".join(f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda item: -item[1]))
    return (
        f"scored 0 of {len(rows)} variants of {variants}, so {out} was not written: {counted}. The variants' "
        f"contigs are {_listed(sorted({v.chrom for v in rows}))}; the reference's are {_listed(list(genome))}. "
        "Is the reference the build the variants were called on (and are its contigs named the same way, "
        "'chr1' or '1')?"
    )


def variant_effect(
    *,
    checkpoint: Path,
    reference: list[str],
    variants: Path,
    out: Path,
    window: Optional[int] = None,
    both_strands: bool = False,
    regions: Optional[Union[str, list[str]]] = None,
    batch_size: int = 8,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    mix: Optional[Path] = None,
    mix_mode: Optional[MixModeName] = None,
    mix_weight: Optional[float] = None,
    mix_switch_rate: Optional[float] = None,
    overwrite: bool = False,
) -> Path:
    """Score variants (SNVs, MNVs, indels) by the log-likelihood ratio (bits) of alt against ref.

    Causal models compare the summed log-likelihood of a window with the alternative allele
    against the reference window, from the variant to the window's end (the downstream flank
    aligned); masked models take the masked marginal at the variant (SNVs only). Variants that
    cannot be scored (unknown contig, position outside it, ref not matching the reference, an
    allele that is not A/C/G/T bases) keep their row with the reason; when not one variant can be
    scored (a reference of another build), nothing is written and the command fails, naming the
    contigs of both. With `mix`, the llr is the
    mixture's of the network and a Markov model (causal models only; each window one stream of
    the mixture, scored by both models from the window's bases).

    Args:
        checkpoint: A DNA language model: a .ckpt file of `genoformer fit`, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last, genoformer-dna, an exported folder or a Hub id.
        reference: The reference genome: FASTA/GenBank files or a genome store (.zarr).
        variants: A VCF (.vcf, .vcf.gz) or a TSV of chrom, pos (1-based), ref, alt.
        out: The output: a TSV of the input's columns, then llr and note; or, for a VCF input, a
            VCF (.vcf, .vcf.gz) of the input's records with the llr of each ALT in INFO GF_LLR.
        window: Bases around each variant; default the model's trained context (on a CPU at most
            2,048, the default of every scoring command: `genoformer mutagenesis` scores an SNV
            as this does).
        both_strands: A flag: average the llr of the forward strand and of the reverse-complemented
            windows (twice the work).
        regions: Keep only the variants inside these: a BED file (0-based) or regions
            chrom:start-end (1-based, inclusive), several after one flag.
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
        overwrite: A flag: replace an existing `out`.
    """
    out, variants = Path(out), Path(variants)
    refuse_existing(out, overwrite)
    mixture = mixture_settings(mix, mix_mode, mix_weight, mix_switch_rate)
    if is_vcf(out) and not is_vcf(variants):
        table = out.with_name(out.name.split(".")[0] + ".tsv")
        raise ValueError(
            f"{out}: a VCF output copies the input's VCF records, but {variants} is a TSV; give the variants "
            f"as a VCF, or write a TSV: {option('out', table)}"
        )
    genome = {record.name: record.codes for record in read_sequences(reference, flag="--reference")}
    columns, rows = read_variants(variants)
    if regions is not None:
        total = len(rows)
        rows = in_regions(rows, regions, {name: len(codes) for name, codes in genome.items()})
        print(f"{len(rows)} of {total} variants lie in the regions")
    unknown = sorted({v.chrom for v in rows} - set(genome))
    if all(v.chrom in unknown for v in rows):  # nothing to score: say so before the model loads
        raise ValueError(_nothing_scored(variants, out, rows, genome, regions is not None))
    if unknown:
        print(
            f"{sum(v.chrom in unknown for v in rows)} of {len(rows)} variants lie on contigs that are not in the "
            f"reference: {_listed(unknown)}; the reference has {_listed(list(genome))}"
        )
    checkpoint = resolve_checkpoint(checkpoint)  # the file itself, for the report and titles
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    chosen = scoring_window(scorer.context, scorer.device, window)
    window = chosen.length
    scorer.check_context(window, 0, name="window", command="variant_effect")
    if chosen.note:
        print(chosen.note)
    mixing = None
    if mixture is not None:
        require_causal(scorer.causal, checkpoint)
        mixing = load_mixture(mix, mixture)
    variant_effects(
        scorer, genome, rows, window=window, both_strands=both_strands, batch_size=batch_size, mixing=mixing
    )
    failed = [v for v in rows if v.llr is None]
    for v in failed[:20]:
        print(f"{variants}:{v.line}: not scored: {v.note}")
    if len(failed) > 20:
        print(f"... and {len(failed) - 20} more not scored (see the note column)")
    if len(failed) == len(rows):
        raise ValueError(_nothing_scored(variants, out, rows, genome, regions is not None))
    if is_vcf(out):
        strands = ", mean of both strands" if both_strands else ""
        mixed = "" if mixing is None else f", mixed with {mixing.path.name} ({mixing.mixture.label()})"
        description = (
            f"genoformer variant_effect: log2 likelihood ratio of ALT against REF (bits), "
            f"{Path(checkpoint).name}{mixed}, window {window}{strands}"
        )
        path = write_vcf(variants, rows, out, description)
    else:
        path = write_effects(columns, rows, out)
    mixed = "" if mixing is None else f" with the mixture: {mixing.label()}"
    print(f"scored {len(rows) - len(failed)} of {len(rows)} variants{mixed}; wrote {path}")
    return path
