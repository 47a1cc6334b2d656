"""Compiled models: the `model.runtime.compile` switch, graphs without breaks around the attention kernels,
and the fused elementwise regions against their plain PyTorch references.

On a CPU the switch compiles with torch.compile's "aot_eager" backend (no code generation, so a
step takes seconds, not minutes); what is checked is the capture: one graph per kind of block and
no graph break. The GPU run of `benchmarks/train.py` compiles with inductor and records graph breaks.
"""

from __future__ import annotations

import functools
import types
from pathlib import Path

import pytest
import torch
from genoformer.kernels.dispatch import Backend
from genoformer.kernels.layout import SlidingWindow
from model_helpers import random_tokens, tiny_config
from torch._dynamo.utils import counters

import genoformer.core.training as training_module
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import (
    RotaryEmbedding,
    Transformer,
    compile_blocks,
    fused,
    rms_norm,
    rotary_qk,
    swiglu,
)
from genoformer.genome.lm import IGNORE, GenoformerLM, cross_entropy_sum
from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dynamo_counters():
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_compile_switch_builds_and_runs_a_step(tmp_path, monkeypatch, dynamo_counters):
    """`genoformer fit --config configs/genome_8k_gpu.yaml` (compile: true) on a CPU, shrunk, with
    dense layers: on a CPU `auto` runs layouts on the PyTorch block-sparse backend, which reads
    block counts on the host (graph breaks); the next test compiles layouts on our kernels."""
    monkeypatch.setattr(training_module, "compile_blocks", functools.partial(compile_blocks, backend="aot_eager"))
    cli = training_cli(
        [
            "--config",
            str(REPO_ROOT / "configs" / "genome_8k_gpu.yaml"),
            "--trainer.accelerator",
            "cpu",
            "--trainer.precision",
            "32-true",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "2",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.logger",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks",
            "[]",
            "--model.transformer.d_model",
            "32",
            "--model.transformer.n_layers",
            "4",
            "--model.transformer.n_heads",
            "2",
            "--model.transformer.n_kv_heads",
            "1",
            "--model.transformer.max_seq_len",
            "256",
            "--config",
            '{"model": {"transformer": {"attention": [null]}}}',
            "--data.init_args.store",
            str(tmp_path / "ecoli.zarr"),
            "--data.init_args.batch_size",
            "2",
            "--data.init_args.num_workers",
            "0",
        ],
        run=False,
    )
    assert cli.model.runtime.compile
    before = {name: p.detach().clone() for name, p in cli.model.named_parameters()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert all(block._compiled_call_impl is not None for block in cli.model.model.blocks)
    assert dict(dynamo_counters["graph_break"]) == {}
    # all four blocks share one graph (plus the final norm's)
    assert dynamo_counters["stats"]["unique_graphs"] == 2
    changed = [name for name, p in cli.model.named_parameters() if not torch.equal(p, before[name])]
    assert len(changed) == len(before)  # the compiled step trained every parameter
    # checkpoints keep the eager parameter names
    assert not any("_orig_mod" in key for key in cli.model.state_dict())


def test_compiled_blocks_run_the_triton_kernels_in_one_graph(dynamo_counters):
    """Sliding-window and dense layers on our kernels (interpreted on a CPU): no graph break,
    and the same logits and gradients as the eager model."""
    config = tiny_config(
        n_layers=4,
        n_heads=2,
        max_seq_len=64,
        attention=[SlidingWindow(window=32, block_size=16), SlidingWindow(window=32, block_size=16), None],
    )
    torch.manual_seed(0)
    triton = RuntimeSettings(attention_backend=Backend.TRITON)
    eager = Transformer(config, triton).to(torch.bfloat16)
    compiled = Transformer(config, triton).to(torch.bfloat16)
    compiled.load_state_dict(eager.state_dict())
    compile_blocks(compiled, backend="aot_eager")
    tokens_BL = random_tokens(2, 64, seed=3)
    results = []
    for model in (eager, compiled):
        logits_BLV = model(tokens_BL)
        logits_BLV.float().square().mean().backward()
        results.append((logits_BLV.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert dict(dynamo_counters["graph_break"]) == {}
    # equal specs share one layout, so one graph per kind of layer: sliding, dense, final norm
    assert dynamo_counters["stats"]["unique_graphs"] == 3
    torch.testing.assert_close(results[1][0], results[0][0], atol=0, rtol=0)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=0, rtol=0, msg=name)


def test_fused_regions_only_on_cuda_in_training_outside_compiled_graphs():
    """The policy of `fused`, with a stand-in for a CUDA tensor (it reads `is_cuda` only), so that
    a `fused` that ignored `enabled`, the device or autograd would fail here on a CPU too."""
    cpu = torch.zeros(2)
    cuda = types.SimpleNamespace(is_cuda=True)
    assert fused(rms_norm, True, cpu) is rms_norm  # a CPU tensor: the reference itself
    assert fused(rms_norm, False, cpu) is rms_norm
    assert fused(rms_norm, False, cuda) is rms_norm  # turned off: the reference on CUDA too
    compiled = fused(rms_norm, True, cuda)
    assert compiled is not rms_norm and fused(rms_norm, True, cuda) is compiled  # one region, cached
    with torch.no_grad():  # inference keeps the reference: no compile pause before a short embed
        assert fused(rms_norm, True, cuda) is rms_norm


def _regions(x_BLE, w_E, q_BHLD, k_BKLD, cos_LR, sin_LR, gate_up_BLF2, logits_BLV, targets_BL):
    q_BHLD, k_BKLD = rotary_qk(q_BHLD, k_BKLD, cos_LR, sin_LR)
    return (rms_norm(x_BLE, w_E, 1e-6), q_BHLD, k_BKLD, swiglu(gate_up_BLF2), cross_entropy_sum(logits_BLV, targets_BL))


@pytest.mark.slow
def test_inductor_regions_match_the_references(dynamo_counters):
    """What `fused` compiles (RMSNorm, RoPE, SwiGLU gate, loss), through inductor in one
    compile (C++ here, Triton on a GPU): outputs and gradients as the plain references."""
    generator = torch.Generator().manual_seed(0)
    B, L, E, H, K, D, F, V = 2, 24, 32, 4, 2, 8, 48, 8
    cos_LR, sin_LR = RotaryEmbedding(D, 10000.0, L).cos_sin(L, torch.device("cpu"))
    inputs = {
        "x_BLE": torch.randn(B, L, E, generator=generator),
        "w_E": torch.randn(E, generator=generator),
        # heads split from a (B, L, H, D) projection, as the model does: a strided view
        "q_BHLD": torch.randn(B, L, H, D, generator=generator).transpose(1, 2),
        "k_BKLD": torch.randn(B, L, K, D, generator=generator).transpose(1, 2),
        "gate_up_BLF2": torch.randn(B, L, 2 * F, generator=generator),
        "logits_BLV": torch.randn(B, L, V, generator=generator),
    }
    targets_BL = torch.randint(0, V, (B, L), generator=generator)
    targets_BL[0, :5] = IGNORE
    results = []
    for fn in (_regions, torch.compile(_regions, fullgraph=True, backend="inductor")):
        leaves = {name: t.detach().clone().requires_grad_(True) for name, t in inputs.items()}
        outputs = fn(cos_LR=cos_LR, sin_LR=sin_LR, targets_BL=targets_BL, **leaves)
        weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(outputs)]
        sum(((o.float() * w).sum() for o, w in zip(outputs, weights))).backward()
        results.append(([o.detach() for o in outputs], {name: t.grad for name, t in leaves.items()}))
    assert dict(dynamo_counters["graph_break"]) == {}
    for got, want in zip(results[1][0], results[0][0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name, want in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], want, atol=1e-5, rtol=1e-5, msg=name)


def test_every_gpu_config_compiles(tmp_path):
    """Every GPU config of the genomic model (GenoformerLM, the default model class) compiles its
    blocks (runtime.compile), as its resolved configuration says."""
    # the fine-tuning recipe (FineTuner) reads labelled files and is checked in tests/configs
    gpu_configs = sorted(p for p in (REPO_ROOT / "configs").glob("*_gpu*.yaml") if not p.name.startswith("finetune_"))
    assert len(gpu_configs) >= 5
    not_compiled = []
    for path in gpu_configs:
        cli = training_cli(
            [
                "--config",
                str(path),
                "--trainer.accelerator",
                "cpu",
                "--trainer.precision",
                "32-true",
                "--trainer.default_root_dir",
                str(tmp_path),
                "--data.init_args.store",
                str(tmp_path / "store.zarr"),
            ],
            run=False,
        )
        if isinstance(cli.model, GenoformerLM) and not cli.model.runtime.compile:
            not_compiled.append(path.name)
    assert not_compiled == []
