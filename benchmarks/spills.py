"""Registers, register spills and shared memory of our Triton attention kernels, cross-compiled on a CPU.

For each case (a pattern and head dim of `benchmarks/kernel_variants.py`, at its GPU shapes) and
each launch configuration (the table's candidates of `kernels/triton_flash_configs.py` for the
generation, or chosen ones), the real launchers `flash_fwd` / `flash_bwd` run on CPU tensors with
their kernels replaced by recorders: every launch's arguments and constexprs (block sizes,
EVEN_Q, SPARSE, SPLIT, TMA, ...) are exactly those a GPU launch of the same inputs would pass.
Each recorded launch is then compiled for the target as `JITFunction.run` compiles it (same
specialisation of the arguments, same options), and its PTX is assembled again with the ptxas
that ships with Triton and `-v`:

  regs        registers per thread (ptxas "Used N registers"; 255 is the most one thread gets)
  spill st/ld bytes of spill stores / loads per thread (ptxas), and the spill instructions (STL /
              LDL) in the SASS: all of them, and those inside the kernel's step loops (a loop of
              the SASS that issues tensor-core instructions, HGMMA or HMMA: run once per tile)
  smem        bytes of shared memory per program (`compiled.metadata.shared`)

One run, from the repository root (no GPU needed; 5 to 30 s per kernel compiled, on 2 cores):

    python -m benchmarks.spills          # default configurations, custom-128 and sliding_window-128, sm_90
    python -m benchmarks.spills --cases sliding_window-128 --capability 90 80 --all-candidates
    python -m benchmarks.spills --kernels dkdv --extra bwd:128:64,128,8,3,128,64,8,3,dv_late,heads_outer

The numbers are those of the Triton installed here: the GPU image's Triton may allocate
registers differently (run it there, or with that version's wheel on PYTHONPATH, to compare).

Shape legend: B batch, H heads, L sequence length, D head dim, bs layout block size.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch

from benchmarks.common import markdown_table
from benchmarks.kernel_variants import Case, _config_text, gpu_cases, parse_extra
from genoformer.kernels import triton_flash as tf
from genoformer.kernels import triton_flash_configs as configs

KERNELS = {
    "attn_fwd_kernel": "fwd",
    "fwd_merge_kernel": "fwd_merge",
    "bwd_preprocess_kernel": "preprocess",
    "bwd_dkdv_kernel": "dkdv",
    "bwd_dq_kernel": "dq",
    "split_sum_kernel": "split_sum",
}
"""The launchers' kernels (names in ``triton_flash``) -> the short names this script reports."""

WIDTH = 2048
"""H * D of every case, as in benchmarks/kernel_variants.py's GPU run."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as the launcher made it: the kernel's short name, the JITFunction, its arguments."""

    kernel: str
    fn: object
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a JITFunction in ``triton_flash``: ``kernel[grid](...)`` records the launch."""

    def __init__(self, name: str, fn, launches: list[Launch]) -> None:
        self.name, self.fn, self.launches = name, fn, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(Launch(self.name, self.fn, args, kwargs))

        return launch


def _generation(capability: int) -> configs.Generation:
    return configs.generation_for((capability // 10, capability % 10))


@contextlib.contextmanager
def _recording(capability: int) -> Iterator[list[Launch]]:
    """Replace the launchers' kernels by recorders; tensor descriptors count as available on
    sm_90 (what ``_tma_ready`` finds for the aligned, contiguous inputs of a GPU run)."""
    launches: list[Launch] = []
    with contextlib.ExitStack() as stack:
        for name, short in KERNELS.items():
            stack.enter_context(mock.patch.object(tf, name, _Recorder(short, getattr(tf, name), launches)))
        stack.enter_context(mock.patch.object(tf, "_tma_ready", lambda *tensors: capability >= 90))
        yield launches


def record(case: Case, kind: str, config: configs.FwdConfig | configs.BwdConfig, capability: int) -> list[Launch]:
    """The launches of one forward or backward call of `case` with `config` (fitted to its layout)."""
    H, L, D = case.heads(WIDTH), case.seq_len, case.head_dim
    layout = case.layout(L)
    q, k, v, o, do = (torch.empty(1, H, L, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(1, H, L, dtype=torch.float32)
    bs = layout.block_size if layout is not None else 0
    kcnt = kidx = qcnt = qidx = None
    if layout is not None:
        kcnt, kidx = layout.kv_indices(torch.device("cpu"))
        qcnt, qidx = layout.q_indices(torch.device("cpu"))
    with _recording(capability) as launches:
        if kind == "fwd":
            tf.flash_fwd(q, k, v, None, kcnt, kidx, bs, case.causal, D**-0.5,
                         config=configs.fit_fwd(config, bs or None))
        else:
            tf.flash_bwd(do, q, k, v, o, lse, None, kcnt, kidx, qcnt, qidx, bs, case.causal, D**-0.5,
                         config=configs.fit_bwd(config, bs or None))
    return launches


_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_TARGET = re.compile(r"`\(?(\.L_x_\d+)\)?")


def step_loop_spills(sass: str) -> tuple[int, int]:
    """(STL, LDL) instructions inside the SASS's step loops: the backward branches' bodies that
    issue a tensor-core instruction (HGMMA on sm_90, HMMA on sm_80), innermost loops only."""
    lines = sass.splitlines()
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"\s*\.L_x_\d+:", line)}
    loops = []
    for i, line in enumerate(lines):
        match = _TARGET.search(line) if re.search(r"\bBRA\b", line) else None
        if match and match.group(1) in labels and labels[match.group(1)] < i:
            loops.append((labels[match.group(1)], i))
    inner = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops if (c, d) != (a, b))]
    stores = loads = 0
    for a, b in inner:
        body = lines[a:b + 1]
        if any(re.search(r"\bH(G)?MMA\b", line) for line in body):
            stores += sum(bool(re.search(r"\bSTL\b", line)) for line in body)
            loads += sum(bool(re.search(r"\bLDL\b", line)) for line in body)
    return stores, loads


def compile_launch(launch: Launch, capability: int, maxnreg: int | None = None) -> dict:
    """Compile one recorded launch for sm_<capability> as ``JITFunction.run`` would, then read
    ptxas' register and spill report and count the spill instructions of the SASS."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs, debug=fn.debug or knobs.runtime.debug)
    if maxnreg is not None:
        kwargs["maxnreg"] = maxnreg
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    arch = sm_arch_from_capability(capability)
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([get_ptxas(capability).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                                 f"--gpu-name={arch}", str(ptx), "-o", str(cubin)],
                                check=True, capture_output=True, text=True).stderr
        nvdisasm = Path(get_ptxas(capability).path).with_name("nvdisasm")
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    frame, spill_st, spill_ld = (int(x) for x in _SPILLS.search(report).groups())
    loop_stl, loop_ldl = step_loop_spills(sass)
    return {
        "regs": int(_REGS.search(report).group(1)),
        "spill_stores_B": spill_st,
        "spill_loads_B": spill_ld,
        "stack_B": frame,
        "STL": sum(bool(re.search(r"\bSTL\b", line)) for line in sass.splitlines()),
        "LDL": sum(bool(re.search(r"\bLDL\b", line)) for line in sass.splitlines()),
        "loop_STL": loop_stl,
        "loop_LDL": loop_ldl,
        "smem_B": compiled.metadata.shared,
    }


