"""End-to-end training-step throughput of a shipped config's model, per attention backend.

    python -m benchmarks.train_step --out DIR --markdown BENCHMARKS.md          (on a CUDA GPU)
    python -m benchmarks.train_step --device cpu --tiny                         (a CPU smoke run)

Builds the model of a shipped config (default configs/genome_8k_gpu.yaml: 8 layers, three of
every four with a 2,048-token sliding window, the fourth dense; causal LM at 8,192 tokens) through
the same LightningCLI parser that `genoformer fit` uses, then times one optimizer step (forward,
backward, AdamW) under bf16 autocast for each attention backend on identical weights and an
identical batch of real E. coli windows:

- `triton`: genoformer's kernels (what `auto` picks on a CUDA GPU);
- `sdpa`: torch SDPA; dense layers run on its FlashAttention-2 backend, block-sparse layers on
  SDPA with the layout expanded to a dense boolean mask (what a user without our kernels gets).

It also checks that `auto` chose Triton, that both backends give the same loss and gradients
(relative difference), and records peak memory. Results go to DIR/train_step.json and .md and,
with --markdown, the `training` section of that file; --render-from re-renders a saved run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.common import (
    TrainStep,
    command_line,
    describe_environment,
    environment_markdown,
    kept_weights,
    logged_messages,
    markdown_table,
    median,
    publish,
    synchronize,
    time_calls,
)
from genoformer.cli import training_cli
from genoformer.data.genome.store import GenomeStore, prepare_genome_store
from genoformer.kernels.dispatch import Backend
from genoformer.genome.lm import GenoformerLM

REPO_ROOT = Path(__file__).resolve().parents[1]
ECOLI = REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"


def build_module(config: Path, overrides: list[str]) -> GenoformerLM:
    """The LightningModule exactly as `genoformer fit --config CONFIG OVERRIDES` would build it."""
    with tempfile.TemporaryDirectory() as tmp:
        cli = training_cli(
            ["--config", str(config), "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
             "--trainer.default_root_dir", tmp, "--data.init_args.store", f"{tmp}/store.zarr", *overrides],
            run=False,
        )
    return cli.model


def real_batch(batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """(B, L) uint8 tokens: random windows of the shipped E. coli genome."""
    with tempfile.TemporaryDirectory() as tmp:
        store = GenomeStore(prepare_genome_store([ECOLI], Path(tmp) / "ecoli.zarr", progress=False))
        contig = store.contigs[0]
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, contig.length - seq_len, (batch_size,), generator=generator)
        return torch.stack([torch.from_numpy(store.read(contig.name, int(s), int(s) + seq_len).copy()) for s in starts])


def with_backend(module: GenoformerLM, backend: Backend) -> GenoformerLM:
    """The same module (same weights) with every attention layer on `backend`: its runtime
    settings changed and applied to the trunk, as a config's `model.runtime` would be."""
    module.runtime = dataclasses.replace(module.runtime, attention_backend=backend)
    module.model.apply_runtime(module.runtime)
    return module


