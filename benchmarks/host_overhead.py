"""Host time per attention call against GPU time, on the sparsest pattern of benchmarks/attention.py.

A block-sparse layout at a few percent density runs its kernels in under a millisecond at 16k
tokens, so the Python around them (checks, launch order, dispatch, autograd) decides the speed
once it takes as long: the GPU then waits for the host. This measures, for the custom pattern
(causal window 512 | every 16th key block, block 128) at L = 16k, D = 64 and 128, bf16:
  * host ms per call: a loop of calls without synchronising, divided by the calls (forward with
    autograd on; backward replayed on one stored graph);
  * GPU ms: `triton.testing.do_bench` medians of the same calls, ours and compiled FlexAttention
    (Triton backend) with the same block mask, and their ratio.

    python -m benchmarks.host_overhead --out OUT    # a GPU; about a minute, most of it Flex compiling

It writes OUT/host_overhead.json and OUT/host_overhead.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.attention import flex_block_mask
from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.triton_flash import triton_attention

SEQ_LEN, WIDTH, BLOCK = 16384, 2048, 128


def host_ms(fn: Callable[[], object], calls: int) -> float:
    """Milliseconds of host time per call: `calls` calls queued without synchronising."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - began
    torch.cuda.synchronize()
    return seconds / calls * 1e3


def gpu_ms(fn: Callable[[], object], grads: list[torch.Tensor] | None = None) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median", grad_to_none=grads))


def measure(head_dim: int) -> dict:
    from torch.nn.attention.flex_attention import flex_attention

    layout = (BlockLayout.sliding_window(SEQ_LEN, 512, BLOCK) | BlockLayout.strided(SEQ_LEN, 16, BLOCK)).with_causal()
    heads = WIDTH // head_dim
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, SEQ_LEN, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    flex = torch.compile(flex_attention, dynamic=False)
    mask = flex_block_mask(layout, True, heads, q.device)
    calls = {"ours": lambda: triton_attention(q, k, v, causal=True, layout=layout),
             "flex": lambda: flex(q, k, v, block_mask=mask)}
    row = {"D": head_dim, "heads": heads}
    for name, call in calls.items():
        out = call()
        out.backward(dout, retain_graph=True)  # compile and tune both passes first
        row[f"{name} fwd GPU ms"] = gpu_ms(call)
        row[f"{name} bwd GPU ms"] = gpu_ms(lambda: out.backward(dout, retain_graph=True), [q, k, v])
        row[f"{name} fwd host ms"] = host_ms(call, 200)
        row[f"{name} bwd host ms"] = host_ms(lambda: out.backward(dout, retain_graph=True), 50)
    row["ours ÷ flex fwd"] = row["ours fwd GPU ms"] / row["flex fwd GPU ms"]
    row["ours ÷ flex bwd"] = row["ours bwd GPU ms"] / row["flex bwd GPU ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write host_overhead.json and .md here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.host_overhead needs a CUDA GPU (it times kernels against the host)")
    rows = [measure(d) for d in (64, 128)]
    env = describe_environment(torch.device("cuda"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_overhead.json").write_text(json.dumps({"environment": env, "command": command_line(),
                                                             "rows": rows}, indent=1) + "\n")
    table = markdown_table(rows)
    (args.out / "host_overhead.md").write_text(environment_markdown(env, command_line()) + "\n\n" + table + "\n")
    print(table)


if __name__ == "__main__":
    main()
