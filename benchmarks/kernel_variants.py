"""Every launch configuration of our Triton attention kernels, side by side, in one run.

For each case below, every forward and every backward candidate that
`kernels/triton_flash_configs.py` lists for this GPU (plain tile configurations and the sm_90
variants: tensor-descriptor/TMA loads, conditional rescaling, heads-outer backward grid, dQ on a
second stream, the dK/dV loop's late dV matmul) is forced in turn through the launchers'
`config=` argument and timed; the fastest of each list is what the launcher's autotuning would
pick, and the table's order (its default first) is set from these numbers. Two diagnostics of
the block-sparse path follow:
  * sparse overhead: dense bidirectional attention through the dense kernels (layout None)
    against the same function through the block-sparse kernels (`BlockLayout.dense`, every
    block listed): after the pipelining fix of `tile_start` the two should be within a few %;
  * backward breakdown: `torch.profiler` CUDA times of each kernel of our backward (preprocess,
    dK/dV, dQ, the sums of split lists) and of Flex's (Triton backend) for the same BlockMask,
    and each call's GPU time, for the cases of --breakdown (default the window at D128).

One run, from the repository root (about 2 minutes on an H200, most of it compiling):

    python -m benchmarks.kernel_variants --out OUT
    python -m benchmarks.kernel_variants --out OUT --only custom-128 sliding_window-64 \
        --extra fwd:128:128,64,4,3 bwd:128:64,128,8,2,128,64,8,2   # some cases, candidates beside the table's
    python -m benchmarks.kernel_variants --out OUT --only custom-64 --seq-len 32768  # another length
    python -m benchmarks.kernel_variants --out OUT --no-candidates --breakdown custom-128 custom-64  # profiles
    TRITON_INTERPRET=1 python -m benchmarks.kernel_variants --smoke --out /tmp/v   # CPU smoke run

It writes OUT/kernel_variants.json and OUT/kernel_variants.md and prints the table last.
Cases (bf16, B = 1, H = 2048 / D): attention.py's custom pattern (causal window 512 | every 16th
key block) at D 64 and 128, causal dense at D 64 and 128, the sliding window ±1024
bidirectional and BigBird (window 512, 1 global, 2 random blocks) at D 128, all at L = 16k
(`--seq-len` sets another).
Every candidate's output and gradients are compared with the first candidate's (worst row
error as in benchmarks/attention.py); one that differs is flagged WRONG and never "best".
Times: medians of `triton.testing.do_bench` (a perf_counter loop on the CPU smoke run).

Shape legend: B batch, H heads, L sequence length, D head dim, bs block size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.attention import allowed_pairs, flex_block_mask, static_flex, tuner_choices
from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table
from genoformer.kernels import triton_flash as tf
from genoformer.kernels import triton_flash_configs as configs
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import row_error

CHECK_TOLERANCE = 3e-2
"""Worst row error against the first candidate before a candidate is flagged WRONG (bf16)."""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    head_dim: int
    seq_len: int
    causal: bool
    layout: Callable[[int], BlockLayout | None]  # seq_len -> layout (None: dense)

    def heads(self, width: int) -> int:
        return width // self.head_dim

    @property
    def key(self) -> str:
        """What --only matches: the pattern's first word and the head dim, e.g. custom-128."""
        return f"{self.name.split()[0]}-{self.head_dim}"


def _window(window: int, bs: int) -> Callable[[int], BlockLayout]:
    return lambda L: BlockLayout.sliding_window(L, window, bs)


def _bigbird(window: int, bs: int) -> Callable[[int], BlockLayout]:
    return lambda L: BlockLayout.bigbird(L, window, 1, 2, bs)


def _custom(window: int, stride: int, bs: int) -> Callable[[int], BlockLayout]:
    """benchmarks/attention.py's custom pattern: a causal window united with every stride-th key block."""
    return lambda L: (BlockLayout.sliding_window(L, window, bs) | BlockLayout.strided(L, stride, bs)).with_causal()


def gpu_cases() -> list[Case]:
    return [
        Case("custom (window 512 | every 16th block)", 64, 16384, True, _custom(512, 16, 128)),
        Case("custom (window 512 | every 16th block)", 128, 16384, True, _custom(512, 16, 128)),
        Case("causal", 128, 16384, True, lambda L: None),
        Case("causal", 64, 16384, True, lambda L: None),
        Case("sliding_window ±1024", 128, 16384, False, _window(1024, 128)),
        Case("sliding_window ±1024", 64, 16384, False, _window(1024, 128)),
        Case("bigbird", 128, 16384, False, _bigbird(512, 128)),
    ]


