"""What each flash-attn parameter costs in our Triton kernels, against the same call without it, and
against FlexAttention and flash-attn-4 with the same parameter.

    python -m benchmarks.flash_params --out OUT          # a GPU (H100 or H200): bf16, 16k tokens, 16 heads of 128
    python -m benchmarks.flash_params --smoke --out OUT  # the CPU, Triton's interpreter, tiny shapes

Situations (ours: `triton_flash.triton_attention` on (B, H, L, D) views of (B, L, H, D) tensors):
causal; an exact window (window_size (W, 0) causal, and (W, W)) beside the block-granular layout of
the same width (BlockLayout.sliding_window, the CSR lists); ALiBi (the paper's slopes) and softcap
beside plain causal; dropout beside none; `flash_attn_compat.flash_attn_func` beside the native call
on the same tensors. Each against FlexAttention (torch.compile(flex_attention), its Triton backend:
mask_mod for the windows, score_mod for ALiBi and softcap; it has no dropout) and flash-attn-4
(`flash_attn.cute.flash_attn_func`: window_size, softcap; no ALiBi slopes but through a CuTe-DSL
score_mod, no dropout) when installed; what cannot run is recorded with the reason.

Forward and forward + backward medians (`Timer`: triton's do_bench), the best of --rounds
interleaved rounds. Our launches use the default configurations (GENOFORMER_TRITON_AUTOTUNE=0), so a
parameter is compared with its absence in the same tiles. Before timing, each situation runs once in
a process of its own (--warm-workers at a time: Triton's and Inductor's disk caches fill, and the
timed process finds its kernels built), and each implementation's output is compared with ours
(bf16, max |difference|). Targets: exact window within 1.05x the block-granular window, ALiBi and
softcap within 1.10x plain causal, dropout within 1.25x, the compatible module within 1.03x the
native call (all forward + backward); reported: the ratios to Flex (aim: at most 1.0x) and FA4.

Shape legend: q (B, H, L, D) for our kernels, (B, L, H, D) for flash-attn's and flash-attn-4's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import math
import multiprocessing
import os
import time
from typing import Callable

import torch

from benchmarks.common import Attempts, Benchmark, Summary, Timer, at_most, ratio, table

SOFTCAP, DROPOUT = 30.0, 0.1


@dataclasses.dataclass(frozen=True)
class Situation:
    name: str
    ours: tuple  # (key, value) pairs of triton_attention's keywords; "layout": a window width; "alibi", "compat": True
    baseline: str | None = None  # the situation whose ours this one is compared with
    target: float | None = None  # ours / baseline (forward + backward) at most
    flex: str | None = None  # "causal", "sliding", "band", "alibi", "softcap"; None: not run (why_not_flex)
    fa4: tuple | None = None  # flash_attn.cute.flash_attn_func keywords; None: not run (why_not_fa4)
    why_not_flex: str = ""
    why_not_fa4: str = ""


def situations(window: int, smoke: bool) -> list[Situation]:
    causal, block = "causal", f"block-granular window {window}, causal"
    plain = [
        Situation(causal, (("causal", True),), flex="causal", fa4=(("causal", True),)),
        Situation(
            block,
            (("causal", True), ("layout", window)),
            why_not_flex="the exact window's row",
            why_not_fa4="the exact window's row",
        ),
        Situation(
            f"exact window {window}, causal",
            (("causal", True), ("window", (window, 0))),
            block,
            1.05,
            flex="sliding",
            fa4=(("causal", True), ("window_size", (window, 0))),
        ),
        Situation(
            "ALiBi, causal",
            (("causal", True), ("alibi", True)),
            causal,
            1.10,
            flex="alibi",
            why_not_fa4="flash-attn-4 takes ALiBi slopes only as a CuTe-DSL score_mod",
        ),
    ]
    if smoke:
        return plain
    both = f"block-granular window ±{window}"
    return plain + [
        Situation(
            both, (("layout", window),), why_not_flex="the exact window's row", why_not_fa4="the exact window's row"
        ),
        Situation(
            f"exact window ±{window}",
            (("window", (window, window)),),
            both,
            1.05,
            flex="band",
            fa4=(("window_size", (window, window)),),
        ),
        Situation(
            f"softcap {SOFTCAP:g}, causal",
            (("causal", True), ("softcap", SOFTCAP)),
            causal,
            1.10,
            flex="softcap",
            fa4=(("causal", True), ("softcap", SOFTCAP)),
        ),
        Situation(
            f"dropout {DROPOUT:g}, causal",
            (("causal", True), ("dropout_p", DROPOUT)),
            causal,
            1.25,
            why_not_flex="FlexAttention has no dropout",
            why_not_fa4="flash-attn-4 has no dropout",
        ),
        Situation(
            "flash_attn_compat.flash_attn_func, causal",
            (("causal", True), ("compat", True)),
            causal,
            1.03,
            why_not_flex="the native call's row",
            why_not_fa4="the native call's row",
        ),
    ]


def _inputs(shape: tuple, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v, dout (B, H, L, D) bf16 views of (B, L, H, D) tensors (flash-attn's layout)."""
    B, H, L, D = shape
    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn(B, L, H, D, device=device, dtype=torch.bfloat16, generator=g).transpose(1, 2) for _ in range(4)]


