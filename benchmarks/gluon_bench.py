"""Forward and backward time of our Gluon kernels against our Triton kernels, SDPA's FlashAttention-2
and flash-attn-4, on an sm_90 GPU; one pass per run.

  * fwd: dense causal and bidirectional, D 64 (32 heads) and 128 (16 heads), L 8k..32k with
    B = max(1, 16384 // L), under no_grad: `gluon_ws`, `gluon_ahead` (qk_ahead, D 64),
    `gluon_plain` (the three launch tables of gluon_fwd), `gluon_api` (`attention(backend="gluon")`
    on inputs that require grad, as a training forward calls it), `triton` (flash_fwd, tuned before
    timing), `fa2`, `fa4`. Each output is checked against triton's (max |difference| <= 0.05).
  * bwd: the same cells: `gluon_wide`, `gluon_narrow`, `gluon_ws` (gluon_bwd's tables) and `triton`
    (flash_bwd, the tuner's choice recorded) from their own forward's o and lse; `fa2` and `fa4` as
    autograd.grad on a graph built once. Each gradient against triton's, relative to its largest
    element (<= 0.02). --implementations keeps only the named ones (and triton, the reference).
  * layouts: `attention(..., layout, backend=B)` forward, B = gluon and triton, on the attention
    benchmark's block-sparse patterns (its FULL sweep's layouts, B and H).
Times: medians of do_bench, two interleaved rounds, the faster kept. FLOPs 4·B·H·pairs·D forward,
2.5x that backward. A failing or disagreeing Gluon kernel fails the run after the result is written.

    python -m benchmarks.gluon_bench --out OUT --passes fwd          # about 2 minutes on an H200
    python -m benchmarks.gluon_bench --out OUT --passes bwd --implementations triton fa2 fa4 --seq-lens 16384 32768 8192 65536
"""

from __future__ import annotations

import importlib

import torch
from genoformer.kernels.dispatch import Backend, attention

from benchmarks.common import (
    FULL,
    Attempts,
    Benchmark,
    Budget,
    Pattern,
    Summary,
    Timer,
    allowed_pairs,
    fa2,
    fa4,
    fmt,
    interleaved_rounds,
    length_label,
    ratio,
    table,
    tuner_choices,
)

PASSES = {
    "fwd": ("gluon_api", ("gluon_ws", "gluon_ahead", "gluon_plain", "gluon_api", "triton", "fa2", "fa4"), 0.05),
    "bwd": ("triton", ("triton", "gluon_wide", "gluon_narrow", "gluon_ws", "fa2", "fa4"), 0.02),
    "layouts": ("gluon_api", ("gluon_api", "triton_api"), 0.05),
}
"""pass -> (the implementation the ratios are of, every implementation, the check's tolerance)."""


def forward_impls(fa4_module) -> dict:
    """name -> (q, k, v, causal) -> out (B, H, L, D)."""
    from genoformer.kernels import gluon_flash, gluon_fwd, triton_flash

    def gluon(configs):
        def run(q, k, v, causal):
            return gluon_flash.gluon_fwd_launch(q, k, v, causal, q.shape[-1] ** -0.5, configs[q.shape[-1]])[0]

        run.head_dims = tuple(configs)  # a table without the cell's head dim leaves it empty
        return run

    def api(q, k, v, causal):  # the public entry point as a training forward runs it
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            return attention(q, k, v, causal=causal, backend=Backend.GLUON).detach()

    impls = {
        "gluon_ws": gluon(gluon_fwd.WS_CONFIGS),
        "gluon_ahead": gluon(gluon_fwd.AHEAD_CONFIGS),
        "gluon_plain": gluon(gluon_fwd.PLAIN_CONFIGS),
        "gluon_api": api,
        "triton": lambda q, k, v, causal: triton_flash.flash_fwd(
            q, k, v, None, None, None, 0, causal, q.shape[-1] ** -0.5
        )[0],
        "fa2": lambda q, k, v, causal: fa2(causal).fn(q, k, v),
    }
    if fa4_module is not None:
        impls["fa4"] = lambda q, k, v, causal: fa4(fa4_module, causal).fn(q, k, v)
    return impls


