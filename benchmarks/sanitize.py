"""compute-sanitizer (memcheck, racecheck) over genoformer's Triton attention kernels.

For each tool, one child process runs under `compute-sanitizer --tool TOOL` and calls the forward
and backward of `triton_attention` on every case below: lengths that are not a multiple of any
tile, grouped-query heads, key padding with an empty batch row, block-sparse layouts with per-head
patterns and empty query-block rows, head dims 16 to 256 with the padded ones (24, 40: padded to
a multiple of 16 inside, the padding never read), bfloat16 and float16. Under memcheck every
candidate launch configuration of the GPU's table runs once per case (--default-config-only: the
default one); racecheck runs the default. The child checks every result against float64, so a
kernel that silently did nothing is caught too. PyTorch's caching allocator is off in the child
(each tensor its own allocation, so that a read past a tensor is out of bounds for memcheck).

    python -m benchmarks.sanitize --out OUT           # a GPU with the CUDA toolkit, about 2 minutes
    python -m benchmarks.sanitize --out /tmp/s --smoke    # the cases tiny, interpreted, no sanitizer

Shape legend: q (B, H, L, D); k, v (B, HKV, L, D); layouts (H_l, Mb, Nb).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO_ROOT, Benchmark, Summary, table, verdict

TOOLS = ("memcheck", "racecheck")


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
    kv_lens: tuple[int, ...] | None = None
    layout: str | None = None  # "sliding", "bigbird" (per head) or "empty_rows" (per head)
    block_size: int = 64
    dtype: str = "bfloat16"

    def smoke(self) -> Case:
        """The same case at interpreter size: short, blocks of 16, head dim 16 unless a padded one."""
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

    if case.layout == "sliding":
        return BlockLayout.sliding_window(case.L, 2 * case.block_size, block_size=case.block_size)
    if case.layout == "bigbird":
        return BlockLayout.bigbird(case.L, case.block_size, 1, 1, block_size=case.block_size, seed=3, num_heads=case.H)
    if case.layout is None:
        return None
    n = -(-case.L // case.block_size)
    mask_HMN = torch.rand(case.H, n, n, generator=torch.Generator().manual_seed(4)) < 0.5
    mask_HMN[0, 1] = False  # query block 1 of head 0 sees nothing
    mask_HMN[-1, n - 1] = False  # nor the last (ragged) query block of the last head
    return BlockLayout.from_block_mask(mask_HMN, case.L, case.L, case.block_size)


def run_case(case: Case, device: str) -> dict:
    """Forward and backward of one case; the largest error of out, dq, dk, dv against float64,
    relative to the largest expected value (a few roundings for a working kernel, about 1 for
    one that skipped work or wrote the wrong rows)."""
    import torch
    from genoformer.kernels.reference import reference_attention
    from genoformer.kernels.triton_flash import triton_attention

    generator = torch.Generator().manual_seed(0)
    shapes = {
        "q": (case.B, case.H, case.L, case.D),
        "k": (case.B, case.HKV, case.L, case.D),
        "v": (case.B, case.HKV, case.L, case.D),
        "do": (case.B, case.H, case.L, case.D),
    }
    exact = {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in shapes.items()}
    layout, dtype = _layout(case), getattr(torch, case.dtype)
    kv_lens = None if case.kv_lens is None else torch.tensor(case.kv_lens, dtype=torch.int32)

    def forward_backward(fn, tensors, lens):
        q, k, v = (tensors[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v"))
        out = fn(q, k, v, kv_lens=lens, causal=case.causal, layout=layout)
        out.backward(tensors["do"])
        return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}

    low = {name: t.to(device=device, dtype=dtype) for name, t in exact.items()}
    result = forward_backward(triton_attention, low, None if kv_lens is None else kv_lens.to(device))
    expected = forward_backward(reference_attention, {n: t.to(dtype).double() for n, t in exact.items()}, kv_lens)
    errors = {
        name: float((value.double().cpu() - expected[name]).abs().max() / expected[name].abs().max().clamp(min=1e-9))
        for name, value in result.items()
    }
    finite = all(bool(torch.isfinite(value).all()) for value in result.values())
    return {
        "case": case.name,
        "relative_errors": errors,
        "ok": finite and max(errors.values()) <= (0.05 if case.dtype == "bfloat16" else 0.01),
    }


def child(results_path: Path, smoke: bool, all_configs: bool) -> int:
    """Every case (recorded even when it raises); exit status 1 when one does not match."""
    if all_configs and not smoke:  # every candidate configuration once, then the default
        from genoformer.kernels import triton_flash

        def every_candidate(key, candidates, run, device):
            for candidate in candidates[1:]:
                run(candidate)
            return candidates[0]

        triton_flash.choose_config = every_candidate
    results = []
    for case in CASES[:3] if smoke else CASES:
        started = time.perf_counter()
        try:
            result = run_case(case.smoke() if smoke else case, "cpu" if smoke else "cuda")
        except Exception as error:  # recorded, and the other cases still run under the tool
            result = {"case": case.name, "relative_errors": {}, "ok": False, "error": repr(error)}
        results.append({**result, "seconds": round(time.perf_counter() - started, 2)})
    results_path.write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


# ----------------------------------------------------------------------------- the parent: tools
def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, in a CUDA toolkit, or from the nvidia-cuda-sanitizer-api wheel."""
    patterns = ["/usr/local/cuda*/bin/compute-sanitizer", "/usr/local/cuda*/compute-sanitizer/compute-sanitizer"]
    patterns += [
        os.path.join(p, "nvidia", "cuda_sanitizer_api", "compute-sanitizer", "compute-sanitizer") for p in sys.path if p
    ]
    found = [shutil.which("compute-sanitizer")] + [m for p in patterns for m in sorted(glob.glob(p))[-1:]]
    return next((path for path in found if path), None)


