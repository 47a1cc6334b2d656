"""Check the flash-attn backends on a GPU: the equivalence sweep, auto's choices, and their speed.

One command after installing flash-attn-4 (or flash-attn 2):

    python -m benchmarks.flash_attn_check --out benchmarks/results/flash_attn_check

  1. runs `pytest tests/kernels/test_backends_gpu.py -q -rs` in a child process (every installed
     backend against the float64 reference, outputs and gradients; the log is kept);
  2. for each situation below (H200 sizes: bf16, 16 heads of 128), times every backend that can
     run it through `genoformer.kernels.attention` (forward, and forward + backward), and records
     the reason of those that cannot and the backend `auto` picks;
  3. writes flash_attn_check.json and .md to --out (atomically), with --markdown BENCHMARKS.md
     also its section there, and prints the table last.

The times say whether auto's measured table (`FASTEST_FIRST` in kernels/dispatch.py) still holds
for our adapters. `--smoke` runs tiny shapes on a CPU (a test runs it); there the flash-attn and
Triton backends only report why they cannot run.

The head-dim sweep (`--head-dims`, instead of the above) decides which head dims flash-attn-4 is
trusted with (`FLASH_ATTN_4_HEAD_DIMS` in kernels/flash_attn_backend.py):

    python -m benchmarks.flash_attn_check --head-dims --out OUT

For every multiple of 8 from 16 to 256 and each backend (flash-attn-4 through our adapter, with
the trusted-dims table bypassed; our Triton kernels as the control), 12 cases: dense, packed
documents (cu_seqlens) and key padding (kv_lens), each causal and bidirectional, each with and
without GQA, at about 1000 bf16 tokens whose lengths and document cuts are drawn per head dim
from a seed. Output, dQ, dK and dV are compared with the float64 reference: a tensor passes when
its largest error is at most PASS_FACTOR times that of dense attention computed in bf16 (the
same-precision baseline), plus one bf16 rounding of the exact answer; NaN never passes. An
exception (an MLIR or compile error) is recorded as that case's result. Each (backend, head dim)
runs in a process of its own, several at once (compiling dominates), so one H200 does the whole
sweep in a few minutes. Writes flash_attn_head_dims.json and .md and prints the table and the
frozenset of head dims that passed every case, to paste into FLASH_ATTN_4_HEAD_DIMS.

Shape legend: q (B, H, L, D), k and v (B, Hkv, L, D).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import importlib.util
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import (
    command_line,
    describe_environment,
    environment_markdown,
    markdown_table,
    replace_markdown_section,
    write_atomically,
)
from genoformer.kernels import Backend, BlockLayout, attention
from genoformer.kernels import flash_attn_backend
from genoformer.kernels.dispatch import plan_attention, unsupported_reason
from genoformer.kernels.flash_attn_backend import FlashAttn
from genoformer.kernels.reference import allowed_mask, reference_attention

REPO = Path(__file__).resolve().parents[1]
SECTION = "flash-attn-check"
"""Its section of BENCHMARKS.md (--markdown), appended at the end the first time."""
SWEEP = ["-m", "pytest", "tests/kernels/test_backends_gpu.py", "-q", "-rs", "-p", "no:cacheprovider"]
TIMED = (Backend.FLASH_ATTN_4, Backend.FLASH_ATTN_2, Backend.TRITON, Backend.SDPA, Backend.TORCH)


@dataclasses.dataclass(frozen=True)
class Shapes:
    seq_len: int
    heads: int
    head_dim: int
    block_size: int
    warmup_ms: float
    rep_ms: float
    slow_backends: tuple[Backend, ...]
    """Timed only at this size when they run without a dense mask (sdpa) or never (torch)."""


FULL = Shapes(seq_len=16384, heads=16, head_dim=128, block_size=128, warmup_ms=25, rep_ms=100,
              slow_backends=(Backend.SDPA, Backend.TORCH))
SMOKE = Shapes(seq_len=256, heads=2, head_dim=16, block_size=128, warmup_ms=0, rep_ms=1, slow_backends=())


@dataclasses.dataclass(frozen=True)
class Situation:
    name: str
    batch: int
    seq_len: int
    kwargs: Callable[[torch.device], dict]
    """attention keywords (causal, layout, kv_lens, cu_seqlens) built on the device."""


def _packed_cu_seqlens(total: int, longest: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Documents of 100 to `longest` tokens (seeded), the last one cut to fill `total` tokens."""
    g = torch.Generator().manual_seed(seed)
    low = min(100, longest)
    lengths, used = [], 0
    while used < total:
        n = min(int(torch.randint(low, longest + 1, (1,), generator=g)), total - used)
        lengths.append(n)
        used += n
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def situations(shapes: Shapes) -> list[Situation]:
    L, bs = shapes.seq_len, shapes.block_size
    window = max(bs, L // 16)  # 1024 at 16k
    bigbird_window = min(512, L)
    return [
        Situation("dense causal", 1, L, lambda d: dict(causal=True)),
        Situation("key padding, causal", 2, L // 2, lambda d: dict(causal=True, kv_lens=torch.tensor([L // 2, L // 3], device=d))),
        Situation("packed documents, causal", 1, 4 * L, lambda d: dict(causal=True, cu_seqlens=_packed_cu_seqlens(4 * L, L // 2, d))),
        Situation(f"window ±{window}, causal", 1, L,
                  lambda d: dict(causal=True, layout=BlockLayout.sliding_window(L, window, bs))),
        Situation(f"window ±{window}, bidirectional", 1, L, lambda d: dict(layout=BlockLayout.sliding_window(L, window, bs))),
        Situation(f"BigBird (window {bigbird_window}, 1 global, 2 random)", 1, L,
                  lambda d: dict(layout=BlockLayout.bigbird(L, bigbird_window, 1, 2, block_size=bs, seed=0))),
    ]


# ---------------------------------------------------------------------------------- timing
def median_ms(fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float, grads=()) -> float:
    """Median time of fn() in ms: triton's do_bench on CUDA, a perf_counter loop on a CPU."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=list(grads),
                                             return_mode="median"))
    fn()  # warm-up
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or time.perf_counter() < deadline:
        for t in grads:
            t.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(torch.tensor(times).median())


def measure(situation: Situation, shapes: Shapes, device: torch.device) -> dict:
    """Times of every backend that runs the situation, the reasons of the others, auto's choice."""
    B, L, H, D = situation.batch, situation.seq_len, shapes.heads, shapes.head_dim
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, L, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4))
    kwargs = situation.kwargs(device)
    plan = plan_attention("auto", batch=B, q_heads=H, kv_heads=H, q_len=L, kv_len=L, head_dim=D,
                          dtype=q.dtype, device=device, **kwargs)
    record = {"situation": situation.name, "shape": [B, H, L, D], "auto": plan.backend.value, "backends": {}}
    for backend in TIMED:
        reason = unsupported_reason(backend, q, k, v, **kwargs)
        needs_mask = any(kwargs.get(key) is not None for key in ("layout", "kv_lens", "cu_seqlens"))
        if reason is None and backend in shapes.slow_backends and (backend is Backend.TORCH or needs_mask):
            reason = f"not timed at {L} tokens (a dense mask or the PyTorch fallback; see BENCHMARKS.md)"
        if reason is not None:
            record["backends"][backend.value] = {"reason": reason}
            continue
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def forward(qg=qg, kg=kg, vg=vg, backend=backend):
            with torch.no_grad():
                return attention(qg, kg, vg, backend=backend, **kwargs)

        def forward_backward(qg=qg, kg=kg, vg=vg, backend=backend):
            attention(qg, kg, vg, backend=backend, **kwargs).backward(dout)

        record["backends"][backend.value] = {
            "fwd_ms": median_ms(forward, device, shapes.warmup_ms, shapes.rep_ms),
            "fwd_bwd_ms": median_ms(forward_backward, device, shapes.warmup_ms, shapes.rep_ms, grads=(qg, kg, vg)),
        }
        del qg, kg, vg
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def run_sweep(device: torch.device, timeout_s: float, log: Path) -> dict:
    """The pytest sweep of installed backends in a child process: its summary line and counts."""
    command = [sys.executable, *SWEEP]
    if device.type == "cuda" and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(max(1, min(8, os.cpu_count() or 1)))]  # first-use compiles dominate
    started = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        log.write_text(output)
        return {"returncode": None, "summary": f"timed out after {timeout_s:g} s", "counts": {},
                "wall_s": time.monotonic() - started}
    log.write_text(proc.stdout + proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "(no output)"
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {"returncode": proc.returncode, "summary": summary, "counts": counts, "wall_s": time.monotonic() - started}


# ----------------------------------------------------------------------------- reporting
def rows(results: dict) -> list[dict]:
    """One row per situation: each backend's forward / forward+backward ms (or 'cannot'), auto's pick."""
    table = []
    for record in results["situations"]:
        row = {"situation": record["situation"], "auto": record["auto"]}
        for backend in TIMED:
            entry = record["backends"][backend.value]
            row[backend.value] = (
                f"{entry['fwd_ms']:.3g} / {entry['fwd_bwd_ms']:.3g}" if "fwd_ms" in entry else "cannot (see JSON)"
            )
        timed = {b: e["fwd_bwd_ms"] for b, e in record["backends"].items() if "fwd_bwd_ms" in e}
        row["fastest fwd+bwd"] = min(timed, key=timed.get) if timed else ""
        table.append(row)
    return table


def render_markdown(results: dict) -> str:
    sweep = results.get("sweep")
    lines = [
        "## flash-attn backends on the GPU: equivalence, auto's choice, speed",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        "flash-attn installs: " + ", ".join(f"{name}: {status}" for name, status in results["installs"].items()) + ".",
        "",
        f"Equivalence sweep (`python {' '.join(SWEEP)}`): {sweep['summary'] if sweep else 'not run'}.",
        "",
        "Times in ms, forward / forward + backward (medians), through `genoformer.kernels.attention`; "
        "`auto` is the backend auto picks here, `fastest fwd+bwd` the one measured fastest.",
        "",
        markdown_table(rows(results)),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the head-dim sweep
HEAD_DIMS = tuple(range(16, 257, 8))
SMOKE_HEAD_DIMS = (16, 24)
SWEPT = (Backend.FLASH_ATTN_4, Backend.TRITON)
"""flash-attn-4 under test, our Triton kernels as the control (a failure of both points at the harness)."""
PASS_FACTOR = 3.0
"""A tensor passes when its error is at most this multiple of the bf16 baseline's, plus one rounding."""
TENSORS = ("out", "dq", "dk", "dv")


@dataclasses.dataclass(frozen=True)
class GradCase:
    """One of the 12 cases run at every head dim."""

    masking: str  # "dense", "packed" (cu_seqlens) or "padding" (kv_lens)
    causal: bool
    gqa: bool

    @property
    def name(self) -> str:
        return f"{self.masking} {'causal' if self.causal else 'bidirectional'}{' GQA' if self.gqa else ''}"


GRAD_CASES = tuple(GradCase(m, c, g) for m in ("dense", "packed", "padding") for c in (True, False) for g in (False, True))


def _case_inputs(case: GradCase, head_dim: int, index: int, device: torch.device, smoke: bool) -> tuple:
    """(q, k, v, dout) in bf16 and the attention keywords, shapes drawn from a seed per (head dim, case):
    B = 2 rows of 450 to 600 tokens (40 to 60 in a smoke run), 8 query heads, 2 key/value heads with GQA."""
    g = torch.Generator().manual_seed(1000 * head_dim + index)
    B, Hq, Hkv = 2, 8, 2 if case.gqa else 8
    low, high = (40, 60) if smoke else (450, 600)
    L = int(torch.randint(low, high + 1, (1,), generator=g))
    kwargs: dict = {"causal": case.causal}
    if case.masking == "packed":
        cuts = []
        for _ in range(B):  # 2 to 4 documents per row, cut at random places
            inner = torch.randperm(L - 1, generator=g)[: int(torch.randint(1, 4, (1,), generator=g))] + 1
            cuts.append(sorted(inner.tolist()) + [L])
        ends = [b * L + c for b, row in enumerate(cuts) for c in row]
        kwargs["cu_seqlens"] = torch.tensor([0, *ends], dtype=torch.int32, device=device)
    elif case.masking == "padding":
        kwargs["kv_lens"] = torch.tensor([L, int(torch.randint(1, L, (1,), generator=g))], device=device)
    q, k, v, dout = (torch.randn(B, H, L, head_dim, generator=g).to(device, torch.bfloat16)
                     for H in (Hq, Hkv, Hkv, Hq))
    return q, k, v, dout, kwargs


def _with_grads(fn: Callable, q, k, v, dout, **kwargs) -> dict[str, torch.Tensor]:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kwargs)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _same_precision(q, k, v, *, causal=False, kv_lens=None, cu_seqlens=None):
    """Dense attention computed in q's own dtype with an explicit mask: the same-precision baseline."""
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores_BHLS = (q @ k.transpose(-1, -2)) * D**-0.5
    mask = allowed_mask(L, L, causal=causal, layout=None, kv_lens=kv_lens, device=q.device,
                        cu_seqlens=cu_seqlens, batch=B)
    if mask is None:
        return torch.softmax(scores_BHLS, -1) @ v
    return (torch.softmax(scores_BHLS.masked_fill(~mask, torch.finfo(q.dtype).min), -1) * mask) @ v


def _runner(backend: Backend) -> Callable:
    """What the sweep runs: flash-attn-4 through our adapter directly (the table of trusted head
    dims is what the sweep decides), any other backend through `attention`."""
    if backend is Backend.FLASH_ATTN_4:
        return functools.partial(flash_attn_backend.flash_attn_attention, (FlashAttn.V4,))
    return functools.partial(attention, backend=backend)


def _unavailable(backend: Backend, q, k, v, kwargs) -> str | None:
    """Why `backend` cannot run here at all (not installed, not this device), else None; for
    flash-attn-4 without asking its table of trusted head dims."""
    if backend is not Backend.FLASH_ATTN_4:
        return unsupported_reason(backend, q, k, v, **kwargs)
    error = flash_attn_backend.import_error(FlashAttn.V4)
    if error is not None:
        return f"flash-attn-4 does not import ({error}); {flash_attn_backend.FA4_INSTALL}"
    if flash_attn_backend.device_capability(q.device) is None:
        return f"flash-attn-4 runs on CUDA GPUs only (inputs on {q.device.type})"
    return None


def _error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def sweep_head_dim(backend_value: str, head_dim: int, device_type: str, smoke: bool, deadline: float) -> list[dict]:
    """Every GradCase at one head dim for one backend: a record per case (run in a child process)."""
    os.environ["GENOFORMER_TRITON_AUTOTUNE"] = "0"  # correctness only: the default configurations
    backend, device = Backend(backend_value), torch.device(device_type)
    records = []
    for index, case in enumerate(GRAD_CASES):
        record = {"backend": backend.value, "head_dim": head_dim, "case": case.name, "shape": None,
                  "ok": False, "error": None, "reason": None, "tensors": {}}
        records.append(record)
        if time.time() > deadline:
            record["reason"] = "time budget (--budget-s) spent"
            continue
        try:
            q, k, v, dout, kwargs = _case_inputs(case, head_dim, index, device, smoke)
            B, Hq, L, D = q.shape
            record["shape"] = {"B": B, "Hq": Hq, "Hkv": k.shape[1], "L": L, "D": D, **{
                name: kwargs[name].tolist() for name in ("cu_seqlens", "kv_lens") if name in kwargs}}
            record["reason"] = _unavailable(backend, q, k, v, kwargs)
            if record["reason"] is not None:
                continue
            exact = _with_grads(reference_attention, *(t.double() for t in (q, k, v, dout)), **kwargs)
            baseline = _with_grads(_same_precision, q, k, v, dout, **kwargs)
            result = _with_grads(_runner(backend), q, k, v, dout, **kwargs)
        except Exception as exc:  # recorded as the case's result: an MLIR or compile error is a finding
            record["error"] = _error_text(exc)
            continue
        for name in TENSORS:
            truth = exact[name]
            value = result[name].double()
            err = float((value - truth).abs().max()) if torch.isfinite(value).all() else float("nan")
            naive = float((baseline[name].double() - truth).abs().max())
            rounding = float((truth.to(torch.bfloat16).double() - truth).abs().max())
            record["tensors"][name] = {"err": err, "baseline_err": naive, "rounding": rounding,
                                       "ok": err <= PASS_FACTOR * naive + rounding}  # NaN compares False
        record["ok"] = all(t["ok"] for t in record["tensors"].values())
    return records


def run_head_dim_sweep(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Every (backend, head dim) task, in child processes (`--workers`; 0: in this process)."""
    dims = tuple(args.dims or (SMOKE_HEAD_DIMS if args.smoke else HEAD_DIMS))
    # backend by backend, flash-attn-4 first: a budget that runs out cuts the control, not the subject
    tasks = [(b.value, d, device.type, args.smoke, time.time() + args.budget_s) for b in args.backends for d in dims]
    started = time.monotonic()
    records: list[dict] = []

    def done(task_records: list[dict]) -> None:
        records.extend(task_records)
        first = task_records[0]
        print(f"[{time.monotonic() - started:6.1f}s] {first['backend']} D={first['head_dim']}: {_verdict(task_records)}",
              flush=True)

    if args.workers == 0:
        for task in tasks:
            done(sweep_head_dim(*task))
    else:
        # spawn (CUDA in children), one pool of one process per task: a crash that kills its process
        # (a broken CUDA context) breaks only that task's pool, not the tasks after it
        context = multiprocessing.get_context("spawn")

        def isolated(task: tuple) -> list[dict]:
            backend, head_dim = task[:2]
            try:
                with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                    return pool.submit(sweep_head_dim, *task).result()
            except Exception as exc:  # the child died (e.g. a crash inside a compiled kernel)
                return [{"backend": backend, "head_dim": head_dim, "case": case.name, "shape": None, "ok": False,
                         "error": f"worker process: {_error_text(exc)}", "reason": None, "tensors": {}}
                        for case in GRAD_CASES]

        with concurrent.futures.ThreadPoolExecutor(args.workers) as threads:
            for task_records in threads.map(isolated, tasks):
                done(task_records)
    order = [case.name for case in GRAD_CASES]
    return sorted(records, key=lambda r: (r["backend"], r["head_dim"], order.index(r["case"])))


def _verdict(records: list[dict]) -> str:
    """One cell of the table: how the cases of one (backend, head dim) went."""
    if all(r["reason"] for r in records):
        return f"not run: {records[0]['reason'][:120]}"
    errors = [r for r in records if r["error"]]
    wrong = [r for r in records if not r["error"] and not r["reason"] and not r["ok"]]
    ran = [r for r in records if not r["reason"]]
    worst = max(((_allowance_used(t), name, r["case"]) for r in ran for name, t in r["tensors"].items()),
                default=None, key=lambda item: float("inf") if item[0] != item[0] else item[0])
    parts = [f"{len(ran) - len(errors) - len(wrong)}/{len(records)} ok"]
    if wrong:
        parts.append(f"WRONG in {len(wrong)}")
    if worst is not None:
        parts.append(f"worst {worst[1]} at {worst[0]:.2g} of its allowance ({worst[2]})")
    if errors:
        parts.append(f"{len(errors)} raised: {errors[0]['error'][:100]}")
    if len(ran) < len(records):
        parts.append(f"{len(records) - len(ran)} not run")
    return "; ".join(parts)


def _allowance_used(tensor: dict) -> float:
    """A tensor's error over what passes (PASS_FACTOR x the bf16 baseline's + one rounding): <= 1 passes."""
    return tensor["err"] / max(PASS_FACTOR * tensor["baseline_err"] + tensor["rounding"], 1e-30)


def trusted_head_dims(records: list[dict], backend: Backend = Backend.FLASH_ATTN_4) -> list[int]:
    """The head dims at which `backend` ran every case and passed each."""
    by_dim: dict[int, list[dict]] = {}
    for r in records:
        if r["backend"] == backend.value:
            by_dim.setdefault(r["head_dim"], []).append(r)
    return sorted(d for d, rs in by_dim.items() if len(rs) == len(GRAD_CASES) and all(r["ok"] for r in rs))


def head_dim_rows(records: list[dict]) -> list[dict]:
    backends = list(dict.fromkeys(r["backend"] for r in records))
    rows = []
    for head_dim in sorted({r["head_dim"] for r in records}):
        row = {"head dim": head_dim}
        for backend in backends:
            row[backend] = _verdict([r for r in records if r["backend"] == backend and r["head_dim"] == head_dim])
        rows.append(row)
    return rows


def paste_line(results: dict) -> str:
    capability = results.get("capability") or "(major, minor)"
    dims = ", ".join(str(d) for d in trusted_head_dims(results["records"]))
    return f"    {capability}: frozenset({{{dims}}}),"


def render_head_dims_markdown(results: dict) -> str:
    return "\n".join([
        "## flash-attn-4's head dims: output and gradients against float64",
        "",
        environment_markdown(results["environment"], results["command"]),
        "",
        f"flash-attn installs: {', '.join(f'{k}: {v}' for k, v in results['installs'].items())}. "
        f"{len(GRAD_CASES)} cases per head dim (dense, packed documents, key padding; causal and "
        "bidirectional; with and without GQA), bf16, 2 rows of 450-600 tokens drawn per head dim, 8 query "
        f"heads (2 key/value heads with GQA). A tensor (output, dQ, dK, dV) passes when its largest error "
        f"against the float64 reference is at most {PASS_FACTOR:g}x that of dense attention in bf16 plus one bf16 "
        "rounding (its allowance); each cell gives the cases that passed, the worst tensor's error as a "
        f"fraction of its allowance (above 1: WRONG), and any exception. Wall time {results['wall_s']:.0f} s.",
        "",
        markdown_table(head_dim_rows(results["records"])),
        "",
        "Head dims at which flash-attn-4 passed every case (`FLASH_ATTN_4_HEAD_DIMS` in "
        "kernels/flash_attn_backend.py):",
        "",
        "```",
        paste_line(results),
        "```",
    ])


def head_dim_main(args: argparse.Namespace, device: torch.device) -> dict:
    started = time.monotonic()
    capability = flash_attn_backend.device_capability(device)
    results = {
        "environment": describe_environment(device),
        "command": command_line(),
        "capability": capability,
        "installs": {version.value: flash_attn_backend.import_error(version) or "installed" for version in FlashAttn},
        "pass_factor": PASS_FACTOR,
        "cases": [case.name for case in GRAD_CASES],
        "records": run_head_dim_sweep(args, device),
    }
    results["wall_s"] = time.monotonic() - started
    results["trusted"] = trusted_head_dims(results["records"])
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / "flash_attn_head_dims.json", json.dumps(results, indent=1))
    write_atomically(args.out / "flash_attn_head_dims.md", render_head_dims_markdown(results) + "\n")
    print(markdown_table(head_dim_rows(results["records"])), flush=True)
    print("FLASH_ATTN_4_HEAD_DIMS row to paste (kernels/flash_attn_backend.py):", flush=True)
    print(paste_line(results), flush=True)
    return results


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flash_attn_check",
        description="Run the GPU equivalence sweep of every installed attention backend, time them per "
        "situation (16k tokens, 16 heads of 128, bf16) and record auto's choices; write JSON and Markdown to --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for flash_attn_check.json, .md and _tests.log")
    parser.add_argument("--markdown", type=Path, help="rewrite the 'flash-attn-check' section of this file (BENCHMARKS.md)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on a CPU (checks the script, times nothing real)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the pytest sweep")
    parser.add_argument("--sweep-timeout", type=float, default=420.0, help="seconds before the sweep is stopped")
    sweep = parser.add_argument_group("the head-dim sweep (--head-dims)")
    sweep.add_argument("--head-dims", action="store_true",
                       help="instead of the above: check output and gradients of each backend at every head dim "
                       "(the table of head dims flash-attn-4 is trusted with); writes flash_attn_head_dims.json, .md")
    sweep.add_argument("--dims", type=int, nargs="+", help="head dims to check (default every multiple of 8, 16 to 256)")
    sweep.add_argument("--backends", type=Backend, nargs="+", default=list(SWEPT), metavar="BACKEND",
                       help="backends to check (default flash_attn_4 triton)")
    sweep.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)),
                       help="child processes at once, one per (backend, head dim); 0 runs in this process")
    sweep.add_argument("--budget-s", type=float, default=240.0,
                       help="cases not started after this many seconds are recorded as not run (default 240)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run the CPU smoke version: python -m benchmarks.flash_attn_check --smoke --out /tmp/fa")
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.head_dims:
        return head_dim_main(args, device)
    shapes = SMOKE if args.smoke else FULL
    from genoformer.kernels.flash_attn_backend import FlashAttn, import_error

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = {
        "environment": describe_environment(device),
        "command": command_line(),
        "shapes": {k: v for k, v in dataclasses.asdict(shapes).items() if k != "slow_backends"},
        "installs": {version.value: import_error(version) or "installed" for version in FlashAttn},
        "situations": [],
    }
    if args.sweep:
        print(f"[{time.monotonic() - started:6.1f}s] sweep: python {' '.join(SWEEP)}", flush=True)
        results["sweep"] = run_sweep(device, args.sweep_timeout, args.out / "flash_attn_check_tests.log")
        print(f"[{time.monotonic() - started:6.1f}s] sweep: {results['sweep']['summary']}", flush=True)
    for situation in situations(shapes):
        results["situations"].append(measure(situation, shapes, device))
        print(f"[{time.monotonic() - started:6.1f}s] {situation.name}: auto picks {results['situations'][-1]['auto']}",
              flush=True)
    results["wall_s"] = time.monotonic() - started
    write_atomically(args.out / "flash_attn_check.json", json.dumps(results, indent=1))
    write_atomically(args.out / "flash_attn_check.md", render_markdown(results) + "\n")
    if args.markdown is not None:
        replace_markdown_section(args.markdown, SECTION, render_markdown(results))
    print(markdown_table(rows(results)), flush=True)
    return results


if __name__ == "__main__":
    main()