def _ours(situation: Situation, shape: tuple, device: torch.device) -> Callable:
    from genoformer.kernels import alibi_slopes
    from genoformer.kernels import flash_attn_compat as compat
    from genoformer.kernels.dropout import draw_rng
    from genoformer.kernels.layout import BlockLayout
    from genoformer.kernels.triton_flash import triton_attention

    kwargs = dict(situation.ours)
    if kwargs.pop("compat", False):
        return lambda q, k, v: compat.flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=kwargs["causal"]
        ).transpose(1, 2)
    L, bs = shape[2], 128 if shape[2] >= 1024 else 32
    if "layout" in kwargs:
        layout = BlockLayout.sliding_window(L, kwargs.pop("layout"), bs)
        kwargs["layout"] = layout.with_causal() if kwargs.get("causal") else layout
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = alibi_slopes(shape[1]).to(device)
    if kwargs.get("dropout_p"):
        kwargs["dropout_rng"] = draw_rng(device)
    return functools.partial(triton_attention, **kwargs)


def _flex(kind: str, shape: tuple, window: int, device: torch.device, compiled: bool) -> Callable:
    from genoformer.kernels import alibi_slopes
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, D = shape
    slopes = alibi_slopes(H).to(device)

    def causal(b, h, q, kv):
        return kv <= q

    def sliding(b, h, q, kv):
        return (kv <= q) & (q - kv <= window)

    def band(b, h, q, kv):
        return (q - kv <= window) & (kv - q <= window)

    def alibi(score, b, h, q, kv):
        return score - slopes[h] * (q - kv).abs()

    def softcap(score, b, h, q, kv):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    mask_mod = {"sliding": sliding, "band": band}.get(kind, causal)
    score_mod = {"alibi": alibi, "softcap": softcap}.get(kind)
    block_mask = create_block_mask(mask_mod, None, None, L, L, device=str(device))
    if compiled:
        return functools.partial(
            torch.compile(flex_attention, dynamic=False), score_mod=score_mod, block_mask=block_mask
        )
    # uncompiled, on a CPU: forward only (PyTorch has no CPU Flex backward; the forward+backward is recorded as failed)
    return lambda q, k, v: flex_attention(
        q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=block_mask
    )


def _fa4(kwargs: tuple) -> Callable:
    import flash_attn.cute as fa4

    def run(q, k, v):
        out = fa4.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **dict(kwargs))
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return run


@functools.cache
def _fa4_reason() -> str | None:
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError as error:
        return f"flash-attn-4 is not installed here ({error})"
    return None


