"""Forward and backward time of our Gluon kernels against our Triton kernels, SDPA's FlashAttention-2
and flash-attn-4, on an sm_90 GPU.

Method
  * Shapes: bf16, dense causal and bidirectional; D 64 with 32 heads and D 128 with 16 heads
    (H * D = 2048); L in 8k, 16k, 32k with B = max(1, 16384 // L) (16k tokens per batch or more).
  * Implementations, forward only under torch.no_grad (what a forward pass of training launches):
    `gluon_ws` (``gluon_fwd.WS_CONFIGS``), `gluon_ahead` (``gluon_fwd.AHEAD_CONFIGS``, the ws kernel
    with qk_ahead; D 64 only), `gluon_plain` (``gluon_fwd.PLAIN_CONFIGS``), `triton`
    (``triton_flash.flash_fwd``, Backend.TRITON's forward, tuned once per shape before timing),
    `fa2` (``scaled_dot_product_attention`` restricted to its flash backend) and `fa4`
    (``flash_attn.cute.flash_attn_func`` on (B, L, H, D) views), when importable (else its reason
    is recorded).
  * Times: median of `triton.testing.do_bench` (warm-up, L2 flushed between calls) in ms, two
    rounds with the implementations in turn, the faster round kept (``interleaved_rounds``), as
    benchmarks/attention.py times its kernels. Compiling and tuning happen in a first untimed call.
  * Check: every output against `triton`'s on the same inputs (max |difference|, recorded; a Gluon
    output further than CHECK_TOLERANCE fails the run after the table is written).
  * TFLOP/s: 4 * B * H * L^2 * D, halved for causal.
  * Ratios: ours / other (> 1: ours is slower), for each of ours against the rest.
  * Backward (--passes bwd), the same shapes and method: `gluon_wide`, `gluon_narrow`, `gluon_ws`
    (``gluon_bwd.gluon_bwd_launch`` with ``gluon_bwd.WIDE_CONFIGS``, ``NARROW_CONFIGS``, ``WS_CONFIGS``),
    and `triton` (``triton_flash.flash_bwd``, tuned once per shape before timing; the configuration
    the tuner chose is recorded) launched directly from the o and base-2 lse of their own forward;
    `fa2` and `fa4` as ``torch.autograd.grad(out, (q, k, v), do, retain_graph=True)`` on a graph
    built once (the backward alone plus autograd's few microseconds). TFLOP/s: 2.5 times the
    forward's count (5 matmuls to the forward's 2); the check is each gradient against `triton`'s,
    relative to the largest of it (BWD_CHECK_TOLERANCE). --implementations keeps only the named
    ones (and `triton`, every pass's reference).
  * Layouts (--passes layouts): the forward of `attention(..., layout=..., backend=B)` with inputs
    that require grad (what a training forward runs), B = gluon (`gluon_api`) and triton, on the
    attention benchmark's block-sparse patterns (benchmarks/attention.py's FULL sweep: sliding
    window, BigBird, custom; the same layouts, B and H), D 64 and 128. Both paths then run the
    same Triton backward, so this pass decides which forward `auto` should take for layouts.
    FLOP/s: 4 * D per allowed (query, key) pair (``attention.allowed_pairs``). Check as the
    forward's.

One run on the H200 (about 2 minutes per pass; --budget-s, default 120 a pass, cuts the sweep and the
skipped cells say so):

    python -m benchmarks.gluon_bench --out benchmarks/results [--passes fwd bwd] [--implementations triton fa4 ...]

writes OUT/gluon_fwd.json, OUT/gluon_fwd.md (forward), OUT/gluon_bwd.json, OUT/gluon_bwd.md
(backward) and OUT/gluon_layouts.json, OUT/gluon_layouts.md (--passes layouts) and prints the tables.

Shape legend: q, k, v (B, H, L, D).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import command_line, describe_environment, interleaved_rounds, markdown_table, publish
from genoformer.kernels.dispatch import Backend, attention

OURS = ("gluon_ws", "gluon_ahead", "gluon_plain", "gluon_api")
OTHERS = ("triton", "fa2", "fa4")
CHECK_TOLERANCE = 0.05
"""Largest |gluon - triton| of one output element (bf16, unit-variance inputs) the run accepts."""
BWD_OURS = ("triton", "gluon_wide", "gluon_narrow", "gluon_ws")
BWD_OTHERS = ("triton", "fa2", "fa4")
BWD_CHECK_TOLERANCE = 0.02
"""Largest |gluon - triton| of one gradient element, relative to the largest |triton| of that
gradient, the backward run accepts."""


def cases(seq_lens: list[int], head_dims: list[int]) -> list[dict]:
    """Every (head dim, length, causal) cell: lengths in the order given (16k first by default, the
    issue's column), each at every head dim."""
    return [{"D": d, "H": 2048 // d, "L": L, "B": max(1, 16384 // L), "causal": causal}
            for L in seq_lens for d in head_dims for causal in (True, False)]


LAYOUT_OURS = ("gluon_api", )
LAYOUT_OTHERS = ("triton_api", )
LAYOUT_PATTERNS = ("sliding_window", "bigbird", "custom")


def layout_cases(seq_lens: list[int], head_dims: list[int]) -> list[dict]:
    """Every (head dim, length, pattern) cell of the layouts pass, lengths in the order given; B and H
    as the attention benchmark's."""
    from benchmarks.attention import FULL

    return [{"D": d, "H": FULL.heads(d), "L": L, "B": FULL.batch(L), "pattern": pattern}
            for d in head_dims for L in seq_lens for pattern in LAYOUT_PATTERNS]


def run_layout_case(case: dict, impls: dict, args: argparse.Namespace) -> dict:
    from benchmarks.attention import FULL, Pattern, allowed_pairs

    B, H, L, D, pattern = case["B"], case["H"], case["L"], case["D"], Pattern(case["pattern"])
    layout = pattern.layout(FULL, L)
    g = torch.Generator(device="cuda").manual_seed(L + D)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    flops = 4 * D * B * allowed_pairs(layout, pattern.causal, L, H)
    record = {**case, "causal": pattern.causal, "ms": {}, "tflops": {}, "max_diff_vs_triton": {}, "errors": {}}

    def forward(backend):
        def run():
            with torch.enable_grad():
                return attention(q, k, v, causal=pattern.causal, layout=layout, backend=backend).detach()

        return run

    runs = {"gluon_api": forward(Backend.GLUON), "triton_api": forward(Backend.TRITON)}
    reference = runs["triton_api"]()
    runnable = {}
    for name, fn in runs.items():
        try:
            out = fn()
            torch.cuda.synchronize()
            record["max_diff_vs_triton"][name] = (out.float() - reference.float()).abs().max().item()
            runnable[name] = fn
        except Exception as error:  # recorded; a failing Gluon path fails the run at the end
            record["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"

    return timed(record, runnable, flops, args)


def timed(record: dict, runnable: dict, flops: float, args: argparse.Namespace) -> dict:
    """The record with each runnable's median time (the best of two interleaved rounds) and TFLOP/s."""
    def timer(fn):
        return lambda: triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median")

    times = interleaved_rounds({name: timer(fn) for name, fn in runnable.items()}, rounds=2, best=min)
    for name, ms in times.items():
        record["ms"][name] = ms
        record["tflops"][name] = flops / ms / 1e9
    return record


def implementations(fa4_module) -> dict:
    """name -> (q, k, v, causal) -> out (B, H, L, D)."""
    from genoformer.kernels import gluon_flash, gluon_fwd, triton_flash

    def gluon(table):
        def run(q, k, v, causal):
            return gluon_flash.gluon_fwd_launch(q, k, v, causal, q.shape[-1] ** -0.5, table[q.shape[-1]])[0]

        run.head_dims = tuple(table)  # a table without the cell's head dim leaves it empty ("-")
        return run

    def triton_fwd(q, k, v, causal):
        return triton_flash.flash_fwd(q, k, v, None, None, None, 0, causal, q.shape[-1] ** -0.5)[0]

    def fa2(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def api(q, k, v, causal):
        # the public entry point as a training forward runs it: inputs that require grad, autograd
        # recording the op, the default configuration
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            return attention(q, k, v, causal=causal, backend=Backend.GLUON).detach()

    impls = {"gluon_ws": gluon(gluon_fwd.WS_CONFIGS), "gluon_ahead": gluon(gluon_fwd.AHEAD_CONFIGS),
             "gluon_plain": gluon(gluon_fwd.PLAIN_CONFIGS), "gluon_api": api, "triton": triton_fwd, "fa2": fa2}
    if fa4_module is not None:
        def fa4(q, k, v, causal):
            out = fa4_module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            out = out[0] if isinstance(out, tuple) else out  # (out, lse) in 4.0 betas
            return out.transpose(1, 2)

        impls["fa4"] = fa4
    return impls


def run_case(case: dict, impls: dict, args: argparse.Namespace) -> dict:
    B, H, L, D, causal = case["B"], case["H"], case["L"], case["D"], case["causal"]
    g = torch.Generator(device="cuda").manual_seed(L + D + causal)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0)
    record = {**case, "ms": {}, "tflops": {}, "max_diff_vs_triton": {}, "errors": {}}
    with torch.no_grad():
        reference = impls["triton"](q, k, v, causal)  # also the first (tuning) call of ours in Triton
        runnable = {}
        for name, fn in impls.items():
            if D not in getattr(fn, "head_dims", (D,)):
                continue
            try:
                out = fn(q, k, v, causal)  # compiles and tunes outside the timing
                torch.cuda.synchronize()
                record["max_diff_vs_triton"][name] = (out.float() - reference.float()).abs().max().item()
                runnable[name] = fn
            except Exception as error:  # recorded in the table; a failing Gluon kernel fails the run at the end
                record["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"

        def timer(fn):
            return lambda: triton.testing.do_bench(lambda: fn(q, k, v, causal), warmup=args.warmup_ms,
                                                   rep=args.rep_ms, return_mode="median")

        times = interleaved_rounds({name: timer(fn) for name, fn in runnable.items()}, rounds=2, best=min)
    for name, ms in times.items():
        record["ms"][name] = ms
        record["tflops"][name] = flops / ms / 1e9
    return record


def bwd_implementations(fa4_module) -> dict:
    """name -> (q, k, v, do, causal) -> a function that runs one backward and returns (dq, dk, dv);
    whatever the backward needs of its forward (o, lse, an autograd graph) is made before."""
    from genoformer.kernels import gluon_bwd, gluon_flash, triton_flash

    def gluon(table):
        def setup(q, k, v, do, causal):
            scale = q.shape[-1] ** -0.5
            o, lse = gluon_flash.gluon_fwd_launch(q, k, v, causal, scale)
            return lambda: gluon_bwd.gluon_bwd_launch(do, q, k, v, o, lse, causal, scale, config=table[q.shape[-1]])

        return setup

    def triton_bwd(q, k, v, do, causal):
        scale = q.shape[-1] ** -0.5
        o, lse = triton_flash.flash_fwd(q, k, v, None, None, None, 0, causal, scale)
        return lambda: triton_flash.flash_bwd(do, q, k, v, o, lse, None, None, None, None, None, 0, causal, scale)

    def autograd(attend):
        def setup(q, k, v, do, causal):
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            with torch.enable_grad():
                out = attend(*leaves, causal)
            return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)

        return setup

    def fa2(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    impls = {"gluon_wide": gluon(gluon_bwd.WIDE_CONFIGS), "gluon_narrow": gluon(gluon_bwd.NARROW_CONFIGS),
             "gluon_ws": gluon(gluon_bwd.WS_CONFIGS), "triton": triton_bwd, "fa2": autograd(fa2)}
    if fa4_module is not None:
        def fa4(q, k, v, causal):
            out = fa4_module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
            out = out[0] if isinstance(out, tuple) else out  # (out, lse) in 4.0 betas
            return out.transpose(1, 2)

        impls["fa4"] = autograd(fa4)
    return impls


def run_bwd_case(case: dict, impls: dict, args: argparse.Namespace) -> dict:
    from benchmarks.attention import tuner_choices
    from genoformer.kernels import triton_flash

    B, H, L, D, causal = case["B"], case["H"], case["L"], case["D"], case["causal"]
    g = torch.Generator(device="cuda").manual_seed(L + D + causal)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    flops = 2.5 * 4 * B * H * L * L * D * (0.5 if causal else 1.0)
    record = {**case, "ms": {}, "tflops": {}, "max_diff_vs_triton": {}, "errors": {}, "configs": {}}
    runnable, grads = {}, {}
    for name, setup in impls.items():
        try:
            fn = setup(q, k, v, do, causal)
            with tuner_choices(triton_flash) as chosen:
                grads[name] = fn()  # compiles and tunes outside the timing
            torch.cuda.synchronize()
            runnable[name] = fn
            if chosen:
                record["configs"][name] = [f"{kind} {config}" for kind, config in chosen]
        except Exception as error:  # recorded in the table; a failing Gluon backward fails the run at the end
            record["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if "triton" in grads:  # each gradient against triton's, relative to triton's largest element
        for name, got in grads.items():
            record["max_diff_vs_triton"][name] = max(
                ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                for a, b in zip(got, grads["triton"]))
    del grads

    return timed(record, runnable, flops, args)


def _mask(record: dict) -> str:
    """A cell's mask: its layout pattern, else causal or bidir."""
    return record.get("pattern") or ("causal" if record["causal"] else "bidir")


def _ratio(record: dict, ours: str, other: str) -> str:
    a, b = record["ms"].get(ours), record["ms"].get(other)
    return f"{a / b:.2f}" if a and b else ""


def table(records: list[dict], ours_names: tuple[str, ...] = OURS, others: tuple[str, ...] = OTHERS) -> str:
    rows = []
    for r in records:
        row = {"D": r["D"], "H": r["H"], "L x B": f"{r['L'] // 1024}k x {r['B']}",
               "mask": _mask(r)}
        if "skipped" in r:
            row[f"{ours_names[0]} ms"] = r["skipped"]
            rows.append(row)
            continue
        for name in (*ours_names, *others):
            row[f"{name} ms"] = f"{r['ms'][name]:.3f}" if name in r["ms"] else "-"
        first = ours_names[0]
        row[f"{first.split('_')[-1]} TFLOP/s"] = f"{r['tflops'][first]:.0f}" if first in r["tflops"] else "-"
        for ours in ours_names:
            for other in others:
                if other != ours:
                    row[f"{ours.split('_')[-1] if ours.startswith('gluon') else ours}/{other}"] = _ratio(r, ours, other)
        rows.append(row)
    return markdown_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of gluon_fwd.json/.md and gluon_bwd.json/.md")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 8192, 32768],
                        help="lengths, timed in this order (B = 16384 // L, at least 1)")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up per timing (ms)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="do_bench measuring time per timing (ms)")
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="stop starting new cells of a pass after this many seconds (the rest are marked skipped)")
    parser.add_argument("--implementations", nargs="+", default=None, metavar="NAME",
                        help="only these implementations (default: every one of the pass), e.g. triton fa2 fa4")
    parser.add_argument("--passes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd", "layouts"],
                        help="forward, backward, the forward on block-sparse layouts (OUT/gluon_fwd.*, "
                             "OUT/gluon_bwd.*, OUT/gluon_layouts.*)")
    args = parser.parse_args(argv)
    known = {*OURS, *OTHERS, *BWD_OURS, *BWD_OTHERS}
    if args.implementations and set(args.implementations) - known:
        parser.error(f"--implementations: no implementation {sorted(set(args.implementations) - known)}; "
                     f"choose from {' '.join(sorted(known))}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("the Gluon kernels run on an sm_90 (Hopper) GPU only: run this on the H200")

    try:
        fa4_module, fa4_error = importlib.import_module("flash_attn.cute"), None
    except ImportError as error:
        fa4_module, fa4_error = None, f"flash_attn.cute not importable: {error}"
    failed = False
    if "fwd" in args.passes:
        failed |= sweep(args, "fwd", implementations(fa4_module), run_case, OURS, OTHERS, fa4_error)
    if "bwd" in args.passes:
        failed |= sweep(args, "bwd", bwd_implementations(fa4_module), run_bwd_case, BWD_OURS, BWD_OTHERS, fa4_error)
    if "layouts" in args.passes:
        failed |= sweep(args, "layouts", {}, run_layout_case, LAYOUT_OURS, LAYOUT_OTHERS, None)
    return 1 if failed else 0


def sweep(args: argparse.Namespace, kind: str, impls: dict, run, ours: tuple[str, ...], others: tuple[str, ...],
          fa4_error: str | None) -> bool:
    """One pass (fwd or bwd) over every cell: times, table, OUT/gluon_KIND.json and .md; True when
    one of ours failed or disagreed with triton."""
    tolerance = BWD_CHECK_TOLERANCE if kind == "bwd" else CHECK_TOLERANCE
    if args.implementations and kind != "layouts":
        impls = {name: fn for name, fn in impls.items() if name in args.implementations or name == "triton"}
        ours = tuple(name for name in ours if name in impls)
    start = time.perf_counter()
    records = []
    for case in (layout_cases if kind == "layouts" else cases)(args.seq_lens, args.head_dims):
        if time.perf_counter() - start > args.budget_s:
            records.append({**case, "skipped": f"skipped (--budget-s {args.budget_s:g})"})
            continue
        records.append(run(case, impls, args))
        r = records[-1]
        print(f"{kind} D{r['D']} L{r['L']} B{r['B']} {_mask(r)}: "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in r["ms"].items())
              + (f"; errors {r['errors']}" if r["errors"] else ""), flush=True)
    failures = [f"D{r['D']} L{r['L']} {_mask(r)} {name}: "
                + (r["errors"].get(name) or f"max |diff| {r['max_diff_vs_triton'][name]:.3g} vs triton")
                for r in records if "skipped" not in r for name in ours
                if name in r["errors"] or r["max_diff_vs_triton"].get(name, 0.0) > tolerance]
    what = {"fwd": "Gluon forward", "bwd": "Backward, ours Triton and Gluon (dq, dk, dv from the forward's o and lse)",
            "layouts": "Gluon forward through attention() on block-sparse layouts, against the Triton forward"}[kind]
    text = "\n\n".join([
        f"{what} on {describe_environment()['device']}, {describe_environment()['date_utc']} (bf16; ms, "
        f"ratios ours / other, > 1: ours slower). "
        f"`{command_line()}`",
        table(records, ours, others),
        *([f"fa4: {fa4_error}"] if fa4_error else []),
        *([f"FAILED: {'; '.join(failures)}"] if failures else []),
    ])
    publish(args.out, f"gluon_{kind}", {"environment": describe_environment(), "command": command_line(),
                                        "fa4_error": fa4_error, "failures": failures, "records": records}, text)
    return bool(failures)


if __name__ == "__main__":
    sys.exit(main())