def backward_impls(fa4_module) -> dict:
    """name -> (q, k, v, do, causal) -> a function running one backward; its forward is made before."""
    from genoformer.kernels import gluon_bwd, gluon_flash, triton_flash

    def gluon(configs):
        def setup(q, k, v, do, causal):
            o, lse = gluon_flash.gluon_fwd_launch(q, k, v, causal, q.shape[-1] ** -0.5)
            return lambda: gluon_bwd.gluon_bwd_launch(
                do, q, k, v, o, lse, causal, q.shape[-1] ** -0.5, config=configs[q.shape[-1]]
            )

        return setup

    def triton(q, k, v, do, causal):
        o, lse = triton_flash.flash_fwd(q, k, v, None, None, None, 0, causal, q.shape[-1] ** -0.5)
        return lambda: triton_flash.flash_bwd(
            do, q, k, v, o, lse, None, None, None, None, None, 0, causal, q.shape[-1] ** -0.5
        )

    def autograd(make):
        def setup(q, k, v, do, causal):
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            with torch.enable_grad():
                out = make(causal).fn(*leaves)
            return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)

        return setup

    impls = {
        "gluon_wide": gluon(gluon_bwd.WIDE_CONFIGS),
        "gluon_narrow": gluon(gluon_bwd.NARROW_CONFIGS),
        "gluon_ws": gluon(gluon_bwd.WS_CONFIGS),
        "triton": triton,
        "fa2": autograd(fa2),
    }
    if fa4_module is not None:
        impls["fa4"] = autograd(lambda causal: fa4(fa4_module, causal))
    return impls


def measure_cell(cell: dict, kind: str, impls: dict, timer: Timer, attempts: Attempts, device) -> dict:
    """One cell: every implementation run once (compiling, tuning), checked against triton's, then
    timed in two interleaved rounds (the faster kept)."""
    B, H, L, D = cell["B"], cell["H"], cell["L"], cell["D"]
    g = torch.Generator(device=device).manual_seed(L + D + cell.get("causal", False))
    q, k, v, do = (torch.randn(B, H, L, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4))
    record = {**cell, "ms": {}, "tflops": {}, "max_diff_vs_triton": {}, "errors": {}, "configs": {}}
    if kind == "layouts":
        pattern = Pattern(cell["pattern"])
        layout, record["causal"] = pattern.layout(FULL, L), pattern.causal
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        flops = 4 * D * B * allowed_pairs(layout, pattern.causal, L, H)

        def forward(backend):
            return lambda: attention(q, k, v, causal=pattern.causal, layout=layout, backend=backend).detach()

        runs = {"gluon_api": forward(Backend.GLUON), "triton_api": forward(Backend.TRITON)}
    elif kind == "fwd":
        flops = 4 * B * H * L * L * D * (0.5 if cell["causal"] else 1.0)
        runs = {
            name: (lambda fn=fn: fn(q, k, v, cell["causal"]))
            for name, fn in impls.items()
            if D in getattr(fn, "head_dims", (D,))
        }
    else:
        flops = 2.5 * 4 * B * H * L * L * D * (0.5 if cell["causal"] else 1.0)
        runs = {}
        for name, setup in impls.items():
            fn, error = attempts.attempt(f"{name} set-up", lambda setup=setup: setup(q, k, v, do, cell["causal"]))
            runs[name] = fn if error is None else None
            record["errors"].update({name: error} if error else {})
        runs = {name: fn for name, fn in runs.items() if fn is not None}
    reference_name = "triton_api" if kind == "layouts" else "triton"
    results, runnable = {}, {}
    for name, fn in runs.items():
        triton_flash = importlib.import_module("genoformer.kernels.triton_flash")
        with torch.no_grad() if kind == "fwd" else torch.enable_grad(), tuner_choices(triton_flash) as chosen:
            out, error = attempts.attempt(f"{record} {name}", fn)
        if error is not None:
            record["errors"][name] = error
            continue
        results[name], runnable[name] = out, fn
        if chosen and kind == "bwd":
            record["configs"][name] = str(chosen[-1][1])
    if reference_name in results:
        expected = results[reference_name]
        for name, got in results.items():
            pairs = zip(got, expected) if kind == "bwd" else [(got, expected)]
            record["max_diff_vs_triton"][name] = max(
                ((a.float() - b.float()).abs().max() / (b.float().abs().max() if kind == "bwd" else 1)).item()
                for a, b in pairs
            )
    del results
    with torch.no_grad() if kind == "fwd" else torch.enable_grad():
        times = interleaved_rounds({name: (lambda fn=fn: timer(fn)) for name, fn in runnable.items()}, 2, best=min)
    record["ms"] = times
    record["tflops"] = {name: flops / ms / 1e9 for name, ms in times.items()}
    return record


def arguments(parser) -> None:
    parser.add_argument(
        "--passes",
        dest="kind",
        choices=tuple(PASSES),
        default="fwd",
        help="forward, backward, or the forward on block-sparse layouts (result gluon_PASS)",
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 8192, 32768], help="lengths, in this order")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    parser.add_argument("--implementations", nargs="+", metavar="NAME", help="only these (and triton, the reference)")
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warm-up per timing (ms)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="do_bench measuring time per timing (ms)")
    parser.add_argument("--budget-s", type=float, default=120.0, help="stop starting new cells after this")
    parser.add_argument("--device", default="cuda", help="an sm_90 GPU (--smoke: the CPU, Triton interpreted)")


