"""benchmarks/train.py: a tiny CPU run through every kind of case, and the pure helpers
(case selection, the FLOPs count, the profile classifier, the target verdicts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.train import GROUPS, select
from benchmarks.train_report import config_lines, merge_runs, targets
from benchmarks.train_measure import classify
from benchmarks.train_models import REFERENCE, build_genoformer, fit_arguments, model_flops_per_token, parameter_count

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = ("ceiling,genoformer-causal-8k-eager,sdpa-causal-8k-eager,profile-genoformer-causal-8k-eager,"
         "genoformer-causal-8k-compiled,fit-synthetic-8k,fit-real-8k,math-causal-8k-eager")


def test_smoke_run_writes_every_section(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.train", "--smoke", "--out", str(tmp_path), "--cases", SMOKE,
         "--markdown", str(tmp_path / "BENCHMARKS.md")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "train.json").read_text())
    records = {r["name"]: r for r in summary["records"]}
    assert set(records) == set(SMOKE.split(","))
    assert {name: r["status"] for name, r in records.items() if r["status"] != "ok"} == {}
    step = records["genoformer-causal-8k-compiled"]
    assert step["graph_breaks"] == 0 and step["tokens_per_s"] > 0
    # the same weights and batch: the compiled and the eager model start from the same loss
    assert step["first_loss"] == pytest.approx(records["genoformer-causal-8k-eager"]["first_loss"], rel=1e-5)
    assert step["fit_args"][:2] == ["--config", "configs/genome_8k_gpu.yaml"]
    profile = records["profile-genoformer-causal-8k-eager"]
    assert profile["parts"]["matmuls"] > 0 and profile["parts"]["attention"] > 0
    assert records["fit-real-8k"]["num_workers"] >= 1 and records["fit-synthetic-8k"]["timed_steps"] >= 1
    markdown = (tmp_path / "train.md").read_text()
    for heading in ("### Targets", "### Inside Trainer.fit", "### Where the time goes", "### For the long-context configs"):
        assert heading in markdown
    assert "<!-- training-speed:start -->" in (tmp_path / "BENCHMARKS.md").read_text()
    assert "| case | tokens | tokens/s |" in done.stdout  # the short table prints last


def test_case_selection_by_glob_keeps_groups_and_order():
    chosen = select("genoformer-causal-*-compiled", smoke=False)
    assert list(chosen) == ["compiled-8k", "compiled-long"]
    assert [c.context for c in chosen["compiled-long"]] == [32768, 65536, 131072, 16384]
    with pytest.raises(SystemExit, match="no case matches"):
        select("nonsense-case", smoke=False)
    names = [case.name for cases in GROUPS.values() for case in cases]
    assert len(names) == len(set(names))


def test_flops_count_is_the_issue_formula_for_causal_attention():
    module = build_genoformer(fit_arguments(REFERENCE, 8192, 4, window=False, compiled=False, fused=True))
    config, parameters = module.model.config, parameter_count(module.model)
    assert 80e6 < parameters < 90e6  # the ~85M reference model
    issue = 6 * parameters + 6 * 12 * 768 * 8192
    assert model_flops_per_token(config, parameters, 8192, window=False) == pytest.approx(issue, rel=1e-4)
    windowed = build_genoformer(fit_arguments(REFERENCE, 32768, 1, window=True, compiled=False, fused=True)).model.config
    # three of four layers see about 2,048 keys instead of 16,384: far fewer FLOPs
    assert model_flops_per_token(windowed, parameters, 32768, window=True) < 0.5 * (
        6 * parameters + 6 * 12 * 768 * 32768)


@pytest.mark.parametrize(
    ("kernel", "parents", "part"),
    [
        ("attn_fwd_kernel", [], "attention"),
        ("triton_poi_fused_mul_silu_0", ["## Call CompiledFxGraph ##"], "norms, RoPE, SwiGLU, other elementwise"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", ["aten::mm", "aten::linear"], "matmuls"),
        ("nvjet_tst_128x256", ["aten::mm"], "matmuls"),
        ("void at::native::elementwise_kernel", ["aten::mul_", "Optimizer.step#AdamW.step"], "optimizer"),
        ("void at::native::cunn_SoftMaxForward", ["aten::_log_softmax", "aten::cross_entropy"], "loss"),
        ("Memcpy HtoD (Pageable -> Device)", [], "data (host to device)"),
    ],
)
def test_profile_classifier(kernel, parents, part):
    assert classify(kernel, parents) == part


def test_targets_judge_the_measured_ratios():
    def record(name, **values):
        return {"name": name, "kind": "step", "status": "ok", **values}

    summary = {"records": [
        record("genoformer-causal-8k-compiled", mfu=0.46, tokens_per_s=1300.0),
        record("flex-causal-8k-compiled", mfu=0.30, tokens_per_s=1000.0),
        {"name": "genoformer-causal-128k-compiled", "kind": "step", "status": "OOM"},
        record("genoformer-causal-128k-compiled-ckpt", peak_gib=70.0),
    ]}
    verdicts = {row["target"]: row["status"] for row in targets(summary)}
    assert verdicts["8k compiled MFU"] == "MET"
    assert verdicts["8k compiled vs plain PyTorch + compiled Flex"] == "MET"  # exactly 1.30x
    assert verdicts["8k eager MFU"] == "not measured"
    assert verdicts["128k trains on one GPU (batch 1)"] == "MET"  # with activation checkpointing


def test_long_context_lines_quote_the_window_cases_and_the_checkpointing_retry():
    def record(name, **values):
        return {"name": name, "kind": "step", "status": "ok", "impl": "genoformer", "mode": "compiled", **values}

    measured = dict(tokens_per_s=123456.0, step_ms=265.4, peak_gib=17.25, mfu=0.31)
    summary = {"records": [
        record("genoformer-window-32k-compiled", **measured),
        {"name": "genoformer-window-128k-compiled", "kind": "step", "status": "OOM", "impl": "genoformer"},
        record("genoformer-window-128k-compiled-ckpt", **measured),
    ]}
    lines = config_lines(summary)
    assert len(lines) == 2  # 64k was not measured
    assert lines[0].startswith("- `configs/genome_32k_gpu.yaml`")
    assert "123,456 tokens/s" in lines[0] and "peak 17.2 GiB" in lines[0] and "MFU 31.0%" in lines[0]
    assert "genoformer-window-128k-compiled-ckpt" in lines[1] and "without activation checkpointing" in lines[1]


def test_merged_runs_pair_the_two_gpu_case_with_its_own_one_gpu_twin():
    def run(command, *records, skipped=()):
        return {"command": command, "wall_s": 10.0, "records": list(records), "skipped": list(skipped),
                "environment": {}, "smoke": False, "peak_tflops": 989.0}

    def fit(name, tokens_per_s, step_ms=1.0):
        return {"name": name, "kind": "fit", "status": "ok", "tokens_per_s": tokens_per_s, "step_ms": step_ms}

    one_gpu = run("python -m benchmarks.train", fit("fit-synthetic-8k", 100.0), fit("fit-real-8k", 99.0),
                  skipped=[{"name": "ddp-synthetic-8k-x2", "status": "needs 2 GPUs"}])
    two_gpus = run("python -m benchmarks.train --cases ...", fit("fit-synthetic-8k", 110.0, step_ms=2.0),
                   fit("ddp-synthetic-8k-x2", 209.0))
    merged = merge_runs([one_gpu, two_gpus])
    assert merged["skipped"] == [] and merged["wall_s"] == 20.0
    assert "; then " in merged["command"]
    verdicts = {row["target"]: row for row in targets(merged)}
    assert verdicts["2 GPUs (DDP) vs 1 GPU, 8k, Trainer.fit"]["measured"].startswith("1.90x")  # 209 / 110
    # the real-data case pairs with the synthetic case of its own run (1.0 ms), not the other's (2.0)
    assert verdicts["real data module vs batch on the GPU, step time"]["measured"].startswith("+0.0%")
    assert merge_runs([merged]) == merged  # a merged file renders as it is
