"""Packed documents: one row of mixed-length documents (cu_seqlens) against one long sequence and a
loop over the documents, all on our Triton kernels.

Documents of 100 to 8,192 tokens (uniform, seeded, the last cut to fill the row) packed into one
row of 65,536 tokens; B = 1, H = 16, D = 128, bf16, causal. Three ways, forward and forward +
backward (one call of out = f(q, k, v); out.backward(dout)): packed (every document attends to
itself only), unpacked (the same tokens as one causal sequence), each alone (a Python loop).
The packed outputs and gradients are checked against each-alone's first (row errors).
Targets: packed tokens/s at least 0.9x the unpacked sequence's, with results equal to each
alone; stricter, packed TFLOP/s counting only the pairs it must compute (sum n (n + 1) / 2)
at least 0.9x the unpacked sequence's.

    python -m benchmarks.packed --out OUT             # a GPU, about 2 minutes
"""

from __future__ import annotations

import torch

from benchmarks.common import (
    Benchmark,
    Summary,
    Timer,
    at_least,
    compare,
    fmt,
    outputs,
    random_qkv,
    ratio,
    table,
    verdict,
)

WAYS = {"packed": "packed row (cu_seqlens)", "unpacked": "one unpacked sequence", "alone": "each document alone (loop)"}


def document_lengths(row_len: int, low: int, high: int, seed: int) -> list[int]:
    """Seeded lengths uniform in [low, high] that fill the row exactly (the last one cut)."""
    generator, lengths = torch.Generator().manual_seed(seed), []
    while sum(lengths) < row_len:
        lengths.append(min(int(torch.randint(low, high + 1, (1,), generator=generator)), row_len - sum(lengths)))
    return lengths


def arguments(parser) -> None:
    parser.add_argument("--device", default="cuda", help="device to measure (--smoke: the CPU, interpreted)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and inputs")


def measure(args) -> dict:
    from genoformer.kernels.triton_flash import triton_attention

    device = torch.device(args.device)
    L, low, high, H, D = (48, 8, 24, 1, 16) if args.smoke else (65536, 100, 8192, 16, 128)
    timer = Timer(device, 0 if args.smoke else 25, 1 if args.smoke else 200)
    lengths = document_lengths(L, low, high, args.seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q, k, v, dout = random_qkv((1, H, L, D), device, torch.bfloat16, args.seed)
    pieces = [
        [p.contiguous().requires_grad_(t.requires_grad) for p in torch.split(t.detach(), lengths, dim=2)]
        for t in (q, k, v, dout)
    ]

    def packed(q, k, v):
        return triton_attention(q, k, v, causal=True, cu_seqlens=cu_seqlens)

    def causal(q, k, v):
        return triton_attention(q, k, v, causal=True)

    alone = [outputs(causal, *args) for args in zip(*pieces, strict=True)]
    expected = (torch.cat([a[0] for a in alone], 2), tuple(torch.cat([a[1][i] for a in alone], 2) for i in range(3)))
    check = compare(outputs(packed, q, k, v, dout), expected)  # also compiles and tunes
    outputs(causal, q, k, v, dout)

    def loop(backward: bool):
        for q_, k_, v_, d_ in zip(*pieces, strict=True):
            out = causal(q_, k_, v_)
            out.backward(d_) if backward else None

    leaves = [t for piece in pieces[:3] for t in piece]
    times = {
        way: {
            "fwd_ms": timer(lambda fn=fn: fn(q, k, v)),
            "step_ms": timer(lambda fn=fn: fn(q, k, v).backward(dout), grad_to_none=[q, k, v]),
        }
        for way, fn in (("packed", packed), ("unpacked", causal))
    }
    times["alone"] = {"fwd_ms": timer(lambda: loop(False)), "step_ms": timer(lambda: loop(True), grad_to_none=leaves)}
    pairs = {"packed": sum(n * (n + 1) // 2 for n in lengths), "unpacked": L * (L + 1) // 2}
    pairs["alone"] = pairs["packed"]
    return {
        "row_len": L,
        "heads": H,
        "head_dim": D,
        "documents": lengths,
        "check": check,
        "times": times,
        # forward 4·H·pairs·D FLOPs (two matmuls), backward 2.5x that: a step is 3.5x
        "step_flops": {way: 3.5 * 4 * H * n * D for way, n in pairs.items()},
    }


def summarize(data: dict) -> Summary:
    times, flops, check = data["times"], data["step_flops"], data["check"]
    rows = [
        {
            "way": label,
            "fwd ms": times[way]["fwd_ms"],
            "fwd+bwd ms": times[way]["step_ms"],
            "tokens/s (fwd+bwd)": data["row_len"] / (times[way]["step_ms"] / 1e3),
            "TFLOP/s (useful pairs)": flops[way] / (times[way]["step_ms"] * 1e9),
        }
        for way, label in WAYS.items()
    ]
    speed = ratio(times["unpacked"]["step_ms"], times["packed"]["step_ms"]) if check["ok"] else None
    efficiency = ratio(flops["packed"] / times["packed"]["step_ms"], flops["unpacked"] / times["unpacked"]["step_ms"])
    lengths = data["documents"]
    return Summary(
        tables=[
            table(
                rows,
                f"{len(lengths)} documents of {min(lengths):,} to {max(lengths):,} tokens in one row of "
                f"{data['row_len']:,}; causal, bf16, H = {data['heads']}, D = {data['head_dim']}",
            )
        ],
        targets=[
            at_least("packed tokens/s ≥ 0.9x one unpacked sequence of the same length (fwd+bwd)", speed, 0.9, "x"),
            verdict(
                "packed results equal each document alone (worst row error, out / grads)",
                f"{fmt(check['fwd_rel_err'], 2)} / {fmt(check['bwd_rel_err'], 2)}",
                check["ok"],
            ),
            at_least(
                "stricter: packed TFLOP/s (useful pairs) ≥ 0.9x the unpacked sequence's",
                efficiency if check["ok"] else None,
                0.9,
                "x",
            ),
        ],
        notes=[
            f"Packed against each document alone in a loop: "
            f"{fmt(ratio(times['alone']['step_ms'], times['packed']['step_ms']))}x the tokens/s."
        ],
    )


BENCHMARK = Benchmark(
    "packed",
    "Packed documents",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    baseline="one unpacked sequence of the same tokens, and each document alone",
)

if __name__ == "__main__":
    BENCHMARK.main()