def smoke_cases() -> list[Case]:
    return [
        Case("causal", 32, 80, True, lambda L: None),
        Case("sliding_window ±32", 32, 96, False, _window(32, 32)),
    ]


VARIANTS = ("tma", "rescale_tau", "heads_outer", "dq_stream", "dv_late")
"""The configurations' variant fields (kernels/triton_flash_configs.py), shown by name after the tiles."""


def parse_extra(spec: str) -> tuple[str, int, configs.FwdConfig | configs.BwdConfig]:
    """`fwd:D:block_m,block_n,warps,stages` or `bwd:D:m1,n1,warps1,stages1,m2,n2,warps2,stages2`,
    optionally followed by on/off variants of that pass by name (`bwd:128:64,128,8,3,128,64,8,3,dv_late,
    dq_stream`) -> (pass, head dim, configuration): a candidate to time beside the table's."""
    try:
        kind, head_dim, fields = spec.split(":")
        values = fields.split(",")
        tiles = [int(v) for v in values if v.strip().isdigit()]
        flags = {v.strip(): True for v in values if not v.strip().isdigit()}
        config_type = {"fwd": configs.FwdConfig, "bwd": configs.BwdConfig}[kind]
        booleans = {f.name for f in dataclasses.fields(config_type) if f.type in (bool, "bool")}
        if set(flags) - booleans:
            raise ValueError(f"no on/off variant {sorted(set(flags) - booleans)} in {kind}: {sorted(booleans)}")
        return kind, int(head_dim), config_type(*tiles, **flags)
    except (ValueError, KeyError, TypeError) as error:
        raise argparse.ArgumentTypeError(
            f"--extra {spec!r}: expected fwd:D:block_m,block_n,warps,stages or "
            f"bwd:D:m1,n1,warps1,stages1,m2,n2,warps2,stages2, then variant names ({error})") from None


def candidates(device: torch.device, head_dim: int, block_size: int | None,
               extra: tuple[tuple[str, int, object], ...] = ()) -> tuple[list, list]:
    """(forward, backward) candidates: the launcher's table on a GPU, then the `extra` ones of this
    head dim (fitted to the block size); on the CPU smoke run the interpreter configuration and
    its variants that the interpreter can run, then the extra ones."""
    if device.type == "cuda":
        fwds, bwds = list(tf.fwd_candidates(device, head_dim, block_size)), list(
            tf.bwd_candidates(device, head_dim, block_size))
    else:
        fwd, bwd = configs.INTERPRETER_FWD, configs.INTERPRETER_BWD
        fwds = [configs.fit_fwd(c, block_size) for c in (fwd, dataclasses.replace(fwd, rescale_tau=8.0))]
        bwds = [configs.fit_bwd(c, block_size) for c in (bwd, dataclasses.replace(bwd, heads_outer=True),
                                                         dataclasses.replace(bwd, dv_late=True))]
    for kind, dim, config in extra:
        if dim == head_dim and kind == "fwd":
            fwds.append(configs.fit_fwd(config, block_size))
        elif dim == head_dim:
            bwds.append(configs.fit_bwd(config, block_size))
    return list(dict.fromkeys(fwds)), list(dict.fromkeys(bwds))


class Timer:
    def __init__(self, device: torch.device, smoke: bool) -> None:
        self.device, self.smoke = device, smoke

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))
        fn()  # the interpreter is slow: one warm-up and one timed call
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


def config_text(cfg) -> str:
    fields = dataclasses.asdict(cfg)
    plain = [str(v) for k, v in fields.items() if k not in VARIANTS]
    extra = [k if v is True else f"{k}={v:g}" for k, v in fields.items() if k in VARIANTS and v]
    return "(" + ", ".join(plain) + ")" + ("".join(f" +{e}" for e in extra))


