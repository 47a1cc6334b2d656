"""benchmarks/plugin.py: its smoke run measures every section a CPU runs, with the checks each
section makes before it times; a GPU run's sections, one result file per process, join into one
result whose targets are judged from the numbers."""

from __future__ import annotations

import pytest

from benchmarks import plugin
from benchmarks.common import describe_environment, read_result, render, write_result

CPU_SECTIONS = [name for name in plugin.SECTIONS if name not in plugin.GPU_ONLY]


def test_the_smoke_run_measures_every_section_a_cpu_runs(tmp_path):
    result = plugin.BENCHMARK.main(["--smoke", "--out", str(tmp_path)])
    saved = read_result(tmp_path / "plugin.json")
    sections = saved["data"]["sections"]
    assert sorted(sections) == sorted(CPU_SECTIONS) and not saved["data"]["errors"], saved["data"]["errors"]
    assert all(rate > 0 for rates in sections["generate"]["bases_per_second"].values() for rate in rates.values())
    assert sections["generate"]["greedy_bases_equal_to_today"] == {"today": 1.0, "decode kernel": 1.0}
    assert all(row["error vs float64"] < 1e-5 for row in sections["decode"]["rows"])  # float32 on a CPU
    assert sections["mutagenesis"]["llr_max_abs_diff_bits"] < 1e-3
    assert max(sections["hf"]["logits_max_abs_diff_vs_sdpa"].values()) < 1e-4
    assert abs(sections["fp8_budget"]["bits_per_base_fp8"] - sections["fp8_budget"]["bits_per_base_auto"]) < 0.05
    assert len(saved["summary"]["targets"]) == 7 and not saved["summary"]["failed"]  # fp8: NOT MEASURED
    text = render(result)
    assert all(t["caption"] in text for t in saved["summary"]["tables"])


def _gpu_sections() -> dict:
    """Every section's data as a GPU run gives it (made-up numbers, the real keys)."""
    return {
        "generate": {
            "prompt_bases": 32000,
            "steps": 256,
            "greedy_steps": 64,
            "greedy_bases_equal_to_today": {"today": 1.0, "decode kernel": 1.0, "decode kernel, CUDA graph": 0.97},
            "bases_per_second": {
                "1": {"today": 100.0, "decode kernel": 150.0, "decode kernel, CUDA graph": 450.0},
                "16": {"today": 800.0, "decode kernel": 1600.0, "decode kernel, CUDA graph": 2000.0},
            },
            "section_seconds": 50.0,
        },
        "decode": {
            "rows": [
                {
                    "shape": "a",
                    "error vs float64": 1e-3,
                    "ours us": 12.0,
                    "FA2 (SDPA) us": 20.0,
                    "FA4 us": 10.0,
                    "today us": 90.0,
                },
                {
                    "shape": "b",
                    "error vs float64": 1e-3,
                    "ours us": 30.0,
                    "FA2 (SDPA) us": 40.0,
                    "FA4 error": "RuntimeError: unsupported",
                    "today us": 95.0,
                },
            ],
            "flash_attn_4": "importable",
            "tracebacks": [],
            "section_seconds": 9.0,
        },
        "mutagenesis": {
            "positions": 1000,
            "window": 1024,
            "batch_size": 64,
            "seconds": {"whole windows": [6.0, 5.0], "shared prefix": [2.5, 3.0]},
            "llr_pearson_shared_vs_whole": 0.9999,
            "llr_max_abs_diff_bits": 0.01,
            "section_seconds": 30.0,
        },
        "hf": {
            "parameters": 1_100_000_000,
            "tokens": 8192,
            "ours": "genoformer_ours",
            "logits_tokens": 2048,
            "logits_max_abs_diff_vs_sdpa": {"sdpa": 0.0, "genoformer_ours": 0.05, "genoformer": 0.05},
            "logits_max_abs": 5.0,
            "fwd_bwd_ms": {"sdpa": 200.0, "genoformer_ours": 190.0, "genoformer": 190.0},
            "section_seconds": 80.0,
        },
        "fp8": {
            "kernel": [
                {
                    "causal": True,
                    "tokens": 16384,
                    "max abs diff vs emulation": 1e-3,
                    "bf16 ms": 3.0,
                    "FP8 ms": 2.5,
                    "quantization ms": 0.5,
                },
                {
                    "causal": False,
                    "tokens": 16384,
                    "max abs diff vs emulation": 1e-3,
                    "bf16 ms": 6.0,
                    "FP8 ms": 3.5,
                    "quantization ms": 0.5,
                },
            ],
            "variants": 2000,
            "variants_per_second": {"bf16, window 1024": 2000.0, "FP8, window 1024": 2100.0},
            "section_seconds": 70.0,
        },
        "fp8_budget": {
            "bases": 131072,
            "context": 8192,
            "snvs": 2000,
            "window": 1024,
            "bits_per_base_auto": 1.9,
            "bits_per_base_fp8": 1.9015,
            "llr_pearson_fp8_vs_bf16": 0.9992,
            "llr_max_abs_diff_bits": 0.1,
            "llr_std_bits": 1.0,
            "section_seconds": 20.0,
        },
    }