def _impls(situation: Situation, shape: tuple, window: int, device: torch.device) -> dict:
    """{"ours", "flex", "fa4"}: each a callable (q, k, v) -> out, or why it does not run."""
    impls: dict = {"ours": _ours(situation, shape, device)}
    impls["flex"] = (
        _flex(situation.flex, shape, window, device, device.type == "cuda")
        if situation.flex
        else situation.why_not_flex
    )
    if situation.fa4 is None:
        impls["fa4"] = situation.why_not_fa4
    elif device.type != "cuda":
        impls["fa4"] = "flash-attn-4 runs on CUDA GPUs only"
    else:
        impls["fa4"] = _fa4_reason() or _fa4(situation.fa4)
    return impls


def _warm(name: str, shape: tuple, window: int) -> str:
    """Child process: one situation's implementations once, forward and backward, so that their kernels
    compile into the disk caches (and fail here first); returns what failed."""
    os.environ["GENOFORMER_TRITON_AUTOTUNE"] = "0"
    device = torch.device("cuda")
    situation = next(s for s in situations(window, smoke=False) if s.name == name)
    q, k, v, dout = (t.requires_grad_() for t in _inputs(shape, device))
    attempts = Attempts()
    errors = []
    for key, impl in _impls(situation, shape, window, device).items():
        if callable(impl):
            _, error = attempts.attempt(f"{name}: {key}", lambda impl=impl: impl(q, k, v).backward(dout))
            errors += [f"{key}: {error}"] if error else []
    torch.cuda.synchronize()
    return "; ".join(errors)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="device (default cuda; cpu with --smoke)"
    )
    parser.add_argument("--length", type=int, default=16384, help="tokens (default 16384; 64 with --smoke)")
    parser.add_argument("--window", type=int, default=1024, help="window width (default 1024; 16 with --smoke)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--rep-ms", type=float, default=60.0, help="do_bench measuring time in ms (default 60)")
    parser.add_argument(
        "--warm-workers", type=int, default=6, help="processes compiling the situations first (default 6; 0: none)"
    )


def measure(args: argparse.Namespace) -> dict:
    os.environ["GENOFORMER_TRITON_AUTOTUNE"] = "0"
    if args.device == "cpu":  # our kernels then run under Triton's interpreter (read when they are first imported)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device(args.device)
    L, window = (64, 16) if args.smoke else (args.length, args.window)
    shape = (1, 2, L, 16) if args.smoke else (1, 16, L, 128)
    cases = situations(window, args.smoke)
    began = time.monotonic()
    warm_errors = {}
    if args.warm_workers and device.type == "cuda":
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.warm_workers, mp_context=context) as pool:
            names = [s.name for s in cases]
            warm_errors = dict(zip(names, pool.map(_warm, names, [shape] * len(names), [window] * len(names))))
    warm_s = time.monotonic() - began
    q, k, v, dout = (t.requires_grad_() for t in _inputs(shape, device))
    attempts = Attempts()
    timer = Timer(device, warmup_ms=1 if args.smoke else 10, rep_ms=1 if args.smoke else args.rep_ms)
    impls = {s.name: _impls(s, shape, window, device) for s in cases}
    records = {
        s.name: {key: ({} if callable(impl) else {"error": impl}) for key, impl in impls[s.name].items()} for s in cases
    }
    for s in cases:  # outputs against ours (bf16 both): the same function is timed
        with torch.no_grad():
            ours, error = attempts.attempt(f"{s.name}: ours", lambda s=s: impls[s.name]["ours"](q, k, v).float())
            if error:
                records[s.name]["ours"] = {"error": error}
                continue
            for key in ("flex", "fa4"):
                if callable(impls[s.name][key]):
                    diff, error = attempts.attempt(
                        f"{s.name}: {key}",
                        lambda s=s, key=key: (impls[s.name][key](q, k, v).float() - ours).abs().max().item(),
                    )
                    records[s.name][key] = {"error": error} if error else {"max_abs_diff_vs_ours": diff}
    for _ in range(args.rounds):
        for s in cases:
            for key, impl in impls[s.name].items():
                record = records[s.name][key]
                if not callable(impl) or "error" in record:
                    continue

                def forward(impl=impl):
                    with torch.no_grad():
                        impl(q, k, v)

                def forward_backward(impl=impl):
                    impl(q, k, v).backward(dout)

                for name, fn, grads in (("fwd_ms", forward, None), ("fwd_bwd_ms", forward_backward, [q, k, v])):
                    ms, error = attempts.attempt(f"{s.name}: {key} {name}", lambda fn=fn, grads=grads: timer(fn, grads))
                    if error:
                        record["error"] = error
                        break
                    record[name] = min(record.get(name, math.inf), ms)
    return {
        "shape": list(shape),
        "window": window,
        "rounds": args.rounds,
        "warm_s": warm_s,
        "warm_errors": warm_errors,
        "seconds": time.monotonic() - began,
        "fa4": _fa4_reason() or "installed",
        "situations": [
            {"name": s.name, "baseline": s.baseline, "target": s.target, "records": records[s.name]} for s in cases
        ],
        "tracebacks": attempts.tracebacks,
    }


