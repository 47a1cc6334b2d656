"""The launch configurations of the Triton launcher compile for their GPU generation within that
generation's shared-memory limit (cross-compiled on the CPU: no GPU needed): in CI each list's
default, which runs untuned and must fit, and every sm_90 variant among the candidates (TMA,
conditional rescaling, the heads-outer grid, dV late in the loop: code of their own); with
GENOFORMER_COMPILE=all every configuration the launcher can pick (the GPU scripts' check: minutes
of compiling). A later candidate that does not compile or launch is left out of the tuning with a
warning (``triton_flash.choose_config``): a slower run, not a failed one.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` runs the whole pipeline down
to a cubin with the ptxas that ships with Triton; ``compiled.metadata.shared`` is the bytes of
shared memory one program needs (the driver refuses a launch above the per-block limit).
The arguments carry the divisibility a real launch gives them (``_launch_attrs``): without it
Triton sees unaligned pointers, pipelines no load through shared memory, and reports a fraction
of the shared memory the launch needs (64 KB instead of 224 KB for the sm_90 D=128 forward).
Each kernel is built in its largest variant (a diagonal band on both sides, block-sparse, key
padding, packed documents, ragged query tail, long lists split across programs): the other variants
drop code and use no more shared memory.  Sparse launches without split lists (``SPLIT=False``, the
usual case) are built too for the default configurations of ``UNSPLIT_DIMS`` (the 128-wide tile;
64 too with GENOFORMER_COMPILE=all), and
``split_sum_kernel`` and ``fwd_merge_kernel``, which combine the split lists' partials, at every
tile width and padded head dim on sm_80 and sm_90.  Dense packed rows take one branch of their own
(the launch order of their tiles, ``DENSE_PACKED``): each generation's default configurations of
the 128-wide tile (the largest shared memory of the common head dims; 64 too with
GENOFORMER_COMPILE=all), and the sm_90 variants
among its candidates (TMA, conditional rescaling, the heads-outer grid, which indexes the tile
order by the other grid axis, and dV late in the loop), are built that way too.

The score modifiers (``MODS``: ALiBi, softcap with the GPU's tanh.approx, dropout with its in-kernel
Philox mask, whose joins pass a (rows, keys) int8 tile through shared memory) are built with the
largest variant for the default configurations of ``MODS_DIMS`` on sm_80 and sm_90 (the 128-wide
tile: the largest tiles, so the most shared memory with the dropout tile), variable-length
batches (``VARLEN_CASE``, which excludes layouts, key padding and documents) for sm_90's at 64;
GENOFORMER_COMPILE=all builds them for every configuration the launcher can pick, at every tile
width.

Configurations are chosen per tile width (the head dim rounded up to a power of two); each is
built at its tile width. On sm_80 and sm_90 each tile width is built again at one padded head dim
(``PADDED_DIMS``) in its default configurations and, on sm_90, in those that load through tensor
descriptors (TMA), and in all of them with GENOFORMER_COMPILE=all: the head-dim masks change the
loads and stores, not the tiles held in shared memory, and a tile width's other configurations
(block sizes, stages, conditional rescaling, the grid's order, dV's place in the loop) mask them
with the same code.

Each build also counts the scalar loads that Triton's pipeliner turned into cp.async copies
(``tensor<1x!tt.ptr<i32>>`` in the TTGIR): a layout entry loaded that way in the step that uses
it made every step of the sparse loops wait for all copies in flight (``async_wait {num = 0}``),
so no tile was prefetched; ``tile_start`` is called a step ahead so that none is.

The compiles run in a child process (this file run as a script), one worker per core: the test
session may have set TRITON_INTERPRET=1 for the interpreter tests, and kernels defined under it
cannot be compiled.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import time

import pytest
from genoformer.kernels import triton_flash_configs as configs
from gluon_harness import compile_report

COMMON = {
    "BAND_LO": True,
    "BAND_HI": True,
    "SPARSE": True,
    "HAS_KV_LENS": True,
    "HAS_DOCS": True,
    "DOT_F32": False,
    "SPLIT": True,
    "VARLEN": False,
    "ALIBI_": False,
    "SOFTCAP": False,
    "DROPOUT": False,
    "TANH_ASM": True,
}

PADDED_DIMS = {32: 24, 64: 40, 128: 96, 256: 160}
"""tile width -> a head dim padded to it, compiled too (default and TMA configurations) on PADDED_GENERATIONS"""
PADDED_GENERATIONS = ("sm_80", "sm_90")

MODS = {"ALIBI_": True, "SOFTCAP": True, "DROPOUT": True}
"""constexprs of the score modifiers, all on (added to the largest variant)"""
MODS_DIMS = (128,)
ALL = os.environ.get("GENOFORMER_COMPILE") == "all"
"""GENOFORMER_COMPILE=all: every selectable configuration of every tile width, plain and with the modifiers"""

VARLEN_CASE = {"VARLEN": True, "SPARSE": False, "HAS_KV_LENS": False, "HAS_DOCS": False, "SPLIT": False, **MODS}
"""constexprs of a varlen launch (every score modifier on)"""

DENSE_PACKED = {"SPARSE": False, "HAS_KV_LENS": False, "SPLIT": False}
"""constexprs of a dense packed launch, built for the default configs of DENSE_PACKED_DIMS on sm_80, sm_90
and the sm_90 variants among their candidates"""
DENSE_PACKED_DIMS = (64, 128) if ALL else (128,)

UNSPLIT = {"SPLIT": False}
"""constexprs of a sparse launch whose layout has no long list, built for the default configs of UNSPLIT_DIMS
on sm_80 and sm_90"""
UNSPLIT_DIMS = (64, 128) if ALL else (128,)


def _variant(cfg: configs.FwdConfig | configs.BwdConfig) -> str:
    """The test-id suffix of a configuration's sm_90 variant ("" for a plain configuration)."""
    return (
        ("-tma" if cfg.tma else "")
        + (f"-tau{cfg.rescale_tau:g}" if isinstance(cfg, configs.FwdConfig) and cfg.rescale_tau else "")
        + ("-headsouter" if isinstance(cfg, configs.BwdConfig) and cfg.heads_outer else "")
        + ("-dvlate" if isinstance(cfg, configs.BwdConfig) and cfg.dv_late else "")
    )


