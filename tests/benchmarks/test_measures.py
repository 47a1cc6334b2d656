"""What the benchmarks compute, beside their smoke runs: the pairs a layout allows, the FlexAttention
mask that must compute our function, the FLOPs of the reference model, where the profiler puts a
kernel, how joined runs replace or pair their cases, GPU results cut in parts, the held-out sets'
rule, the fine-tuning variants, the zero-shot verdicts and the forecaster rows a checkpoint adds."""

from __future__ import annotations

import inspect
import tarfile

import numpy as np
import pytest
import torch
from data_helpers import write_fasta
from genoformer.kernels.layout import BlockLayout
from torch.nn.attention.flex_attention import create_block_mask

from benchmarks import attention, finetune_bench, flagship, timeseries_datasets, train
from benchmarks.common import allowed_pairs, classify, flex_block_mask, pack_parts
from benchmarks.train_models import REFERENCE, build_genoformer, fit_arguments, model_flops_per_token, parameter_count
from genoformer.training_cli import finetune


@pytest.mark.parametrize("seq_len", [256, 200])
def test_allowed_pairs_counts_the_token_mask(seq_len):
    heads = 4
    for layout in (
        BlockLayout.sliding_window(seq_len, 32, 32).with_causal(),
        BlockLayout.bigbird(seq_len, 32, 1, 1, 32, num_heads=heads),
        BlockLayout.dense(seq_len, block_size=32),
    ):
        for causal in (False, True):
            expected = int(layout.token_mask(causal).sum()) * (heads // layout.num_heads)
            assert allowed_pairs(layout, causal, seq_len, heads) == expected
    dense = BlockLayout.dense(seq_len, block_size=32)
    assert allowed_pairs(None, True, seq_len, heads) == int(dense.token_mask(True).sum()) * heads


@pytest.mark.parametrize("causal", [False, True])
def test_flex_block_mask_is_the_layout(causal):
    """Built from block lists it equals create_block_mask's and the layout; its mask_mod alone states
    the layout (what uncompiled Flex and the FLASH backend read); the index-only mask_mod agrees on
    every partial (diagonal) block."""
    seq_len, heads, bs = 256, 2, 32
    layout = BlockLayout.bigbird(seq_len, 32, 1, 1, bs, seed=3)
    block_mask = flex_block_mask(layout, causal, heads, torch.device("cpu"))
    reference = create_block_mask(block_mask.mask_mod, 1, heads, seq_len, seq_len, device="cpu", BLOCK_SIZE=bs)
    dense = block_mask.to_dense()
    assert torch.equal(dense.expand_as(reference.to_dense()).bool(), reference.to_dense().bool())
    assert torch.equal(dense[0].bool(), (layout.with_causal() if causal else layout).mask)
    assert int(block_mask.kv_num_blocks.sum()) == (int(layout.mask.diagonal(dim1=1, dim2=2).sum()) if causal else 0)
    q_idx, kv_idx = torch.meshgrid(torch.arange(seq_len), torch.arange(seq_len), indexing="ij")
    for h in range(heads):
        assert torch.equal(block_mask.mask_mod(0, h, q_idx, kv_idx), layout.token_mask(causal)[0])
    index_only = flex_block_mask(layout, causal, heads, torch.device("cpu"), index_only=True)
    assert torch.equal(index_only.to_dense(), dense)
    if causal:
        partial = layout.mask[0, q_idx // bs, kv_idx // bs] & (q_idx // bs == kv_idx // bs)
        assert torch.equal(
            index_only.mask_mod(0, 0, q_idx, kv_idx)[partial], block_mask.mask_mod(0, 0, q_idx, kv_idx)[partial]
        )


def test_joined_attention_runs_replace_measured_cases_only():
    def case(length, ms, skipped=None):
        return {"head_dim": 64, "seq_len": length, "pattern": "causal", "ours": {"fwd_ms": ms}, "skipped": skipped}

    first = {"cases": [case(8192, 1.0), case(16384, 2.0)], "wall_s": 10.0}
    second = {"cases": [case(16384, 3.0), case(8192, None, skipped="time budget")], "wall_s": 5.0}
    merged = attention.merge([first, second])
    assert {r["seq_len"]: r["ours"]["fwd_ms"] for r in merged["cases"]} == {8192: 1.0, 16384: 3.0}
    assert merged["wall_s"] == 15.0


def test_the_flops_count_is_the_usual_formula_for_causal_attention():
    module = build_genoformer(fit_arguments(REFERENCE, 8192, 4, window=False, compiled=False, fused=True))
    config, parameters = module.model.config, parameter_count(module.model)
    assert 80e6 < parameters < 90e6  # the ~85M reference model
    usual = 6 * parameters + 6 * 12 * 768 * 8192
    assert model_flops_per_token(config, parameters, 8192, window=False) == pytest.approx(usual, rel=1e-4)


@pytest.mark.parametrize(
    ("kernel", "parents", "part"),
    [
        ("attn_fwd_kernel", [], "attention"),
        ("triton_poi_fused_mul_silu_0", ["## Call CompiledFxGraph ##"], "norms, RoPE, SwiGLU, other elementwise"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", ["aten::mm", "aten::linear"], "matmuls"),
        ("void at::native::elementwise_kernel", ["aten::mul_", "Optimizer.step#AdamW.step"], "optimizer"),
        ("void at::native::cunn_SoftMaxForward", ["aten::_log_softmax", "aten::cross_entropy"], "loss"),
    ],
)
def test_the_profile_puts_each_kernel_in_its_part(kernel, parents, part):
    assert classify(kernel, parents) == part


def test_joined_training_runs_pair_each_case_with_its_own_run():
    def fit(name, tokens_per_s, step_ms=1.0):
        return {
            "name": name,
            "kind": "fit",
            "impl": "genoformer",
            "mode": "compiled",
            "status": "ok",
            "tokens_per_s": tokens_per_s,
            "step_ms": step_ms,
            "strategy": "x",
            "num_workers": 0,
        }

    step = {
        "name": "genoformer-causal-8k-compiled",
        "kind": "step",
        "impl": "genoformer",
        "mode": "compiled",
        "context": 8192,
        "batch": 4,
        "status": "ok",
        "step_ms": 1.0,
        "tokens_per_s": 1.0,
        "mfu": 0.3,
        "model_tflops": 1.0,
        "peak_gib": None,
    }
    one_gpu = {
        "records": [step, fit("fit-synthetic-8k", 100.0), fit("fit-real-8k", 99.0)],
        "skipped": [{"name": "ddp-synthetic-8k-x2", "status": "needs 2 GPUs"}],
    }
    two_gpus = {
        "records": [fit("fit-synthetic-8k", 110.0, step_ms=2.0), fit("ddp-synthetic-8k-x2", 209.0)],
        "skipped": [],
    }
    merged = train.merge([one_gpu, two_gpus])
    assert merged["skipped"] == []
    verdicts = {t["target"]: t for t in train.summarize(merged).targets}
    assert verdicts["2 GPUs (DDP) vs 1 GPU, 8k, Trainer.fit >= 1.85x tokens/s"]["measured"] == "1.90x"  # 209 / 110
    # the real-data case pairs with the synthetic case of its own run (1.0 ms), not the other's (2.0)
    assert verdicts["real data module vs a batch on the GPU: step time within 3%"]["measured"] == "+0.0%"
    with pytest.raises(SystemExit, match="no case matches"):
        train.select("nonsense-case")


def test_gpu_results_cut_in_parts_rejoin_into_the_folder(tmp_path):
    folder = tmp_path / "out" / "flagship_scores"
    folder.mkdir(parents=True)
    payload = np.random.default_rng(0).bytes(3500)
    (folder / "scores.bin").write_bytes(payload)
    pack_parts(folder, tmp_path / "out", part_bytes=1000)
    parts = sorted((tmp_path / "out").glob("flagship_scores.tar.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))
    assert not folder.exists() and len(parts) > 3 and all(p.stat().st_size <= 1000 for p in parts)
    (tmp_path / "joined.tar").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(tmp_path / "joined.tar") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    assert (tmp_path / "back" / "flagship_scores" / "scores.bin").read_bytes() == payload


def test_held_out_sets_follow_their_rule(tmp_path, monkeypatch):
    assert flagship._contexts_of(32768, [1024, 8192, 32768]) == [1024, 8192, 32768]  # long models: every context
    assert flagship._contexts_of(8192, [1024, 8192, 32768]) == [8192]
    monkeypatch.setattr(flagship, "MIN_CONTIG", 100)
    rng = np.random.default_rng(1)
    fasta = write_fasta(
        tmp_path / "g.fa",
        [(f"c{i}", "".join(rng.choice(list("ACGT"), size=n))) for i, n in enumerate([50, 300, 120, 400, 200])],
    )
    # contigs of at least MIN_CONTIG bases, in file order, until the budget is reached
    assert [name for name, _ in flagship._whole_contigs(fasta, budget=500)] == ["c1", "c2", "c3"]


def test_fine_tuning_variants_are_finetune_options():
    options = set(inspect.signature(finetune).parameters)
    for variants in (finetune_bench.SEQUENCE_VARIANTS, finetune_bench.GENE_VARIANTS):
        for name, values in variants.items():
            assert set(values) <= options, name


def test_zero_shot_rows_judge_the_general_forecaster_against_both_targets():
    def rows(*mses):
        return {str(h): {"mse": m, "mae": m} for h, m in zip((96, 720), mses)}

    data = {
        "horizons": [96, 720],
        "zero_shot": {"model": "general", "datasets": ["held", "unseen", "absent"]},
        "datasets": {
            "held": {"methods": {"general": rows(0.5, 1.0), "seasonal_naive": rows(0.6, 1.1), "ar": rows(0.46, 0.9)}},
            "unseen": {"methods": {"general": rows(0.7, 1.0), "seasonal_naive": rows(0.6, 1.1), "ar": rows(0.7, 1.0)}},
        },
    }
    held, unseen = timeseries_datasets.zero_shot(data)  # a dataset without results is left out
    assert held["beats seasonal naive at every horizon"] == "yes" and held["within 10 % of AR at every horizon"] == "no"
    assert held["MSE / AR"] == "1.09 / 1.11"
    assert (
        unseen["beats seasonal naive at every horizon"] == "no"
        and unseen["within 10 % of AR at every horizon"] == "yes"
    )
    (target,) = timeseries_datasets.summarize(data).targets
    assert target["status"] == "NOT MET" and target["measured"] == "0 of 2 (none)"


def test_a_checkpoints_evaluation_adds_its_forecaster_rows_only():
    rows = [
        {"method": method, "horizon": 96, "mse": mse, "mae": mse, "windows": 3, "lookback": 512}
        for method, mse in (("forecaster", 0.4), ("ar", 0.5))
    ]
    data = {"datasets": {}}
    timeseries_datasets.add_model_results(data, "general", "electricity", {"results": rows})
    assert data["datasets"]["electricity"]["methods"] == {
        "general": {"96": {k: v for k, v in rows[0].items() if k not in ("method", "horizon")}}
    }
