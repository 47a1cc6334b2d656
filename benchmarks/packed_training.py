"""Packed training on a GPU: short records packed end to end (GenomeDataModule's `pack`) train at
the speed of unpacked rows of the same tokens, and every document gets the logits it gets alone.

    python -m benchmarks.packed_training --out DIR            (on a CUDA GPU, 2 to 4 minutes)
    python -m benchmarks.packed_training --out DIR --smoke    (a CPU smoke run, seconds)

The model is the one of configs/genome_8k_gpu.yaml (causal LM, 8,192 tokens), built as
`genoformer fit` builds it. The records are the lambda phage genome cut into pieces of
log-uniform lengths from 100 to 8,192 bases; `PackedRandomWindowDataset` (the data module's
training path) fills B windows with them and `collate_packed` makes the batch and its cu_seqlens.
Measured under bf16 autocast with AdamW, from identical weights:

- `packed`: a training step on the packed batch (cu_seqlens, backend auto);
- `unpacked`: the same tokens without cu_seqlens, i.e. B unpacked rows of the same total length
  (the baseline of the target: packed at least 0.9x its speed);
- `packed, compiled`: the packed step with `compile_blocks`; graph breaks are counted (0 wanted).

Equality: for every document, the largest |logit difference| between the packed batch and the
document run alone, both under bf16 autocast, against a float32 run of the document alone
(backend sdpa); the packed error must be at most twice the alone error (the tests' 2x rule), plus
FLOAT32_FLOOR.
Writes DIR/packed_training.json and DIR/packed_training.md (and, with --markdown FILE, that
section of FILE) and prints the table last.
"""

from __future__ import annotations

import argparse
import gzip
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    TrainStep,
    command_line,
    compile_counts,
    describe_environment,
    environment_markdown,
    kept_weights,
    logged_messages,
    markdown_table,
    median,
    publish,
    reset_compile_counts,
    time_calls,
)
from benchmarks.train_step import build_module, with_backend
from genoformer.core.transformer import compile_blocks
from genoformer.data import PackedRandomWindowDataset, prepare_genome_store, read_records
from genoformer.data.packing import collate_packed
from genoformer.genome.lm import GenoformerLM
from genoformer.kernels.dispatch import Backend

REPO_ROOT = Path(__file__).resolve().parents[1]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
CONFIG = REPO_ROOT / "configs" / "genome_8k_gpu.yaml"
FLOAT32_FLOOR = 1e-4
"""Logit differences below this are float32 rounding (the CPU smoke run has no bf16 error to double)."""
SMOKE_MODEL = ["--model.transformer.d_model", "64", "--model.transformer.n_layers", "2",
               "--model.transformer.n_heads", "2", "--model.transformer.n_kv_heads", "1",
               "--model.transformer.max_seq_len", "512"]


def packed_batch(window: int, batch_size: int, shortest: int, seed: int) -> dict:
    """A packed training batch of lambda pieces with log-uniform lengths in [shortest, window]."""
    sequence = list(read_records(LAMBDA))[0].sequence.decode("ascii")
    rng = np.random.default_rng(seed)
    cuts = [0]
    while cuts[-1] < len(sequence):
        cuts.append(min(len(sequence), cuts[-1] + int(math.exp(rng.uniform(math.log(shortest), math.log(window))))))
    with tempfile.TemporaryDirectory() as tmp:
        fasta = Path(tmp) / "pieces.fa.gz"
        fasta.write_bytes(gzip.compress("".join(f">piece{i}\n{sequence[a:b]}\n"
                                                for i, (a, b) in enumerate(zip(cuts, cuts[1:]))).encode()))
        store = prepare_genome_store([fasta], Path(tmp) / "pieces.zarr", progress=False)
        dataset = PackedRandomWindowDataset(store, window, batch_size, seed=seed)
        return collate_packed([dataset[i] for i in range(batch_size)])


def step_ms(module: GenoformerLM, tokens_BL, cu_seqlens, steps: int, warmup: int) -> float:
    """Median milliseconds of one optimizer step (forward, backward, AdamW) under bf16 autocast
    on CUDA (float32 elsewhere); the weights are as they were afterwards."""
    device = tokens_BL.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with kept_weights(module):
        train_step = TrainStep(lambda: module.loss(tokens_BL, cu_seqlens=cu_seqlens)[0],
                               torch.optim.AdamW(module.parameters(), lr=1e-4), device, dtype)
        return median(time_calls(train_step.step, device, warmup, steps))