def summarize(data: dict) -> Summary:
    ours = {s["name"]: s["records"]["ours"] for s in data["situations"]}
    rows, targets = [], []
    for s in data["situations"]:
        mine, flex, fa4 = (s["records"][key] for key in ("ours", "flex", "fa4"))
        base = ours.get(s["baseline"], {}) if s["baseline"] else {}
        row = {
            "situation": s["name"],
            "ours fwd ms": mine.get("fwd_ms"),
            "ours fwd+bwd ms": mine.get("fwd_bwd_ms"),
            "vs its baseline fwd": ratio(mine.get("fwd_ms"), base.get("fwd_ms")),
            "vs its baseline fwd+bwd": ratio(mine.get("fwd_bwd_ms"), base.get("fwd_bwd_ms")),
            "vs Flex fwd": ratio(mine.get("fwd_ms"), flex.get("fwd_ms")),
            "vs Flex fwd+bwd": ratio(mine.get("fwd_bwd_ms"), flex.get("fwd_bwd_ms")),
            "vs FA4 fwd": ratio(mine.get("fwd_ms"), fa4.get("fwd_ms")),
            "vs FA4 fwd+bwd": ratio(mine.get("fwd_bwd_ms"), fa4.get("fwd_bwd_ms")),
            "not run": "; ".join(
                f"{key}: {record['error']}" for key, record in s["records"].items() if "error" in record
            ),
        }
        rows.append(row)
        if s["baseline"]:
            targets.append(
                at_most(
                    f"{s['name']}: fwd+bwd at most {s['target']:g}x {s['baseline']}",
                    row["vs its baseline fwd+bwd"],
                    s["target"],
                    unit="x",
                )
            )
    B, H, L, D = data["shape"]
    return Summary(
        tables=[
            table(
                rows,
                caption=f"bf16, B={B}, {H} heads of {D}, {L:,} tokens, window {data['window']}; "
                f"medians of do_bench, best of {data['rounds']} interleaved rounds; ratios of times (below 1: "
                "ours faster). Our default launch configurations (no tuning), the same tiles with and without "
                "each parameter. Flex: torch.compile(flex_attention), its Triton backend.",
            )
        ],
        targets=targets,
        notes=[f"flash-attn-4: {data['fa4']}; compiled first in parallel processes for {data['warm_s']:.0f} s"]
        + [f"warm-up of {name}: {error}" for name, error in data["warm_errors"].items() if error],
    )


BENCHMARK = Benchmark(
    "flash_params",
    "flash-attn's parameters: what each costs in our kernels, against FlexAttention and flash-attn-4",
    __doc__,
    measure,
    summarize,
    baseline="our kernels without the parameter (plain causal; the block-granular window of the same width; the "
    "native call for the compatible module)",
    arguments=arguments,
)

if __name__ == "__main__":
    BENCHMARK.main()
