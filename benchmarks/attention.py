"""Attention kernels: ours against FlashAttention-2, flash-attn-4 and both FlexAttention backends, on
the same block masks; and the pieces the other kernel benchmarks share (patterns, block masks, the
implementations, the row-error check).

Ours is `triton_flash.triton_attention` (--ours triton), `attention(backend="gluon")` (the Gluon
forward and the Triton backward, sm_90) or `attention(backend="torch")` (where Triton cannot run).
The others: FA2 (torch SDPA restricted to its flash backend) and FA4 (flash-attn-4's
`flash_attn.cute.flash_attn_func`), both on dense causal only (flash-attn's `window_size` is
token-granular, our window block-granular: not the same function); Flex, `torch.compile(
flex_attention, dynamic=False)` with a BlockMask built from the very BlockLayout ours receives
(its Triton backend visits the block lists and calls the mask_mod on the causal diagonal only, so
its mask_mod is plain `kv <= q`); Flex FLASH, the same call with kernel_options BACKEND FLASH,
whose mask_mod states the layout (that backend ignores the block lists of a trivial mask_mod). A
library that is missing is recorded and its column left out.

Method
  * bf16; L in 8k..64k (16k first, then largest first, so that a --budget-s cut drops the least
    telling), B = max(1, 16384 // L), H = 2048 // D. Patterns (blocks of 128): causal;
    sliding_window (bidirectional, key blocks within ±1024 tokens); bigbird (window 512, 1 global
    and 2 seeded random blocks); custom (causal: a 512-token window | every 16th key block).
  * Times: medians of `triton.testing.do_bench` in ms, autograd on; the backward alone, replayed on
    one stored graph (`out.backward(dout, retain_graph=True)`); --rounds rounds in which every
    implementation runs in turn, each round starting one later, the median kept. Flex compiles for
    each shape (automatic dynamic shapes gave kernels 1.1-1.4x slower for a process's second
    length); hitting the recompile limit raises instead of falling back to eager Flex.
  * FLOPs: 4·B·H·pairs·D forward, 2.5x that backward, pairs = the (query, key) pairs allowed.
  * Checks: every implementation against one reference on the same inputs (FA2, FA4 or Flex; our
    PyTorch block-sparse backend where Flex failed), and ours, Flex and Flex FLASH against float64
    at L = 2048 before the sweep. A row's error is max|impl - ref| / max|ref| over one query's output
    or one token's gradient; WRONG above 0.03 (output) / 0.06 (gradients), and never counted.
  * Memory: peak allocation of one dense causal forward + backward at 64k, 16 heads of 128, ours
    against FA2. Ceiling: bf16 8192^3 matmul. Clocks: nvidia-smi every 50 ms beside the timings.

    python -m benchmarks.attention --out OUT --rounds 3 --lengths 16384     # one length per GPU call
    python -m benchmarks.attention --out benchmarks/results --from RUN_16k.json RUN_64k.json ...  # joined
    python -m benchmarks.attention --out /tmp/a --smoke                     # CPU, interpreter or torch

Targets (ours' time / the other's, fwd and bwd): floor, every pattern no slower than Flex (Triton),
8k..64k, D 64 and 128; goal, causal D 128 at most 1.15x FA4 and block-sparse at most 1.15x Flex
FLASH; moonshot, the goal's comparisons at 1.0x; memory, at most 2x FA2's peak at 64k.

Shape legend: B batch, H heads, L sequence length, D head dim, Mb / Nb query / key blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import time
from collections.abc import Callable

import torch
import torch._dynamo.config
import torch._functorch.config
from genoformer.kernels.dispatch import Backend, attention, unsupported_reason
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import reference_attention

from benchmarks.common import (
    FULL,
    TINY,
    Attempts,
    Benchmark,
    Budget,
    Case,
    ClockSampler,
    Impl,
    Pattern,
    Summary,
    Sweep,
    Timer,
    allowed_pairs,
    build_cases,
    compare,
    fa2,
    fa4,
    flex_block_mask,
    fmt,
    free_memory,
    length_label,
    median_of_rounds,
    outputs,
    random_qkv,
    ratio,
    rotating_rounds,
    static_flex,
    table,
    tuner_choices,
    verdict,
)

GOAL_RATIO, GOAL_HEAD_DIM = 1.15, 128
OTHERS = {"fa2": "FA2", "fa4": "FA4", "flex": "Flex", "flex_flash": "Flex FLASH"}
"""The implementations ours is compared with: record key -> column name."""
FA4_INSTALL = "pip install flash-attn-4 (Hopper or Blackwell GPU)"


class Run(Attempts):
    """One run's device, timer, implementations, clock and budget."""

    def __init__(self, args, sweep: Sweep) -> None:
        super().__init__()
        self.device, self.sweep, self.ours_kind = torch.device(args.device), sweep, args.ours
        self.dtype = getattr(torch, sweep.dtype)
        self.timer = Timer(self.device, args.warmup_ms, args.rep_ms)
        self.rounds, self.seed, self.budget = args.rounds, args.seed, Budget(args.budget_s)
        self.clock = ClockSampler(self.device)
        if self.device.type == "cuda":
            # past the limit Flex would fall back to eager (L^2 scores): raise instead
            torch._dynamo.config.recompile_limit = 128
            torch._dynamo.config.fail_on_recompile_limit_hit = True
            torch._functorch.config.donated_buffer = False  # the backward is replayed on a retained graph
            self.flex = static_flex()

    @functools.cached_property
    def triton_module(self):
        return self.attempt("import triton_flash", lambda: importlib.import_module("genoformer.kernels.triton_flash"))

    @functools.cached_property
    def fa4_module(self):
        if self.device.type != "cuda":
            return None, "flash-attn-4 runs on CUDA only"
        module, error = self.attempt("import flash_attn.cute", lambda: importlib.import_module("flash_attn.cute"))
        return (module, None) if error is None else (None, f"flash-attn-4 not importable ({error}): {FA4_INSTALL}")

    def ours(self, causal: bool, layout: BlockLayout | None, q, k, v) -> Impl:
        if self.ours_kind in ("torch", "gluon"):
            backend = Backend(self.ours_kind)
            reason = unsupported_reason(
                backend, q, k, v, causal=causal, layout=layout, kv_lens=None, cu_seqlens=None, return_lse=False
            )
            return (
                Impl(None, error=f"unsupported: {reason}")
                if reason
                else Impl(functools.partial(attention, causal=causal, layout=layout, backend=backend))
            )
        module, error = self.triton_module
        if error is not None:
            return Impl(None, error=error)
        reason = module.unsupported_reason(q, k, v, causal=causal, layout=layout, kv_lens=None)
        return (
            Impl(None, error=f"unsupported: {reason}")
            if reason
            else Impl(functools.partial(module.triton_attention, causal=causal, layout=layout))
        )

    def flex_impls(self, causal: bool, heads: int, seq_len: int, layout: BlockLayout | None, label: str) -> dict:
        """{"flex": Flex's Triton backend, "flex_flash": its FLASH backend} on this layout's BlockMask."""
        if self.device.type != "cuda":  # Flex has no CPU backward, and compiles for each shape
            return {key: Impl(None, error="FlexAttention is compared on CUDA only") for key in ("flex", "flex_flash")}
        layout = layout or BlockLayout.dense(seq_len, block_size=self.sweep.block_size)
        mask, error = self.attempt(
            f"{label}: flex mask", lambda: flex_block_mask(layout, causal, heads, self.device, True)
        )
        impls = {"flex": Impl(None, error=error) if error else Impl(functools.partial(self.flex, block_mask=mask))}
        fa4_error = self.fa4_module[1]
        if fa4_error is not None:
            return {**impls, "flex_flash": Impl(None, error=fa4_error)}
        mask, error = self.attempt(
            f"{label}: flex FLASH mask", lambda: flex_block_mask(layout, causal, heads, self.device)
        )
        return {
            **impls,
            "flex_flash": Impl(None, error=error)
            if error
            else Impl(functools.partial(self.flex, block_mask=mask, kernel_options={"BACKEND": "FLASH"})),
        }

    def check(self, label: str, impl: Impl, reference: tuple, q, k, v, dout) -> dict:
        ref_name, expected = reference
        result = {"reference": ref_name, "fwd_rel_err": None, "bwd_rel_err": None, "ok": None, "error": None}
        if impl.fn is None or expected is None:
            result["error"] = impl.error or "no reference ran"
            return result
        got, error = self.attempt(f"{label} run", lambda: outputs(impl.fn, q, k, v, dout, impl.backward_error is None))
        if error is not None:
            result["error"] = error
        else:
            result.update(compare(got, expected))
        return result

    def time_impl(self, label: str, impl: Impl, q, k, v, dout) -> dict:
        result = {"fwd_ms": None, "bwd_ms": None, "error": impl.error, "fwd_clock": None, "bwd_clock": None}
        if impl.fn is None:
            return result
        began = time.monotonic()
        result["fwd_ms"], error = self.attempt(f"{label} fwd", lambda: self.timer(lambda: impl.fn(q, k, v)))
        result["fwd_clock"] = self.clock.window(began, time.monotonic())
        if error is not None or impl.backward_error is not None:
            result["error"] = f"fwd: {error}" if error else f"bwd: {impl.backward_error}"
            return result

        def backward_ms() -> float:
            out = impl.fn(q, k, v)
            ms = self.timer(lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v])
            for t in (q, k, v):
                t.grad = None
            return ms

        began = time.monotonic()
        result["bwd_ms"], error = self.attempt(f"{label} bwd", backward_ms)
        result["bwd_clock"] = self.clock.window(began, time.monotonic())
        result["error"] = f"bwd: {error}" if error else None
        return result

    def run_case(self, case: Case, index: int) -> dict:
        layout, causal = case.pattern.layout(self.sweep, case.seq_len), case.pattern.causal
        pairs = allowed_pairs(layout, causal, case.seq_len, case.heads)
        record = {
            "head_dim": case.head_dim,
            "heads": case.heads,
            "batch": case.batch,
            "seq_len": case.seq_len,
            "pattern": case.pattern.value,
            "causal": causal,
            "density": pairs / (case.heads * case.seq_len**2),
            "fwd_flops": 4 * case.batch * pairs * case.head_dim,
            "skipped": None,
        }
        if self.budget.spent:
            record["skipped"] = self.budget.skipped()
            return record
        _, error = self.attempt(case.label, lambda: self.measure_case(case, layout, index, record))
        record["skipped"] = f"failed: {error}" if error else None
        self.release()
        return record

    def measure_case(self, case: Case, layout: BlockLayout | None, index: int, record: dict) -> None:
        causal = case.pattern.causal
        q, k, v, dout = random_qkv(
            (case.batch, case.heads, case.seq_len, case.head_dim),
            self.device,
            self.dtype,
            self.seed * 1_000_003 + index,
        )
        ours, others = self.ours(causal, layout, q, k, v), {}
        if case.pattern.dense:
            module, error = self.fa4_module
            others = {"fa2": fa2(causal=True), "fa4": fa4(module) if error is None else Impl(None, error=error)}
        others.update(self.flex_impls(causal, case.heads, case.seq_len, layout, case.label))
        candidates = [(OTHERS[key], others[key]) for key in ("fa2", "fa4", "flex") if key in others]
        if layout is not None:
            candidates.append(
                ("torch", Impl(functools.partial(attention, causal=causal, layout=layout, backend=Backend.TORCH)))
            )
        reference = (None, None)
        for name, impl in candidates:  # the first that runs is the reference
            if impl.fn is not None:
                expected, error = self.attempt(
                    f"{case.label}: {name} reference",
                    lambda: outputs(impl.fn, q, k, v, dout, impl.backward_error is None),
                )
                if error is None:
                    reference = (name, expected)
                    break
                impl.fn, impl.error = None, error
        triton = self.triton_module[0] if self.ours_kind != "torch" else None
        with tuner_choices(triton) if triton is not None else contextlib.nullcontext([]) as chosen:
            record["check"] = self.check(f"{case.label} ours", ours, reference, q, k, v, dout)
        timed, checks = {"ours": ours}, {}
        for key in OTHERS:
            if key not in others:
                record[key] = None  # not compared on this pattern
                continue
            impl, check = others[key], None
            if impl.fn is not None and OTHERS[key] != reference[0]:
                check = self.check(f"{case.label} {key}", impl, reference, q, k, v, dout)
                if check["error"] is not None and check["fwd_rel_err"] is None and reference[0] is not None:
                    impl = Impl(None, error=check["error"])  # it failed to run: not timed
            timed[key], checks[key] = impl, check
        rounds = rotating_rounds(
            {
                key: functools.partial(self.time_impl, f"{case.label} {key}", impl, q, k, v, dout)
                for key, impl in timed.items()
            },
            self.rounds,
        )
        for key in timed:
            record[key] = median_of_rounds(rounds[key])
            if key != "ours":
                record[key]["check"] = checks[key]
        record["ours"]["configs"] = [f"{kind} {config}" for kind, config in chosen]

    def float64_check(self, patterns: list[Pattern]) -> list[dict]:
        """Ours, Flex and Flex FLASH against float64 at 16 layout blocks, B = 1, 4 heads."""
        seq_len, heads, checks = 16 * self.sweep.block_size, 4, []
        for head_dim in self.sweep.head_dims:
            for index, pattern in enumerate(patterns):
                case = Case(head_dim, heads, 1, seq_len, pattern)
                record = {"head_dim": head_dim, "seq_len": seq_len, "heads": heads, "pattern": pattern.value}
                _, error = self.attempt(
                    f"float64 {case.label}", lambda: record.update(self._exact(case, 500_000 + index))
                )
                if error is not None:
                    record["error"] = error
                checks.append(record)
                self.release()
        return checks

    def _exact(self, case: Case, salt: int) -> dict:
        layout, causal = case.pattern.layout(self.sweep, case.seq_len), case.pattern.causal
        q, k, v, dout = random_qkv((1, case.heads, case.seq_len, case.head_dim), self.device, self.dtype, salt)
        exact = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        reference = (
            "float64",
            outputs(functools.partial(reference_attention, causal=causal, layout=layout), *exact, dout.double()),
        )
        impls = {
            "ours": self.ours(causal, layout, q, k, v),
            **self.flex_impls(causal, case.heads, case.seq_len, layout, f"float64 {case.label}"),
        }
        return {
            key: self.check(f"float64 {case.label} {key}", impl, reference, q, k, v, dout)
            for key, impl in impls.items()
        }

    def release(self) -> None:
        free_memory(self.device)

    def matmul_tflops(self) -> dict:
        n = self.sweep.matmul_n
        a, b = (torch.randn(n, n, device=self.device, dtype=self.dtype) for _ in range(2))
        ms, error = self.attempt("matmul ceiling", lambda: self.timer(lambda: torch.matmul(a, b)))
        return {"n": n, "ms": ms, "tflops": None if ms is None else 2 * n**3 / (ms * 1e9), "error": error}

    def peak_memory(self) -> dict:
        """Peak memory of one dense causal forward + backward above the inputs, ours vs FA2."""
        B, H, L, D = self.sweep.memory_shape
        result = {"batch": B, "heads": H, "seq_len": L, "head_dim": D}
        if self.device.type != "cuda":
            return {**result, "error": "peak memory is measured on CUDA only"}
        q, k, v, dout = random_qkv((B, H, L, D), self.device, self.dtype, 999_999)

        def peak_mib(impl: Impl) -> float:
            outputs(impl.fn, q, k, v, dout)  # compiles and autotunes outside the peak
            self.release()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            impl.fn(q, k, v).backward(dout)
            torch.cuda.synchronize()
            for t in (q, k, v):
                t.grad = None
            return (torch.cuda.max_memory_allocated() - before) / 2**20

        for name, impl in (("ours", self.ours(True, None, q, k, v)), ("fa2", fa2(causal=True))):
            peak, error = (
                self.attempt(f"memory {name}", lambda impl=impl: peak_mib(impl)) if impl.fn else (None, impl.error)
            )
            result[name] = {"peak_mib": peak, "error": error}
        self.release()
        return result