def _cases() -> list[tuple[str, str, int, str, tuple]]:
    """(test id, generation name, head dim, kernel, config fields) of the builds (see the module's docstring)."""
    out = []
    built = [
        (gen, tile, cfg, "")
        for gen, tile, cfg in configs.all_configs()
        if ALL or _variant(cfg) or cfg in (configs.fwd_candidates(gen, tile)[0], configs.bwd_candidates(gen, tile)[0])
    ]
    built += [
        (gen, PADDED_DIMS[tile], cfg, "")
        for gen in configs.GENERATIONS
        if gen.name in PADDED_GENERATIONS
        for tile in PADDED_DIMS
        for candidates in (configs.fwd_candidates, configs.bwd_candidates)
        for i, cfg in enumerate(candidates(gen, tile))
        if ALL or i == 0 or cfg.tma
    ]
    built += [
        (gen, d, cfg, "-dense-packed")
        for gen in configs.GENERATIONS
        if gen.name in PADDED_GENERATIONS
        for d in DENSE_PACKED_DIMS
        for candidates in (configs.fwd_candidates, configs.bwd_candidates)
        for i, cfg in enumerate(candidates(gen, d))
        if i == 0 or _variant(cfg)
    ]
    built += [
        (gen, d, candidates(gen, d)[0], "-unsplit")
        for gen in configs.GENERATIONS
        if gen.name in PADDED_GENERATIONS
        for d in UNSPLIT_DIMS
        for candidates in (configs.fwd_candidates, configs.bwd_candidates)
    ]
    mods_dims = configs.TILE_DIMS if ALL else MODS_DIMS
    built += [
        (gen, d, cfg, "-mods")
        for gen in configs.GENERATIONS
        if gen.name in PADDED_GENERATIONS
        for d in mods_dims
        for candidates in (configs.fwd_candidates, configs.bwd_candidates)
        for cfg in (candidates(gen, d) if ALL else candidates(gen, d)[:1])
    ]
    built += [
        (gen, d, candidates(gen, d)[0], "-varlen")
        for gen in configs.GENERATIONS
        if gen.name in (PADDED_GENERATIONS if ALL else ("sm_90",))
        for d in (configs.TILE_DIMS if ALL else (64,))
        for candidates in (configs.fwd_candidates, configs.bwd_candidates)
    ]
    for gen, d, cfg, packed in built:
        if packed in ("-mods", "-varlen") and isinstance(cfg, configs.FwdConfig):
            cfg = configs.fit_dropout(cfg)  # what the launcher runs with dropout
        if isinstance(cfg, configs.BwdConfig) and cfg.dq_stream:
            # a launch option: it runs the kernels of the same configuration without it
            cfg = dataclasses.replace(cfg, dq_stream=False)
        fields = tuple(cfg.__dict__.values())
        suffix = _variant(cfg) + packed
        if isinstance(cfg, configs.FwdConfig):
            out.append(
                (
                    f"{gen.name}-d{d}-fwd-{cfg.block_m}x{cfg.block_n}-w{cfg.num_warps}s{cfg.num_stages}{suffix}",
                    gen.name,
                    d,
                    "fwd",
                    fields,
                )
            )
        else:
            out.append(
                (
                    f"{gen.name}-d{d}-dkdv-{cfg.block_m1}x{cfg.block_n1}-w{cfg.warps1}s{cfg.stages1}{suffix}",
                    gen.name,
                    d,
                    "dkdv",
                    fields,
                )
            )
            # dv_late changes only the dK/dV kernel: its dQ half is the plain configuration's
            dq_suffix = _variant(dataclasses.replace(cfg, dv_late=False)) + packed
            out.append(
                (
                    f"{gen.name}-d{d}-dq-{cfg.block_m2}x{cfg.block_n2}-w{cfg.warps2}s{cfg.stages2}{dq_suffix}",
                    gen.name,
                    d,
                    "dq",
                    fields,
                )
            )
    out += [
        (f"{gen.name}-d{d}-{kind}-{configs.SPLIT_SUM_BLOCK}", gen.name, d, kind, ())
        for gen in configs.GENERATIONS
        if gen.name in PADDED_GENERATIONS
        for d in (*configs.TILE_DIMS, *PADDED_DIMS.values())
        for kind in ("splitsum", "fwdmerge")
    ]
    # a dK/dV or dQ half shared by two candidates is compiled once
    return list({case[0]: case for case in out}.values())


