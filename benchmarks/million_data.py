"""The sequences the context step of benchmarks/million.py trains on and scores, as one file (the GPU
machine has examples/ but not ../shared-extra):

    python -m benchmarks.million_data --out /tmp/million/bacteria --extra none          (on the GPU: bacteria)
    python -m benchmarks.million_data --out .device/million --no_bacteria --eukaryote_bases 1000000
                                      (on the CPU machine: the eukaryotes, about 1.5 MB; carry .device)

Training: the first 95% of every record of the four bacteria in examples/ and, when --extra holds
them (../shared/data/fetch-more.sh fetches them), of the flagship's four eukaryotes (at most
--eukaryote_bases of each file): what the shipped flagship trained on (its split held out the last
2% + 3% of every record). Held out: each bacterium's last 5% (never trained on) and --celegans_bases
of C. elegans chromosome X from --celegans_offset (a chromosome the flagship never saw), each with
--context_before bases before it as context. Written as OUT/context_data.npz (uint8 codes,
compressed); the context step reads every file it is given.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from genoformer.data.genome.inputs import read_sequences

from benchmarks.million import BACTERIA, EXAMPLES, HELD_OUT_FRACTION

REPO_ROOT = Path(__file__).resolve().parents[1]
EUKARYOTES = (
    "dictyostelium_ax4.fasta.gz",
    "plasmodium_falciparum.fasta.gz",
    "ustilago_maydis.fasta.gz",
    "drosophila_dm3_chr2R.fasta.gz",
)


def prepare(args: argparse.Namespace) -> Path:
    """Write OUT/context_data.npz (see the module docstring); returns its path."""
    extra = Path(args.extra)
    train, heldout = {}, {}
    bacteria = [] if args.no_bacteria else [EXAMPLES / name for name in BACTERIA]
    for path in bacteria + [extra / name for name in EUKARYOTES if (extra / name).is_file()]:
        kept = 0  # eukaryotic training bases of this file so far
        for record in read_sequences([str(path)]):
            cut = round(record.codes.size * (1 - HELD_OUT_FRACTION))
            if path.name in BACTERIA:
                train[f"bacterial/{record.name}"] = record.codes[:cut]
                first = max(0, cut - args.context_before)  # the held-out tail with its context before it
                heldout[f"bacterial/{record.name}@{cut - first}"] = record.codes[first:]
            elif kept < args.eukaryote_bases:
                train[f"eukaryotic/{record.name}"] = record.codes[: min(cut, args.eukaryote_bases - kept)]
                kept += train[f"eukaryotic/{record.name}"].size
    celegans = extra / "celegans_ce2_chrX.fasta.gz"
    if celegans.is_file():
        codes = next(iter(read_sequences([str(celegans)]))).codes
        first = max(0, args.celegans_offset - args.context_before)
        heldout[f"eukaryotic/celegans_chrX@{args.celegans_offset - first}"] = codes[
            first : args.celegans_offset + args.celegans_bases
        ]
    if not heldout:
        raise SystemExit(
            f"million_data: nothing held out to score: no bacteria (--no_bacteria) and no {celegans}; "
            "drop --no_bacteria, or point --extra at the fetched genomes"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "context_data.npz"
    np.savez_compressed(
        path, **{f"train/{k}": v for k, v in train.items()}, **{f"heldout/{k}": v for k, v in heldout.items()}
    )
    print(
        f"wrote {path}: {len(train)} training records ({sum(map(len, train.values())):,} bases), {len(heldout)} held-out "
        "sequences" + ("" if celegans.is_file() else f" (no {celegans}: no eukaryotic held-out DNA)")
    )
    return path


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.million_data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="folder of context_data.npz (e.g. .device/million)")
    parser.add_argument(
        "--extra",
        type=Path,
        default=REPO_ROOT.parent / "shared-extra" / "genomes",
        help="folder of the fetched genomes (default ../shared-extra/genomes; 'none': bacteria only)",
    )
    parser.add_argument("--celegans_offset", type=int, default=8_000_000, help="first held-out base of C. elegans X")
    parser.add_argument("--celegans_bases", type=int, default=500_000, help="held-out bases of C. elegans X")
    parser.add_argument(
        "--context_before",
        type=int,
        default=1_100_000,
        help="bases kept before each held-out part (its context at 1M tokens)",
    )
    parser.add_argument(
        "--eukaryote_bases",
        type=int,
        default=10**12,
        help="at most this many training bases of each eukaryotic file (default: all)",
    )
    parser.add_argument(
        "--no_bacteria",
        action="store_true",
        help="leave out the bacteria (examples/: the GPU machine writes them itself)",
    )
    return prepare(parser.parse_args(argv))


if __name__ == "__main__":
    main()