def document_errors(module: GenoformerLM, tokens_BL, cu_seqlens) -> dict:
    """Largest |logit difference| over all documents: packed vs float32 alone, and bf16 alone vs
    float32 alone (the same-precision error the 2x rule compares with)."""
    model, device = module.model, tokens_BL.device
    L = tokens_BL.shape[1]
    half = dict(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    backend = module.runtime.attention_backend
    packed_err = alone_err = 0.0
    with torch.no_grad():
        with torch.autocast(**half):
            packed_BLV = model(tokens_BL, cu_seqlens=cu_seqlens).float()
        bounds = cu_seqlens.tolist()
        for a, b in zip(bounds, bounds[1:]):
            row, start = divmod(a, L)
            doc_1n = tokens_BL[row:row + 1, start:start + b - a]
            with torch.autocast(**half):
                alone_1nV = model(doc_1n).float()
            with_backend(module, Backend.SDPA)
            exact_1nV = model(doc_1n).float()
            with_backend(module, backend)
            packed_err = max(packed_err, float((packed_BLV[row, start:start + b - a] - exact_1nV[0]).abs().max()))
            alone_err = max(alone_err, float((alone_1nV - exact_1nV).abs().max()))
    return {"packed_max_abs_err": packed_err, "alone_max_abs_err": alone_err,
            "documents": len(bounds) - 1, "passes_2x_rule": packed_err <= 2 * alone_err + FLOAT32_FLOOR}


def auto_log(module: GenoformerLM, tokens_BL, cu_seqlens) -> list[str]:
    """What `auto` logs when it picks the backends of the packed forward pass."""
    with logged_messages() as messages, torch.no_grad(), \
            torch.autocast(tokens_BL.device.type, dtype=torch.bfloat16, enabled=tokens_BL.is_cuda):
        module.model(tokens_BL, cu_seqlens=cu_seqlens)
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for packed_training.json and .md")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, compiled with aot_eager")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the `packed-training` section of this file (e.g. BENCHMARKS.md)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    torch.manual_seed(0)
    module = build_module(CONFIG, SMOKE_MODEL if args.smoke else []).to(device)
    with_backend(module, Backend.AUTO)
    window = module.model.config.max_seq_len
    batch = packed_batch(window, args.batch_size, shortest=20 if args.smoke else 100, seed=0)
    tokens_BL, cu_seqlens = batch["tokens"].to(device), batch["cu_seqlens"].to(device)

    messages = auto_log(module, tokens_BL, cu_seqlens)
    errors = document_errors(module, tokens_BL, cu_seqlens)
    rows = [{"run": "unpacked", "step_ms": step_ms(module, tokens_BL, None, args.steps, args.warmup)},
            {"run": "packed", "step_ms": step_ms(module, tokens_BL, cu_seqlens, args.steps, args.warmup)}]
    compile_blocks(module.model, backend="aot_eager" if args.smoke else "inductor")
    reset_compile_counts()
    rows.append({"run": "packed, compiled", "step_ms": step_ms(module, tokens_BL, cu_seqlens, args.steps, args.warmup)})
    graph_breaks = compile_counts()["graph_breaks"]
    for row in rows:
        row["tokens_per_s"] = tokens_BL.numel() / (row["step_ms"] / 1e3)
        row["speed_vs_unpacked"] = rows[0]["step_ms"] / row["step_ms"]

    lengths = cu_seqlens.diff().tolist()
    summary = {
        "environment": describe_environment(device), "command": command_line(),
        "batch": {"rows": args.batch_size, "window": window, "documents": len(lengths),
                  "shortest": min(lengths), "longest": max(lengths)},
        "auto_log": messages, "equality": errors, "compiled_graph_breaks": graph_breaks, "results": rows,
    }
    publish(args.out, "packed_training", summary, render_markdown(summary), args.markdown, "packed-training")


def render_markdown(summary: dict) -> str:
    batch, errors = summary["batch"], summary["equality"]
    table = markdown_table([
        {"run": r["run"], "step (ms)": f"{r['step_ms']:.1f}", "tokens/s": f"{r['tokens_per_s']:,.0f}",
         "speed vs unpacked": f"{r['speed_vs_unpacked']:.2f}x"} for r in summary["results"]
    ])
    return "\n\n".join([
        "## Packed training (short records, GenomeDataModule pack)",
        environment_markdown(summary["environment"], summary["command"]),
        f"{batch['rows']} rows x {batch['window']:,} tokens holding {batch['documents']} documents of "
        f"{batch['shortest']:,} to {batch['longest']:,} tokens (lambda phage pieces); target: packed at least "
        "0.9x the speed of unpacked.",
        f"Equality over the documents: packed vs float32 alone {errors['packed_max_abs_err']:.2e}, bf16 alone vs "
        f"float32 alone {errors['alone_max_abs_err']:.2e}: 2x rule {'passed' if errors['passes_2x_rule'] else 'FAILED'}. "
        f"Graph breaks of the compiled packed step: {summary['compiled_graph_breaks']}.",
        "`auto` logged: " + ("; ".join(f"`{m}`" for m in summary["auto_log"]) or "(nothing)"),
        table,
    ])


if __name__ == "__main__":
    main()