def run_tool(tool: str, sanitizer: str, work: Path, all_configs: bool, timeout: int) -> dict:
    log, cases = work / f"{tool}.log", work / f"{tool}_cases.json"
    command = [
        sanitizer,
        "--tool",
        tool,
        "--log-file",
        str(log),
        "--print-limit",
        "50",
        sys.executable,
        "-m",
        "benchmarks.sanitize",
        "--child",
        str(cases),
    ]
    command += [] if all_configs else ["--default-config-only"]
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GENOFORMER_TRITON_AUTOTUNE": "0"}
    env.pop("TRITON_INTERPRET", None)
    started = time.perf_counter()
    try:
        status = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    report = log.read_text() if log.exists() else ""
    errors = re.search(r"ERROR SUMMARY: (\d+) error", report)
    race = re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", report)
    return {
        "tool": tool,
        "all_configs": all_configs,
        "exit_status": status,
        "seconds": round(time.perf_counter() - started, 1),
        "report_tail": report[-2000:],
        "errors": int(race.group(1)) if race else int(errors.group(1)) if errors else None,
        "warnings": int(race.group(2)) if race else 0,
        "cases": json.loads(cases.read_text()) if cases.exists() else [],
    }


def arguments(parser) -> None:
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated compute-sanitizer tools")
    parser.add_argument("--default-config-only", action="store_true", help="only the default launch configuration")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per tool")


def measure(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            status = child(Path(tmp) / "cases.json", smoke=True, all_configs=False)
            tools = [
                {
                    "tool": "none (smoke)",
                    "all_configs": False,
                    "exit_status": status,
                    "seconds": 0,
                    "errors": 0,
                    "warnings": 0,
                    "cases": json.loads((Path(tmp) / "cases.json").read_text()),
                }
            ]
        else:
            sanitizer = find_sanitizer()
            if sanitizer is None:
                raise SystemExit(
                    "compute-sanitizer not found: install the CUDA toolkit (or pip install "
                    "nvidia-cuda-sanitizer-api-cu12) or put it on PATH"
                )
            tools = [
                run_tool(tool, sanitizer, Path(tmp), tool == "memcheck" and not args.default_config_only, args.timeout)
                for tool in args.tools.split(",")
            ]
    return {"tools": tools}


def summarize(data: dict) -> Summary:
    rows, targets = [], []
    for t in data["tools"]:
        matched = sum(c["ok"] for c in t["cases"])
        clean = t["exit_status"] == 0 and t["errors"] == 0 and matched == len(t["cases"]) > 0
        worst = max((e for c in t["cases"] for e in c["relative_errors"].values()), default=None)
        rows.append(
            {
                "tool": t["tool"],
                "launch configs": "every candidate" if t["all_configs"] else "default",
                "errors": t["errors"],
                "warnings": t["warnings"],
                "cases matching float64": f"{matched}/{len(t['cases'])}",
                "worst relative error": worst,
            }
        )
        targets.append(
            verdict(
                f"{t['tool']}: no error, every case matches float64",
                f"{t['errors']} errors, {matched}/{len(t['cases'])} cases",
                clean,
            )
        )
    cases = [{"case": c["case"], **{k: v for k, v in c["relative_errors"].items()}} for c in data["tools"][0]["cases"]]
    return Summary(
        tables=[table(rows), table(cases, "Worst relative error of each case against float64", headline=False)],
        targets=targets,
        failed=not all(t["status"] == "MET" for t in targets),
    )


BENCHMARK = Benchmark(
    "sanitize",
    "Kernel memory safety: compute-sanitizer over the Triton kernels",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="the float64 reference of every case",
)

if __name__ == "__main__":
    if "--child" in sys.argv:  # the process compute-sanitizer watches
        sys.exit(
            child(
                Path(sys.argv[sys.argv.index("--child") + 1]),
                smoke=False,
                all_configs="--default-config-only" not in sys.argv,
            )
        )
    BENCHMARK.main()
