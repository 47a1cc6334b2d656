"""Head dims that are not powers of two: what the padded tiles cost, and whether they are right.

One run, from the repository root, on one GPU (about 3 minutes on an H200):

    python -m benchmarks.head_dims --out OUT [--markdown BENCHMARKS.md]
    TRITON_INTERPRET=1 python -m benchmarks.head_dims --device cpu --smoke --out /tmp/h   # CPU smoke run

It does two things and writes OUT/head_dims.json, OUT/head_dims.md and OUT/head_dims_tests.log:
  1. Times dense causal attention, forward and backward, at L = 16k tokens (B = 1, H = 16 heads
     for every head dim, bf16) for head dims 80, 96 and 128: our Triton kernels (80 and 96 run in
     128-wide tiles with the head-dim padding masked) against SDPA restricted to its flash backend
     (FlashAttention-2) at the same head dim.  Before timing, ours is checked against FA2 on the
     same inputs (worst row error, as in benchmarks/attention.py).
  2. Runs the GPU correctness sweep of the padded head dims against the float64 reference,
     `pytest tests/kernels/test_triton_attention.py -m gpu -k padded_head_dims` (24, 40, 48, 80,
     96, 112, 160, 192; outputs and dq, dk, dv held to twice the same-precision error).
It prints a short table last: the times, the ratios and the issue's targets
  * D = 80 and 96: ours at most 1.05x our own time at D = 128, forward and backward;
  * D = 80 and 96: ours faster than FA2 at the same head dim, forward and backward.

Timing method as in benchmarks/attention.py: medians of `triton.testing.do_bench`; the backward
is `out.backward(dout, retain_graph=True)` replayed on one stored forward graph (backward alone);
our autotuning (first call) happens in the check, outside the timed calls.

Shape legend: B batch, H heads, L sequence length, D head dim.
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
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.attention import CHECK_TOLERANCE, Timer, allowed_pairs, fa2
from benchmarks.common import (
    add_kernel_timing_arguments,
    command_line,
    describe_environment,
    environment_markdown,
    format_number,
    kernel_timing,
    markdown_table,
    replace_markdown_section,
    write_atomically,
)
from genoformer.kernels.reference import row_error

REPO = Path(__file__).resolve().parents[1]

SECTION = "head_dims"
"""Name of the BENCHMARKS.md section this script owns (written with --markdown)."""

TIME_RATIO_TO_POW2 = 1.05
"""Target: a padded head dim takes at most this times our own time at the reference head dim."""

SWEEP_COMMAND = ("-m", "pytest", "tests/kernels/test_triton_attention.py", "-m", "gpu", "-k", "padded_head_dims",
                 "-q", "-rs", "-p", "no:cacheprovider")
"""The GPU sweep of the padded head dims (pytest arguments after the interpreter)."""


REP_MS = 100.0
"""do_bench measuring time per timing on a GPU."""


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What one run measures."""

    seq_len: int
    heads: int
    batch: int
    head_dims: tuple[int, ...]
    reference_dim: int  # the power of two whose time the padded head dims are held to
    sweep_timeout_s: float
    dtype: str = "bfloat16"


FULL = Shapes(seq_len=16384, heads=16, batch=1, head_dims=(80, 96, 128), reference_dim=128, sweep_timeout_s=150)
SMOKE = Shapes(seq_len=40, heads=1, batch=1, head_dims=(80, 96, 128), reference_dim=128, sweep_timeout_s=300)


