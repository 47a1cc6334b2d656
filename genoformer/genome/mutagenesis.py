"""`genoformer mutagenesis`: in-silico saturation mutagenesis of genome regions.

    genoformer mutagenesis --checkpoint examples/genoformer_dna.ckpt \\
        --inputs examples/lambda_phage.fasta.gz --regions "gi|9626243|ref|NC_001416.1|:1001-1200" --out mut.tsv

Every position of each region, times the three other bases, is scored as `genoformer
variant_effect` scores that single-nucleotide variant (`genoformer.genome.variants`: the same
windows and the same llr in bits, through the same code; causal models: the windowed
log-likelihood ratio from the variant to the window's end, masked models: the masked marginal).
Positions whose reference base is not A/C/G/T (N) are skipped.

Outputs:
- `out` (TSV): `chrom pos ref alt llr`, 1-based positions in genome coordinates and the genome's
  record names; three rows per position (alt in A, C, G, T order), regions in the order given.
- `out` with the suffix .png: for each region a heatmap of the 4 x positions llr matrix (rows
  A C G T; the reference base grey) above the mean llr of the three alternatives per position, as
  bars coloured by the reference base (a logo-like row: the tall bars mark the positions the
  model cares about). At most `MAX_PLOTTED_REGIONS` regions are drawn; the TSV holds them all.

Cost. A causal model's four windows of a position (the reference and the three alternatives)
share their bases before the variant: that prefix (about window // 2 bases) runs once, into a
key/value cache, and each window continues it from the variant on (`genoformer.genome.variants`),
about 2.5 windows' work per position instead of 4, with the llr of whole windows up to float
rounding. Masked models run one masked window per position, of `window` tokens (twice each with
`both_strands`).

The default window is that of every scoring command (`genoformer.genome.scoring.scoring_window`),
so that an SNV gets the llr `genoformer variant_effect` gives it: the trained context, at most
2,048 on a CPU. The window trades accuracy for time, as measured with a 256 x 8 causal model of an
8k context (`benchmarks/mutagenesis_bench.py`, 600 SNVs of lambda, against float32 at its full
8192 window): Pearson r 0.995 and a mean |difference| of 0.16 bits at 2048, against 0.98 and 0.34
at 1024 (half the work) and 0.95 and 0.51 at 512. On a GPU, where the default is the trained
context, `--window 2048` makes a long region many times cheaper for that accuracy. On a GPU the
model runs under bfloat16 autocast (the inference policy), whose rounding alone moves the llr by
0.09 bits on average at window 1024 and 0.23 at 8192: the llr sums log-probabilities over the
window after the variant.

Shape legend: P positions of a region, A the four bases A C G T.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional, Union

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from genoformer.core.checkpoints import resolve_checkpoint
from genoformer.data.genome.alphabet import T
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.regions import Region, record_regions
from genoformer.data.storage import atomic_build, refuse_existing, write_text
from genoformer.genome.scoring import Scorer, scoring_window
from genoformer.genome.variants import Allele, allele_effects
from genoformer.kernels.dispatch import Backend

BASES = "ACGT"
GPU_BATCH_SIZE = 64
"""Default windows per forward pass on a GPU (8 elsewhere): a 1 kb region at window 1024 takes
1.1 s in batches of 64 on an H200, 5.3 s in batches of 8."""
MAX_PLOTTED_REGIONS = 8
BASE_COLOURS = {"A": "#109648", "C": "#255C99", "G": "#F7B32B", "T": "#D62839"}


def region_alleles(region: Region, codes_L: np.ndarray) -> list[Allele]:
    """The three alternative alleles of every A/C/G/T position of `region`, position by position,
    alternatives in A C G T order."""
    alleles = []
    for position in range(region.start, region.end):
        if codes_L[position] > T:
            continue
        ref = BASES[codes_L[position]]
        alleles += [Allele(region.chrom, position, ref, alt) for alt in BASES if alt != ref]
    return alleles


def saturation_mutagenesis(
    scorer: Scorer,
    reference: Mapping[str, np.ndarray],
    regions: Sequence[Region],
    *,
    window: int,
    both_strands: bool = False,
    batch_size: int = 8,
    progress: bool = True,
) -> list[np.ndarray]:
    """The llr (bits) of every base at every position of each region: float64 (P, A) per region,
    NaN at the reference base and at positions that are not A/C/G/T. All regions share one run,
    so windows they have in common run once."""
    scorer.check_context(window, 0, name="window", command="mutagenesis")
    per_region = [region_alleles(region, reference[region.chrom]) for region in regions]
    llr = allele_effects(
        scorer,
        reference,
        [a for alleles in per_region for a in alleles],
        window=window,
        both_strands=both_strands,
        batch_size=batch_size,
        progress=progress,
        description="mutagenesis",
    )
    matrices, done = [], 0
    for region, alleles in zip(regions, per_region):
        llr_PA = np.full((region.length, len(BASES)), np.nan)
        for allele, value in zip(alleles, llr[done : done + len(alleles)]):
            llr_PA[allele.start - region.start, BASES.index(allele.alt)] = value
        matrices.append(llr_PA)
        done += len(alleles)
    return matrices


def mutagenesis_rows(region: Region, codes_L: np.ndarray, llr_PA: np.ndarray) -> list[str]:
    """TSV rows `chrom pos ref alt llr` (1-based) of one region's matrix."""
    rows = []
    for offset, llr_A in enumerate(llr_PA):
        position = region.start + offset
        if codes_L[position] > T:
            continue
        ref = BASES[codes_L[position]]
        rows += [
            f"{region.chrom}\t{position + 1}\t{ref}\t{alt}\t{llr_A[a]:.6g}" for a, alt in enumerate(BASES) if alt != ref
        ]
    return rows