def arguments(parser) -> None:
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="device to measure (default cuda)")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        help="sequence lengths in this order (default 16384 65536 "
        "32768 8192; one per GPU call, as Flex compiles for each shape)",
    )
    parser.add_argument("--head-dims", type=int, nargs="+", help="head dims (default 64 128; H = 2048 / D)")
    parser.add_argument(
        "--patterns",
        type=Pattern,
        nargs="+",
        default=list(Pattern),
        metavar="PATTERN",
        help=f"of {', '.join(p.value for p in Pattern)} (default all)",
    )
    parser.add_argument(
        "--ours",
        default="triton",
        choices=("triton", "gluon", "torch"),
        help="ours: the Triton kernels, the Hopper path (Gluon forward, Triton backward; sm_90), or "
        "attention(backend='torch') where Triton cannot run (--smoke without the interpreter)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds in turns, each implementation's median kept")
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip (and record) what is left after this")
    parser.add_argument("--warmup-ms", type=float, default=10.0, help="do_bench warm-up in ms")
    parser.add_argument("--rep-ms", type=float, default=40.0, help="do_bench measuring time in ms")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--no-float64-check",
        dest="float64_check",
        action="store_false",
        help="skip the float64 check of ours, Flex and Flex FLASH before the sweep",
    )


