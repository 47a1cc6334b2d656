"""Every launch configuration of our Triton attention kernels, side by side, in one run: what sets
the order (the default first) of the tables in kernels/triton_flash_configs.py.

For each case, every forward and backward candidate the launchers list for this GPU (tile
configurations and the sm_90 variants: TMA loads, conditional rescaling, heads-outer backward
grid, dQ on a second stream, the dK/dV loop's late dV matmul), and the --extra ones, is forced in
turn through the launchers' `config=` and timed (do_bench medians); each result is checked against
the first candidate's (row error above 0.03: WRONG, never best). Cases (bf16, B = 1, H = 2048 / D,
L = 16k or --seq-len): the attention benchmark's custom pattern and causal at D 64 and 128, the
sliding window ±1024 at D 64 and 128, BigBird at D 128.

    python -m benchmarks.kernel_variants --out OUT                       # a GPU, about 2 minutes
    python -m benchmarks.kernel_variants --out OUT --only custom-128 --extra bwd:128:64,128,8,2,128,64,8,2,dv_late
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from genoformer.kernels.reference import row_error

from benchmarks.common import (
    FULL,
    TINY,
    Attempts,
    Benchmark,
    Pattern,
    Summary,
    Timer,
    allowed_pairs,
    length_label,
    table,
)

CHECK_TOLERANCE = 3e-2
VARIANTS = ("tma", "rescale_tau", "heads_outer", "dq_stream", "dv_late")
"""The configurations' on/off variant fields, shown by name after the tiles."""
CASES = {
    f"{p}-{d}": (Pattern(p), d)
    for p, d in (
        ("custom", 64),
        ("custom", 128),
        ("causal", 128),
        ("causal", 64),
        ("sliding_window", 128),
        ("sliding_window", 64),
        ("bigbird", 128),
    )
}


