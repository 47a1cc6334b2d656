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
  --mix       the step loops' instructions: in all, and tensor-core (HGMMA/HMMA), exp (MUFU), global
              loads (LDG, LDGSTS, TMA), shared memory (LDS, LDSM, STS), synchronisation (BAR,
              SYNCS, WARPGROUP, DEPBAR), spills (STL, LDL); summed over the kernel's step loops
  --per-loop  the same counts for each step loop ("masked / unmasked", in SASS order)

One run, from the repository root (no GPU needed; 5 to 30 s per kernel compiled, on 2 cores):

    python -m benchmarks.spills          # default configurations, custom-128 and sliding_window-128, sm_90
    python -m benchmarks.spills --cases sliding_window-128 --capability 90 80 --all-candidates
    python -m benchmarks.spills --kernels dkdv --extra bwd:128:64,128,8,3,128,64,8,3,dv_late,heads_outer
    python -m benchmarks.spills --cases custom-128 --kernels dkdv dq --mix   # with the step loops' instruction mix
    python -m benchmarks.spills --ptx flex_ptx/*.ptx --per-loop   # kernels compiled elsewhere (benchmarks/flex_ptx.py)

The numbers are those of the Triton installed here: the GPU image's Triton may allocate
registers differently (run it there, or with that version's wheel on PYTHONPATH, to compare).
TRITON_PTXAS_PATH chooses another ptxas. Inductor assembles FlexAttention's kernels with the
ptxas that ships with torch (torch/bin/ptxas, CUDA 13.0 in the GPU image's torch 2.11), so their
PTX says `.version 9.0`, which Triton 3.6's own ptxas (CUDA 12.8) refuses. Read them, and ours
for the comparison, with a CUDA 13 ptxas from pip (nvdisasm then comes from Triton):

    pip download --no-deps -d /tmp/cu13 "nvidia-cuda-nvcc==13.0.*" && unzip -q -d /tmp/cu13 /tmp/cu13/*.whl
    TRITON_PTXAS_PATH=/tmp/cu13/nvidia/cu13/bin/ptxas python -m benchmarks.spills --ptx flex_ptx/*.ptx --per-loop

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
from benchmarks.kernel_variants import Case, config_text, gpu_cases, parse_extra
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


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
MIX = {
    "mma": ("HGMMA", "HMMA"),
    "exp": ("MUFU",),
    "global_ld": ("LDG", "LDGSTS", "UTMALDG", "LDGDEPBAR"),
    "shared": ("LDS", "LDSM", "STS"),
    "sync": ("BAR", "SYNCS", "WARPGROUP", "DEPBAR", "WARPSYNC"),
    "spill": ("STL", "LDL"),
}
"""The instruction groups of the step loops' mix (SASS opcodes without their modifiers)."""


def _step_loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of each innermost SASS loop that issues a tensor-core instruction
    (HGMMA on sm_90, HMMA on sm_80): the loops that run once per tile."""
    labels = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if re.match(r"\s*\.L_x_\d+:", line)}
    loops = []
    for i, line in enumerate(lines):
        match = _TARGET.search(line) if re.search(r"\bBRA\b", line) else None
        if match and match.group(1) in labels and labels[match.group(1)] < i:
            loops.append((labels[match.group(1)], i))
    inner = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops if (c, d) != (a, b))]
    return [(a, b) for a, b in inner if any(re.search(r"\bH(G)?MMA\b", line) for line in lines[a:b + 1])]


def step_loop_spills(sass: str) -> tuple[int, int]:
    """(STL, LDL) instructions inside the SASS's step loops (see ``_step_loops``)."""
    lines = sass.splitlines()
    body = [line for a, b in _step_loops(lines) for line in lines[a:b + 1]]
    return (sum(bool(re.search(r"\bSTL\b", line)) for line in body),
            sum(bool(re.search(r"\bLDL\b", line)) for line in body))


def step_loop_mix(sass: str, per_loop: bool = False) -> dict:
    """Instructions of the step loops, in all and by group (``MIX``), summed over the loops: what
    one tile step of each loop issues (the masked and the unmasked loop of a kernel both count).
    With `per_loop`, each count is instead the loops' own, in SASS order, as "a / b / ..."."""
    lines = sass.splitlines()
    loops = _step_loops(lines)
    opcodes_L = [[m.group(1) for line in lines[a:b + 1] if (m := _OPCODE.search(line))] for a, b in loops]
    counts_L = [{"loop_instr": len(ops), **{f"loop_{group}": sum(op in names for op in ops)
                                            for group, names in MIX.items()}} for ops in opcodes_L]
    keys = ["loop_instr", *(f"loop_{group}" for group in MIX)]
    if per_loop:
        return {"loops": len(loops), **{key: " / ".join(str(c[key]) for c in counts_L) for key in keys}}
    return {"loops": len(loops), **{key: sum(c[key] for c in counts_L) for key in keys}}


def _nvdisasm(ptxas: Path) -> Path:
    """The disassembler beside `ptxas`, else Triton's own (the CUDA 13 ptxas of a pip wheel, used
    through TRITON_PTXAS_PATH for FlexAttention's PTX, comes without one)."""
    beside = ptxas.with_name("nvdisasm")
    if beside.is_file():
        return beside
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"


def assemble(ptx: str, capability: int, mix: bool = False, per_loop: bool = False) -> dict:
    """Assemble PTX again with Triton's ptxas (or TRITON_PTXAS_PATH's) and `-v`: registers, spill
    bytes, the spill instructions of the SASS (all, and in the step loops), and with `mix` the step
    loops' instruction mix (each loop's with `per_loop`)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    arch = sm_arch_from_capability(capability)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_file, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx_file.write_text(ptx)
        report = subprocess.run([get_ptxas(capability).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                                 f"--gpu-name={arch}", str(ptx_file), "-o", str(cubin)],
                                check=True, capture_output=True, text=True).stderr
        nvdisasm = _nvdisasm(Path(get_ptxas(capability).path))
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    frame, spill_st, spill_ld = (int(x) for x in _SPILLS.search(report).groups())
    loop_stl, loop_ldl = step_loop_spills(sass)
    row = {
        "regs": int(_REGS.search(report).group(1)),
        "spill_stores_B": spill_st,
        "spill_loads_B": spill_ld,
        "stack_B": frame,
        "STL": sum(bool(re.search(r"\bSTL\b", line)) for line in sass.splitlines()),
        "LDL": sum(bool(re.search(r"\bLDL\b", line)) for line in sass.splitlines()),
        "loop_STL": loop_stl,
        "loop_LDL": loop_ldl,
    }
    if mix:
        row.update(step_loop_mix(sass, per_loop))
    return row


def compile_launch(launch: Launch, capability: int, maxnreg: int | None = None, mix: bool = False,
                   per_loop: bool = False) -> dict:
    """Compile one recorded launch for sm_<capability> as ``JITFunction.run`` would, then read
    ptxas' register and spill report and count the spill instructions of the SASS."""
    ptx, shared = compile_ptx(launch, capability, maxnreg)
    return {**assemble(ptx, capability, mix, per_loop), "smem_B": shared}


def compile_ptx(launch: Launch, capability: int, maxnreg: int | None = None) -> tuple[str, int]:
    """(PTX, shared memory bytes) of one recorded launch compiled for sm_<capability>."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
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
    return compiled.asm["ptx"], compiled.metadata.shared


_PTX_TARGET = re.compile(r"^\s*\.target\s+sm_(\d+)", re.MULTILINE)
_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)")


def ptx_row(path: Path, mix: bool, per_loop: bool = False) -> dict:
    """The report of a PTX file compiled elsewhere (e.g. FlexAttention's kernels, copied from a
    GPU machine's Triton cache by benchmarks/flex_ptx.py): its target and entry are read from it."""
    ptx = path.read_text()
    target, entry = _PTX_TARGET.search(ptx), _PTX_ENTRY.search(ptx)
    if target is None or entry is None:
        raise ValueError(f"{path}: not a PTX module (no .target sm_NN or no .entry)")
    capability = int(target.group(1))
    return {"file": path.name, "sm": capability, "kernel": entry.group(1),
            **assemble(ptx, capability, mix, per_loop)}


def _work(item: tuple) -> dict:
    """Worker process: record the case's launches, compile the one asked for."""
    case_key, kind, config, capability, kernel, maxnreg, mix, per_loop = item
    case = next(c for c in gpu_cases() if c.key == case_key)
    launch = next(launch for launch in record(case, kind, config, capability) if launch.kernel == kernel)
    row = {"case": case_key, "sm": capability, "kernel": kernel, "config": config_text(config),
           "warps": launch.kwargs.get("num_warps"), "stages": launch.kwargs.get("num_stages")}
    if maxnreg is not None:
        row["maxnreg"] = maxnreg
    try:
        row.update(compile_launch(launch, capability, maxnreg, mix, per_loop))
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
    parser.add_argument("--mix", action="store_true",
                        help="also count the step loops' instructions: in all, tensor-core, exp (MUFU), global "
                             "loads, shared memory, synchronisation, spills")
    parser.add_argument("--per-loop", action="store_true",
                        help="--mix with each step loop's counts (\"masked / unmasked\", in SASS order) instead of "
                             "their sums")
    parser.add_argument("--ptx", nargs="+", type=Path, metavar="FILE",
                        help="report these PTX files instead of our kernels (e.g. FlexAttention's, fetched from a "
                             "GPU machine by benchmarks/flex_ptx.py); --cases and the configuration options are "
                             "then ignored")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles in parallel")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.ptx:
        missing = [str(path) for path in args.ptx if not path.is_file()]
        if missing:
            sys.exit(f"--ptx: no such file: {', '.join(missing)}")
        rows = [ptx_row(path, args.mix or args.per_loop, args.per_loop) for path in args.ptx]
    else:
        if tf.INTERPRETED:
            sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
        known = {c.key for c in gpu_cases()}
        if set(args.cases) - known:
            sys.exit(f"--cases: no case {sorted(set(args.cases) - known)}; the cases are {sorted(known)}")
        items = plan(args.cases, args.capability, args.kernels, args.all_candidates, args.extra, args.maxnreg)
        with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
            rows = list(pool.map(_work, [(*item, args.mix or args.per_loop, args.per_loop) for item in items]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(markdown_table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
