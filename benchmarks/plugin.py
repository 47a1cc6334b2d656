"""Issue 47's GPU figures in one run: transformers models on our kernels, decoding over a key/value
cache, mutagenesis by shared prefixes, FP8 inference; each against its baseline in the same run.

    python -m benchmarks.plugin --out $OUT/plugin                      # every section (H100/H200, ~6 min)
    python -m benchmarks.plugin --out DIR --sections fp8_budget,mutagenesis --device cpu --positions 50 \
        --budget-bases 16384 --budget-context 2048 --budget-snvs 200   # the CPU's smaller versions

Sections (each checks its numbers first, then times; a section that fails is recorded with its
error and the next one runs):
- hf: a 1B-class Llama (16 layers, width 2048, 32 heads of 64, 8 kv heads, random weights, bf16)
  forward + backward on 8,192 tokens with attn_implementation "sdpa", "genoformer_triton" (our
  Triton kernels) and "genoformer" (auto); the logits of the three at 8k (target: ours <= 0.9x
  SDPA's time).
- generate: the shipped model (examples/genoformer_dna.ckpt) generating after a 32,000-base prompt
  (a 32k cache), 1 and 16 samples: today's path (each step's attention through the dispatcher,
  launched one kernel at a time), the decoding kernel launched one by one, and the decoding kernel
  in a CUDA graph; bases per second over 256 steps, the prefill subtracted (target: >= 3x today's).
- decode: the decoding kernel against FlashAttention-2 through SDPA and flash-attn-4 (when
  installed), one query per row over a 32k cache, at the shipped model's shape and a GQA shape
  (target: within 1.2x); the kernel's error against the float64 reference first.
- mutagenesis: 1,000 positions of held-out E. coli DNA at the default window (1,024), whole
  windows (today) against shared prefixes; the llr of both compared (target: >= 1.5x faster). Runs
  on the CPU too (--device cpu).
- fp8: the FP8 forward (quantization included, and without it) against our bf16 Triton forward
  at 16k, D 128, causal and not (target >= 1.5x), its error against its emulation first; bits per
  base of held-out DNA in bf16 and FP8 (target: within 0.002) and 2,000 SNVs' llr (target: Pearson
  r >= 0.999), held-out being the last 3% of E. coli K-12 (examples/, never trained on); the
  shipped model's variant-scoring throughput (variants per second, window 1,024 and 8,192).
- fp8_budget: bits per base and SNV scores in bf16 (autocast) and FP8 on any device (the CPU
  runs the emulation; smaller sizes).

Writes OUT/plugin.json and OUT/plugin.md (`benchmarks.common.publish`).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import traceback
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table, median, publish
from benchmarks.common import synchronize, time_calls

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "examples" / "genoformer_dna.ckpt"
ECOLI = ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"
HELD_OUT = (4_500_485, 4_639_675)
"""The last 3% of E. coli K-12 (0-based, end exclusive): the shipped model's held-out test region."""
SECTIONS = ("hf", "generate", "decode", "mutagenesis", "fp8")


def _ecoli() -> np.ndarray:
    from genoformer.data.genome.inputs import read_sequences

    return next(iter(read_sequences([str(ECOLI)]))).codes


