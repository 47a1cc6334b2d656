"""Every benchmark script's --smoke run on the CPU: it measures, writes its result file, and the
result renders with numbers in its tables (the wording is the script's business, not the test's)."""

from __future__ import annotations

import importlib
import math

import pytest

from benchmarks.common import read_result, render

SMOKE = {
    "attention": ["--ours", "torch", "--patterns", "causal", "bigbird", "--head-dims", "16"],
    "command_speed": [],
    "data": [],
    "ecg": [],
    "embedding_guide": [],
    "finetune_baselines": [],
    "finetune_bench": [],
    "flagship": [],
    "flash_attn_check": ["--backends", "triton"],
    "flash_params": ["--rounds", "1"],
    "generate_bench": [],
    "gluon_bench": [],
    "head_dims": [],
    "hf_export": [],
    "integrity": [],
    "host_overhead": [],
    "kernel_variants": [],
    "million": ["--step", "memory", "--budget-s", "1"],
    "mutagenesis_bench": [],
    "packed": [],
    "sanitize": [],
    "scoring_speed": [],
    "timeseries_datasets": [],
    "train": [],
    "train_step": [],
}
"""Module -> extra options of its smoke run."""


@pytest.mark.parametrize("module", sorted(SMOKE))
def test_a_smoke_run_produces_numbers_and_renders_them(module, tmp_path):
    benchmark = importlib.import_module(f"benchmarks.{module}").BENCHMARK
    result = benchmark.main(["--smoke", "--out", str(tmp_path), *SMOKE[module]])
    saved = read_result(tmp_path / f"{result['name']}.json")
    tables = saved["summary"]["tables"]
    assert tables and all(t["rows"] for t in tables)
    numbers = [
        v
        for t in tables
        for row in t["rows"]
        for v in row.values()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    assert numbers and any(math.isfinite(v) and v != 0 for v in numbers)
    text = render(saved)
    assert text.startswith(f"## {saved['title']}\n") and f"`python -m benchmarks.{module}" in text
    assert all(str(t["columns"][0]) in text for t in tables)
