"""Check the flash-attn backends on a GPU: the equivalence sweep, auto's choices, and their speed.

One command for the lead after installing flash-attn-4 (or flash-attn 2):

    python -m benchmarks.flash_attn_check --out benchmarks/results/flash_attn_check

  1. runs `pytest tests/kernels/test_backends_gpu.py -q -rs` in a child process (every installed
     backend against the float64 reference, outputs and gradients; the log is kept);
  2. for each situation below (H200 sizes: bf16, 16 heads of 128), times every backend that can
     run it through `genoformer.kernels.attention` (forward, and forward + backward), and records
     the reason of those that cannot and the backend `auto` picks;
  3. writes flash_attn_check.json and .md to --out (atomically), with --markdown BENCHMARKS.md
     also its section there, and prints the table last.

The times say whether auto's measured table (`FASTEST_FIRST` in kernels/dispatch.py) still holds
for our adapters. `--smoke` runs tiny shapes on a CPU (a test runs it); there the flash-attn and
Triton backends only report why they cannot run.

Shape legend: q (B, H, L, D), k and v (B, Hkv, L, D).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import (
    command_line,
    describe_environment,
    environment_markdown,
    markdown_table,
    replace_markdown_section,
    write_atomically,
)
from genoformer.kernels import Backend, BlockLayout, attention
from genoformer.kernels.dispatch import plan_attention, unsupported_reason

REPO = Path(__file__).resolve().parents[1]
SECTION = "flash-attn-check"
"""Its section of BENCHMARKS.md (--markdown), appended at the end the first time."""
SWEEP = ["-m", "pytest", "tests/kernels/test_backends_gpu.py", "-q", "-rs", "-p", "no:cacheprovider"]
TIMED = (Backend.FLASH_ATTN_4, Backend.FLASH_ATTN_2, Backend.TRITON, Backend.SDPA, Backend.TORCH)


@dataclasses.dataclass(frozen=True)
class Shapes:
    seq_len: int
    heads: int
    head_dim: int
    block_size: int
    warmup_ms: float
    rep_ms: float
    slow_backends: tuple[Backend, ...]
    """Timed only at this size when they run without a dense mask (sdpa) or never (torch)."""


FULL = Shapes(seq_len=16384, heads=16, head_dim=128, block_size=128, warmup_ms=25, rep_ms=100,
              slow_backends=(Backend.SDPA, Backend.TORCH))
SMOKE = Shapes(seq_len=256, heads=2, head_dim=16, block_size=128, warmup_ms=0, rep_ms=1, slow_backends=())


@dataclasses.dataclass(frozen=True)
class Situation:
    name: str
    batch: int
    seq_len: int
    kwargs: Callable[[torch.device], dict]
    """attention keywords (causal, layout, kv_lens, cu_seqlens) built on the device."""


def _packed_cu_seqlens(total: int, longest: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Documents of 100 to `longest` tokens (seeded), the last one cut to fill `total` tokens."""
    g = torch.Generator().manual_seed(seed)
    low = min(100, longest)
    lengths, used = [], 0
    while used < total:
        n = min(int(torch.randint(low, longest + 1, (1,), generator=g)), total - used)
        lengths.append(n)
        used += n
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def situations(shapes: Shapes) -> list[Situation]:
    L, bs = shapes.seq_len, shapes.block_size
    window = max(bs, L // 16)  # 1024 at 16k
    bigbird_window = min(512, L)
    return [
        Situation("dense causal", 1, L, lambda d: dict(causal=True)),
        Situation("key padding, causal", 2, L // 2, lambda d: dict(causal=True, kv_lens=torch.tensor([L // 2, L // 3], device=d))),
        Situation("packed documents, causal", 1, 4 * L, lambda d: dict(causal=True, cu_seqlens=_packed_cu_seqlens(4 * L, L // 2, d))),
        Situation(f"window ±{window}, causal", 1, L,
                  lambda d: dict(causal=True, layout=BlockLayout.sliding_window(L, window, bs))),
        Situation(f"window ±{window}, bidirectional", 1, L, lambda d: dict(layout=BlockLayout.sliding_window(L, window, bs))),
        Situation(f"BigBird (window {bigbird_window}, 1 global, 2 random)", 1, L,
                  lambda d: dict(layout=BlockLayout.bigbird(L, bigbird_window, 1, 2, block_size=bs, seed=0))),
    ]


# ---------------------------------------------------------------------------------- timing
def median_ms(fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float, grads=()) -> float:
    """Median time of fn() in ms: triton's do_bench on CUDA, a perf_counter loop on a CPU."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=list(grads),
                                             return_mode="median"))
    fn()  # warm-up
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or time.perf_counter() < deadline:
        for t in grads:
            t.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(torch.tensor(times).median())


def measure(situation: Situation, shapes: Shapes, device: torch.device) -> dict:
    """Times of every backend that runs the situation, the reasons of the others, auto's choice."""
    B, L, H, D = situation.batch, situation.seq_len, shapes.heads, shapes.head_dim
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4))
    kwargs = situation.kwargs(device)
    plan = plan_attention("auto", batch=B, q_heads=H, kv_heads=H, q_len=L, kv_len=L, head_dim=D,
                          dtype=q.dtype, device=device, **kwargs)
    record = {"situation": situation.name, "shape": [B, H, L, D], "auto": plan.backend.value, "backends": {}}
    for backend in TIMED:
        reason = unsupported_reason(backend, q, k, v, **kwargs)
        needs_mask = any(kwargs.get(key) is not None for key in ("layout", "kv_lens", "cu_seqlens"))
        if reason is None and backend in shapes.slow_backends and (backend is Backend.TORCH or needs_mask):
            reason = f"not timed at {L} tokens (a dense mask or the PyTorch fallback; see BENCHMARKS.md)"
        if reason is not None:
            record["backends"][backend.value] = {"reason": reason}
            continue
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def forward(qg=qg, kg=kg, vg=vg, backend=backend):
            with torch.no_grad():
                return attention(qg, kg, vg, backend=backend, **kwargs)

        def forward_backward(qg=qg, kg=kg, vg=vg, backend=backend):
            attention(qg, kg, vg, backend=backend, **kwargs).backward(dout)

        record["backends"][backend.value] = {
            "fwd_ms": median_ms(forward, device, shapes.warmup_ms, shapes.rep_ms),
            "fwd_bwd_ms": median_ms(forward_backward, device, shapes.warmup_ms, shapes.rep_ms, grads=(qg, kg, vg)),
        }
        del qg, kg, vg
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def run_sweep(device: torch.device, timeout_s: float, log: Path) -> dict:
    """The pytest sweep of installed backends in a child process: its summary line and counts."""
    command = [sys.executable, *SWEEP]
    if device.type == "cuda" and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(max(1, min(8, os.cpu_count() or 1)))]  # first-use compiles dominate
    started = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write_text(output)
        return {"returncode": None, "summary": f"timed out after {timeout_s:g} s", "counts": {},
                "wall_s": time.monotonic() - started}
    log.write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "(no output)"
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {"returncode": proc.returncode, "summary": summary, "counts": counts, "wall_s": time.monotonic() - started}


# ----------------------------------------------------------------------------- reporting
def rows(results: dict) -> list[dict]:
    """One row per situation: each backend's forward / forward+backward ms (or 'cannot'), auto's pick."""
    table = []
    for record in results["situations"]:
        row = {"situation": record["situation"], "auto": record["auto"]}
        for backend in TIMED:
            entry = record["backends"][backend.value]
            row[backend.value] = (
                f"{entry['fwd_ms']:.3g} / {entry['fwd_bwd_ms']:.3g}" if "fwd_ms" in entry else "cannot (see JSON)"
            )
        timed = {b: e["fwd_bwd_ms"] for b, e in record["backends"].items() if "fwd_bwd_ms" in e}
        row["fastest fwd+bwd"] = min(timed, key=timed.get) if timed else ""
        table.append(row)
    return table


def render_markdown(results: dict) -> str:
    sweep = results.get("sweep")
    lines = [
        "## flash-attn backends on the GPU: equivalence, auto's choice, speed",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        "flash-attn installs: " + ", ".join(f"{name}: {status}" for name, status in results["installs"].items()) + ".",
        "",
        f"Equivalence sweep (`python {' '.join(SWEEP)}`): {sweep['summary'] if sweep else 'not run'}.",
        "",
        "Times in ms, forward / forward + backward (medians), through `genoformer.kernels.attention`; "
        "`auto` is the backend auto picks here, `fastest fwd+bwd` the one measured fastest.",
        "",
        markdown_table(rows(results)),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flash_attn_check",
        description="Run the GPU equivalence sweep of every installed attention backend, time them per "
        "situation (16k tokens, 16 heads of 128, bf16) and record auto's choices; write JSON and Markdown to --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for flash_attn_check.json, .md and _tests.log")
    parser.add_argument("--markdown", type=Path, help="rewrite the 'flash-attn-check' section of this file (BENCHMARKS.md)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on a CPU (checks the script, times nothing real)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the pytest sweep")
    parser.add_argument("--sweep-timeout", type=float, default=420.0, help="seconds before the sweep is stopped")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run the CPU smoke version: python -m benchmarks.flash_attn_check --smoke --out /tmp/fa")
    device = torch.device("cpu" if args.smoke else "cuda")
    shapes = SMOKE if args.smoke else FULL
    from genoformer.kernels.flash_attn_backend import FlashAttn, import_error

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {
        "environment": describe_environment(device),
        "command": command_line(),
        "shapes": {k: v for k, v in dataclasses.asdict(shapes).items() if k != "slow_backends"},
        "installs": {version.value: import_error(version) or "installed" for version in FlashAttn},
        "situations": [],
    }
    if args.sweep:
        print(f"[{time.monotonic() - started:6.1f}s] sweep: python {' '.join(SWEEP)}", flush=True)
        results["sweep"] = run_sweep(device, args.sweep_timeout, args.out / "flash_attn_check_tests.log")
        print(f"[{time.monotonic() - started:6.1f}s] sweep: {results['sweep']['summary']}", flush=True)
    for situation in situations(shapes):
        results["situations"].append(measure(situation, shapes, device))
        print(f"[{time.monotonic() - started:6.1f}s] {situation.name}: auto picks {results['situations'][-1]['auto']}",
              flush=True)
    results["wall_s"] = time.monotonic() - started
    write_atomically(args.out / "flash_attn_check.json", json.dumps(results, indent=1))
    write_atomically(args.out / "flash_attn_check.md", render_markdown(results) + "\n")
    if args.markdown is not None:
        replace_markdown_section(args.markdown, SECTION, render_markdown(results))
    print(markdown_table(rows(results)), flush=True)
    return results


if __name__ == "__main__":
    main()
