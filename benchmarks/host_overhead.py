"""Host time per attention call against GPU time, on the sparsest pattern of benchmarks/attention.py.

At a few percent density the block-sparse kernels run in under a millisecond at 16k tokens, so the
Python around them (checks, launch order, dispatch, autograd) decides the speed once it takes as
long. For the custom pattern (causal window 512 | every 16th key block, blocks of 128), L = 16k,
D 64 and 128, bf16: host ms per call (calls queued without synchronising, forward with autograd on,
backward replayed on one stored graph) and GPU ms (do_bench medians), ours and compiled Flex with
the same block mask (its mask_mod reads the layout, as benchmarks/train_models.py's Flex does).

    python -m benchmarks.host_overhead --out OUT      # a GPU, about a minute
"""

from __future__ import annotations

import time

import torch
from genoformer.kernels.layout import BlockLayout

from benchmarks.common import Attempts, Benchmark, Summary, Timer, flex_block_mask, static_flex, synchronize, table


def arguments(parser) -> None:
    parser.add_argument("--device", default="cuda", help="device to measure (--smoke: the CPU, interpreted)")


def measure(args) -> dict:
    from genoformer.kernels.triton_flash import triton_attention
    from torch.nn.attention.flex_attention import flex_attention

    device = torch.device(args.device)
    L, width, block = (64, 16, 16) if args.smoke else (16384, 2048, 128)
    layout = (BlockLayout.sliding_window(L, block * 4, block) | BlockLayout.strided(L, 16, block)).with_causal()
    timer, attempts, rows = Timer(device, 0 if args.smoke else 10, 1 if args.smoke else 100), Attempts(), []

    def host_ms(fn, calls: int) -> float:
        synchronize(device)
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        seconds = time.perf_counter() - began
        synchronize(device)
        return seconds / calls * 1e3

    for head_dim in (16,) if args.smoke else (64, 128):
        heads = width // head_dim
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(1, heads, L, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        dout = torch.randn_like(q)
        flex = static_flex() if device.type == "cuda" else flex_attention
        mask = flex_block_mask(layout, True, heads, device)
        row = {"D": head_dim, "heads": heads}
        for name, call in {
            "ours": lambda: triton_attention(q, k, v, causal=True, layout=layout),
            "flex": lambda: flex(q, k, v, block_mask=mask),
        }.items():

            def timings(call=call) -> dict:
                out = call()
                out.backward(dout, retain_graph=True)  # compile and tune both passes first
                replay = lambda: out.backward(dout, retain_graph=True)  # noqa: E731
                return {
                    "fwd GPU ms": timer(call),
                    "bwd GPU ms": timer(replay, grad_to_none=[q, k, v]),
                    "fwd host ms": host_ms(call, 1 if args.smoke else 200),
                    "bwd host ms": host_ms(replay, 1 if args.smoke else 50),
                }

            values, error = attempts.attempt(f"D={head_dim} {name}", timings)
            row.update({f"{name} {key}": value for key, value in (values or {}).items()})
            row.update({f"{name} error": error} if error else {})
        rows.append(row)
    return {"seq_len": L, "rows": rows}


def summarize(data: dict) -> Summary:
    rows = [
        {
            "D": r["D"],
            **{
                key: r.get(key)
                for key in ("ours fwd host ms", "ours fwd GPU ms", "ours bwd host ms", "ours bwd GPU ms")
            },
            "ours ÷ Flex fwd": r["ours fwd GPU ms"] / r["flex fwd GPU ms"] if "flex fwd GPU ms" in r else None,
            "ours ÷ Flex bwd": r["ours bwd GPU ms"] / r["flex bwd GPU ms"] if "flex bwd GPU ms" in r else None,
        }
        for r in data["rows"]
    ]
    return Summary(
        tables=[
            table(
                rows,
                f"Custom pattern at L = {data['seq_len']:,}, bf16 (host ms: 200 forward, "
                "50 backward calls queued without a sync)",
            )
        ],
        notes=[f"Flex at D={r['D']}: {r['flex error']}" for r in data["rows"] if r.get("flex error")],
    )


BENCHMARK = Benchmark(
    "host_overhead",
    "Host time per attention call",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="compiled FlexAttention (Triton backend) on the same block mask",
)

if __name__ == "__main__":
    BENCHMARK.main()