def parse_extra(spec: str) -> tuple[str, int, object]:
    """`fwd:D:block_m,block_n,warps,stages` or `bwd:D:m1,n1,warps1,stages1,m2,n2,warps2,stages2`, then
    on/off variants by name -> (pass, head dim, configuration): a candidate beside the table's."""
    from genoformer.kernels import triton_flash_configs as configs

    try:
        kind, head_dim, fields = spec.split(":")
        values = [v.strip() for v in fields.split(",")]
        config_type = {"fwd": configs.FwdConfig, "bwd": configs.BwdConfig}[kind]
        flags = {v: True for v in values if not v.isdigit()}
        booleans = {f.name for f in dataclasses.fields(config_type) if f.type in (bool, "bool")}
        if set(flags) - booleans:
            raise ValueError(f"no on/off variant {sorted(set(flags) - booleans)} in {kind}: {sorted(booleans)}")
        return kind, int(head_dim), config_type(*[int(v) for v in values if v.isdigit()], **flags)
    except (ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(
            f"--extra {spec!r}: expected fwd:D:block_m,block_n,warps,stages or bwd:D:m1,"
            f"n1,warps1,stages1,m2,n2,warps2,stages2, then variant names ({error})"
        ) from None


def config_text(config) -> str:
    fields = dataclasses.asdict(config)
    flags = [k if v is True else f"{k}={v:g}" for k, v in fields.items() if k in VARIANTS and v]
    return (
        "(" + ", ".join(str(v) for k, v in fields.items() if k not in VARIANTS) + ")" + "".join(f" +{f}" for f in flags)
    )


def measure_case(pattern: Pattern, D: int, L: int, width: int, device, timer: Timer, extra, attempts: Attempts) -> dict:
    from genoformer.kernels import triton_flash as tf
    from genoformer.kernels import triton_flash_configs as configs

    H, sweep = width // D, FULL if device.type == "cuda" else TINY
    layout, causal = pattern.layout(sweep, L), pattern.causal
    g = torch.Generator(device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    q, k, v, do = (torch.randn(1, H, L, D, generator=g, device=device, dtype=dtype) for _ in range(4))
    bs = layout.block_size if layout is not None else 0
    kcnt, kidx = layout.kv_indices(device) if layout is not None else (None, None)
    qcnt, qidx = layout.q_indices(device) if layout is not None else (None, None)
    if device.type == "cuda":
        fwds, bwds = list(tf.fwd_candidates(device, D, bs or None)), list(tf.bwd_candidates(device, D, bs or None))
    else:  # the interpreter's configuration and the variants it can run
        fwd, bwd = configs.INTERPRETER_FWD, configs.INTERPRETER_BWD
        fwds = [configs.fit_fwd(c, bs or None) for c in (fwd, dataclasses.replace(fwd, rescale_tau=8.0))]
        bwds = [configs.fit_bwd(c, bs or None) for c in (bwd, dataclasses.replace(bwd, heads_outer=True))]
    fwds += [configs.fit_fwd(c, bs or None) for kind, dim, c in extra if (kind, dim) == ("fwd", D)]
    bwds += [configs.fit_bwd(c, bs or None) for kind, dim, c in extra if (kind, dim) == ("bwd", D)]
    scale, record = (
        D**-0.5,
        {
            "case": f"{pattern.value} D={D} L={length_label(L)}",
            "head_dim": D,
            "seq_len": L,
            "fwd_flops": 4 * allowed_pairs(layout, causal, L, H) * D,
            "fwd": [],
            "bwd": [],
        },
    )
    runs = {"fwd": lambda c: tf.flash_fwd(q, k, v, None, kcnt, kidx, bs, causal, scale, config=c)}
    first: dict = {}
    for direction, candidates in (("fwd", dict.fromkeys(fwds)), ("bwd", dict.fromkeys(bwds))):
        if direction == "bwd":
            if "fwd" not in first:
                break
            o, lse = first["fwd"]
            runs["bwd"] = lambda c: tf.flash_bwd(
                do, q, k, v, o, lse, None, kcnt, kidx, qcnt, qidx, bs, causal, scale, config=c
            )
        for config in candidates:
            result, error = attempts.attempt(f"{record['case']} {config}", lambda c=config: runs[direction](c))
            entry = {"config": config_text(config), "ms": None, "err": None, "error": error}
            if error is None:
                first.setdefault(direction, result)
                got, expected = (result[0], first["fwd"][0]) if direction == "fwd" else (result, first["bwd"])
                entry["err"] = (
                    row_error(got, expected)
                    if direction == "fwd"
                    else max(row_error(a, b) for a, b in zip(got, expected, strict=True))
                )
                entry["ms"] = timer(lambda c=config: runs[direction](c))
            record[direction].append(entry)
    return record


def arguments(parser) -> None:
    parser.add_argument("--only", nargs="+", metavar="PATTERN-D", choices=sorted(CASES), help="only these cases")
    parser.add_argument(
        "--extra",
        nargs="+",
        type=parse_extra,
        default=[],
        metavar="SPEC",
        help="candidates beside the table's: fwd:D:block_m,block_n,warps,stages or bwd:D:m1,n1,warps1,"
        "stages1,m2,n2,warps2,stages2, then variant names (bwd:128:64,128,8,3,128,64,8,3,dv_late)",
    )
    parser.add_argument("--seq-len", type=int, metavar="L", help="every case at this length (default 16k)")
    parser.add_argument("--device", default="cuda", help="a GPU (--smoke: the CPU, interpreted)")


def measure(args) -> dict:
    device = torch.device(args.device)
    L = 64 if args.smoke else args.seq_len or 16384
    timer, attempts = Timer(device, 0 if args.smoke else 10, 1 if args.smoke else 40), Attempts()
    cases = (
        [measure_case(Pattern.CAUSAL, 16, L, 32, device, timer, args.extra, attempts)]
        if args.smoke
        else [measure_case(*CASES[n], L, 2048, device, timer, args.extra, attempts) for n in args.only or CASES]
    )
    return {"cases": cases, "tracebacks": attempts.tracebacks}


def summarize(data: dict) -> Summary:
    rows = []
    for record in data["cases"]:
        for direction in ("fwd", "bwd"):
            entries = record[direction]
            good = [e for e in entries if e["ms"] is not None and e["err"] is not None and e["err"] <= CHECK_TOLERANCE]
            winner = min(good, key=lambda e: e["ms"]) if good else None
            default = entries[0]["ms"] if entries else None
            flops = record["fwd_flops"] * (2.5 if direction == "bwd" else 1.0)
            rows += [
                {
                    "case": record["case"],
                    "pass": direction,
                    "config": e["config"],
                    "ms": e["ms"],
                    "TFLOP/s": flops / (e["ms"] * 1e9) if e["ms"] else None,
                    "vs default": e["ms"] / default if e["ms"] and default else None,
                    "check": e["error"]
                    or ("WRONG" if e["err"] is None or e["err"] > CHECK_TOLERANCE else f"{e['err']:.1e}"),
                    "best": "best" if e is winner else "",
                }
                for e in entries
            ]
    return Summary(tables=[table(rows, "Every candidate; 'vs default': its time over the first (default) candidate's")])


BENCHMARK = Benchmark(
    "kernel_variants",
    "Kernel variants: every launch configuration",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="the default (first) configuration of the same launcher",
)

if __name__ == "__main__":
    BENCHMARK.main()