def _result_file(tmp_path, name: str, sections: dict, errors: dict):
    data = {"sections": sections, "errors": errors, "tracebacks": [f"== {n}\n..." for n in errors]}
    command = f"python -m benchmarks.plugin --out OUT --name {name}"
    return write_result(tmp_path, plugin.BENCHMARK.result(data, name, describe_environment("cpu"), command))


def test_a_gpu_runs_sections_join_and_each_target_is_judged(tmp_path):
    sections = _gpu_sections()
    first = _result_file(
        tmp_path,
        "plugin_a",
        {k: sections[k] for k in ("generate", "decode", "mutagenesis")},
        {"hf": "OutOfMemoryError: CUDA out of memory"},
    )
    second = _result_file(tmp_path, "plugin_b", {k: sections[k] for k in ("hf", "fp8", "fp8_budget")}, {})
    joined = plugin.BENCHMARK.main(["--out", str(tmp_path / "joined"), "--from", str(first), str(second)])
    assert joined["data"]["errors"] == {} and not joined["summary"]["failed"]  # hf measured in the second run
    status = {
        t["target"].split(" ")[0] + " " + t["target"].split(" ")[1]: (t["measured"], t["status"])
        for t in joined["summary"]["targets"]
    }
    assert status == {
        "generate at": ("2.50x", "NOT MET"),  # 16 samples: 2,000 bases/s against today's 800 (1 sample: 4.5x)
        "decoding kernel": ("1.20x", "MET"),  # shape a: 12 us against FA4's 10; shape b: 30 against FA2's 40
        "mutagenesis of": ("2.00x", "MET"),  # the best round of each: 5 s and 2.5 s
        "transformers model": ("0.950x", "NOT MET"),
        "FP8 forward": ("1.20x", "NOT MET"),  # the slower of causal (1.2x) and not (1.71x)
        "FP8 bits": ("0.00150", "MET"),
        "FP8 variant": ("0.99920", "MET"),
    }
    decode_rows = next(t for t in joined["summary"]["tables"] if t["caption"].startswith("decoding"))["rows"]
    assert [r["ours / fastest of FA2, FA4"] for r in decode_rows] == pytest.approx([1.2, 0.75])


def test_a_failed_section_fails_the_run_and_says_why(tmp_path):
    failed = _result_file(
        tmp_path,
        "plugin_c",
        {"decode": _gpu_sections()["decode"]},
        {"generate": "RuntimeError: CUDA error: an illegal memory access was encountered"},
    )
    with pytest.raises(SystemExit) as exit_info:
        plugin.BENCHMARK.main(["--out", str(tmp_path), "--name", "plugin_again", "--from", str(failed)])
    assert exit_info.value.code == 1
    again = read_result(tmp_path / "plugin_again.json")
    assert any("illegal memory access" in note for note in again["summary"]["notes"])
    statuses = {t["target"].split(" ")[0]: (t["measured"], t["status"]) for t in again["summary"]["targets"]}
    assert statuses["decoding"] == ("1.20x", "MET")
    assert statuses["generate"] == (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "NOT MEASURED",
    )
    assert statuses["mutagenesis"] == ("not run", "NOT MEASURED")


def test_the_command_refuses_an_unknown_section(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plugin.BENCHMARK.main(["--out", str(tmp_path), "--device", "cpu", "--sections", "decode,decoding"])
    assert "--sections: choose from generate, decode," in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