TENSOR_STRIDES = ("sq", "sk", "sv", "so", "sdo", "sdq", "sdk", "sdv", "sout")


def _launch_attrs(kernel, signature: dict[str, str], head_dim: int) -> dict:
    """The divisibility Triton's launcher specialises on for contiguous inputs: every pointer is
    16-byte aligned (torch allocations), and the strides of q, k, v, o and their gradients are
    multiples of 16 elements when D % 16 == 0 (D % 16 == 8: not, the kernels' ALIGN8 hint covers them)."""
    divisible = [i for i, name in enumerate(kernel.arg_names) if signature[name].startswith("*")]
    if head_dim % 16 == 0:
        divisible += [i for i, name in enumerate(kernel.arg_names) if name.split("_")[0] in TENSOR_STRIDES]
    return {(i,): [["tt.divisibility", 16]] for i in divisible}


def _compile_one(case: tuple) -> dict:
    """Child process: compile one case and report its shared memory (or the error)."""
    import triton
    from genoformer.kernels.triton_flash_bwd import bwd_dkdv_kernel, bwd_dq_kernel, split_sum_kernel
    from genoformer.kernels.triton_flash_fwd import SCAN, attn_fwd_kernel, fwd_merge_kernel
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    case_id, gen_name, d, kind, fields = case
    gen = next(g for g in configs.GENERATIONS if g.name == gen_name)
    if kind in ("splitsum", "fwdmerge"):
        kernel = split_sum_kernel if kind == "splitsum" else fwd_merge_kernel
        constexprs, warps, stages = {"BLOCK": configs.SPLIT_SUM_BLOCK}, 4, 1
    elif kind == "fwd":
        cfg = configs.FwdConfig(*fields)
        kernel, constexprs = (
            attn_fwd_kernel,
            {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "TMA": cfg.tma, "RESCALE_TAU": cfg.rescale_tau},
        )
        warps, stages = cfg.num_warps, cfg.num_stages
    else:
        cfg = configs.BwdConfig(*fields)
        variant = {"TMA": cfg.tma, "HEADS_OUTER": cfg.heads_outer, "DV_LATE": cfg.dv_late}
        if kind == "dkdv":
            kernel = bwd_dkdv_kernel
            constexprs = {"BLOCK_M1": cfg.block_m1, "BLOCK_N1": cfg.block_n1, "EVEN_Q": False, **variant}
            warps, stages = cfg.warps1, cfg.stages1
        else:
            kernel, constexprs = bwd_dq_kernel, {"BLOCK_M2": cfg.block_m2, "BLOCK_N2": cfg.block_n2, **variant}
            warps, stages = cfg.warps2, cfg.stages2
    # ALIGN8 is what the launcher sets for contiguous inputs of these head dims
    variants = {"-dense-packed": DENSE_PACKED, "-unsplit": UNSPLIT, "-mods": MODS, "-varlen": VARLEN_CASE}
    packed = next((variant for suffix, variant in variants.items() if case_id.endswith(suffix)), {})
    constexprs = {
        "D": d,
        "D_TILE": configs.tile_dim(d),
        "ALIGN8": d % 16 == 8,
        "SCAN_": SCAN,
        **COMMON,
        **packed,
        **constexprs,
    }
    constexprs = {name: value for name, value in constexprs.items() if name in kernel.arg_names}
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "OUT"):
            signature[name] = "*bf16"
        elif name in ("LSE", "DELTA", "PDK", "PDV", "PDQ", "PART", "PO", "PM", "PL", "ALIBI"):
            signature[name] = "*fp32"
        elif name in ("KV_LENS", "CNT", "IDX", "ORDER", "DOC_START", "DOC_END", "DOC_ORDER", "SUMS", "CU_Q", "CU_K"):
            signature[name] = "*i32"
        elif name == "RNG":
            signature[name] = "*i64"
        elif name in ("qk_scale", "sm_scale", "scale", "cap_in", "cap2", "drop_scale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    t0 = time.perf_counter()
    try:
        source = ASTSource(
            fn=kernel, signature=signature, constexprs=constexprs, attrs=_launch_attrs(kernel, signature, d)
        )
        compiled = triton.compile(
            source,
            target=GPUTarget("cuda", gen.compile_capability, 32),
            options={"num_warps": warps, "num_stages": stages},
        )
    except Exception as error:  # reported to the parent test, which fails with it
        return {"id": case_id, "error": f"{type(error).__name__}: {error}"}
    scalar_copies = re.findall(r"async_copy_global_to_local[^\n]*: tensor<1x!tt\.ptr<i32>", compiled.asm["ttgir"])
    return {
        "id": case_id,
        "shared": compiled.metadata.shared,
        "limit": gen.shared_limit,
        "scalar_async_loads": len(scalar_copies),
        "seconds": round(time.perf_counter() - t0, 2),
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
def test_config_compiles_within_shared_memory(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, f"{case[0]} does not compile: {result.get('error')}"
    assert result["shared"] <= result["limit"], (
        f"{case[0]} needs {result['shared']} B of shared memory, over the {result['limit']} B limit of its "
        f"GPU generation: shrink its tiles or stages in kernels/triton_flash_configs.py"
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_sparse_loops_keep_their_prefetch(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, f"{case[0]} does not compile: {result.get('error')}"
    assert result["scalar_async_loads"] == 0, (
        f"{case[0]}: Triton pipelined {result['scalar_async_loads']} layout-entry load(s) as cp.async, which "
        f"serialises the tile loads of the sparse loops: load the entry a step ahead (see tile_start)"
    )


def test_padded_head_dims_use_their_tile_configs():
    assert [configs.tile_dim(d) for d in (16, 24, 32, 40, 64, 72, 96, 128, 136, 192, 256)] == [
        16,
        32,
        32,
        64,
        64,
        128,
        128,
        128,
        256,
        256,
        256,
    ]
    for gen in configs.GENERATIONS:
        assert configs.fwd_candidates(gen, 96) == configs.fwd_candidates(gen, 128)
        assert configs.bwd_candidates(gen, 40) == configs.bwd_candidates(gen, 64)
    for bad in (8, 20, 100, 264):
        with pytest.raises(ValueError, match="multiple of 8 from 16 to 256"):
            configs.tile_dim(bad)


if __name__ == "__main__":
    print(json.dumps(_compile_all()))
