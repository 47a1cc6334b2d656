"""Packed variable-length sequences: one packed row against one long sequence and a loop.

One run, from the repository root, on one GPU (about 2 minutes on an H200):

    python -m benchmarks.packed --out OUT [--markdown BENCHMARKS.md]
    TRITON_INTERPRET=1 python -m benchmarks.packed --device cpu --smoke --out /tmp/p   # CPU smoke run

A batch of documents of mixed lengths (uniform in 100 .. 8,192 tokens, seeded; the last one cut
so that they fill the row) is packed into one row of 65,536 tokens (B = 1, H = 16, D = 128, bf16,
causal). Our Triton kernels run it three ways, forward and forward + backward:
  * packed: the row with `cu_seqlens` (every document attends only to itself);
  * unpacked: the same 65,536 tokens as one causal sequence (no documents);
  * each alone: a Python loop over the documents, each its own causal sequence.
Before timing, the packed outputs and gradients are checked against each-alone's (worst row error,
as in benchmarks/attention.py). It writes OUT/packed.json and OUT/packed.md and prints a short
table last: tokens/s of each way, the ratios, and the issue's target
  * packed tokens/s >= 0.9x unpacked tokens/s (the same total length), with results equal to
    running each document alone;
plus the stricter reading of "speed" as useful work: packed TFLOP/s (counting only the pairs it
must compute, sum of len_i (len_i + 1) / 2) against the unpacked sequence's TFLOP/s.

Timing method as in benchmarks/attention.py (`Timer`: medians of triton's do_bench on a GPU); the
forward + backward is one call of out = f(q, k, v); out.backward(dout). Autotuning happens in the
check, before the timed calls.

Shape legend: B batch, H heads, L row length, D head dim, N documents.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.attention import CHECK_TOLERANCE, Timer
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

SECTION = "packed"
"""Name of the BENCHMARKS.md section this script owns (written with --markdown)."""

SPEED_TARGET = 0.9
"""Target: packed tokens/s at least this times the unpacked sequence's (the issue's packed target)."""


REP_MS = 200.0
"""do_bench measuring time per timing on a GPU."""


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What one run measures."""

    row_len: int
    min_doc: int
    max_doc: int
    heads: int
    head_dim: int
    dtype: str = "bfloat16"


FULL = Shapes(row_len=65536, min_doc=100, max_doc=8192, heads=16, head_dim=128)
SMOKE = Shapes(row_len=96, min_doc=5, max_doc=40, heads=2, head_dim=16)


def document_lengths(shapes: Shapes, seed: int) -> list[int]:
    """Seeded lengths uniform in [min_doc, max_doc] that fill the row exactly (the last one cut)."""
    generator = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < shapes.row_len:
        n = int(torch.randint(shapes.min_doc, shapes.max_doc + 1, (1,), generator=generator))
        n = min(n, shapes.row_len - total)
        lengths.append(n)
        total += n
    return lengths