def measure(args) -> dict:
    sweep = TINY if args.smoke else FULL
    sweep = dataclasses.replace(
        sweep, lengths=tuple(args.lengths or sweep.lengths), head_dims=tuple(args.head_dims or sweep.head_dims)
    )
    if args.smoke:
        args.warmup_ms, args.rep_ms = 0.0, 1.0
        triton_flash = importlib.import_module("genoformer.kernels.triton_flash")
        args.ours = args.ours if triton_flash.INTERPRETED else "torch"
    run = Run(args, sweep)
    data = {
        "settings": {
            **dataclasses.asdict(sweep),
            "patterns": [p.value for p in args.patterns],
            "ours": args.ours,
            "warmup_ms": args.warmup_ms,
            "rep_ms": args.rep_ms,
            "rounds": args.rounds,
        },
        "matmul": run.matmul_tflops(),
        "memory": run.peak_memory(),
        "cases": [],
    }
    if args.float64_check:
        data["float64_check"] = run.float64_check(args.patterns)
    for index, case in enumerate(build_cases(sweep, args.patterns)):
        data["cases"].append(run.run_case(case, index))
        print(
            f"[{run.budget.elapsed:6.1f}s] {case.label}: {data['cases'][-1].get('skipped') or 'measured'}", flush=True
        )
    data.update(wall_s=run.budget.elapsed, tracebacks=run.tracebacks, clock=run.clock.close())
    return data