def measure_case(case: Case, device: torch.device, dtype: torch.dtype, width: int, timer: Timer,
                 extra: tuple[tuple[str, int, object], ...] = ()) -> dict:
    """Forward and backward times of every candidate on one case."""
    H, L, D = case.heads(width), case.seq_len, case.head_dim
    layout = case.layout(L)
    g = torch.Generator(device).manual_seed(0)
    q, k, v, do = (torch.randn(1, H, L, D, generator=g, device=device, dtype=dtype) for _ in range(4))
    bs = layout.block_size if layout is not None else 0
    kcnt = kidx = qcnt = qidx = None
    if layout is not None:
        kcnt, kidx = layout.kv_indices(device)
        qcnt, qidx = layout.q_indices(device)
    scale = D**-0.5
    flops = 4 * allowed_pairs(layout, case.causal, L, H) * D
    fwd_cands, bwd_cands = candidates(device, D, bs or None, extra)
    record = {"case": case.name, "head_dim": D, "seq_len": L, "heads": H, "causal": case.causal,
              "block_size": bs or None, "fwd_flops": flops, "fwd": [], "bwd": []}
    reference = None
    for cfg in fwd_cands:
        entry = {"config": config_text(cfg), "ms": None, "err": None, "error": None}
        try:
            o, lse = tf.flash_fwd(q, k, v, None, kcnt, kidx, bs, case.causal, scale, config=cfg)
            reference = (o, lse) if reference is None else reference
            entry["err"] = row_error(o, reference[0])
            entry["ms"] = timer(lambda cfg=cfg: tf.flash_fwd(q, k, v, None, kcnt, kidx, bs, case.causal, scale,
                                                             config=cfg))
        except Exception as error:  # recorded: a variant this GPU's Triton cannot build
            entry["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        record["fwd"].append(entry)
    if reference is None:
        return record
    o, lse = reference
    expected = None
    for cfg in bwd_cands:
        entry = {"config": config_text(cfg), "ms": None, "err": None, "error": None}
        try:
            grads = tf.flash_bwd(do, q, k, v, o, lse, None, kcnt, kidx, qcnt, qidx, bs, case.causal, scale, config=cfg)
            expected = grads if expected is None else expected
            entry["err"] = max(row_error(a, b) for a, b in zip(grads, expected, strict=True))
            entry["ms"] = timer(lambda cfg=cfg: tf.flash_bwd(do, q, k, v, o, lse, None, kcnt, kidx, qcnt, qidx, bs,
                                                             case.causal, scale, config=cfg))
        except Exception as error:  # recorded: a variant this GPU's Triton cannot build
            entry["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        record["bwd"].append(entry)
    return record


def sparse_overhead(device: torch.device, dtype: torch.dtype, L: int, D: int, H: int, bs: int, timer: Timer) -> dict:
    """Dense bidirectional attention through the dense kernels and through the block-sparse ones."""
    g = torch.Generator(device).manual_seed(1)
    q, k, v, do = (torch.randn(1, H, L, D, generator=g, device=device, dtype=dtype) for _ in range(4))
    scale = D**-0.5
    layout = BlockLayout.dense(L, block_size=bs)
    kcnt, kidx = layout.kv_indices(device)
    qcnt, qidx = layout.q_indices(device)
    fwd_d, bwd_d = (c[0] for c in candidates(device, D, None))
    fwd_s, bwd_s = (c[0] for c in candidates(device, D, bs))
    o, lse = tf.flash_fwd(q, k, v, None, None, None, 0, False, scale, config=fwd_d)
    out = {"seq_len": L, "head_dim": D, "heads": H, "block_size": bs}
    out["dense_fwd_ms"] = timer(lambda: tf.flash_fwd(q, k, v, None, None, None, 0, False, scale, config=fwd_d))
    out["sparse_fwd_ms"] = timer(lambda: tf.flash_fwd(q, k, v, None, kcnt, kidx, bs, False, scale, config=fwd_s))
    out["dense_bwd_ms"] = timer(lambda: tf.flash_bwd(do, q, k, v, o, lse, None, None, None, None, None, 0, False,
                                                     scale, config=bwd_d))
    out["sparse_bwd_ms"] = timer(lambda: tf.flash_bwd(do, q, k, v, o, lse, None, kcnt, kidx, qcnt, qidx, bs, False,
                                                      scale, config=bwd_s))
    return out


def backward_breakdown(device: torch.device, dtype: torch.dtype, case: Case, width: int) -> dict:
    """Ours' and Flex's backward on one case: CUDA time per kernel (ms per call, summed over 5
    calls / 5; kernels on two streams overlap, so they may add up to more than the call), the
    call's GPU time (CUDA events around 20 calls before the profile, / 20) and the configurations
    ours' tuner chose for the case."""
    from torch.profiler import ProfilerActivity, profile

    H, L, D = case.heads(width), case.seq_len, case.head_dim
    layout = case.layout(L)
    g = torch.Generator(device).manual_seed(2)
    q, k, v, do = (torch.randn(1, H, L, D, generator=g, device=device, dtype=dtype).requires_grad_()
                   for _ in range(4))
    flex = static_flex()
    block_mask = flex_block_mask(layout, case.causal, H, device, index_only=True)
    result = {"case": case.name, "head_dim": D, "seq_len": L}
    for name, fn in (("ours", lambda: tf.triton_attention(q, k, v, causal=case.causal, layout=layout)),
                     ("flex", lambda: flex(q, k, v, block_mask=block_mask))):
        with tuner_choices(tf) as chosen:
            out = fn()
            out.backward(do.detach(), retain_graph=True)  # compiles and autotunes outside the profile
        torch.cuda.synchronize()
        if name == "ours":
            result["ours_configs"] = [config_text(config) for _, config in chosen]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # outside the profiler, whose host overhead can leave the GPU waiting
        for _ in range(20):
            out.backward(do.detach(), retain_graph=True)
        end.record()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                out.backward(do.detach(), retain_graph=True)
            torch.cuda.synchronize()
        kernels = {}
        for event in prof.key_averages():
            cuda_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
            if cuda_us and event.key not in kernels and "Memcpy" not in event.key and "Memset" not in event.key:
                kernels[event.key[:60]] = round(cuda_us / 5 / 1e3, 4)
        result[name] = dict(sorted(kernels.items(), key=lambda item: -item[1])[:8])
        result[f"{name}_call_ms"] = round(start.elapsed_time(end) / 20, 4)
        for t in (q, k, v):
            t.grad = None
    return result


def _length_label(seq_len: int) -> str:
    return f"{seq_len // 1024}k" if seq_len % 1024 == 0 else str(seq_len)


def best(entries: list[dict]) -> dict | None:
    """The fastest candidate whose result matches the first's."""
    ok = [e for e in entries if e["ms"] is not None and e["err"] is not None and e["err"] <= CHECK_TOLERANCE]
    return min(ok, key=lambda e: e["ms"]) if ok else None


def rows(results: dict) -> list[dict]:
    out = []
    for record in results["cases"]:
        for direction in ("fwd", "bwd"):
            entries = record[direction]
            winner = best(entries)
            default = entries[0]["ms"] if entries else None
            for e in entries:
                flops = record["fwd_flops"] * (2.5 if direction == "bwd" else 1.0)
                wrong = e["err"] is not None and not e["err"] <= CHECK_TOLERANCE
                out.append({
                    "case": f"{record['case']} D={record['head_dim']} L={_length_label(record['seq_len'])}",
                    "pass": direction,
                    "config": e["config"],
                    "ms": "—" if e["ms"] is None else f"{e['ms']:.3f}",
                    "TFLOP/s": "—" if e["ms"] is None else f"{flops / (e['ms'] * 1e9):.0f}",
                    "vs default": "—" if e["ms"] is None or not default else f"{e['ms'] / default:.3f}",
                    "check": e["error"] or ("WRONG" if wrong else f"{e['err']:.1e}"),
                    "best": "**best**" if e is winner else "",
                })
    return out


def breakdown_lines(results: dict) -> list[str]:
    """The backward profiles (``backward_breakdown``) as Markdown lines."""
    lines = []
    breakdowns = results.get("backward_breakdown", [])
    for breakdown in [breakdowns] if isinstance(breakdowns, dict) else breakdowns:  # older JSONs: one dict
        chosen = breakdown.get("ours_configs")
        chosen = "not recorded" if chosen is None else ", ".join(chosen)
        lines += ["", f"Backward kernels, {breakdown['case']} D={breakdown['head_dim']} "
                      f"L={_length_label(breakdown['seq_len'])}, ms per call (ours' tuned configurations: {chosen}):", ""]
        for name in ("ours", "flex"):
            parts = ", ".join(f"`{k}` {v}" for k, v in breakdown.get(name, {}).items())
            call = breakdown.get(f"{name}_call_ms")
            lines.append(f"- {name}{f' (the call: {call} ms)' if call is not None else ''}: {parts}")
    return lines


def render_markdown(results: dict) -> str:
    lines = [
        "## Kernel variants (every launch configuration, side by side)",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        "Each candidate of `kernels/triton_flash_configs.py` forced through the launcher's `config=`; "
        "'vs default' is the time over the first (default) candidate's; 'check' the worst row error "
        "against the first candidate's result. Configuration fields: fwd (block_m, block_n, warps, stages), "
        "bwd (dK/dV block_m1, block_n1, warps, stages, dQ block_m2, block_n2, warps, stages).",
        "",
        markdown_table(rows(results)),
    ]
    overhead = results.get("sparse_overhead")
    if overhead:
        lines += [
            "",
            f"Sparse-path overhead (dense bidirectional, L={overhead['seq_len']}, D={overhead['head_dim']}, "
            f"H={overhead['heads']}): dense kernels {overhead['dense_fwd_ms']:.3f} / {overhead['dense_bwd_ms']:.3f} ms, "
            f"block-sparse kernels with every block listed {overhead['sparse_fwd_ms']:.3f} / "
            f"{overhead['sparse_bwd_ms']:.3f} ms (fwd / bwd).",
        ]
    lines += breakdown_lines(results)
    return "\n".join(lines)


def summary(results: dict) -> str:
    short = [{k: r[k] for k in ("case", "pass", "config", "ms", "vs default", "check", "best")} for r in rows(results)]
    text = markdown_table(short)
    overhead = results.get("sparse_overhead")
    if overhead:
        text += (f"\nsparse-path overhead: fwd {overhead['sparse_fwd_ms'] / overhead['dense_fwd_ms']:.3f}x, "
                 f"bwd {overhead['sparse_bwd_ms'] / overhead['dense_bwd_ms']:.3f}x of the dense kernels")
    return "\n".join([text, *breakdown_lines(results), f"wall {results['wall_s']:.0f} s"])


def _write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("kernel_variants.json", json.dumps(results, indent=1)),
                       ("kernel_variants.md", render_markdown(results) + "\n")):
        partial = out / (name + ".tmp")
        partial.write_text(text)
        partial.replace(out / name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_variants", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write kernel_variants.json and .md here")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU under Triton's interpreter (set TRITON_INTERPRET=1)")
    parser.add_argument("--only", nargs="+", metavar="PATTERN-D",
                        help="run only these cases, by the pattern's first word and head dim (custom-128, "
                             "sliding_window-64, causal-128, bigbird-128, ...)")
    parser.add_argument("--extra", nargs="+", type=parse_extra, default=[], metavar="SPEC",
                        help="candidates to time beside the table's: fwd:D:block_m,block_n,warps,stages or "
                             "bwd:D:m1,n1,warps1,stages1,m2,n2,warps2,stages2, optionally followed by variant "
                             "names (bwd:128:64,128,8,3,128,64,8,3,dv_late,heads_outer)")
    parser.add_argument("--seq-len", type=int, metavar="L",
                        help="run every case at this sequence length instead of its own (16k on a GPU); "
                             "a multiple of the layouts' block size")
    parser.add_argument("--breakdown", nargs="*", default=["sliding_window-128"], metavar="PATTERN-D",
                        help="cases whose backward is profiled kernel by kernel, ours beside Flex, at --seq-len "
                             "when given (default sliding_window-128; none when the flag has no case)")
    parser.add_argument("--no-candidates", action="store_true",
                        help="skip the candidates' table (with --breakdown: the profiles alone)")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke and not tf.INTERPRETED:
        sys.exit("the CPU smoke run needs Triton's interpreter: "
                 "TRITON_INTERPRET=1 python -m benchmarks.kernel_variants --smoke --out /tmp/v")
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run the CPU smoke version, "
                 "TRITON_INTERPRET=1 python -m benchmarks.kernel_variants --smoke --out /tmp/v")
    started = time.monotonic()
    timer = Timer(device, args.smoke)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    width = 2048 if device.type == "cuda" else 64
    results = {"environment": describe_environment(device), "command": command_line(), "cases": []}
    cases = gpu_cases() if device.type == "cuda" else smoke_cases()
    if args.only:
        unknown = set(args.only) - {case.key for case in cases}
        if unknown:
            sys.exit(f"--only: no case {sorted(unknown)}; the cases are {[case.key for case in cases]}")
        cases = [case for case in cases if case.key in args.only]
    unknown = set(args.breakdown) - {case.key for case in gpu_cases()}
    if unknown:
        sys.exit(f"--breakdown: no case {sorted(unknown)}; the cases are {[case.key for case in gpu_cases()]}")
    if args.seq_len is not None:
        cases = [dataclasses.replace(case, seq_len=args.seq_len) for case in cases]
    for case in [] if args.no_candidates else cases:
        results["cases"].append(measure_case(case, device, dtype, width, timer, tuple(args.extra)))
        results["wall_s"] = time.monotonic() - started
        _write(results, args.out)  # kept current, so that a killed run still leaves its numbers
        print(f"[{results['wall_s']:5.0f}s] {case.name} D={case.head_dim} done", flush=True)
    if not args.no_candidates:
        results["sparse_overhead"] = (sparse_overhead(device, dtype, 16384, 128, 16, 128, timer) if device.type == "cuda"
                                      else sparse_overhead(device, dtype, 64, 32, 2, 32, timer))
    if device.type == "cuda":
        results["backward_breakdown"] = [
            backward_breakdown(device, dtype, dataclasses.replace(case, seq_len=args.seq_len or case.seq_len), width)
            for case in gpu_cases() if case.key in args.breakdown]
    results["wall_s"] = time.monotonic() - started
    _write(results, args.out)
    print(summary(results), flush=True)
    return results


if __name__ == "__main__":
    main()