# ----------------------------------------------------------------------------- measuring
def _inputs(shapes: Shapes, device: torch.device, seed: int):
    generator = torch.Generator(device).manual_seed(seed)
    shape = (1, shapes.heads, shapes.row_len, shapes.head_dim)
    dtype = getattr(torch, shapes.dtype)
    q, k, v, dout = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def _split(t: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Each document's slice of a (1, H, L, D) tensor as its own contiguous (leaf) tensor."""
    pieces = torch.split(t.detach(), lengths, dim=2)
    return [p.contiguous().requires_grad_(t.requires_grad) for p in pieces]


def _run_packed(fn: Callable, q, k, v, dout) -> tuple[torch.Tensor, ...]:
    """out, dq, dk, dv of one forward + backward of fn on (1, H, L, D) leaves."""
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(dout)
    grads = (q.grad, k.grad, v.grad)
    for t in (q, k, v):
        t.grad = None
    return out.detach(), *grads


def _run_alone(fn: Callable, qs, ks, vs, douts) -> tuple[torch.Tensor, ...]:
    """out, dq, dk, dv of each document alone, concatenated back into (1, H, L, D)."""
    results = [_run_packed(fn, *args) for args in zip(qs, ks, vs, douts, strict=True)]
    return tuple(torch.cat(parts, dim=2) for parts in zip(*results, strict=True))


def measure(shapes: Shapes, timer: Timer, device: torch.device, seed: int) -> dict:
    """The check (packed equals each alone), then the three ways timed, forward and forward + backward."""
    from genoformer.kernels.triton_flash import triton_attention

    lengths = document_lengths(shapes, seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)

    def packed(q, k, v):
        return triton_attention(q, k, v, causal=True, cu_seqlens=cu_seqlens)

    def unpacked(q, k, v):
        return triton_attention(q, k, v, causal=True)

    def alone(q, k, v):
        return triton_attention(q, k, v, causal=True)

    q, k, v, dout = _inputs(shapes, device, seed)
    qs, ks, vs, douts = (_split(t, lengths) for t in (q, k, v, dout))

    got = _run_packed(packed, q, k, v, dout)  # also compiles and autotunes
    expected = _run_alone(alone, qs, ks, vs, douts)
    _run_packed(unpacked, q, k, v, dout)  # compile and autotune outside the timed calls
    fwd_err = row_error(got[0], expected[0])
    bwd_err = max(row_error(a, b) for a, b in zip(got[1:], expected[1:], strict=True))
    ok = fwd_err <= CHECK_TOLERANCE["fwd"] and bwd_err <= CHECK_TOLERANCE["bwd"]  # NaN compares False
    del got, expected

    def step(fn, q, k, v, dout):
        fn(q, k, v).backward(dout)

    def loop_fwd():
        for args in zip(qs, ks, vs, strict=True):
            alone(*args)

    def loop_step():
        for args in zip(qs, ks, vs, douts, strict=True):
            step(alone, *args)

    leaves = [*qs, *ks, *vs]
    times = {
        "packed": {"fwd_ms": timer(lambda: packed(q, k, v)),
                   "step_ms": timer(lambda: step(packed, q, k, v, dout), grad_to_none=[q, k, v])},
        "unpacked": {"fwd_ms": timer(lambda: unpacked(q, k, v)),
                     "step_ms": timer(lambda: step(unpacked, q, k, v, dout), grad_to_none=[q, k, v])},
        "alone": {"fwd_ms": timer(loop_fwd), "step_ms": timer(loop_step, grad_to_none=leaves)},
    }
    L, H, D = shapes.row_len, shapes.heads, shapes.head_dim
    pairs = {  # query-key pairs each way must compute (causal: j <= i)
        "packed": sum(n * (n + 1) // 2 for n in lengths),
        "unpacked": L * (L + 1) // 2,
    }
    pairs["alone"] = pairs["packed"]
    return {
        "documents": lengths,
        "check": {"fwd_rel_err": fwd_err, "bwd_rel_err": bwd_err, "ok": ok, "reference": "each document alone"},
        "times": times,
        # forward 4·H·pairs·D FLOPs (two matmuls), backward 2.5x that: a step is 3.5x
        "step_flops": {way: 3.5 * 4 * H * n * D for way, n in pairs.items()},
    }


# ----------------------------------------------------------------------------- reporting
WAYS = {"packed": "packed row (cu_seqlens)", "unpacked": "one unpacked sequence", "alone": "each document alone (loop)"}


def rows(results: dict) -> list[dict]:
    """One table row per way of running the tokens."""
    record = results["record"]
    tokens = results["shapes"]["row_len"]
    out = []
    for way, label in WAYS.items():
        t = record["times"][way]
        out.append({
            "way": label,
            "fwd ms": format_number(t["fwd_ms"]),
            "fwd+bwd ms": format_number(t["step_ms"]),
            "tokens/s (fwd+bwd)": format_number(tokens / (t["step_ms"] / 1e3)),
            "TFLOP/s (fwd+bwd, useful pairs)": format_number(record["step_flops"][way] / (t["step_ms"] * 1e9)),
        })
    return out


def targets(results: dict) -> list[dict]:
    """The issue's packed target, its stricter reading, and the check; a wrong result meets nothing."""
    record = results["record"]
    times, flops, ok = record["times"], record["step_flops"], record["check"]["ok"]
    speed = times["unpacked"]["step_ms"] / times["packed"]["step_ms"] if ok else None
    vs_alone = times["alone"]["step_ms"] / times["packed"]["step_ms"] if ok else None
    efficiency = None
    if ok:
        packed_tflops = flops["packed"] / times["packed"]["step_ms"]
        efficiency = packed_tflops / (flops["unpacked"] / times["unpacked"]["step_ms"])
    check = record["check"]
    return [
        {"target": f"packed tokens/s ≥ {SPEED_TARGET}× one unpacked sequence of the same length (fwd+bwd)",
         "measured": f"{format_number(speed)}×", "status": "MET" if speed is not None and speed >= SPEED_TARGET else "NOT MET"},
        {"target": "packed results equal each document alone (out, dq, dk, dv; worst row error)",
         "measured": f"{format_number(check['fwd_rel_err'], 2)} / {format_number(check['bwd_rel_err'], 2)}",
         "status": "MET" if ok else "NOT MET"},
        {"target": f"stricter: packed TFLOP/s (useful pairs) ≥ {SPEED_TARGET}× the unpacked sequence's",
         "measured": f"{format_number(efficiency)}×",
         "status": "MET" if efficiency is not None and efficiency >= SPEED_TARGET else "NOT MET"},
        {"target": "information: packed tokens/s ÷ each document alone in a loop", "measured": f"{format_number(vs_alone)}×",
         "status": ""},
    ]


def render_markdown(results: dict) -> str:
    shapes = results["shapes"]
    lengths = results["record"]["documents"]
    return "\n".join([
        "## Packed variable-length sequences",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        f"{len(lengths)} documents of {min(lengths)} to {max(lengths)} tokens (uniform in {shapes['min_doc']} .. "
        f"{shapes['max_doc']}, seed {results['seed']}, the last cut to fill the row) packed into one row of "
        f"{shapes['row_len']} tokens; causal, {shapes['dtype']}, H = {shapes['heads']}, D = {shapes['head_dim']}, "
        "our Triton kernels every way. Times are medians in ms; fwd+bwd is one forward and its backward. "
        "TFLOP/s count only the pairs each way must compute (3.5 · 4·H·pairs·D per step). "
        f"Wall time {format_number(results.get('wall_s'))} s.",
        "",
        markdown_table(rows(results)),
        "",
        markdown_table(targets(results)),
    ])


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.packed",
        description="Time a row packed with documents of 100 to 8,192 tokens (64k tokens, 16 heads of 128, bf16, "
        "causal) against one unpacked 64k sequence and a loop over the documents; check that packed equals "
        "each alone; write JSON and Markdown to --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for packed.json and packed.md")
    parser.add_argument("--markdown", type=Path, help="rewrite the 'packed' section of this file (BENCHMARKS.md)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes (a row of 96 tokens, 2 heads of 16) for a CPU run under Triton's interpreter")
    add_kernel_timing_arguments(parser, rep_ms=REP_MS)
    parser.add_argument("--seed", type=int, default=0, help="seed of the document lengths and the random inputs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = kernel_timing(args, REP_MS, "TRITON_INTERPRET=1 python -m benchmarks.packed --device cpu --smoke --out /tmp/p")
    shapes = SMOKE if args.smoke else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {"environment": describe_environment(device), "command": command_line(),
               "shapes": dataclasses.asdict(shapes), "seed": args.seed,
               "record": measure(shapes, Timer(device, args.warmup_ms, args.rep_ms), device, args.seed)}
    results["wall_s"] = time.monotonic() - started
    write_atomically(args.out / "packed.json", json.dumps(results, indent=1))
    write_atomically(args.out / "packed.md", render_markdown(results) + "\n")
    if args.markdown is not None:
        replace_markdown_section(args.markdown, SECTION, render_markdown(results))
    print(markdown_table(rows(results)) + "\n\n" + markdown_table(targets(results)), flush=True)
    return results


if __name__ == "__main__":
    main()