def plot_mutagenesis(
    regions: Sequence[Region],
    reference: Mapping[str, np.ndarray],
    matrices: Sequence[np.ndarray],
    path: Path,
    *,
    title: str,
) -> Path:
    """Draw each region's heatmap and mean-effect row into a PNG (see the module docstring)."""
    shown = list(zip(regions, matrices))[:MAX_PLOTTED_REGIONS]
    longest = max(region.length for region, _ in shown)
    figure = Figure(figsize=(min(24.0, max(8.0, longest / 40)), 3.6 * len(shown) + 0.4), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2 * len(shown), 1, squeeze=False, gridspec_kw={"height_ratios": [2.2, 1.0] * len(shown)})[
        :, 0
    ]
    for (region, llr_PA), heat, bars in zip(shown, axes[0::2], axes[1::2]):
        positions_P = np.arange(region.start + 1, region.end + 1)
        limit = float(np.nanmax(np.abs(llr_PA))) if np.isfinite(llr_PA).any() else 1.0
        colours = heat.imshow(
            llr_PA.T,
            aspect="auto",
            cmap=_colour_map(),
            vmin=-limit,
            vmax=limit,
            interpolation="nearest",
            extent=(region.start + 0.5, region.end + 0.5, len(BASES) - 0.5, -0.5),
        )
        heat.set_yticks(range(len(BASES)), list(BASES))
        heat.set_title(
            f"{region.name}" if region.name == region.label else f"{region.name} ({region.label})", fontsize=10
        )
        figure.colorbar(colours, ax=heat, label="llr (bits)", pad=0.01)
        codes_P = reference[region.chrom][region.start : region.end]
        scored_P1 = np.isfinite(llr_PA).any(1, keepdims=True)  # an N position: no llr, a bar of 0
        mean_P = np.nanmean(np.where(scored_P1, llr_PA, 0.0), axis=1)
        bar_colours = [BASE_COLOURS[BASES[c]] if c <= T else "0.6" for c in codes_P]
        bars.bar(positions_P, mean_P, width=1.0, color=bar_colours, linewidth=0)
        bars.axhline(0, color="0.3", lw=0.5)
        bars.set_xlim(region.start + 0.5, region.end + 0.5)
        bars.set_ylabel("mean llr")
        bars.set_xlabel(f"{region.chrom} position (1-based)")
        if region.length <= 120:  # room to write the reference base in its cell
            for position, code in zip(positions_P, codes_P):
                if code <= T:
                    heat.text(position, code, BASES[code], ha="center", va="center", fontsize=7, color="white")
    handles = [Patch(color=colour, label=base) for base, colour in BASE_COLOURS.items()]
    axes[1].legend(
        handles=handles, title="ref", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0)
    )
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=120)
    return Path(path)