def _seconds(fn) -> float:
    """Wall-clock seconds of fn(), the GPU's queue drained before and after."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    synchronize(device)
    began = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - began


# --------------------------------------------------------------------------------------------- hf
def section_hf(args) -> dict:
    import transformers

    from genoformer.kernels import transformers_attention
    from genoformer.kernels.backend import Backend

    ours = transformers_attention.register("genoformer_triton", Backend.TRITON)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.randint(0, 32000, (1, args.hf_tokens), device="cuda")
    logits = {}
    for implementation in ("sdpa", ours, "genoformer"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits[implementation] = model(ids[:, :2048]).logits.float()
    result = {"parameters": sum(p.numel() for p in model.parameters()), "tokens": args.hf_tokens,
              "logits_max_abs_diff_vs_sdpa_2k": {k: (v - logits["sdpa"]).abs().max().item() for k, v in logits.items()}}

    def step():
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    times = {}
    for implementation in ("sdpa", ours, "genoformer"):
        model.set_attn_implementation(implementation)
        times[implementation] = median(time_calls(step, torch.device("cuda"), warmup=2, calls=args.calls))
    result["fwd_bwd_ms"] = times
    result["ratio_ours_over_sdpa"] = times[ours] / times["sdpa"]
    result["ratio_auto_over_sdpa"] = times["genoformer"] / times["sdpa"]
    result["target_met"] = result["ratio_ours_over_sdpa"] <= 0.9
    return result


# --------------------------------------------------------------------------------------- generate
def _legacy_decode_attention(q, k, v, cache_seqlens=None, *, causal=True, scale=None, backend="auto", num_splits=0):
    """The decoding step's attention before the decoding kernel: the dispatcher's attention of one
    query over the cached keys (no mask), one program per (row, head)."""
    from genoformer.kernels.dispatch import attention

    assert q.shape[2] == 1 and cache_seqlens is None
    return attention(q, k, v, causal=False, backend=backend)


def section_generate(args) -> dict:
    from genoformer.core import transformer
    from genoformer.genome.generate import Generator

    codes = _ecoli()[: args.prompt]
    generator = Generator.from_checkpoint(SHIPPED, device="cuda")
    paths = {
        "today": dict(cuda_graphs=False, legacy=True),
        "decode_kernel": dict(cuda_graphs=False, legacy=False),
        "decode_kernel_cuda_graph": dict(cuda_graphs=True, legacy=False),
    }

    def run(path, length, samples, **options):
        generator.cuda_graphs = paths[path]["cuda_graphs"]
        patch = (mock.patch.object(transformer, "decode_attention", _legacy_decode_attention)
                 if paths[path]["legacy"] else contextlib.nullcontext())
        with patch:
            return generator.generate(codes, length, seed=1, num_samples=samples, batch_size=samples,
                                      context=32768, **options)

    result = {"prompt_bases": len(codes), "steps": args.steps}
    # the same greedy bases first (bf16: a near-tie may still differ between kernels)
    greedy = {path: run(path, 64, 1, top_k=1) for path in paths}
    result["greedy_bases_equal_to_today"] = {p: float((g == greedy["today"]).mean()) for p, g in greedy.items()}
    for samples in (1, 16):
        rates = {}
        for path in paths:
            run(path, 4, samples)  # warm-up: kernels compiled, graph captured
            whole = _seconds(lambda: run(path, args.steps + 1, samples))
            prefill = _seconds(lambda: run(path, 1, samples))
            rates[path] = samples * args.steps / max(whole - prefill, 1e-9)
        result[f"bases_per_second_{samples}_samples"] = rates
        result[f"speedup_{samples}_samples"] = {p: r / rates["today"] for p, r in rates.items()}
    result["target_met"] = max(result["speedup_1_samples"]["decode_kernel_cuda_graph"],
                               result["speedup_16_samples"]["decode_kernel_cuda_graph"]) >= 3
    return result


# ----------------------------------------------------------------------------------------- decode
def section_decode(args) -> dict:
    import importlib.util

    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from genoformer.kernels.kvcache import decode_attention, kvcache_reference

    rows = []
    for B, H, HKV, D in ((16, 4, 4, 64), (8, 32, 8, 128)):
        C = args.cache
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, H, 1, D, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, HKV, C, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, HKV, C, D, device="cuda", generator=g, dtype=torch.bfloat16)
        ours = lambda: decode_attention(q, k, v, backend="triton")  # noqa: E731
        exact, _ = kvcache_reference(q[:2].double(), k[:2].double(), v[:2].double(),
                                     torch.full((2,), C, dtype=torch.int32, device="cuda"), scale=D ** -0.5,
                                     causal=True)
        row = {"shape": f"B{B} H{H} HKV{HKV} D{D} cache {C}",
               "error_vs_float64": (ours()[:2].double() - exact).abs().max().item()}
        row["ours_us"] = 1e3 * triton.testing.do_bench(ours, warmup=25, rep=200)

        def fa2():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=H != HKV)

        try:
            row["sdpa_flash_us"] = 1e3 * triton.testing.do_bench(fa2, warmup=25, rep=200)
        except RuntimeError as error:
            row["sdpa_flash_us"] = None
            row["sdpa_flash_error"] = str(error).splitlines()[0]
        if importlib.util.find_spec("flash_attn") is not None:
            try:
                from flash_attn.cute import flash_attn_func

                q4, k4, v4 = (t.transpose(1, 2) for t in (q, k, v))
                row["flash_attn_4_us"] = 1e3 * triton.testing.do_bench(lambda: flash_attn_func(q4, k4, v4),
                                                                       warmup=25, rep=200)
            except Exception as error:  # reported in the table, the section goes on
                row["flash_attn_4_error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        best = min(t for t in (row.get("sdpa_flash_us"), row.get("flash_attn_4_us")) if t) if (
            row.get("sdpa_flash_us") or row.get("flash_attn_4_us")) else None
        row["ours_over_best"] = row["ours_us"] / best if best else None
        rows.append(row)
    return {"rows": rows, "target_met": all(r["ours_over_best"] is not None and r["ours_over_best"] <= 1.2
                                            for r in rows)}


# ------------------------------------------------------------------------------------ mutagenesis
def section_mutagenesis(args) -> dict:
    from genoformer.data.genome.regions import Region
    from genoformer.genome.mutagenesis import GPU_BATCH_SIZE, saturation_mutagenesis
    from genoformer.genome.scoring import Scorer

    scorer = Scorer.from_checkpoint(SHIPPED, device=args.device)
    reference = {"ecoli": _ecoli()}
    start = HELD_OUT[0] + 20_000
    regions = [Region("ecoli", start, start + args.positions, "held-out")]
    batch_size = GPU_BATCH_SIZE if scorer.device.type == "cuda" else 8  # the command's defaults

    def run(whole: bool):
        patch = mock.patch.object(Scorer, "can_continue", property(lambda self: False)) if whole else \
            contextlib.nullcontext()
        with patch:
            return saturation_mutagenesis(scorer, reference, regions, window=1024, batch_size=batch_size,
                                          progress=False)[0]

    shared, whole = run(False), run(True)  # warm-up and the check
    ok = np.isfinite(shared) & np.isfinite(whole)
    times = {"whole_windows_s": [], "shared_prefix_s": []}
    for _ in range(args.rounds):
        times["whole_windows_s"].append(_seconds(lambda: run(True)))
        times["shared_prefix_s"].append(_seconds(lambda: run(False)))
    best = {name: min(values) for name, values in times.items()}
    return {"positions": args.positions, "window": 1024, "batch_size": batch_size,
            "llr_pearson_shared_vs_whole": float(np.corrcoef(shared[ok], whole[ok])[0, 1]),
            "llr_max_abs_diff_bits": float(np.abs(shared[ok] - whole[ok]).max()),
            "seconds": times, "speedup": best["whole_windows_s"] / best["shared_prefix_s"],
            "target_met": best["whole_windows_s"] / best["shared_prefix_s"] >= 1.5}


# ---------------------------------------------------------------------------------------------- fp8
def _snvs(codes: np.ndarray, count: int, seed: int):
    from genoformer.genome.variants import Allele

    rng = np.random.default_rng(seed)
    positions = np.sort(rng.choice(np.arange(HELD_OUT[0] + 5_000, HELD_OUT[1] - 5_000), count, replace=False))
    alleles = []
    for p in positions:
        ref = "ACGTN"[codes[p]]
        if ref == "N":
            continue
        alleles.append(Allele("ecoli", int(p), ref, rng.choice([b for b in "ACGT" if b != ref])))
    return alleles


def _budget(device: str, bases: int, context: int, snvs: int, window: int) -> dict:
    """Bits per base of held-out E. coli and SNV llr, bf16 against FP8 (the emulation on a CPU)."""
    from genoformer.genome.scoring import Scorer
    from genoformer.genome.variants import allele_effects

    codes = _ecoli()
    held_out = codes[HELD_OUT[0]:HELD_OUT[0] + bases]
    alleles = _snvs(codes, snvs, seed=3)
    out = {"bases": len(held_out), "context": context, "snvs": len(alleles), "window": window, "device": device}
    scores = {}
    for backend in ("auto", "fp8"):
        scorer = Scorer.from_checkpoint(SHIPPED, device=device, backend=backend)
        scorer.autocast_dtype = torch.bfloat16  # bf16 on the CPU too: the baseline FP8 is judged against
        log2p = scorer.log2_likelihood(held_out, context=context, overlap=context // 2, batch_size=4)
        out[f"bits_per_base_{backend}"] = float(-np.nanmean(log2p))
        scores[backend] = allele_effects(scorer, {"ecoli": codes}, alleles, window=window, batch_size=16,
                                         progress=False)
    out["bits_per_base_diff"] = out["bits_per_base_fp8"] - out["bits_per_base_auto"]
    out["llr_pearson_fp8_vs_bf16"] = float(np.corrcoef(scores["auto"], scores["fp8"])[0, 1])
    out["llr_max_abs_diff_bits"] = float(np.abs(scores["auto"] - scores["fp8"]).max())
    out["targets_met"] = abs(out["bits_per_base_diff"]) <= 0.002 and out["llr_pearson_fp8_vs_bf16"] >= 0.999
    return out


def section_fp8(args) -> dict:
    import triton.testing

    from genoformer.genome.scoring import Scorer
    from genoformer.genome.variants import allele_effects
    from genoformer.kernels.triton_flash import triton_attention
    from genoformer.kernels.triton_fp8 import KB, QB, emulated_fp8_attention, fp8_candidates, fp8_fwd, quantize_blocks

    result = {"kernel": []}
    for causal in (True, False):
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(1, 16, args.fp8_tokens, 128, device="cuda", generator=g, dtype=torch.bfloat16)
                   for _ in range(3))
        with torch.no_grad():
            fp8 = fp8_fwd(q, k, v, None, causal, 128 ** -0.5, config=fp8_candidates(128)[0])  # keys 128 at a time
            emulated = emulated_fp8_attention(q[:, :2], k[:, :2], v[:, :2], causal=causal, kv_lens=None,
                                              scale=128 ** -0.5)
            bf16 = lambda: triton_attention(q, k, v, causal=causal)  # noqa: E731
            quantize = lambda: [quantize_blocks(q, QB), quantize_blocks(k, KB), quantize_blocks(v, KB, transpose=True)]  # noqa: E731
            row = {"causal": causal, "tokens": args.fp8_tokens, "heads": 16, "head_dim": 128,
                   "max_abs_diff_vs_emulation": (fp8[:, :2].float() - emulated.float()).abs().max().item(),
                   "bf16_ms": triton.testing.do_bench(bf16, warmup=25, rep=100),
                   "fp8_ms": triton.testing.do_bench(lambda: fp8_fwd(q, k, v, None, causal, 128 ** -0.5),
                                                     warmup=25, rep=100),
                   "quantize_ms": triton.testing.do_bench(quantize, warmup=10, rep=50)}
        row["speedup"] = row["bf16_ms"] / row["fp8_ms"]
        row["speedup_without_quantization"] = row["bf16_ms"] / (row["fp8_ms"] - row["quantize_ms"])
        result["kernel"].append(row)
    result["budget"] = _budget("cuda", args.budget_bases, 8192, args.budget_snvs, 1024)
    codes = _ecoli()
    alleles = _snvs(codes, args.throughput_snvs, seed=4)
    throughput = {}
    for backend in ("auto", "fp8"):
        for window in (1024, 8192):
            scorer = Scorer.from_checkpoint(SHIPPED, device="cuda", backend=backend)
            batch = 64 if window == 1024 else 8
            allele_effects(scorer, {"ecoli": codes}, alleles[:64], window=window, batch_size=batch, progress=False)
            seconds = _seconds(lambda: allele_effects(scorer, {"ecoli": codes}, alleles, window=window,
                                                      batch_size=batch, progress=False))
            throughput[f"{backend}_window_{window}"] = len(alleles) / seconds
    result["variants_per_second"] = throughput
    result["gpu_days_per_million_variants"] = {k: 1e6 / v / 86400 for k, v in throughput.items()}
    result["target_met"] = min(r["speedup"] for r in result["kernel"]) >= 1.5 and result["budget"]["targets_met"]
    return result


def section_fp8_budget(args) -> dict:
    return _budget(args.device, args.budget_bases, args.budget_context, args.budget_snvs, args.budget_window)


# ---------------------------------------------------------------------------------------- report
def render(summary: dict) -> str:
    lines = [environment_markdown(summary["environment"], summary["command"]), ""]
    for name, value in summary["sections"].items():
        lines.append(f"### {name}\n")
        if "error" in value:
            lines.append(f"Failed: `{value['error']}`\n")
            continue
        if name == "decode":
            lines.append(markdown_table(value["rows"]) + "\n")
            continue
        if name == "fp8":
            lines.append(markdown_table(value["kernel"]) + "\n")
            value = {key: val for key, val in value.items() if key != "kernel"}
        lines.append(markdown_table([{"figure": key, "value": val if not isinstance(val, dict) else
                                      ", ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}"
                                                for k, v in val.items())} for key, val in value.items()]) + "\n")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for plugin.json and plugin.md")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)}, fp8_budget")
    parser.add_argument("--device", default="cuda",
                        help="cuda, or cpu for the sections that run there: fp8_budget (the emulation), mutagenesis")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per measurement (hf)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (mutagenesis)")
    parser.add_argument("--hf-tokens", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=32000, help="generate: prompt bases (the cache)")
    parser.add_argument("--steps", type=int, default=256, help="generate: timed steps")
    parser.add_argument("--cache", type=int, default=32768, help="decode: cache positions")
    parser.add_argument("--positions", type=int, default=1000, help="mutagenesis: positions")
    parser.add_argument("--fp8-tokens", type=int, default=16384)
    parser.add_argument("--budget-bases", type=int, default=131072)
    parser.add_argument("--budget-context", type=int, default=8192)
    parser.add_argument("--budget-snvs", type=int, default=2000)
    parser.add_argument("--budget-window", type=int, default=1024)
    parser.add_argument("--throughput-snvs", type=int, default=4000)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in names if name not in (*SECTIONS, "fp8_budget")]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {', '.join((*SECTIONS, 'fp8_budget'))}")
    device = args.device if set(names) <= {"fp8_budget", "mutagenesis"} else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("these sections need a CUDA GPU; on a CPU run --sections fp8_budget,mutagenesis --device cpu")
    summary = {"environment": describe_environment(device), "command": command_line(), "sections": {}}
    for name in names:
        began = time.perf_counter()
        try:
            summary["sections"][name] = globals()[f"section_{name}"](args)
        except Exception as error:  # recorded with its traceback; the other sections still run
            traceback.print_exc()
            summary["sections"][name] = {"error": f"{type(error).__name__}: {error}"}
        summary["sections"][name]["seconds"] = round(time.perf_counter() - began, 1)
        print(f"{name}: {summary['sections'][name]}", flush=True)
        publish(args.out, "plugin", summary, render(summary))


if __name__ == "__main__":
    main()
