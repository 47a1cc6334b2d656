"""The inference kernels compile for the GPUs they run on, within shared memory (cross-compiled on
the CPU, no GPU needed), as tests/kernels/test_triton_compile.py does for the training kernels:

- the FP8 forward (``triton_fp8.fp8_fwd_kernel``) for sm_90 (Hopper): its default configuration at
  head dims 64 and 128 and every configuration the tuner may choose at 128, with p in e4m3
  (the matmuls must compile to e4m3 tensor-core instructions) and in bf16; at D 128 for sm_89 (Ada,
  the consumer parts' 99 KB of shared memory);
- the decoding kernel (``triton_decode.decode_fwd_kernel``, its largest variant: paged, windowed,
  ALiBi, softcap, split) at the block sizes the launcher picks for one query (D 64 and 128) and
  for a tile of 64 rows (D 128) on sm_90, one query on sm_80, and its merge kernel.
A subset (11 builds, about 3 minutes on 2 cores without Triton's cache), as each takes 10 to 60 s.

The compiles run in a child process (this file run as a script) without TRITON_INTERPRET, which
the test session may have set for the interpreter tests.
"""

from __future__ import annotations

import concurrent.futures
import json
import os

import pytest
from genoformer.kernels.triton_flash_configs import AMPERE, HOPPER, SMALL_SMEM
from gluon_harness import compile_report

FP8_DIMS = (64, 128)
DECODE_DIMS = (64, 128)
DECODE_ROWS = (1, 64)  # Lq * GROUP: one query of one head, and a full tile


def _cases() -> list[tuple]:
    """(test id, kernel, generation, head dim, details): the FP8 forward's default configuration at
    each head dim and every candidate at D 128 on sm_90, p in bf16 and the sm_89 build at D 128; the
    decoding kernel at both block sizes at D 128 on sm_80 and sm_90, D 64 and 256 on sm_90, and the merge."""
    from genoformer.kernels.triton_decode import block_sizes
    from genoformer.kernels.triton_fp8 import fp8_candidates

    def fp8(gen, d, cfg, p_fp8=True):
        return (
            f"fp8-{gen.name}-d{d}-{cfg.block_m}x{cfg.block_n}-w{cfg.num_warps}s{cfg.num_stages}"
            f"{'' if p_fp8 else '-pbf16'}",
            "fp8",
            gen.name,
            d,
            (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, p_fp8),
        )

    out = [fp8(HOPPER, d, fp8_candidates(d)[0]) for d in FP8_DIMS]
    out += [fp8(HOPPER, 128, cfg) for cfg in fp8_candidates(128)[1:]]
    out += [fp8(HOPPER, 128, fp8_candidates(128)[0], p_fp8=False), fp8(SMALL_SMEM, 128, fp8_candidates(128)[0])]
    for gen, dims, rows_list in ((HOPPER, DECODE_DIMS, DECODE_ROWS), (AMPERE, (128,), DECODE_ROWS[:1])):
        for d in dims:
            for rows in rows_list if d == 128 else rows_list[:1]:
                block_m, block_n = block_sizes(rows, d)
                out.append((f"decode-{gen.name}-d{d}-{block_m}x{block_n}", "decode", gen.name, d, (block_m, block_n)))
    out.append((f"decode-merge-{HOPPER.name}-d128", "merge", HOPPER.name, 128, ()))
    return out


def _compile_one(case: tuple) -> dict:
    """Child process: compile one case and report its shared memory (or the error)."""
    import triton
    from genoformer.kernels.triton_decode import decode_fwd_kernel, decode_merge_kernel
    from genoformer.kernels.triton_flash_configs import tile_dim
    from genoformer.kernels.triton_fp8 import KB, P_SCALE, QB, fp8_fwd_kernel
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    case_id, kind, gen_name, d, details = case
    gen = next(g for g in (HOPPER, AMPERE, SMALL_SMEM) if g.name == gen_name)
    capability = 89 if kind == "fp8" and gen is SMALL_SMEM else gen.compile_capability
    pointers = {
        "Q": "*bf16",
        "K": "*bf16",
        "V": "*bf16",
        "O": "*bf16",
        "Q8": "*fp8e4nv",
        "K8": "*fp8e4nv",
        "V8T": "*fp8e4nv",
        "LSE": "*fp32",
        "PO": "*fp32",
        "PM": "*fp32",
        "PL": "*fp32",
        "QS": "*fp32",
        "KS": "*fp32",
        "VS": "*fp32",
        "MU_V": "*fp32",
        "ALIBI": "*fp32",
        "KV_LENS": "*i32",
        "SEQLENS": "*i32",
        "LEFTPAD": "*i32",
        "BATCH_IDX": "*i32",
        "BLOCK_TABLE": "*i32",
    }
    floats = ("qk_scale", "softcap")
    if kind == "fp8":
        block_m, block_n, warps, stages, p_fp8 = details
        kernel = fp8_fwd_kernel
        constexprs = {
            "D": d,
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "QB_": QB,
            "KB_": KB,
            "CAUSAL": True,
            "HAS_KV_LENS": True,
            "P_FP8": p_fp8,
            "P_SCALE_": P_SCALE,
            "ROUND_P": False,
        }
    elif kind == "decode":
        block_m, block_n = details
        kernel, warps, stages = decode_fwd_kernel, 4, 2
        constexprs = {
            "D": d,
            "D_TILE": tile_dim(d),
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "LEFT_BOUND": True,
            "RIGHT_BOUND": True,
            "HAS_LEFTPAD": True,
            "HAS_BATCH_IDX": False,
            "PAGED": True,
            "HAS_ALIBI": True,
            "SOFTCAP": True,
            "SPLIT": True,
            "DOT_F32": False,
        }
    else:
        kernel, warps, stages = decode_merge_kernel, 4, 1
        constexprs = {"D": d, "D_TILE": tile_dim(d), "BLOCK": 16}
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in floats else "i32")
        for name in kernel.arg_names
    }
    # what a launch with contiguous inputs gives: aligned pointers, strides that are multiples of 16
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if signature[name].startswith("*") or (name.startswith("s") and signature[name] == "i32")
    }
    try:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
            target=GPUTarget("cuda", capability, 32),
            options={"num_warps": warps, "num_stages": stages},
        )
    except Exception as error:  # reported to the parent test, which fails with it
        return {"id": case_id, "error": f"{type(error).__name__}: {error}"}
    fp8_mma = "f8E4M3FN" in compiled.asm["ttgir"] and (
        "wgmma" in compiled.asm["ptx"] or "mma.sync" in compiled.asm["ptx"]
    )
    return {
        "id": case_id,
        "shared": compiled.metadata.shared,
        "limit": gen.shared_limit,
        "fp8_mma": "e4m3" in compiled.asm["ptx"] and fp8_mma,
    }


def _compile_all() -> list[dict]:
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_compile_one, _cases()))


@pytest.fixture(scope="session")
def compiled() -> dict[str, dict]:
    return compile_report(__file__, timeout=1200)


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_inference_kernel_compiles_within_shared_memory(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, f"{case[0]} does not compile: {result.get('error')}"
    assert result["shared"] <= result["limit"], (
        f"{case[0]} needs {result['shared']} B of shared memory, over the {result['limit']} B limit: shrink its "
        f"tiles or stages (triton_fp8.fp8_candidates, triton_decode.block_sizes)"
    )
    if case[1] == "fp8" and case[4][-1]:
        assert result["fp8_mma"], f"{case[0]}: the matmuls did not compile to FP8 (e4m3) tensor-core instructions"


if __name__ == "__main__":
    print(json.dumps(_compile_all()))
