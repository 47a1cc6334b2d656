"""Which head dims flash-attn-4 is trusted with (`FLASH_ATTN_4_HEAD_DIMS` in
kernels/flash_attn_backend.py): output and gradients against float64 at every head dim.

For every multiple of 8 from 16 to 256 and each backend (flash-attn-4 through our adapter, the
trusted-dims table bypassed; our Triton kernels as the control, whose failure would point at the
harness), 12 cases: dense, packed documents (cu_seqlens) and key padding (kv_lens), each causal and
bidirectional, each with and without GQA, at about 1,000 bf16 tokens (2 rows of 450-600, 8 query
heads, 2 key/value heads with GQA) drawn per head dim from a seed. A tensor (out, dQ, dK, dV)
passes when its largest error against float64 is at most 3x that of dense attention computed in
bf16 plus one bf16 rounding (its allowance); NaN never passes; an exception (an MLIR or compile
error) is the case's result. Each (backend, head dim) runs in a process of its own, several at
once (compiling dominates). The result lists the head dims that passed every case: the row to
paste into FLASH_ATTN_4_HEAD_DIMS.

    python -m benchmarks.flash_attn_check --out OUT          # an H100 or H200 with flash-attn-4, minutes
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import multiprocessing
import os
import time

import torch
from genoformer.kernels import Backend, attention, flash_attn_backend
from genoformer.kernels.dispatch import unsupported_reason
from genoformer.kernels.flash_attn_backend import FlashAttn
from genoformer.kernels.reference import allowed_mask, reference_attention

from benchmarks.common import Benchmark, Summary, error_text, table, verdict

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


GRAD_CASES = tuple(
    GradCase(m, c, g) for m in ("dense", "packed", "padding") for c in (True, False) for g in (False, True)
)


def case_inputs(case: GradCase, head_dim: int, index: int, device: torch.device, smoke: bool) -> tuple:
    """(q, k, v, dout) in bf16 and the attention keywords, drawn from a seed per (head dim, case)."""
    g = torch.Generator().manual_seed(1000 * head_dim + index)
    B, Hq, Hkv = 2, 8, 2 if case.gqa else 8
    L = int(torch.randint(*((20, 31) if smoke else (450, 601)), (1,), generator=g))
    kwargs: dict = {"causal": case.causal}
    if case.masking == "packed":  # 2 to 4 documents per row, cut at random places
        cuts = [
            sorted((torch.randperm(L - 1, generator=g)[: int(torch.randint(1, 4, (1,), generator=g))] + 1).tolist())
            + [L]
            for _ in range(B)
        ]
        ends = [b * L + c for b, row in enumerate(cuts) for c in row]
        kwargs["cu_seqlens"] = torch.tensor([0, *ends], dtype=torch.int32, device=device)
    elif case.masking == "padding":
        kwargs["kv_lens"] = torch.tensor([L, int(torch.randint(1, L, (1,), generator=g))], device=device)
    q, k, v, dout = (torch.randn(B, H, L, head_dim, generator=g).to(device, torch.bfloat16) for H in (Hq, Hkv, Hkv, Hq))
    return q, k, v, dout, kwargs


def _with_grads(fn, q, k, v, dout, **kwargs) -> dict[str, torch.Tensor]:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kwargs)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def same_precision(q, k, v, *, causal=False, kv_lens=None, cu_seqlens=None):
    """Dense attention computed in q's own dtype with an explicit mask: the same-precision baseline."""
    B, Hq, L, D = q.shape
    k, v = (t.repeat_interleave(Hq // k.shape[1], 1) for t in (k, v))
    scores_BHLS = (q @ k.transpose(-1, -2)) * D**-0.5
    mask = allowed_mask(
        L, L, causal=causal, layout=None, kv_lens=kv_lens, device=q.device, cu_seqlens=cu_seqlens, batch=B
    )
    if mask is None:
        return torch.softmax(scores_BHLS, -1) @ v
    return (torch.softmax(scores_BHLS.masked_fill(~mask, torch.finfo(q.dtype).min), -1) * mask) @ v


def _unavailable(backend: Backend, q, k, v, kwargs) -> str | None:
    """Why `backend` cannot run here at all; for flash-attn-4 without asking its trusted head dims."""
    if backend is not Backend.FLASH_ATTN_4:
        return unsupported_reason(backend, q, k, v, **kwargs)
    error = flash_attn_backend.import_error(FlashAttn.V4)
    if error is not None:
        return f"flash-attn-4 does not import ({error}); {flash_attn_backend.FA4_INSTALL}"
    return None if q.is_cuda else f"flash-attn-4 runs on CUDA GPUs only (inputs on {q.device.type})"


def sweep_head_dim(backend_value: str, head_dim: int, device_type: str, smoke: bool, deadline: float) -> list[dict]:
    """Every GradCase at one head dim for one backend: a record per case (run in a child process)."""
    os.environ["GENOFORMER_TRITON_AUTOTUNE"] = "0"  # correctness only: the default configurations
    backend, device = Backend(backend_value), torch.device(device_type)
    run = (
        functools.partial(flash_attn_backend.flash_attn_attention, (FlashAttn.V4,))
        if backend is Backend.FLASH_ATTN_4
        else functools.partial(attention, backend=backend)
    )
    records = []
    for index, case in enumerate(GRAD_CASES[:3] if smoke else GRAD_CASES):
        record = {
            "backend": backend.value,
            "head_dim": head_dim,
            "case": case.name,
            "ok": False,
            "error": None,
            "reason": None,
            "tensors": {},
        }
        records.append(record)
        if time.time() > deadline:
            record["reason"] = "time budget (--budget-s) spent"
            continue
        try:
            q, k, v, dout, kwargs = case_inputs(case, head_dim, index, device, smoke)
            record["reason"] = _unavailable(backend, q, k, v, kwargs)
            if record["reason"] is not None:
                continue
            exact = _with_grads(reference_attention, *(t.double() for t in (q, k, v, dout)), **kwargs)
            baseline = _with_grads(same_precision, q, k, v, dout, **kwargs)
            result = _with_grads(run, q, k, v, dout, **kwargs)
        except Exception as exc:  # recorded as the case's result: an MLIR or compile error is a finding
            record["error"] = error_text(exc)
            continue
        for name in TENSORS:
            truth, value = exact[name], result[name].double()
            err = float((value - truth).abs().max()) if torch.isfinite(value).all() else float("nan")
            naive = float((baseline[name].double() - truth).abs().max())
            rounding = float((truth.to(torch.bfloat16).double() - truth).abs().max())
            record["tensors"][name] = {
                "err": err,
                "baseline_err": naive,
                "rounding": rounding,
                "ok": err <= PASS_FACTOR * naive + rounding,
            }  # NaN compares False
        record["ok"] = all(t["ok"] for t in record["tensors"].values())
    return records


def _isolated(task: tuple) -> list[dict]:
    """One task in a process of its own (spawn: CUDA in children): a crash that kills it breaks only it."""
    try:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(sweep_head_dim, *task).result()
    except Exception as exc:  # the child died (e.g. a crash inside a compiled kernel)
        return [
            {
                "backend": task[0],
                "head_dim": task[1],
                "case": case.name,
                "ok": False,
                "reason": None,
                "error": f"worker process: {error_text(exc)}",
                "tensors": {},
            }
            for case in GRAD_CASES
        ]


def arguments(parser) -> None:
    parser.add_argument("--dims", type=int, nargs="+", help="head dims (default every multiple of 8, 16 to 256)")
    parser.add_argument(
        "--backends",
        type=Backend,
        nargs="+",
        default=[Backend.FLASH_ATTN_4, Backend.TRITON],
        metavar="BACKEND",
        help="backends to check (default flash_attn_4 triton)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=max(1, min(14, (os.cpu_count() or 2) - 2)),
        help="processes at once (0: every task in this process)",
    )
    parser.add_argument("--budget-s", type=float, default=240.0, help="cases left after this are not run")
    parser.add_argument("--device", default="cuda", help="device (--smoke: the CPU, interpreted)")


def measure(args) -> dict:
    dims = args.dims or ((16,) if args.smoke else tuple(range(16, 257, 8)))
    # backend by backend, flash-attn-4 first: a budget that runs out cuts the control, not the subject
    tasks = [(b.value, d, args.device, args.smoke, time.time() + args.budget_s) for b in args.backends for d in dims]
    if args.workers == 0 or args.smoke:
        done = [sweep_head_dim(*task) for task in tasks]
    else:
        with concurrent.futures.ThreadPoolExecutor(args.workers) as threads:
            done = list(threads.map(_isolated, tasks))
    return {
        "installs": {v.value: flash_attn_backend.import_error(v) or "installed" for v in FlashAttn},
        "capability": flash_attn_backend.device_capability(torch.device(args.device)),
        "records": [r for records in done for r in records],
    }


def merge(runs: list[dict]) -> dict:
    """Runs joined (e.g. one per backend): a later run's records replace an earlier one's of the
    same backend and head dim."""
    cells = {}
    for run in runs:
        for r in run["records"]:
            cells.setdefault((r["backend"], r["head_dim"]), {}).setdefault(id(run), []).append(r)
    records = [r for by_run in cells.values() for r in list(by_run.values())[-1]]
    installs = {
        k: next((run["installs"][k] for run in runs if run["installs"][k] == "installed"), v)
        for k, v in runs[-1]["installs"].items()
    }
    return {**runs[-1], "installs": installs, "records": records}


def _cell(records: list[dict]) -> str:
    """How the cases of one (backend, head dim) went."""
    if all(r["reason"] for r in records):
        return f"not run: {records[0]['reason'][:80]}"
    ran = [r for r in records if not r["reason"]]
    errors = [r for r in ran if r["error"]]
    worst = max(
        (
            t["err"] / max(PASS_FACTOR * t["baseline_err"] + t["rounding"], 1e-30)
            for r in ran
            for t in r["tensors"].values()
        ),
        default=None,
        key=lambda x: float("inf") if x != x else x,
    )
    text = f"{sum(r['ok'] for r in ran)}/{len(records)} ok"
    text += f", worst at {worst:.2g} of its allowance" if worst is not None else ""
    return text + (f", {len(errors)} raised: {errors[0]['error'][:60]}" if errors else "")


def summarize(data: dict) -> Summary:
    records = data["records"]
    backends = list(dict.fromkeys(r["backend"] for r in records))
    by_cell: dict[tuple, list[dict]] = {}
    for r in records:
        by_cell.setdefault((r["backend"], r["head_dim"]), []).append(r)
    dims = sorted({r["head_dim"] for r in records})
    rows = [{"head dim": d, **{b: _cell(by_cell[b, d]) for b in backends if (b, d) in by_cell}} for d in dims]
    trusted = {
        b: [
            d
            for d in dims
            if by_cell.get((b, d))
            and len({r["case"] for r in records}) == len(by_cell[b, d])
            and all(r["ok"] for r in by_cell[b, d])
        ]
        for b in backends
    }
    fa4 = trusted.get(Backend.FLASH_ATTN_4.value, [])
    return Summary(
        tables=[
            table(
                [
                    {
                        "backend": b,
                        "head dims passing every case": ", ".join(map(str, ds)) or "none",
                        "failing or not run": ", ".join(str(d) for d in dims if d not in ds) or "none",
                    }
                    for b, ds in trusted.items()
                ],
                f"{len(GRAD_CASES)} cases per head dim",
            ),
            table(rows, "Every head dim", headline=False),
        ],
        targets=[
            verdict(
                "our Triton kernels (the control) pass every case at every head dim",
                f"{len(trusted.get('triton', []))} of {len(dims)} head dims",
                len(trusted.get("triton", [])) == len(dims) if "triton" in trusted else None,
            )
        ],
        notes=[
            f"FLASH_ATTN_4_HEAD_DIMS row for {tuple(data['capability'] or ())}: frozenset({{{', '.join(map(str, fa4))}}})"
        ],
    )


BENCHMARK = Benchmark(
    "flash_attn_head_dims",
    "flash-attn-4's head dims against float64",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=merge,
    module="benchmarks.flash_attn_check",
    baseline="dense attention computed in bf16 (the same-precision error), and our Triton kernels",
)

if __name__ == "__main__":
    BENCHMARK.main()
