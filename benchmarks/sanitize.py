"""compute-sanitizer (memcheck, racecheck) over genoformer's Triton attention kernels.

    python -m benchmarks.sanitize --out DIR                  (on a CUDA GPU with the CUDA toolkit)
    python -m benchmarks.sanitize --out DIR --smoke          (a CPU check of the harness: the same
                                                              cases, tiny, interpreted, no sanitizer)

For each tool, one child process runs under `compute-sanitizer --tool TOOL` and calls the forward
and backward of `triton_attention` on every case below: lengths that are not a multiple of any
tile (97, 333, 520), grouped-query heads, key padding with an empty batch row, block-sparse
layouts with per-head patterns and empty query-block rows, causal and not, head dims 16 to 256 including the
padded ones (24, 40: the kernels pad them to the next multiple of 16 and must never read the
padding), bfloat16 and float16. Under memcheck every candidate launch configuration of the GPU's table runs
once per case (`--default-config-only`: only the default one); racecheck, much slower per
launch, runs the default configuration. The child checks each result
against the float64 reference, so a kernel that silently did nothing is caught too.

PyTorch's caching allocator is switched off in the child (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each
tensor is its own allocation, so memcheck sees a read one element past a tensor as out of bounds
instead of landing inside a cached segment.

Writes DIR/<tool>.log (the sanitizer's report), DIR/<tool>_cases.json (per-case errors relative to
the float64 reference), DIR/summary.json and DIR/summary.md, and prints a short table last. Exit status 0
when every tool reports no error and every case matches the reference.

Shape legend: q (B, H, L, D); k, v (B, HKV, L, D); layouts (H_l, Mb, Nb).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

TOOLS = ("memcheck", "racecheck")
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention call: shapes, masking and dtype."""

    name: str
    B: int
    H: int
    HKV: int
    L: int
    D: int
    causal: bool = False
    kv_lens: Optional[tuple[int, ...]] = None
    layout: Optional[str] = None  # "sliding", "bigbird" (per head) or "empty_rows" (per head)
    block_size: int = 64
    dtype: str = "bfloat16"

    def smoke(self) -> Case:
        """The same case at interpreter size: short, blocks of 16, head dim 16 unless it is a
        padded one (not a multiple of 16)."""
        length = min(self.L, 50)
        lens = None if self.kv_lens is None else tuple(min(n, length - 7) if n else 0 for n in self.kv_lens)
        return dataclasses.replace(self, L=length, D=self.D if self.D % 16 else 16, kv_lens=lens, block_size=16)


CASES = (
    Case("causal_odd_length", B=2, H=4, HKV=4, L=97, D=64, causal=True),
    Case("causal_gqa_4_to_1", B=1, H=4, HKV=1, L=520, D=128, causal=True),
    Case("padding_empty_row_gqa", B=2, H=4, HKV=2, L=333, D=64, kv_lens=(200, 0)),
    Case("causal_padding_fp16", B=2, H=2, HKV=1, L=333, D=64, causal=True, kv_lens=(333, 45), dtype="float16"),
    Case("sliding_window_causal", B=1, H=2, HKV=1, L=520, D=64, causal=True, layout="sliding"),
    Case("bigbird_per_head_padding", B=2, H=4, HKV=2, L=520, D=128, layout="bigbird", kv_lens=(520, 301)),
    Case("empty_block_rows_causal", B=1, H=2, HKV=2, L=333, D=64, causal=True, layout="empty_rows", block_size=32),
    Case("bigbird_block128_causal", B=1, H=2, HKV=2, L=333, D=64, causal=True, layout="bigbird", block_size=128),
    Case("head_dim_16", B=1, H=2, HKV=1, L=97, D=16, causal=True),
    Case("head_dim_32_sparse", B=1, H=2, HKV=2, L=130, D=32, layout="bigbird", block_size=32),
    Case("head_dim_256", B=1, H=2, HKV=2, L=97, D=256, causal=True),
    Case("head_dim_40_padded", B=1, H=2, HKV=1, L=130, D=40, causal=True, kv_lens=(111,)),
    Case("head_dim_24_padded_sparse", B=2, H=2, HKV=2, L=97, D=24, layout="bigbird", block_size=32, kv_lens=(97, 0)),
)