def _colour_map():
    """Diverging: red where the alternative is less likely, blue where more, grey for the reference."""
    return colormaps["RdBu"].with_extremes(bad="0.45")


def mutagenesis(
    *,
    checkpoint: Path,
    inputs: list[str],
    regions: Union[str, list[str]],
    out: Path,
    window: Optional[int] = None,
    both_strands: bool = False,
    batch_size: Optional[int] = None,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """In-silico saturation mutagenesis: the llr (bits) of every base at every position of regions.

    Each position times the three other bases is scored as `genoformer variant_effect` scores
    that SNV with the same window. Writes a TSV (chrom pos ref alt llr, 1-based genome
    coordinates) and, beside it, a PNG of the same name: a heatmap per region and the mean effect
    per position.

    Args:
        checkpoint: A DNA language model: a .ckpt file of `genoformer fit`, a run directory (its best
            checkpoint), RUN_DIR/best or RUN_DIR/last, genoformer-dna, an exported folder or a Hub id.
        inputs: The genome: FASTA/GenBank files or a genome store (.zarr).
        regions: The regions to mutate: a BED file (0-based) or regions chrom:start-end (1-based,
            inclusive), several after one flag.
        out: The output TSV; the PNG is written beside it with the suffix .png.
        window: Bases around each variant; default the trained context, at most 2,048 on a CPU (as
            for `genoformer variant_effect`).
        both_strands: A flag: average the llr of the forward strand and of the reverse-complemented
            windows (twice the work).
        batch_size: Windows per forward pass; default 64 on a GPU, 8 on the CPU.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device; fp8 runs it in FP8 on
            Hopper (faster, at the error docs/inference.md measures).
        overwrite: A flag: replace an existing `out` and its PNG.
    """
    out = Path(out)
    png = out.with_suffix(".png")
    refuse_existing(out, overwrite)
    refuse_existing(png, overwrite)
    records = list(read_sequences(inputs))
    chosen = [region for _, region in record_regions(records, regions)]
    checkpoint = resolve_checkpoint(checkpoint)  # the file itself, for the report and titles
    scorer = Scorer.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    chosen_window = scoring_window(scorer.context, scorer.device, window)
    window = chosen_window.length
    if chosen_window.note:
        print(chosen_window.note)
    if batch_size is None:
        batch_size = GPU_BATCH_SIZE if scorer.device.type == "cuda" else 8
    reference = {record.name: record.codes for record in records}
    matrices = saturation_mutagenesis(
        scorer, reference, chosen, window=window, both_strands=both_strands, batch_size=batch_size
    )
    rows = ["chrom\tpos\tref\talt\tllr"]
    for region, llr_PA in zip(chosen, matrices):
        rows += mutagenesis_rows(region, reference[region.chrom], llr_PA)
    write_text(out, "\n".join(rows) + "\n", overwrite=True)
    strands = ", mean of both strands" if both_strands else ""
    with atomic_build(png, overwrite=True) as tmp:
        plot_mutagenesis(chosen, reference, matrices, tmp, title=f"{Path(checkpoint).name}, window {window}{strands}")
    if len(chosen) > MAX_PLOTTED_REGIONS:
        print(f"{png} draws the first {MAX_PLOTTED_REGIONS} of the {len(chosen)} regions; {out} holds all")
    print(
        f"scored {len(rows) - 1:,} variants at {sum(r.length for r in chosen):,} positions of {len(chosen)} "
        f"region(s); wrote {out} and {png}"
    )
    return out
