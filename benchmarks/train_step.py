"""The training step of a shipped config's model, per attention backend.

Builds the model of configs/genome_8k_gpu.yaml (8 layers, three of every four with a 2,048-token
sliding window, the fourth dense; causal LM at 8,192 tokens) through the LightningCLI parser that
`genoformer fit` uses, then times one optimizer step (forward, backward, AdamW) under bf16
autocast per backend, on identical weights and one batch of real E. coli windows: `triton` (ours,
what `auto` picks on a GPU) and `sdpa` (dense layers on SDPA's FlashAttention-2, block-sparse ones
on SDPA with the layout expanded to a boolean mask: what a user without our kernels gets). It
checks that `auto` chose Triton and that both give the same loss and gradients.

    python -m benchmarks.train_step --out OUT        # a GPU, about 2 minutes
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch
from genoformer.data.genome.store import GenomeStore, prepare_genome_store
from genoformer.kernels.dispatch import Backend

from benchmarks.common import (
    REPO_ROOT,
    Benchmark,
    Summary,
    TrainStep,
    argv,
    kept_weights,
    logged_messages,
    median,
    table,
    time_calls,
)
from genoformer.training_cli import training_cli

ECOLI = REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"


def build_module(config: Path, overrides: list[str]):
    """The LightningModule exactly as `genoformer fit --config CONFIG OVERRIDES` builds it."""
    with tempfile.TemporaryDirectory() as tmp:
        return training_cli(
            argv(
                "--config {config} --trainer.accelerator cpu --trainer.precision 32-true "
                "--trainer.default_root_dir {tmp} --data.init_args.store {store}",
                config=config,
                tmp=tmp,
                store=f"{tmp}/store.zarr",
            )
            + overrides,
            run=False,
        ).model


def with_backend(module, backend: Backend):
    """The same module (same weights) with every attention layer on `backend`, as a config's
    `model.runtime` would set it."""
    module.runtime = dataclasses.replace(module.runtime, attention_backend=backend)
    module.model.apply_runtime(module.runtime)
    return module


def arguments(parser) -> None:
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "genome_8k_gpu.yaml")
    parser.add_argument("--device", default="cuda", help="device to measure (--smoke: the CPU)")
    parser.add_argument(
        "--backends", default="triton,sdpa", help="comma-separated attention backends, the first the yardstick"
    )


def measure(args) -> dict:
    device = torch.device(args.device)
    overrides = (
        argv(
            "--model.transformer.d_model 64 --model.transformer.n_layers 2 --model.transformer.n_heads 2 "
            "--model.transformer.n_kv_heads 1 --model.transformer.max_seq_len 512"
        )
        if args.smoke
        else []
    )
    torch.manual_seed(0)
    module = build_module(args.config, overrides).to(device)
    seq_len, batch = module.model.config.max_seq_len, 2 if args.smoke else 8
    with tempfile.TemporaryDirectory() as tmp:
        store = GenomeStore(prepare_genome_store([ECOLI], Path(tmp) / "ecoli.zarr", progress=False))
        starts = torch.randint(
            0, store.contigs[0].length - seq_len, (batch,), generator=torch.Generator().manual_seed(0)
        )
        tokens_BL = torch.stack(
            [torch.from_numpy(store.read(store.contigs[0].name, s, s + seq_len).copy()) for s in starts.tolist()]
        ).to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with_backend(module, Backend.AUTO)
    with (
        logged_messages() as auto_log,
        torch.no_grad(),
        torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"),
    ):
        module.model(tokens_BL[:1])
    results = []
    for name in ("torch,sdpa" if args.smoke else args.backends).split(","):
        with_backend(module, Backend(name))
        with kept_weights(module):
            module.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss, _ = module.loss(tokens_BL)
            loss.backward()
            grads = {n: p.grad.detach().float().clone() for n, p in module.named_parameters() if p.grad is not None}
            step = TrainStep(
                lambda: module.loss(tokens_BL)[0], torch.optim.AdamW(module.parameters(), lr=1e-4), device, dtype
            )
            for _ in range(1 if args.smoke else 3):
                step.step()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            step_ms = median(time_calls(step.step, device, warmup=0, calls=2 if args.smoke else 10))
        first = results[0]["grads"] if results else grads
        results.append(
            {
                "backend": name,
                "step_ms": step_ms,
                "tokens_per_s": tokens_BL.numel() / step_ms * 1e3,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
                "loss_at_init": float(loss),
                "grads": grads,
                "max_grad_rel_diff_vs_first": max(
                    float((grads[n] - first[n]).norm() / first[n].norm().clamp_min(1e-30)) for n in first
                ),
            }
        )
    config = module.model.config
    return {
        "config": str(args.config.relative_to(REPO_ROOT))
        if args.config.is_relative_to(REPO_ROOT)
        else str(args.config),
        "model": {
            "parameters": sum(p.numel() for p in module.parameters()),
            "n_layers": config.n_layers,
            "d_model": config.d_model,
            "seq_len": seq_len,
            "batch_size": batch,
        },
        "auto_log": auto_log,
        "results": [{k: v for k, v in r.items() if k != "grads"} for r in results],
    }


def summarize(data: dict) -> Summary:
    first, model = data["results"][0], data["model"]
    rows = [
        {
            "backend": r["backend"],
            "step ms": r["step_ms"],
            "tokens/s": round(r["tokens_per_s"]),
            f"time ÷ {first['backend']}": r["step_ms"] / first["step_ms"],
            "peak GiB": r["peak_gib"],
            "loss at init": f"{r['loss_at_init']:.4f}",
            f"max grad rel. diff vs {first['backend']}": f"{r['max_grad_rel_diff_vs_first']:.1e}",
        }
        for r in data["results"]
    ]
    return Summary(
        tables=[
            table(
                rows,
                f"Model of `{data['config']}`: {model['parameters'] / 1e6:.1f} M parameters, "
                f"batch {model['batch_size']} x {model['seq_len']:,} tokens of E. coli",
            )
        ],
        notes=[f"`auto` chose: {', '.join(sorted({m.rsplit(' ', 1)[-1] for m in data['auto_log']}))}"]
        if data["auto_log"]
        else [],
    )


BENCHMARK = Benchmark(
    "train_step",
    "Training step (model of a shipped config)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="the same model and batch on torch SDPA",
)

if __name__ == "__main__":
    BENCHMARK.main()
