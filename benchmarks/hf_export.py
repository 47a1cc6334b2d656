"""Hugging Face export of the shipped models, measured against issue 27's targets on a CPU:

- export time and size of examples/genoformer_dna.ckpt (target: under 10 s, at most the
  bf16 weights plus a few hundred kB);
- `genoformer score` from the .ckpt and from its export (bigWig, float32 per base) on the lambda
  genome: the largest per-base difference in bits (target: 1e-4);
- transformers' AutoModelForCausalLM logits (float32) on the genome's first window against the
  score track at the same bases (target: 2e-3 bits);
- the shipped gene annotator: its export's AutoModelForTokenClassification `predict` against
  `GeneAnnotator` probabilities on a slice of the lambda genome.

    python -m benchmarks.hf_export                  # writes benchmarks/results/hf_export.{json,md}
                                                    # and the "hf_export" section of BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import command_line, describe_environment, environment_markdown, publish
from genoformer.cli import main
from genoformer.core.hf import export_hf
from genoformer.data.genome.inputs import read_sequences
from genoformer.genome.scoring import LOG2E

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "examples" / "genoformer_dna.ckpt"
ANNOTATOR = ROOT / "examples" / "genoformer_gene_annotator.ckpt"
GENOME = ROOT / "examples" / "lambda_phage.fasta.gz"
LOAD = dict(trust_remote_code=True, local_files_only=True)


def read_bigwig(path: Path, chrom: str, length: int) -> np.ndarray:
    import pyBigWig

    with pyBigWig.open(str(path)) as track:
        return np.asarray(track.values(chrom, 0, length, numpy=True), dtype=np.float64)


def measure(work: Path, annotate_bases: int) -> dict:
    record = next(iter(read_sequences([str(GENOME)])))
    result: dict = {"genome": GENOME.name, "record": record.name, "bases": int(record.codes.size)}

    start = time.perf_counter()
    directory = export_hf(SHIPPED, work / "dna")
    result["export_seconds"] = time.perf_counter() - start
    from safetensors.torch import load_file

    tensors = load_file(directory / "model.safetensors")
    result["bf16_weight_bytes"] = sum(t.numel() * 2 for t in tensors.values())
    result["directory_bytes"] = sum(path.stat().st_size for path in directory.iterdir())

    window = 8192  # the transformers forward below reads the first `window` bases at once; score's first window is the same
    tracks = {}
    for name, source in (("ckpt", SHIPPED), ("hf", directory)):
        out = work / f"{name}.bw"
        start = time.perf_counter()
        main(["score", "--checkpoint", str(source), "--inputs", str(GENOME), "--out", str(out), "--device", "cpu",
              "--context", str(window)])
        result[f"score_seconds_{name}"] = time.perf_counter() - start
        tracks[name] = read_bigwig(out, record.name, record.codes.size)
    both = np.isfinite(tracks["ckpt"]) & np.isfinite(tracks["hf"])
    result["score_positions_compared"] = int(both.sum())
    result["score_max_abs_diff_bits"] = float(np.abs(tracks["ckpt"][both] - tracks["hf"][both]).max())

    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()
    ids_1L = torch.from_numpy(record.codes[:window].astype(np.int64))[None]
    with torch.no_grad():
        log2p_LV = torch.log_softmax(lm(input_ids=ids_1L).logits[0].double(), -1) * LOG2E
    hf_L = log2p_LV[:-1].gather(-1, ids_1L[0, 1:, None])[:, 0].numpy()
    track_L = tracks["ckpt"][1:window]
    known = np.isfinite(track_L)
    result["transformers_positions_compared"] = int(known.sum())
    result["transformers_max_abs_diff_bits"] = float(np.abs(hf_L[known] - track_L[known]).max())

    from transformers import AutoModelForTokenClassification

    from genoformer.genome.predict import GeneAnnotator

    annotator_dir = export_hf(ANNOTATOR, work / "annotator")
    codes = record.codes[:annotate_bases]
    ours = GeneAnnotator.from_checkpoint(ANNOTATOR, device="cpu").probabilities(codes)
    hf = AutoModelForTokenClassification.from_pretrained(annotator_dir, dtype=torch.float32, **LOAD).eval()
    with torch.no_grad():
        theirs = hf.predict(torch.from_numpy(codes.astype(np.int64))[None])[0].numpy()
    result["annotator_bases"] = int(codes.size)
    result["annotator_max_abs_diff_probability"] = float(np.abs(theirs - ours).max())
    return result


def report(result: dict, env: dict, command: str) -> str:
    mib = 2**20
    rows = [
        ("export of genoformer_dna.ckpt", f"{result['export_seconds']:.2f} s", "under 10 s"),
        ("export directory", f"{result['directory_bytes'] / mib:.2f} MiB ({(result['directory_bytes'] - result['bf16_weight_bytes']) / 1e3:,.0f} kB over the bf16 weights)",
         "bf16 weights + a few hundred kB"),
        ("`genoformer score`, .ckpt vs export (bigWig)", f"{result['score_max_abs_diff_bits']:.2e} bits max over {result['score_positions_compared']:,} bases", "1e-4 bits"),
        ("transformers logits vs `score` (float32, first 8,192 bases)", f"{result['transformers_max_abs_diff_bits']:.2e} bits max over {result['transformers_positions_compared']:,} bases", "2e-3 bits"),
        ("gene annotator: transformers `predict` vs GeneAnnotator", f"{result['annotator_max_abs_diff_probability']:.2e} max probability difference over {result['annotator_bases']:,} bases", "(same outputs)"),
    ]
    lines = [environment_markdown(env, command), "",
             f"On {result['genome']} ({result['bases']:,} bases); scoring took {result['score_seconds_ckpt']:.1f} s from the .ckpt "
             f"and {result['score_seconds_hf']:.1f} s from the export.", "",
             "| what | measured | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--annotate_bases", type=int, default=4000)
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HF_MODULES_CACHE", str(Path(tmp) / "modules"))
        result = measure(Path(tmp), args.annotate_bases)
    env = describe_environment("cpu")
    command = command_line()
    publish(args.out, "hf_export", {"environment": env, "command": command, **result}, report(result, env, command),
            markdown=args.markdown)


if __name__ == "__main__":
    main_cli()