def merge(runs: list[dict]) -> dict:
    """Runs of one sweep joined in order: a later run's measured cases replace an earlier run's
    (same D, L, pattern; a skipped case never replaces a measured one), float64 checks likewise;
    the ceiling, memory and clock of the last run."""
    merged = {**runs[-1], "tracebacks": [t for run in runs for t in run.get("tracebacks", [])]}
    cases, checks = {}, {}
    for run in runs:
        for record in run["cases"]:
            key = (record["head_dim"], record["seq_len"], record["pattern"])
            if key not in cases or not record.get("skipped"):
                cases[key] = record
        checks.update({(c["head_dim"], c["pattern"]): c for c in run.get("float64_check") or ()})
    merged["cases"], merged["float64_check"] = list(cases.values()), list(checks.values())
    merged["wall_s"] = sum(run.get("wall_s") or 0.0 for run in runs)
    return merged


# ------------------------------------------------------------------------------ the summary
def _time(record: dict, key: str, direction: str, trusted: bool = False) -> float | None:
    """A time, None when missing or (trusted) when its check found the result WRONG."""
    timing = record.get(key) or {}
    check = record.get("check") if key == "ours" else timing.get("check")
    return None if trusted and (check or {}).get("ok") is False else timing.get(f"{direction}_ms")