# ----------------------------------------------------------------------------- measuring
def _inputs(shapes: Shapes, head_dim: int, device: torch.device, seed: int):
    generator = torch.Generator(device).manual_seed(seed * 1_000 + head_dim)
    shape = (shapes.batch, shapes.heads, shapes.seq_len, head_dim)
    dtype = getattr(torch, shapes.dtype)
    q, k, v, dout = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def _outputs(fn: Callable, q, k, v, dout) -> tuple[torch.Tensor, ...]:
    """out, dq, dk, dv of one forward + backward."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(dout)
    grads = (q.grad, k.grad, v.grad)
    for t in (q, k, v):
        t.grad = None
    return out.detach(), *grads


def _times(timer: Timer, fn: Callable, q, k, v, dout) -> dict[str, float]:
    """Forward and backward-alone medians in ms."""
    fwd = timer(lambda: fn(q, k, v))
    out = fn(q, k, v)
    bwd = timer(lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v])
    for t in (q, k, v):
        t.grad = None
    return {"fwd_ms": fwd, "bwd_ms": bwd}


def measure(shapes: Shapes, head_dim: int, timer: Timer, device: torch.device, seed: int) -> dict:
    """One head dim: the check of ours against FA2, then both timed."""
    from genoformer.kernels.triton_flash import triton_attention

    def ours(q, k, v):
        return triton_attention(q, k, v, causal=True)

    baseline = fa2(causal=True).fn
    q, k, v, dout = _inputs(shapes, head_dim, device, seed)
    got = _outputs(ours, q, k, v, dout)  # also compiles and autotunes ours
    expected = _outputs(baseline, q, k, v, dout)
    fwd_err = row_error(got[0], expected[0])
    bwd_err = max(row_error(a, b) for a, b in zip(got[1:], expected[1:], strict=True))
    ok = fwd_err <= CHECK_TOLERANCE["fwd"] and bwd_err <= CHECK_TOLERANCE["bwd"]  # NaN compares False
    del got, expected
    record = {
        "head_dim": head_dim,
        "fwd_flops": 4 * shapes.batch * allowed_pairs(None, True, shapes.seq_len, shapes.heads) * head_dim,
        "check": {"fwd_rel_err": fwd_err, "bwd_rel_err": bwd_err, "ok": ok, "reference": "FA2"},
        "ours": _times(timer, ours, q, k, v, dout),
        "fa2": _times(timer, baseline, q, k, v, dout),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def run_sweep(device: torch.device, timeout_s: float, log: Path) -> dict:
    """The pytest sweep of the padded head dims in a child process; its summary line and exit code."""
    command = [sys.executable, *SWEEP_COMMAND]
    if device.type == "cuda" and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(max(1, min(16, os.cpu_count() or 1)))]  # compiles dominate: one worker per core
    env = dict(os.environ)
    if device.type == "cuda":
        env.pop("TRITON_INTERPRET", None)  # the GPU sweep needs compiled kernels
    started = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write_text(text)
        return {"command": "python " + " ".join(command[1:]), "returncode": None, "summary": f"timed out after {timeout_s:g} s",
                "counts": {}, "wall_s": time.monotonic() - started}
    log.write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "(no output)"
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    return {"command": "python " + " ".join(command[1:]), "returncode": proc.returncode, "summary": summary,
            "counts": counts, "wall_s": time.monotonic() - started}


# ----------------------------------------------------------------------------- reporting
def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _ms(record: dict, impl: str, direction: str) -> float | None:
    return record[impl][f"{direction}_ms"]


def _pair(value: Callable[[str], float | None]) -> str:
    """A "forward / backward" cell."""
    return f"{format_number(value('fwd'))} / {format_number(value('bwd'))}"


def rows(results: dict) -> list[dict]:
    """One table row per head dim (cells are forward / backward)."""
    ref_dim = results["shapes"]["reference_dim"]
    ref = next((r for r in results["cases"] if r["head_dim"] == ref_dim), None)
    out = []
    for r in results["cases"]:
        check = r["check"]
        verdict = "ok" if check["ok"] else "WRONG"
        # each lambda below is called by _pair at once, within this iteration
        out.append({
            "D": r["head_dim"],
            "ours ms": _pair(lambda d: _ms(r, "ours", d)),
            "FA2 ms": _pair(lambda d: _ms(r, "fa2", d)),
            "ours/FA2": _pair(lambda d: _ratio(_ms(r, "ours", d), _ms(r, "fa2", d))),
            f"ours/ours(D={ref_dim})": _pair(
                lambda d: _ratio(_ms(r, "ours", d), _ms(ref, "ours", d) if ref else None)),
            "ours TFLOP/s": _pair(
                lambda d: r["fwd_flops"] * (2.5 if d == "bwd" else 1) / (_ms(r, "ours", d) * 1e9)),
            "check vs FA2 (fwd / bwd err)":
                f"{verdict} {format_number(check['fwd_rel_err'], 2)} / {format_number(check['bwd_rel_err'], 2)}",
        })
    return out


def targets(results: dict) -> list[dict]:
    """The issue's two time targets for every padded head dim, and the sweep; a wrong result meets nothing."""
    ref_dim = results["shapes"]["reference_dim"]
    by_dim = {r["head_dim"]: r for r in results["cases"]}
    out = []
    for r in results["cases"]:
        if r["head_dim"] == ref_dim:
            continue
        for d in ("fwd", "bwd"):
            ours = _ms(r, "ours", d) if r["check"]["ok"] else None
            to_pow2 = _ratio(ours, _ms(by_dim[ref_dim], "ours", d)) if ref_dim in by_dim else None
            to_fa2 = _ratio(ours, _ms(r, "fa2", d))
            out.append({"target": f"D={r['head_dim']} {d}: ours ≤ {TIME_RATIO_TO_POW2}× ours at D={ref_dim}",
                        "measured": f"{format_number(to_pow2)}×",
                        "status": "MET" if to_pow2 is not None and to_pow2 <= TIME_RATIO_TO_POW2 else "NOT MET"})
            out.append({"target": f"D={r['head_dim']} {d}: ours < FA2 at D={r['head_dim']}",
                        "measured": f"{format_number(to_fa2)}×",
                        "status": "MET" if to_fa2 is not None and to_fa2 < 1 else "NOT MET"})
    sweep = results.get("sweep")
    if sweep is not None:
        passed = sweep["returncode"] == 0 and sweep["counts"].get("passed", 0) > 0
        out.append({"target": "GPU sweep of the padded head dims (float64 reference, 2× rule)",
                    "measured": sweep["summary"], "status": "MET" if passed else "NOT MET"})
    return out