def _work(item: tuple) -> dict:
    """Worker process: record the case's launches, compile the one asked for."""
    case_key, kind, config, capability, kernel, maxnreg = item
    case = next(c for c in gpu_cases() if c.key == case_key)
    launch = next(launch for launch in record(case, kind, config, capability) if launch.kernel == kernel)
    row = {"case": case_key, "sm": capability, "kernel": kernel, "config": _config_text(config),
           "warps": launch.kwargs.get("num_warps"), "stages": launch.kwargs.get("num_stages")}
    if maxnreg is not None:
        row["maxnreg"] = maxnreg
    try:
        row.update(compile_launch(launch, capability, maxnreg))
    except Exception as error:  # reported in the table: a variant this Triton cannot build
        row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return row


def plan(cases: list[str], capabilities: list[int], kernels: list[str], all_candidates: bool,
         extra: list[tuple[str, int, object]], maxnreg: list[int | None]) -> list[tuple]:
    """(case, pass, config, capability, kernel, maxnreg) for every compile asked for."""
    by_key = {c.key: c for c in gpu_cases()}
    items = []
    for key in cases:
        D = by_key[key].head_dim
        for capability in capabilities:
            gen = _generation(capability)
            for kind, table in (("fwd", configs.fwd_candidates), ("bwd", configs.bwd_candidates)):
                chosen = list(table(gen, D) if all_candidates else table(gen, D)[:1])
                chosen += [c for k, d, c in extra if k == kind and d == D]
                chosen = [c for c in dict.fromkeys(chosen) if not getattr(c, "dq_stream", False)]
                names = ("fwd",) if kind == "fwd" else ("dkdv", "dq")
                items += [(key, kind, c, capability, name, n) for c in chosen for name in names
                          if name in kernels for n in maxnreg]
    # a dK/dV or dQ half shared by two candidates of one case is compiled once
    seen, out = set(), []
    for item in items:
        key, kind, config, capability, name, n = item
        same = dataclasses.replace(config, **({"block_m2": 0, "block_n2": 0, "warps2": 0, "stages2": 0}
                                              if name == "dkdv" else
                                              {"block_m1": 0, "block_n1": 0, "warps1": 0, "stages1": 0}
                                              if name == "dq" else {}))
        if (key, same, capability, name, n) not in seen:
            seen.add((key, same, capability, name, n))
            out.append(item)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spills", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["custom-128", "sliding_window-128"], metavar="PATTERN-D",
                        help="cases of benchmarks/kernel_variants.py by key (custom-128, sliding_window-64, "
                             "causal-128, bigbird-128, ...)")
    parser.add_argument("--capability", nargs="+", type=int, default=[90], metavar="CC",
                        help="compute capabilities to compile for (90: H100/H200, 80: A100)")
    parser.add_argument("--kernels", nargs="+", default=["fwd", "dkdv", "dq"], choices=["fwd", "dkdv", "dq"],
                        help="which kernels to report")
    parser.add_argument("--all-candidates", action="store_true",
                        help="every candidate of the table (default: its first, the default configuration)")
    parser.add_argument("--extra", nargs="+", type=parse_extra, default=[], metavar="SPEC",
                        help="configurations beside the table's, as benchmarks/kernel_variants.py takes them")
    parser.add_argument("--maxnreg", nargs="+", type=lambda s: None if s == "none" else int(s), default=[None],
                        metavar="N", help="compile once per value with Triton's maxnreg launch option (a cap "
                                          "on the registers per thread; 'none', the default: no cap)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles in parallel")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if tf.INTERPRETED:
        sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    known = {c.key for c in gpu_cases()}
    if set(args.cases) - known:
        sys.exit(f"--cases: no case {sorted(set(args.cases) - known)}; the cases are {sorted(known)}")
    items = plan(args.cases, args.capability, args.kernels, args.all_candidates, args.extra, args.maxnreg)
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(_work, items))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(markdown_table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