def _pair(record: dict, key: str, of=lambda r, k, d: _time(r, k, d)) -> str:
    return " / ".join(fmt(of(record, key, d)) or "—" for d in ("fwd", "bwd"))


def _ratio(record: dict, key: str, direction: str) -> float | None:
    """ours ÷ other; none against a yardstick whose result was WRONG."""
    return ratio(_time(record, "ours", direction), _time(record, key, direction, trusted=True))


def _check(check: dict | None) -> str:
    if not check or check.get("ok") is None:
        return "—"
    bwd = f" / {fmt(check['bwd_rel_err'], 2)}" if check.get("bwd_rel_err") is not None else ""
    return f"{'ok' if check['ok'] else 'WRONG'} {fmt(check['fwd_rel_err'], 2)}{bwd} vs {check['reference']}"


def _notes(record: dict) -> str:
    notes = [
        f"{OTHERS.get(k, 'ours')}: {(record.get(k) or {}).get('error')}"[:160]
        for k in ("ours", *OTHERS)
        if (record.get(k) or {}).get("error")
    ]
    notes += [
        f"{OTHERS[k]} {_check(record[k]['check'])}"
        for k in OTHERS
        if ((record.get(k) or {}).get("check") or {}).get("ok") is False
    ]
    return "; ".join(dict.fromkeys(notes))


