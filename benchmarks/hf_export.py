"""Hugging Face export of the shipped models on a CPU: time, size, and what genoformer and
transformers compute from the export against the .ckpt.

- export time and size of examples/genoformer_dna.ckpt (target: under 10 s, at most the bf16
  weights plus a few hundred kB);
- `genoformer score` from the .ckpt and from its export (bigWig, float32 per base) on the lambda
  genome: the largest per-base difference in bits (target: 1e-4);
- transformers' AutoModelForCausalLM logits (float32) on the genome's first window against the
  score track at the same bases (target: 2e-3 bits);
- the shipped gene annotator: its export's AutoModelForTokenClassification `predict` against
  `GeneAnnotator` probabilities on the genome's first bases (the same outputs).

    python -m benchmarks.hf_export --out benchmarks/results      # about 2 minutes on 2 cores
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from genoformer.data.genome.alphabet import decode
from genoformer.data.genome.inputs import read_sequences

from benchmarks.common import REPO_ROOT, Benchmark, Summary, argv, at_most, table
from genoformer.cli import main as genoformer
from genoformer.core.hf import export_hf
from genoformer.genome.scoring import LOG2E

SHIPPED = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
ANNOTATOR = REPO_ROOT / "examples" / "genoformer_gene_annotator.ckpt"
GENOME = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
LOAD = dict(trust_remote_code=True, local_files_only=True)


def read_bigwig(path: Path, chrom: str, length: int) -> np.ndarray:
    import pyBigWig

    with pyBigWig.open(str(path)) as track:
        return np.asarray(track.values(chrom, 0, length, numpy=True), dtype=np.float64)


def measure(args) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from genoformer.genome.predict import GeneAnnotator

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        record = next(iter(read_sequences([str(GENOME)])))
        genome, window = GENOME, 8192  # transformers reads the first window at once: score's first window
        if args.smoke:
            window, genome = 256, work / "lambda_600.fa"
            genome.write_text(f">{record.name}\n{decode(record.codes[:600])}\n")
            record = next(iter(read_sequences([str(genome)])))
        data = {"genome": GENOME.name, "bases": int(record.codes.size)}
        start = time.perf_counter()
        directory = export_hf(SHIPPED, work / "dna")
        data["export_seconds"] = time.perf_counter() - start
        data["bf16_weight_bytes"] = sum(t.numel() * 2 for t in load_file(directory / "model.safetensors").values())
        data["directory_bytes"] = sum(path.stat().st_size for path in directory.iterdir())
        tracks = {}
        for name, source in (("ckpt", SHIPPED), ("hf", directory)):
            start = time.perf_counter()
            genoformer(
                argv(
                    "score --checkpoint {source} --inputs {genome} --out {out} --device cpu --context {window}",
                    source=source,
                    genome=genome,
                    out=work / f"{name}.bw",
                    window=window,
                )
            )
            data[f"score_seconds_{name}"] = time.perf_counter() - start
            tracks[name] = read_bigwig(work / f"{name}.bw", record.name, record.codes.size)
        both = np.isfinite(tracks["ckpt"]) & np.isfinite(tracks["hf"])
        data["score_positions_compared"] = int(both.sum())
        data["score_max_abs_diff_bits"] = float(np.abs(tracks["ckpt"][both] - tracks["hf"][both]).max())

        lm = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()
        ids_1L = torch.from_numpy(record.codes[:window].astype(np.int64))[None]
        with torch.no_grad():
            log2p_LV = torch.log_softmax(lm(input_ids=ids_1L).logits[0].double(), -1) * LOG2E
        hf_L = log2p_LV[:-1].gather(-1, ids_1L[0, 1:, None])[:, 0].numpy()
        track_L = tracks["ckpt"][1:window]
        known = np.isfinite(track_L)
        data["transformers_positions_compared"] = int(known.sum())
        data["transformers_max_abs_diff_bits"] = float(np.abs(hf_L[known] - track_L[known]).max())

        codes = record.codes[: 200 if args.smoke else 4000]
        ours = GeneAnnotator.from_checkpoint(ANNOTATOR, device="cpu").probabilities(codes)
        hf = AutoModelForTokenClassification.from_pretrained(
            export_hf(ANNOTATOR, work / "annotator"), dtype=torch.float32, **LOAD
        ).eval()
        with torch.no_grad():
            theirs = hf.predict(torch.from_numpy(codes.astype(np.int64))[None])[0].numpy()
        data["annotator_bases"] = int(codes.size)
        data["annotator_max_abs_diff_probability"] = float(np.abs(theirs - ours).max())
    return data


def summarize(data: dict) -> Summary:
    extra_kb = (data["directory_bytes"] - data["bf16_weight_bytes"]) / 1e3
    return Summary(
        tables=[
            table(
                [
                    {
                        "what": "scoring seconds",
                        "from the .ckpt": data["score_seconds_ckpt"],
                        "from the export": data["score_seconds_hf"],
                    }
                ],
                f"`genoformer score` of {data['genome']} ({data['bases']:,} bases)",
            )
        ],
        targets=[
            at_most("export of genoformer_dna.ckpt under 10 s", data["export_seconds"], 10.0, " s"),
            at_most(
                "export directory at most 500 kB over the bf16 weights",
                extra_kb,
                500.0,
                measured=f"{data['directory_bytes'] / 2**20:.2f} MiB, {extra_kb:,.0f} kB over the weights",
            ),
            at_most(
                "`score` from the export: within 1e-4 bits of the .ckpt",
                data["score_max_abs_diff_bits"],
                1e-4,
                measured=f"{data['score_max_abs_diff_bits']:.2e} bits over {data['score_positions_compared']:,} bases",
            ),
            at_most(
                "transformers logits within 2e-3 bits of `score` (float32)",
                data["transformers_max_abs_diff_bits"],
                2e-3,
                measured=f"{data['transformers_max_abs_diff_bits']:.2e} bits over "
                f"{data['transformers_positions_compared']:,} bases",
            ),
            at_most(
                "gene annotator: transformers `predict` gives GeneAnnotator's probabilities",
                data["annotator_max_abs_diff_probability"],
                1e-6,
                measured=f"{data['annotator_max_abs_diff_probability']:.2e} over {data['annotator_bases']:,} bases",
            ),
        ],
    )


BENCHMARK = Benchmark(
    "hf_export",
    "Sharing: Hugging Face export (CPU)",
    __doc__,
    measure,
    summarize,
    baseline="the .ckpt scored by the same `genoformer score`",
)

if __name__ == "__main__":
    BENCHMARK.main()
