"""The Gluon backward kernels (kernels/gluon_bwd.py; the forward's tests are test_gluon.py).

CPU (CI): every configuration of the main kernel (both head dims, causal and not) and the two row
kernels are cross-compiled for sm_90 in a child process (this file run as a script, without
TRITON_INTERPRET, with the triton installed here: 3.9 in CI; run it with a 3.6 environment's
python to check the GPU image's version: it needs triton alone, no torch), and the report holds:
shared memory within the sm_90 limit, no register spills, no serialised wgmma, the PTX has its
wgmma, TMA loads and relaxed fp32 reductions.  `python tests/kernels/test_gluon_bwd.py` prints
the JSON report.  What this file shares with test_gluon.py (the compile harness, the markers,
the error bound) is in gluon_harness.py.

GPU (`-m gpu`, an sm_90 GPU): dq, dk, dv of ``gluon_bwd_launch`` with both tables (fed with the Gluon forward's o and
lse) against the float64 reference, held to twice the error
of dense attention in the same precision plus one rounding of the exact answer, on random odd shapes
(lengths that are not multiples of the blocks, GQA, both head dims, causal and bidirectional,
bf16 and fp16), the outputs poisoned with NaN beforehand; the lse's own gradient (dlse) against
autograd through the reference's lse; the kernel first runs once in a child process with a time
limit, per table (a barrier that never completes fails the tests instead of hanging the GPU).  The worst
errors are printed at the end of the session.

Shape legend: q, do (B, H, L, D), k and v (B, HKV, L, D), lse (B, H, L).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap
import types

import pytest
from gluon_harness import (
    KERNELS,
    SM90_SHARED_LIMIT,
    compile_all,
    compile_report,
    descriptor_signature,
    error_bound,
    needs_gluon,
    on_hopper,
    ptxas_report,
    write_errors,
)


def _gluon_bwd():
    """kernels/gluon_bwd.py without torch: the package ``genoformer.kernels`` (whose __init__ imports
    torch) stands in as a bare namespace over kernels/, so that gluon_bwd's import of gluon_fwd
    loads that file alone."""
    if "genoformer.kernels.gluon_bwd" in sys.modules:
        return sys.modules["genoformer.kernels.gluon_bwd"]
    for name, path in (("genoformer", KERNELS.parent / "genoformer"), ("genoformer.kernels", KERNELS)):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    import genoformer.kernels.gluon_bwd as gluon_bwd

    return gluon_bwd


TABLES = ("wide", "narrow", "ws")  # gluon_bwd.WIDE_CONFIGS, NARROW_CONFIGS, WS_CONFIGS


def _table(gluon_bwd, name: str) -> dict:
    return {"wide": gluon_bwd.WIDE_CONFIGS, "narrow": gluon_bwd.NARROW_CONFIGS, "ws": gluon_bwd.WS_CONFIGS}[name]


def _cases() -> list[tuple[str, str, int, bool, str]]:
    """(id, kernel, head dim, causal, dtype): the main kernel's configurations (the wide and narrow
    tables at both head dims, causal and bidirectional; the warp-specialised table causal; bf16:
    fp16 changes only the element type, checked on the GPU), and the row kernels at D 128."""
    out = [
        (f"{table}-d{d}-{'causal' if causal else 'bidir'}-bf16", table, d, causal, "bf16")
        for table in TABLES
        for d in (64, 128)
        for causal in (True, False)
        if table != "ws" or causal
    ]
    return out + [
        ("preprocess-d128-bf16", "pre", 128, False, "bf16"),
        ("postprocess-d128-bf16", "post", 128, False, "bf16"),
    ]


# --------------------------------------------------------------------------------------------
# The child process: compile and report (triton only)
# --------------------------------------------------------------------------------------------


def _source(case: tuple):
    """(kernel, signature, constexprs, BwdConfig or None for the row kernels) of a case."""
    _, kind, d, causal, dtype = case
    gluon_bwd = _gluon_bwd()
    if kind in ("pre", "post"):
        constexprs = {"HEAD_DIM": d, "ROWS": gluon_bwd.PRE_ROWS, "num_warps": 4}
        if kind == "pre":
            constexprs["HAS_DLSE"] = True
            signature = {
                "O": f"*{dtype}",
                "DO": f"*{dtype}",
                "DLSE": "*fp32",
                "DELTA": "*fp32",
                "DQ_ACC": "*fp32",
                "n_rows": "i32",
            }
            return gluon_bwd.bwd_preprocess_kernel, signature, constexprs, None
        signature = {"DQ_ACC": "*fp32", "DQ": f"*{dtype}", "n_rows": "i32", "sm_scale": "fp32"}
        return gluon_bwd.bwd_postprocess_kernel, signature, constexprs, None
    cfg = _table(gluon_bwd, kind)[d]
    constexprs = {
        "HEAD_DIM": d,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "STAGES": cfg.stages,
        "CAUSAL": causal,
        "WARP_SPECIALIZED": cfg.warp_specialized,
        "PRODUCER_REGS": cfg.producer_regs,
        "num_warps": cfg.num_warps,
    }
    gluon_fwd = sys.modules["genoformer.kernels.gluon_fwd"]  # gluon_bwd's descriptors take its layout
    m_desc = descriptor_signature(gluon_fwd, cfg.block_m, d, dtype)
    n_desc = descriptor_signature(gluon_fwd, cfg.block_n, d, dtype)
    signature = {
        "q_desc": m_desc,
        "k_desc": n_desc,
        "v_desc": n_desc,
        "do_desc": m_desc,
        "dk_desc": n_desc,
        "dv_desc": n_desc,
        "LSE": "*fp32",
        "DELTA": "*fp32",
        "DQ_ACC": "*fp32",
        "H": "i32",
        "HKV": "i32",
        "GROUP": "i32",
        "Lq": "i32",
        "Lk": "i32",
        "qk_scale": "fp32",
        "sm_scale": "fp32",
    }
    return gluon_bwd.attn_bwd_kernel, signature, constexprs, cfg


def _compile_one(case: tuple) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    try:
        kernel, signature, constexprs, cfg = _source(case)
        options = {"num_warps": constexprs["num_warps"]}
        if cfg is not None and cfg.warp_specialized:
            options["maxnreg"] = cfg.maxnreg
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        # the torch allocations are 16-byte aligned
        attrs = {
            (kernel.arg_names.index(name),): [["tt.divisibility", 16]]
            for name, kind in signature.items()
            if kind.startswith("*")
        }
        source = GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as error:  # reported to the parent test, which fails with it
        return {"id": case[0], "error": f"{type(error).__name__}: {error}"}
    ptx = compiled.asm["ptx"]
    return {
        "id": case[0],
        "triton": triton.__version__,
        "shared_B": compiled.metadata.shared,
        **ptxas_report(ptx, 90),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global", ptx)),
        "reductions": sorted(set(re.findall(r"\b(red\.[\w.]+|atom\.[\w.]+)", ptx))),
        "bar_syncs": len(re.findall(r"\bbar\.sync|barrier\.sync", ptx)),
        "barriers": sorted(set(re.findall(r"(?:bar|barrier)\.sync(?:\.aligned)?\s+[^;]+;", ptx))),
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
    }


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """This file's compile report (run as a script in a child process), by case id."""
    return compile_report(__file__)