def measure(args) -> dict:
    ours, known, _ = PASSES[args.kind]
    if args.implementations and set(args.implementations) - set(known):
        raise SystemExit(
            f"--implementations: no {sorted(set(args.implementations) - set(known))} in the {args.kind} "
            f"pass; choose from {' '.join(known)}"
        )
    device = torch.device(args.device)
    if not args.smoke and torch.cuda.get_device_capability(device) != (9, 0):
        raise SystemExit("the Gluon kernels run on an sm_90 (Hopper) GPU only: run this on an H100 or H200")
    attempts = Attempts()
    fa4_module, fa4_error = attempts.attempt(
        "import flash_attn.cute", lambda: importlib.import_module("flash_attn.cute")
    )
    impls = {} if args.kind == "layouts" else (forward_impls if args.kind == "fwd" else backward_impls)(fa4_module)
    wanted = set(args.implementations or known) | {"triton", "triton_api"}
    if args.smoke:  # what runs on a CPU: the Triton kernels interpreted, and SDPA's error recorded
        wanted &= {"triton", "triton_api", "fa2"}
    impls = {name: fn for name, fn in impls.items() if name in wanted}
    seq_lens, head_dims = ([128], [64]) if args.smoke else (args.seq_lens, args.head_dims)
    if args.kind == "layouts":
        cells = [
            {"D": d, "H": FULL.heads(d), "L": L, "B": FULL.batch(L), "pattern": p}
            for d in head_dims
            for L in seq_lens
            for p in ("sliding_window", "bigbird", "custom")
        ]
    else:
        cells = [
            {"D": d, "H": 2048 // d, "L": L, "B": max(1, 16384 // L), "causal": c}
            for L in seq_lens
            for d in head_dims
            for c in (True, False)
        ]
    if args.smoke:
        cells = [{**cell, "H": 2, "B": 1} for cell in cells[:2]]
    timer, budget, records = (
        Timer(device, 0 if args.smoke else args.warmup_ms, 1 if args.smoke else args.rep_ms),
        Budget(args.budget_s),
        [],
    )
    for cell in cells:
        if budget.spent:
            records.append({**cell, "skipped": budget.skipped()})
            continue
        records.append(measure_cell(cell, args.kind, impls, timer, attempts, device))
        print(f"{args.kind} {cell}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in records[-1]["ms"].items()), flush=True)
    return {"pass": args.kind, "fa4_error": fa4_error, "records": records, "tracebacks": attempts.tracebacks}


def summarize(data: dict) -> Summary:
    ours, known, tolerance = PASSES[data["pass"]]
    records = [r for r in data["records"] if "skipped" not in r]
    names = [n for n in dict.fromkeys(n for r in records for n in r["ms"])]
    ours = ours if any(ours in r["ms"] for r in records) else (names[0] if names else ours)
    ratio_rows, ms_rows, failures = [], [], []
    for r in records:
        cell = {
            "D": r["D"],
            "L x B": f"{length_label(r['L'])} x {r['B']}",
            "mask": r.get("pattern") or ("causal" if r["causal"] else "bidir"),
        }
        ratio_rows.append(
            {**cell, **{f"{ours} ÷ {n}": ratio(r["ms"].get(ours), r["ms"].get(n)) for n in names if n != ours}}
        )
        ms_rows.append({**cell, **{f"{n} ms": r["ms"].get(n) for n in names}, f"{ours} TFLOP/s": r["tflops"].get(ours)})
        failures += [
            f"{cell} {n}: {r['errors'].get(n) or 'max |diff| ' + fmt(r['max_diff_vs_triton'].get(n))}"
            for n in r["ms"].keys() | r["errors"].keys()
            if n.startswith("gluon") and (n in r["errors"] or r["max_diff_vs_triton"].get(n, 0.0) > tolerance)
        ]
    what = {"fwd": "Gluon forward", "bwd": "Backward", "layouts": "Gluon forward on block-sparse layouts"}[data["pass"]]
    notes = [f"flash-attn-4: {data['fa4_error']}"] if data.get("fa4_error") else []
    notes += [f"FAILED: {f}" for f in failures]
    notes += (
        [f"{len(data['records']) - len(records)} cells skipped (time budget)"]
        if len(records) < len(data["records"])
        else []
    )
    return Summary(
        title=f"{what}, {ours} against the others (sm_90)",
        tables=[
            table(ratio_rows, f"Time ratios, {ours} ÷ other (> 1: {ours} slower)"),
            table(ms_rows, "Milliseconds", headline=False),
        ],
        notes=notes,
        failed=bool(failures),
    )


BENCHMARK = Benchmark(
    "gluon_bench",
    "Gluon kernels (sm_90)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="our Triton kernels, SDPA FlashAttention-2 and flash-attn-4 on the same inputs",
    name_of=lambda args: f"gluon_{args.kind}",
)

if __name__ == "__main__":
    BENCHMARK.main()