def measure(module: GenoformerLM, tokens_BL: torch.Tensor, backend: Backend, dtype: torch.dtype, steps: int, warmup: int) -> dict:
    """Median step time, peak memory, and the loss and gradients at the initial weights (for the
    cross-backend check) of one backend; the weights are as they were afterwards."""
    device = tokens_BL.device
    with_backend(module, backend)
    with kept_weights(module):
        module.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, _ = module.loss(tokens_BL)
        loss.backward()
        grads = {name: p.grad.detach().float().clone() for name, p in module.named_parameters() if p.grad is not None}
        train_step = TrainStep(lambda: module.loss(tokens_BL)[0], torch.optim.AdamW(module.parameters(), lr=1e-4), device, dtype)
        for _ in range(warmup):
            train_step.step()
        synchronize(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = time_calls(train_step.step, device, warmup=0, calls=steps)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    step_ms = median(times)
    return {
        "backend": backend.value,
        "step_ms": step_ms,
        "tokens_per_s": tokens_BL.numel() / (step_ms / 1e3),
        "peak_gib": peak,
        "loss_at_init": float(loss.detach()),
        "grads": grads,
    }


def auto_choice(module: GenoformerLM, tokens_BL: torch.Tensor) -> list[str]:
    """The messages `auto` logs when it picks a backend for this model's layers."""
    with_backend(module, Backend.AUTO)
    with logged_messages() as messages, torch.no_grad(), \
            torch.autocast(tokens_BL.device.type, dtype=torch.bfloat16, enabled=tokens_BL.is_cuda):
        module.model(tokens_BL[:1])
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "genome_8k_gpu.yaml")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backends", default="triton,sdpa")
    parser.add_argument("--tiny", action="store_true", help="a small model and context, for a CPU smoke run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite the `training` section of this file")
    parser.add_argument("--render-from", type=Path, default=None, help="measure nothing: re-render from an earlier train_step.json")
    args = parser.parse_args()
    if args.render_from is not None:
        summary = json.loads(args.render_from.read_text())
        publish(args.out, "train_step", summary, render_markdown(summary), args.markdown, "training")
        return

    device = torch.device(args.device)
    overrides = []
    if args.tiny:
        overrides = ["--model.transformer.d_model", "64", "--model.transformer.n_layers", "2",
                     "--model.transformer.n_heads", "2", "--model.transformer.n_kv_heads", "1",
                     "--model.transformer.max_seq_len", "1024"]
    torch.manual_seed(0)
    module = build_module(args.config, overrides).to(device)
    seq_len = module.model.config.max_seq_len
    tokens_BL = real_batch(args.batch_size, seq_len, seed=0).to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    auto_messages = auto_choice(module, tokens_BL)
    results = [measure(module, tokens_BL, Backend(name), dtype, args.steps, args.warmup) for name in args.backends.split(",")]
    base = results[0]
    for result in results:
        diffs = [
            float((result["grads"][n] - base["grads"][n]).norm() / base["grads"][n].norm().clamp_min(1e-30))
            for n in base["grads"]
        ]
        result["max_grad_rel_diff_vs_first"] = max(diffs)
    for result in results:
        result.pop("grads")
        result["speedup_of_first"] = result["step_ms"] / base["step_ms"]

    config = module.model.config
    summary = {
        "environment": describe_environment(device),
        "command": command_line(),
        "config": str(args.config.relative_to(REPO_ROOT) if args.config.is_relative_to(REPO_ROOT) else args.config),
        "model": {"d_model": config.d_model, "n_layers": config.n_layers, "n_heads": config.n_heads,
                  "n_kv_heads": config.kv_heads, "seq_len": seq_len, "batch_size": args.batch_size,
                  "parameters": sum(p.numel() for p in module.parameters()),
                  "dtype": str(dtype).removeprefix("torch."), "steps": args.steps, "warmup": args.warmup},
        "auto_log": auto_messages,
        "results": results,
    }
    publish(args.out, "train_step", summary, render_markdown(summary), args.markdown, "training")


def render_markdown(summary: dict) -> str:
    """The `training` section of BENCHMARKS.md for one run's summary."""
    results = summary["results"]
    base = results[0]["backend"]
    rows = [
        {
            "backend": r["backend"],
            "step (ms)": f"{r['step_ms']:.1f}",
            "tokens/s": f"{r['tokens_per_s']:,.0f}",
            f"time vs {base}": f"{r['speedup_of_first']:.2f}x",
            "peak memory (GiB)": "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}",
            "loss at init": f"{r['loss_at_init']:.4f}",
            f"max grad rel. diff vs {base}": f"{r['max_grad_rel_diff_vs_first']:.1e}",
        }
        for r in results
    ]
    model = summary["model"]
    messages = summary["auto_log"]
    return "\n\n".join([
        "## Training step (model of a shipped config)",
        environment_markdown(summary["environment"], summary["command"]),
        f"Model of `{summary['config']}`: {model['parameters'] / 1e6:.1f} M parameters, {model['n_layers']} layers, "
        f"d_model {model['d_model']}, {model['n_heads']} query / {model['n_kv_heads']} key-value heads, "
        f"batch {model['batch_size']} x {model['seq_len']:,} tokens of E. coli, {model['dtype']} autocast, AdamW; "
        f"median of {model['steps']} steps after {model['warmup']} warm-up steps, identical weights and batch "
        "for every backend. `sdpa` runs dense layers on SDPA's FlashAttention-2 backend and block-sparse "
        "layers on SDPA with the layout expanded to a boolean mask.",
        markdown_table(rows),
        "`auto` logged: " + ("; ".join(f"`{m}`" for m in messages) if messages else "(nothing)"),
    ])


if __name__ == "__main__":
    main()