# ------------------------------------------------------------------------------ the child: cases
def _layout(case: Case):
    import torch

    from genoformer.kernels.layout import BlockLayout

    if case.layout is None:
        return None
    if case.layout == "sliding":
        return BlockLayout.sliding_window(case.L, 2 * case.block_size, block_size=case.block_size)
    if case.layout == "bigbird":
        return BlockLayout.bigbird(case.L, case.block_size, 1, 1, block_size=case.block_size, seed=3, num_heads=case.H)
    n = -(-case.L // case.block_size)
    generator = torch.Generator().manual_seed(4)
    mask_HMN = torch.rand(case.H, n, n, generator=generator) < 0.5
    mask_HMN[0, 1] = False  # query block 1 of head 0 sees nothing
    mask_HMN[-1, n - 1] = False  # nor the last (ragged) query block of the last head
    return BlockLayout.from_block_mask(mask_HMN, case.L, case.L, case.block_size)


def run_case(case: Case, device: str) -> dict:
    """Forward and backward of one case; the largest error of out, dq, dk, dv against float64."""
    import torch

    from genoformer.kernels.reference import reference_attention
    from genoformer.kernels.triton_flash import triton_attention

    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, case.dtype)
    shapes = {"q": (case.B, case.H, case.L, case.D), "k": (case.B, case.HKV, case.L, case.D),
              "v": (case.B, case.HKV, case.L, case.D), "do": (case.B, case.H, case.L, case.D)}
    exact = {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in shapes.items()}
    layout = _layout(case)
    kv_lens = None if case.kv_lens is None else torch.tensor(case.kv_lens, dtype=torch.int32)
    kwargs = dict(causal=case.causal, layout=layout)

    def forward_backward(fn, tensors, lens):
        q, k, v = (tensors[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v"))
        out = fn(q, k, v, kv_lens=lens, **kwargs)
        out.backward(tensors["do"])
        return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}

    low = {name: t.to(device=device, dtype=dtype) for name, t in exact.items()}
    result = forward_backward(triton_attention, low, None if kv_lens is None else kv_lens.to(device))
    if device == "cuda":
        torch.cuda.synchronize()
    rounded = {name: t.to(dtype).double() for name, t in exact.items()}  # the inputs the kernel saw
    expected = forward_backward(reference_attention, rounded, kv_lens)
    # error relative to the largest expected value: a few roundings of the dtype for a working
    # kernel, about 1 for one that skipped work or wrote the wrong rows
    errors = {name: float((value.double().cpu() - expected[name]).abs().max()
                          / expected[name].abs().max().clamp(min=1e-9)) for name, value in result.items()}
    finite = all(bool(torch.isfinite(value).all()) for value in result.values())
    tolerance = 0.05 if case.dtype == "bfloat16" else 0.01
    return {"case": case.name, "relative_errors": errors, "finite": finite,
            "ok": finite and max(errors.values()) <= tolerance}


def _run_every_candidate() -> None:
    """Make the launchers run every candidate configuration once (then keep the default)."""
    from genoformer.kernels import triton_flash

    def every_candidate(key, candidates, run, device):
        for candidate in candidates[1:]:
            run(candidate)
        return candidates[0]

    triton_flash.choose_config = every_candidate


def child(results_path: Path, smoke: bool, all_configs: bool) -> int:
    device = "cpu" if smoke else "cuda"
    if all_configs and not smoke:
        _run_every_candidate()
    results = []
    for case in CASES:
        case = case.smoke() if smoke else case
        started = time.perf_counter()
        try:
            result = run_case(case, device)
        except Exception as error:  # recorded, and the other cases still run under the tool
            result = {"case": case.name, "relative_errors": {}, "finite": False, "ok": False, "error": repr(error)}
        result["seconds"] = round(time.perf_counter() - started, 2)
        results.append(result)
        worst = max(result["relative_errors"].values(), default=float("nan"))
        print(f"case {case.name}: {'ok' if result['ok'] else 'WRONG ' + result.get('error', '')} "
              f"max relative error {worst:.3g} ({result['seconds']} s)", flush=True)
    results_path.write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


# ----------------------------------------------------------------------------- the parent: tools
def find_sanitizer() -> Optional[str]:
    """compute-sanitizer on PATH, in a CUDA toolkit, or from the nvidia-cuda-sanitizer-api wheel."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    patterns = ["/usr/local/cuda*/bin/compute-sanitizer", "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
                "/opt/nvidia/*/compute-sanitizer/compute-sanitizer"]
    patterns += [os.path.join(p, "nvidia", "cuda_sanitizer_api", "compute-sanitizer", "compute-sanitizer")
                 for p in sys.path if p]
    for pattern in patterns:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[-1]
    return None


def parse_report(text: str, tool: str) -> dict:
    """The counts in a compute-sanitizer report: errors (and hazards/warnings for racecheck)."""
    summary: dict = {"tool": tool, "errors": None, "warnings": 0, "kernels": []}
    match = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if match:
        summary["errors"] = int(match.group(1))
    race = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    if race:
        summary["errors"] = int(race.group(2))
        summary["warnings"] = int(race.group(3))
    summary["kernels"] = sorted(set(re.findall(r"\b(\w+_kernel)\b", text)))  # named in the report
    return summary


def run_tool(tool: str, sanitizer: str, out: Path, all_configs: bool, timeout: int) -> dict:
    log = out / f"{tool}.log"
    cases = out / f"{tool}_cases.json"
    command = [sanitizer, "--tool", tool, "--log-file", str(log), "--print-limit", "50",
               sys.executable, "-m", "benchmarks.sanitize", "--child", str(cases)]
    if not all_configs:
        command.append("--default-config-only")
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GENOFORMER_TRITON_AUTOTUNE": "0"}
    env.pop("TRITON_INTERPRET", None)
    started = time.perf_counter()
    try:
        process = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        status, output = process.returncode, process.stdout + process.stderr
    except subprocess.TimeoutExpired as expired:
        status, output = "timeout", f"{expired.stdout or ''}{expired.stderr or ''}"
    seconds = round(time.perf_counter() - started, 1)
    (out / f"{tool}.stdout.txt").write_text(output if isinstance(output, str) else output.decode())
    summary = parse_report(log.read_text() if log.exists() else "", tool)
    summary.update(exit_status=status, seconds=seconds, command=" ".join(command), all_configs=all_configs)
    summary["cases"] = json.loads(cases.read_text()) if cases.exists() else []
    summary["clean"] = (status == 0 and summary["errors"] == 0 and len(summary["cases"]) == len(CASES)
                        and all(c["ok"] for c in summary["cases"]))
    return summary


def describe_case(case: Case) -> str:
    parts = [f"B={case.B} H={case.H} HKV={case.HKV} L={case.L} D={case.D} {case.dtype}"]
    if case.causal:
        parts.append("causal")
    if case.layout:
        parts.append(f"layout={case.layout} (blocks of {case.block_size})")
    if case.kv_lens:
        parts.append(f"kv_lens={list(case.kv_lens)}")
    return " ".join(parts)


def write_summary(out: Path, summaries: list[dict], environment: dict) -> str:
    (out / "summary.json").write_text(json.dumps({"environment": environment, "tools": summaries}, indent=1))
    lines = ["| tool | launch configs | errors | warnings | cases matching float64 | seconds | result |",
             "|---|---|---|---|---|---|---|"]
    for s in summaries:
        matched = sum(c["ok"] for c in s["cases"])
        configs = "every candidate" if s.get("all_configs") else "default"
        lines.append(f"| {s['tool']} | {configs} | {s['errors']} | {s['warnings']} | {matched}/{len(CASES)} | "
                     f"{s['seconds']} | "
                     f"{'clean' if s['clean'] else 'FAILED (exit ' + str(s['exit_status']) + ')'} |")
    table = "\n".join(lines)
    cases = "\n".join(f"- `{c.name}`: {describe_case(c)}" for c in CASES)
    env = ", ".join(f"{k} {v}" for k, v in environment.items())
    (out / "summary.md").write_text(f"## compute-sanitizer over the Triton kernels\n\n{env}\n\n{table}\n\nCases "
                                    f"(forward and backward each):\n{cases}\n")
    return table


def _environment(smoke: bool) -> dict:
    import torch

    env = {"torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "absent"
    env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() and not smoke else "cpu (interpreter)"
    return env


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the logs and the summary")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated compute-sanitizer tools")
    parser.add_argument("--default-config-only", action="store_true",
                        help="run only the default launch configuration (faster), not every candidate")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per tool")
    parser.add_argument("--smoke", action="store_true", help="CPU: run the cases tiny under the Triton interpreter")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported
    if args.child is not None:
        return child(args.child, smoke=False, all_configs=not args.default_config_only)
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    environment = _environment(args.smoke)
    if args.smoke:
        status = child(args.out / "smoke_cases.json", smoke=True, all_configs=False)
        cases = json.loads((args.out / "smoke_cases.json").read_text())
        summaries = [{"tool": "none (smoke)", "errors": None, "warnings": 0, "seconds": 0, "exit_status": status,
                      "cases": cases, "clean": status == 0, "kernels": []}]
    else:
        sanitizer = find_sanitizer()
        if sanitizer is None:
            print("compute-sanitizer not found: install the CUDA toolkit (or pip install "
                  "nvidia-cuda-sanitizer-api-cu12) or put it on PATH", file=sys.stderr)
            return 2
        environment["compute-sanitizer"] = sanitizer
        summaries = [run_tool(tool, sanitizer, args.out, tool == "memcheck" and not args.default_config_only,
                              args.timeout) for tool in args.tools.split(",")]
    print(write_summary(args.out, summaries, environment))
    return 0 if all(s["clean"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
