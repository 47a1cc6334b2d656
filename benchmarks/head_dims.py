"""Padded head dims: our causal kernels at D 80 and 96 (padded to the next multiple of 16 inside the
kernels) against ours at D 128 and SDPA's FlashAttention-2 at the same D, then the GPU test sweep
of the padded head dims.

Dense causal, bf16, B = 1, H = 16 for every D, L = 16k; forward and backward-alone medians of
do_bench; ours checked against FA2 (row errors, as benchmarks/attention.py). TFLOP/s count the real
D. Targets: a padded D takes at most 1.05x ours at D 128 and less than FA2 at its D; the sweep
(`pytest tests/kernels/test_triton_attention.py -m gpu -k padded_head_dims`) passes.

    python -m benchmarks.head_dims --out OUT          # a GPU, about 2 minutes
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import torch

from benchmarks.common import (
    REPO_ROOT,
    Benchmark,
    Summary,
    Timer,
    allowed_pairs,
    at_most,
    compare,
    fa2,
    fwd_bwd_ms,
    outputs,
    random_qkv,
    ratio,
    table,
    verdict,
)

SWEEP = [
    "-m",
    "pytest",
    "tests/kernels/test_triton_attention.py",
    "-m",
    "gpu",
    "-k",
    "padded_head_dims",
    "-q",
    "-rs",
    "-p",
    "no:cacheprovider",
]


def run_sweep(timeout_s: float) -> dict:
    """The pytest sweep of the padded head dims in a child process: its summary line and exit code."""
    command = [sys.executable, *SWEEP]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(max(1, min(16, os.cpu_count() or 1)))]  # compiles dominate: one worker per core
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the GPU sweep needs compiled kernels
    try:
        proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"returncode": None, "summary": f"timed out after {timeout_s:g} s", "counts": {}}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else proc.stderr[-300:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {"returncode": proc.returncode, "summary": summary, "counts": counts}


def arguments(parser) -> None:
    parser.add_argument("--device", default="cuda", help="device to measure (--smoke: the CPU, interpreted)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the pytest sweep")


def measure(args) -> dict:
    from genoformer.kernels.triton_flash import triton_attention

    device = torch.device(args.device)
    L, H = (40, 1) if args.smoke else (16384, 16)
    timer = Timer(device, 0 if args.smoke else 25, 1 if args.smoke else 100)
    cases = []
    for D in (80, 96, 128):
        q, k, v, dout = random_qkv((1, H, L, D), device, torch.bfloat16, D)
        ours = lambda q, k, v: triton_attention(q, k, v, causal=True)  # noqa: E731
        baseline = (
            fa2(causal=True).fn
            if device.type == "cuda"
            else lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        )
        check = compare(outputs(ours, q, k, v, dout), outputs(baseline, q, k, v, dout))
        cases.append(
            {
                "head_dim": D,
                "fwd_flops": 4 * allowed_pairs(None, True, L, H) * D,
                "check": check,
                "ours": fwd_bwd_ms(timer, ours, q, k, v, dout),
                "fa2": fwd_bwd_ms(timer, baseline, q, k, v, dout),
            }
        )
    data = {"seq_len": L, "heads": H, "cases": cases}
    if args.sweep and not args.smoke:
        data["sweep"] = run_sweep(150)
    return data


def summarize(data: dict) -> Summary:
    by_dim = {c["head_dim"]: c for c in data["cases"]}
    rows, to_128, to_fa2 = [], [], []
    for c in data["cases"]:
        pair = {d: (c["ours"][f"{d}_ms"] if c["check"]["ok"] else None) for d in ("fwd", "bwd")}
        rows.append(
            {
                "D": c["head_dim"],
                **{f"ours {d} ms": c["ours"][f"{d}_ms"] for d in ("fwd", "bwd")},
                **{f"FA2 {d} ms": c["fa2"][f"{d}_ms"] for d in ("fwd", "bwd")},
                "check vs FA2": "ok" if c["check"]["ok"] else "WRONG",
            }
        )
        if c["head_dim"] == 128:
            continue
        for d in ("fwd", "bwd"):
            to_128.append((ratio(pair[d], by_dim[128]["ours"][f"{d}_ms"]) or float("inf"), f"D={c['head_dim']} {d}"))
            to_fa2.append((ratio(pair[d], c["fa2"][f"{d}_ms"]) or float("inf"), f"D={c['head_dim']} {d}"))
    targets = (
        [
            at_most(
                "padded head dims: ours ≤ 1.05x ours at D=128, fwd and bwd (worst)",
                max(to_128)[0],
                1.05,
                f"x ({max(to_128)[1]})",
            ),
            at_most(
                "padded head dims: ours faster than FA2 at the same D, fwd and bwd (worst ours ÷ FA2)",
                max(to_fa2)[0],
                1.0 - 1e-9,
                f"x ({max(to_fa2)[1]})",
            ),
        ]
        if to_128
        else []
    )
    if "sweep" in data:
        targets.append(
            verdict(
                "GPU sweep of the padded head dims (float64 reference, 2x rule)",
                data["sweep"]["summary"],
                data["sweep"]["returncode"] == 0 and data["sweep"]["counts"].get("passed", 0) > 0,
            )
        )
    return Summary(
        tables=[table(rows, f"Dense causal, bf16, B = 1, H = {data['heads']}, L = {data['seq_len']:,}")],
        targets=targets,
    )


BENCHMARK = Benchmark(
    "head_dims",
    "Padded head dims",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="ours at D 128 and SDPA FlashAttention-2 at the same head dim",
)

if __name__ == "__main__":
    BENCHMARK.main()