@pytest.mark.slow
@needs_gluon
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_compiles_for_sm90_within_shared_memory(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, f"{case[0]} does not compile for sm_90: {result.get('error')}"
    assert result["shared_B"] <= SM90_SHARED_LIMIT, (
        f"{case[0]} needs {result['shared_B']} B of shared memory, over sm_90's {SM90_SHARED_LIMIT} B: "
        f"lower its stages in kernels/gluon_bwd.py"
    )
    assert not result["wgmma_serialized"], f"{case[0]}: ptxas serialised the wgmma chain (a register hazard)"
    if case[1] in TABLES:
        assert result["wgmma"] > 0 and result["tma_loads"] > 0, f"{case[0]}: no wgmma or no TMA load in the PTX"
        assert result["reductions"] and all("relaxed" in r and "f32" in r for r in result["reductions"]), (
            f"{case[0]}: dQ's adds compiled to {result['reductions']}, expected relaxed fp32 reductions"
        )


SPILL_LIMIT_B = {
    "wide-d128-causal-bf16": 448,
    "wide-d128-bidir-bf16": 384,
    "narrow-d128-causal-bf16": 448,
    "narrow-d128-bidir-bf16": 128,
    "ws-d128-causal-bf16": 512,
}
"""Spill bytes (stores) ptxas may use per case; 0 for the others.  D 128 holds dK, dV (128 registers a
thread) beside S^T, dP^T and dQ_part: it spills a little at 255 registers (the warp-specialised
kernel's consumers have 240), more with Triton 3.6
(whose fp32 atomic adds return their old values: `atom`, where 3.9 emits `red`); docs/design/gluon.md
lists the counts.  The limits catch a change that makes it worse."""


@pytest.mark.slow
@needs_gluon
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_register_spills_stay_within_their_limit(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, result.get("error")
    limit = SPILL_LIMIT_B.get(case[0], 0)
    assert result["spill_stores_B"] <= limit, (
        f"{case[0]} spills {result['spill_stores_B']} B ({result['regs']} registers), over its limit of {limit} B: "
        f"shorten what is live across its wgmma (kernels/gluon_bwd.py) or raise SPILL_LIMIT_B with the reason"
    )


@pytest.mark.slow
@needs_gluon
@pytest.mark.parametrize("case", [c for c in _cases() if c[1] == "ws"], ids=lambda c: c[0])
def test_warp_specialised_kernel_moves_registers_and_syncs_its_consumers_only(compiled, case):
    """setmaxnreg raises the consumers and lowers the producer warp; the consumers' barriers (dS^T in
    shared memory, the stage hand-off) are named barriers over their own warps, which the producer
    never joins (a CTA-wide one would deadlock)."""
    result = compiled[case[0]]
    assert "error" not in result, result.get("error")
    cfg = _gluon_bwd().WS_CONFIGS[case[2]]
    moves = {tuple(m) for m in result["setmaxnreg"]}
    consumer_regs = (65536 - 128 * cfg.producer_regs) // (32 * cfg.num_warps) // 8 * 8
    assert ("inc", str(consumer_regs)) in moves and ("dec", str(cfg.producer_regs)) in moves, (
        f"{case[0]}: setmaxnreg {sorted(moves)}, expected the consumers raised to {consumer_regs} and the "
        f"producer lowered to {cfg.producer_regs}"
    )
    consumers = 32 * cfg.num_warps
    named = [b for b in result["barriers"] if b.startswith("bar.sync")]
    assert named and all(b.replace("\t", " ").split(",")[-1].strip(" ;") == str(consumers) for b in named), (
        f"{case[0]}: barriers {result['barriers']}, expected the consumers' to count {consumers} threads"
    )


@needs_gluon
def test_launcher_descriptors_match_the_compiled_signature():
    """The launcher's TensorDescriptor (gluon_flash._descriptor) mangles to the type the compile test
    builds the kernel with, for both block heights."""
    import torch
    from genoformer.kernels import gluon_bwd, gluon_flash, gluon_fwd
    from triton.runtime.jit import mangle_type

    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for d in gluon_bwd.HEAD_DIMS:
            t = torch.empty(2, 3, 77, d, dtype=dtype)
            for rows in {cfg.block_m for table in TABLES for cfg in _table(gluon_bwd, table).values()} | {
                cfg.block_n for table in TABLES for cfg in _table(gluon_bwd, table).values()
            }:
                assert mangle_type(gluon_flash._descriptor(t, rows)) == descriptor_signature(gluon_fwd, rows, d, name)


@needs_gluon
def test_unsupported_inputs_get_a_reason():
    import torch
    from genoformer.kernels import gluon_bwd

    def reason(q, k=None, o=None, lse=None):
        k = q if k is None else k
        o = q if o is None else o
        lse = torch.empty(q.shape[:3]) if lse is None else lse
        return gluon_bwd.unsupported_reason(o, q, k, k, o, lse)

    assert "head dim 96" in reason(torch.empty(1, 4, 33, 96, dtype=torch.bfloat16))
    assert "float16 or bfloat16" in reason(torch.empty(1, 4, 33, 64))
    q = torch.empty(1, 4, 33, 64, dtype=torch.bfloat16)
    assert "multiple of HKV" in reason(q, torch.empty(1, 3, 33, 64, dtype=torch.bfloat16))
    assert "lse (1, 4, 33) float32" in reason(q, lse=torch.empty(1, 4, 32))
    assert "sm_90" in reason(q)
    with pytest.raises(ValueError, match="gluon backward cannot run these inputs: .*sm_90"):
        gluon_bwd.gluon_bwd_launch(q, q, q, q, q, torch.empty(1, 4, 33), False, 0.125)


# --------------------------------------------------------------------------------------------
# GPU tests
# --------------------------------------------------------------------------------------------

ERRORS: list[dict] = []  # printed at the end of the session

SMOKE = textwrap.dedent("""
    import sys
    import torch
    from genoformer.kernels import gluon_bwd
    table = getattr(gluon_bwd, sys.argv[1])
    for d, cfg in table.items():
        for causal in (True, False):
            q = torch.randn(1, 2, 300, d, device="cuda", dtype=torch.bfloat16)
            lse = torch.full((1, 2, 300), 10.0, device="cuda")
            gluon_bwd.gluon_bwd_launch(q, q, q, q, q, lse, causal, d ** -0.5, config=cfg)
    torch.cuda.synchronize()
    print("ok")
""")
SMOKED: dict[str, str | None] = {}  # table -> None when its kernels finished, else why not


def _require_runs(table: str) -> None:
    """The table's kernels finished once in a child process (120 s): else the test fails with the
    reason instead of waiting on an mbarrier that never completes."""
    if table not in SMOKED:
        name = {"wide": "WIDE_CONFIGS", "narrow": "NARROW_CONFIGS", "ws": "WS_CONFIGS"}[table]
        try:
            proc = subprocess.run([sys.executable, "-c", SMOKE, name], capture_output=True, text=True, timeout=120)
            SMOKED[table] = (
                None
                if proc.returncode == 0 and "ok" in proc.stdout
                else f"failed in its child process:\n{proc.stderr[-4000:]}"
            )
        except subprocess.TimeoutExpired:
            SMOKED[table] = "did not finish within 120 s at L=300 (an mbarrier deadlock?)"
    if SMOKED[table] is not None:
        pytest.fail(
            f"the Gluon backward's {table} table {SMOKED[table]}: keep it out of gluon_bwd.CONFIGS until it is fixed"
        )


@pytest.fixture(scope="module", autouse=True)
def error_report(request):
    """The worst errors of the GPU tests, printed at the end (pytest -q hides passing tests' output)."""
    yield
    write_errors(
        request, "Gluon backward: max |error| against float64 (ours / same-precision / bound)", ERRORS, case_width=46
    )


def _shapes() -> list[tuple[str, tuple[int, int, int, int, int, int], bool, str]]:
    """(id, (B, H, HKV, Lq, Lk, D), causal, dtype) drawn at random (seeded): lengths from 1 to 3000
    (none a multiple of 64), one of 4097 and one under 130 per head dim and mask, and L = 1, GQA groups of 1
    to 4, both head dims, causal and not, a bidirectional case with Lq != Lk, bf16 and fp16."""
    rng = random.Random(30)

    def length(longest=3000):
        n = rng.randint(1, longest)
        return n + 1 if n % 64 == 0 else n

    out = []
    for d in (64, 128):
        for causal in (True, False):
            for i in range(4):
                hkv = rng.choice((1, 2, 3))
                h = hkv * rng.choice((1, 2, 4))
                lq = 4097 if i == 0 and causal else length(130 if i == 3 else 3000)
                lk = lq if causal or i < 2 else length()
                b = 1 if lq * h > 8000 else rng.choice((1, 2))
                dtype = "fp16" if i == 1 else "bf16"
                out.append(
                    (
                        f"d{d}-{'causal' if causal else 'bidir'}-Lq{lq}-Lk{lk}-B{b}H{h}KV{hkv}-{dtype}",
                        (b, h, hkv, lq, lk, d),
                        causal,
                        dtype,
                    )
                )
    return out + [("d128-causal-Lq1-Lk1-B1H2KV1-bf16", (1, 2, 1, 1, 1, 128), True, "bf16")]


FP32_FLOOR = 1e-5
"""An absolute error float32 accumulation may leave on these O(1) inputs, added to every bound
(error_bound's floor): what it leaves of a gradient that is exactly 0 (dq of a row with one key:
P = 1 and dP - delta cancel only up to rounding; seen on the H200 at L = 1, 9.8e-7 where the naive
computation gives exactly 0)."""


def _inputs(B, H, HKV, Lq, Lk, D, dtype, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(B, H, Lq, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, HKV, Lk, D, generator=g, dtype=torch.float64) for _ in range(2))
    return tuple(t.to(dtype).cuda() for t in (q, k, v, do))


def _poison_allocator(nbytes: int) -> None:
    """Fill nbytes of the caching allocator's free memory with NaN: the launcher's outputs and its
    fp32 dQ accumulator (torch.empty) then start as NaN, and a row the kernels skip shows."""
    import torch

    torch.full((nbytes // 4 + 1,), float("nan"), device="cuda")  # freed at once, its blocks kept for reuse


@pytest.mark.gpu
@needs_gluon
@on_hopper
@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: s[0])
def test_gradients_match_float64(attn, shape):
    import torch
    from genoformer.kernels import gluon_bwd, gluon_flash

    case, (B, H, HKV, Lq, Lk, D), causal, dtype_name = shape
    dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
    q, k, v, do = _inputs(B, H, HKV, Lq, Lk, D, dtype, seed=Lq + Lk + D)
    scale = D**-0.5
    with torch.no_grad():
        o, lse = gluon_flash.gluon_fwd_launch(q, k, v, causal, scale)
    exact = attn.reference(*(t.double() for t in (q, k, v, do)), causal=causal)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, do, causal=causal)
    for table in TABLES:
        _require_runs(table)
        _poison_allocator(4 * (2 * q.numel() + 2 * k.numel() + 2 * q.numel()))
        dq, dk, dv = gluon_bwd.gluon_bwd_launch(do, q, k, v, o, lse, causal, scale, config=_table(gluon_bwd, table)[D])
        torch.cuda.synchronize()
        got = {"dq": dq, "dk": dk, "dv": dv}
        errors = {
            name: error_bound(value, naive.tensors()[name], exact.tensors()[name], floor=FP32_FLOOR)
            for name, value in got.items()
        }
        ERRORS.append({"case": f"{table} {case}", **errors})
        for name, value in got.items():
            assert value.dtype == dtype and value.shape == exact.tensors()[name].shape
            assert not value.isnan().any(), f"{table} {case} {name} has NaN (a row left unwritten?)"
        for name, (err, naive_err, bound) in errors.items():
            assert err <= bound, (
                f"{table} {case} {name}: error {err:.3g}, same-precision {naive_err:.3g}, bound {bound:.3g}"
            )


@pytest.mark.gpu
@needs_gluon
@on_hopper
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_lse_gradient_matches_float64(monkeypatch, causal):
    """<out, dout> + <lse, dlse> through gluon_bwd_launch's dlse (the gradient of the base-2 lse),
    against float64 autograd of the reference; the same-precision baseline is our Triton backward
    given the same o, lse and dlse."""
    import torch
    from genoformer.kernels import gluon_bwd, gluon_flash, triton_flash
    from genoformer.kernels.reference import reference_attention

    monkeypatch.setenv("GENOFORMER_TRITON_AUTOTUNE", "0")  # the Triton backward's first configuration: no tuning time
    B, H, HKV, L, D = 2, 4, 2, 777, 128
    q, k, v, do = _inputs(B, H, HKV, L, L, D, torch.bfloat16, seed=5)
    dlse = torch.randn(B, H, L, device="cuda", dtype=torch.float32, generator=torch.Generator("cuda").manual_seed(6))
    scale = D**-0.5
    with torch.no_grad():
        o, lse2 = gluon_flash.gluon_fwd_launch(q, k, v, causal, scale)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    out, lse = reference_attention(*leaves, causal=causal, return_lse=True)
    exact = torch.autograd.grad((out, lse), leaves, (do.double(), dlse.double()))
    dlse2 = dlse * triton_flash.LN2  # lse = lse2 * ln 2
    base = triton_flash.flash_bwd(do, q, k, v, o, lse2, None, None, None, None, None, 0, causal, scale, dlse=dlse2)
    for table in TABLES:
        _require_runs(table)
        _poison_allocator(4 * 4 * q.numel())
        got = gluon_bwd.gluon_bwd_launch(
            do, q, k, v, o, lse2, causal, scale, dlse=dlse2, config=_table(gluon_bwd, table)[D]
        )
        errors = {
            name: error_bound(g, b, e, floor=FP32_FLOOR) for name, g, b, e in zip(("dq", "dk", "dv"), got, base, exact)
        }
        ERRORS.append({"case": f"{table} dlse {'causal' if causal else 'bidir'} L{L}", **errors})
        for name, (err, base_err, bound) in errors.items():
            assert err <= bound, f"{table} {name}: error {err:.3g}, triton backward {base_err:.3g}, bound {bound:.3g}"


if __name__ == "__main__":
    print(json.dumps(compile_all(_compile_one, _cases())))