def _cases(data: dict) -> list[dict]:
    order = {p.value: i for i, p in enumerate(Pattern)}
    return sorted(
        (r for r in data["cases"] if not r.get("skipped")),
        key=lambda r: (-r["head_dim"], r["seq_len"], order[r["pattern"]]),
    )


def _target(name: str, data: dict, yardstick: Callable[[dict], str | None], limit: float) -> dict:
    """MET when every comparison (ours ÷ the yardstick, fwd and bwd) is at most `limit` and none is
    missing; a yardstick that did not run is left out and counted."""
    items, left_out = [], 0
    for r in data["cases"]:
        key = None if r.get("skipped") else yardstick(r)
        if r.get("skipped") and yardstick(r) is not None:
            items += [(None, "")] * 2
        if key is None:
            continue
        for d in ("fwd", "bwd"):
            if _time(r, key, d, trusted=True) is None and _time(r, "ours", d, trusted=True) is not None:
                left_out += 1
                continue
            items.append(
                (
                    ratio(_time(r, "ours", d, trusted=True), _time(r, key, d, trusted=True)),
                    f"{r['pattern']} D{r['head_dim']} {length_label(r['seq_len'])} {d} vs {OTHERS[key]}",
                )
            )
    present = [(v, label) for v, label in items if v is not None]
    missing = len(items) - len(present)
    extra = f"; {left_out} not compared (no trusted time)" if left_out else ""
    if not present:
        return verdict(name, "not in this run" + extra, None)
    worst, label = max(present)
    measured = f"worst {worst:.2f}x ({label}) of {len(present)}" + (f"; {missing} failed or missing" if missing else "")
    return verdict(name, measured + extra, worst <= limit and not missing)


