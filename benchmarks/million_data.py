"""The sequences the context step of benchmarks/million.py trains on and scores, as one file that a GPU
call carries (../shared-extra is not on the GPU machine):

    python -m benchmarks.million_data --out .device/million     (then carry .device with the GPU call)

Training: the first 95% of every record of the four bacteria in examples/ and, when --extra holds
them (../shared/data/fetch-more.sh fetches them), of the flagship's four eukaryotes: what the
shipped flagship trained on (its split held out the last 2% + 3% of every record). Held out: each
bacterium's last 5% (never trained on), with the whole record before it as context, and
--celegans_bases of C. elegans chromosome X from --celegans_offset (a chromosome the flagship never
saw). Written as OUT/context_data.npz (uint8 codes, compressed: about 35 MB with the eukaryotes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.million import BACTERIA, EXAMPLES, HELD_OUT_FRACTION
from genoformer.data.genome.inputs import read_sequences

REPO_ROOT = Path(__file__).resolve().parents[1]
EUKARYOTES = ("dictyostelium_ax4.fasta.gz", "plasmodium_falciparum.fasta.gz", "ustilago_maydis.fasta.gz",
              "drosophila_dm3_chr2R.fasta.gz")


def prepare(args: argparse.Namespace) -> Path:
    """Write OUT/context_data.npz (see the module docstring); returns its path."""
    extra = Path(args.extra)
    train, heldout = {}, {}
    for path in [EXAMPLES / name for name in BACTERIA] + [extra / name for name in EUKARYOTES if (extra / name).is_file()]:
        for record in read_sequences([str(path)]):
            cut = round(record.codes.size * (1 - HELD_OUT_FRACTION))
            kind = "bacterial" if path.name in BACTERIA else "eukaryotic"
            train[f"{kind}/{record.name}"] = record.codes[:cut]
            if path.name in BACTERIA:  # the whole record: the bases before `cut` are the context of the held-out tail
                heldout[f"bacterial/{record.name}@{cut}"] = record.codes
    celegans = extra / "celegans_ce2_chrX.fasta.gz"
    if celegans.is_file():
        codes = next(iter(read_sequences([str(celegans)]))).codes
        heldout[f"eukaryotic/celegans_chrX@{args.celegans_offset}"] = codes[:args.celegans_offset + args.celegans_bases]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "context_data.npz"
    np.savez_compressed(path, **{f"train/{k}": v for k, v in train.items()}, **{f"heldout/{k}": v for k, v in heldout.items()})
    print(f"wrote {path}: {len(train)} training records ({sum(map(len, train.values())):,} bases), {len(heldout)} held-out "
          "sequences" + ("" if celegans.is_file() else f" (no {celegans}: bacteria only)"))
    return path


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.million_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of context_data.npz (e.g. .device/million)")
    parser.add_argument("--extra", type=Path, default=REPO_ROOT.parent / "shared-extra" / "genomes",
                        help="folder of the fetched genomes (default ../shared-extra/genomes)")
    parser.add_argument("--celegans_offset", type=int, default=8_000_000, help="first held-out base of C. elegans X")
    parser.add_argument("--celegans_bases", type=int, default=2_000_000, help="held-out bases of C. elegans X")
    return prepare(parser.parse_args(argv))


if __name__ == "__main__":
    main()