def render_markdown(results: dict) -> str:
    shapes = results["shapes"]
    return "\n".join([
        "## Padded head dims",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        f"Dense causal, {shapes['dtype']}, B = {shapes['batch']}, H = {shapes['heads']} for every head dim, "
        f"L = {shapes['seq_len']}. Cells are forward / backward; times are medians in ms, the backward "
        "timed alone. FA2 is SDPA restricted to its flash backend at the same head dim. TFLOP/s count "
        "4·B·H·pairs·D at the real D (the padded columns are not counted). "
        f"Wall time {format_number(results.get('wall_s'))} s.",
        "",
        markdown_table(rows(results)),
        "",
        markdown_table(targets(results)),
    ])


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.head_dims",
        description="Time causal attention at head dims 80, 96, 128 (ours vs SDPA FlashAttention-2, L=16k, "
        "16 heads) and run the GPU test sweep of the padded head dims; write JSON and Markdown to --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for head_dims.json, .md and _tests.log")
    parser.add_argument("--markdown", type=Path, help="rewrite the 'head_dims' section of this file (BENCHMARKS.md)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes (L=40, H=1) for a CPU run of the script under Triton's interpreter")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the pytest sweep")
    add_kernel_timing_arguments(parser, rep_ms=REP_MS)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = kernel_timing(args, REP_MS, "TRITON_INTERPRET=1 python -m benchmarks.head_dims --device cpu --smoke --out /tmp/h")
    shapes = SMOKE if args.smoke else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timer = Timer(device, args.warmup_ms, args.rep_ms)
    results = {"environment": describe_environment(device), "command": command_line(),
               "shapes": dataclasses.asdict(shapes), "cases": []}
    for head_dim in shapes.head_dims:
        results["cases"].append(measure(shapes, head_dim, timer, device, args.seed))
        r = results["cases"][-1]
        print(f"[{time.monotonic() - started:6.1f}s] D={head_dim} ours {format_number(r['ours']['fwd_ms'])} / "
              f"{format_number(r['ours']['bwd_ms'])} ms, FA2 {format_number(r['fa2']['fwd_ms'])} / {format_number(r['fa2']['bwd_ms'])} ms, "
              f"check {'ok' if r['check']['ok'] else 'WRONG'}", flush=True)
    if args.sweep:
        print(f"[{time.monotonic() - started:6.1f}s] GPU sweep: python {' '.join(SWEEP_COMMAND)}", flush=True)
        results["sweep"] = run_sweep(device, shapes.sweep_timeout_s, args.out / "head_dims_tests.log")
    results["wall_s"] = time.monotonic() - started
    write_atomically(args.out / "head_dims.json", json.dumps(results, indent=1))
    write_atomically(args.out / "head_dims.md", render_markdown(results) + "\n")
    if args.markdown is not None:
        replace_markdown_section(args.markdown, SECTION, render_markdown(results))
    print(markdown_table(rows(results)) + "\n\n" + markdown_table(targets(results)), flush=True)
    return results


if __name__ == "__main__":
    main()