def summarize(data: dict) -> Summary:
    cases = _cases(data)
    settings = data["settings"]
    present = [k for k in OTHERS if any(_time(r, k, d) is not None for r in cases for d in ("fwd", "bwd"))]
    cells = list(dict.fromkeys((r["head_dim"], r["seq_len"], r["batch"]) for r in cases))
    by_key = {(r["pattern"], r["head_dim"], r["seq_len"]): r for r in cases}
    ratio_rows = []
    for pattern in Pattern:
        for key in present:
            row = {"ours ÷ other, fwd / bwd": f"{pattern.value} ÷ {OTHERS[key]}"}
            for d, L, B in cells:
                r = by_key.get((pattern.value, d, L))
                row[f"D{d} {length_label(L)}" + (f" x{B}" if B > 1 else "")] = (
                    _pair(r, key, _ratio) if r is not None and r.get(key) is not None else ""
                )
            if any(v for v in list(row.values())[1:]):
                ratio_rows.append(row)
    full = [
        {
            "D": r["head_dim"],
            "L": length_label(r["seq_len"]),
            "B×H": f"{r['batch']}×{r['heads']}",
            "pattern": r["pattern"],
            "density": round(r["density"], 3),
            "ours ms": _pair(r, "ours"),
            **{f"{OTHERS[k]} ms": _pair(r, k) if r.get(k) else "—" for k in present},
            **{f"ours÷{OTHERS[k]}": _pair(r, k, _ratio) if r.get(k) else "—" for k in present},
            "ours TFLOP/s": " / ".join(
                fmt(ratio(r["fwd_flops"] * m / 1e9, _time(r, "ours", d))) for d, m in (("fwd", 1), ("bwd", 2.5))
            ),
            "check": _check(r.get("check")),
            "notes": _notes(r),
        }
        for r in cases
    ]
    memory = data["memory"]
    mem = {k: (memory.get(k) or {}).get("peak_mib") for k in ("ours", "fa2")}
    goal = lambda r: ("fa4" if r["head_dim"] == GOAL_HEAD_DIM else None) if r["pattern"] == "causal" else "flex_flash"  # noqa: E731
    targets = [
        _target("floor: every pattern, ours ≤ Flex (Triton), fwd and bwd", data, lambda r: "flex", 1.0),
        _target(
            f"goal: causal D {GOAL_HEAD_DIM} ≤ {GOAL_RATIO}x FA4, block-sparse ≤ {GOAL_RATIO}x Flex FLASH",
            data,
            goal,
            GOAL_RATIO,
        ),
        _target("moonshot: the goal's comparisons ≤ 1.0x", data, goal, 1.0),
        verdict(
            f"memory: peak fwd+bwd at L={length_label(memory['seq_len'])} ≤ 2x FA2's",
            f"ours {fmt(mem['ours'])} MiB, FA2 {fmt(mem['fa2'])} MiB" if mem["ours"] else memory.get("error", ""),
            None if not (mem["ours"] and mem["fa2"]) else mem["ours"] <= 2 * mem["fa2"],
        ),
    ]
    absent = {
        OTHERS[k]: next((r[k]["error"] for r in data["cases"] if (r.get(k) or {}).get("error")), "not run")
        for k in OTHERS
        if k not in present
    }
    notes = [
        f"ours = `{settings['ours']}`; bf16, B·L = {settings['tokens']:,} (B = 1 beyond), H·D = {settings['width']}, "
        f"blocks of {settings['block_size']}; medians of {settings['rounds']} rotating rounds.",
        _float64_note(data.get("float64_check")),
    ]
    notes += [f"{name} absent: {why}" for name, why in absent.items()]
    lengths = " and ".join(length_label(L) for L in sorted({r["seq_len"] for r in cases}))
    title = "Attention kernels" + ("" if settings["ours"] == "triton" else f", ours = {settings['ours']}, {lengths}")
    d128 = [{k: v for k, v in row.items() if not k.startswith("D64")} for row in ratio_rows]
    return Summary(
        title=title,
        tables=[
            table(d128, "Time ratios at D 128, ours ÷ other (> 1: ours slower)"),
            table(ratio_rows, "Time ratios, every head dim", headline=False),
            table(full, "Every case (ms, fwd / bwd)", headline=False),
        ],
        targets=targets,
        notes=[n for n in notes if n],
    )


def _float64_note(checks: list[dict] | None) -> str:
    if not checks:
        return ""
    parts = []
    for key in ("ours", "flex", "flex_flash"):
        done = [(r, r[key]) for r in checks if (r.get(key) or {}).get("ok") is not None]
        if not done:
            continue
        bwd = [c["bwd_rel_err"] for _, c in done if c["bwd_rel_err"] is not None]
        wrong = [f"{r['pattern']} D={r['head_dim']}" for r, c in done if not c["ok"]]
        parts.append(
            f"{OTHERS.get(key, key)} worst {fmt(max(c['fwd_rel_err'] for _, c in done), 2)} / "
            f"{fmt(max(bwd), 2) if bwd else '—'}" + (f", WRONG on {', '.join(wrong)}" if wrong else ", ok")
        )
    return (
        (
            f"Against float64 at L = {checks[0]['seq_len']}, every pattern and head dim (worst row error, out / "
            f"grads): {'; '.join(parts)}."
        )
        if parts
        else ""
    )


BENCHMARK = Benchmark(
    "attention",
    "Attention kernels",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=merge,
    baseline="SDPA FlashAttention-2, flash-attn-4 and compiled FlexAttention (Triton and FLASH "
    "backends) on the same block masks",
    name_of=lambda args: "attention" if args.ours == "triton" else f"attention_{args.ours}",
)

if __name__ == "__main__":
    BENCHMARK.main()
