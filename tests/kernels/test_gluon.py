"""The Gluon forward kernels (kernels/gluon_fwd.py, launcher kernels/gluon_flash.py).

CPU (CI): every configuration of both kernels is cross-compiled for sm_90 in a child process (this
file run as a script, without TRITON_INTERPRET, with the triton installed here: 3.9 in CI; run it
with a 3.6 environment's python to check the GPU image's version), and the report holds: shared
memory within the sm_90 limit, no register spills, the warp-specialised kernel's setmaxnreg moves
registers from the producer to the consumers, and ptxas did not serialise the wgmma chain.  The
child needs triton alone (no torch): `python tests/kernels/test_gluon.py` prints its JSON report.

GPU (`-m gpu`, an sm_90 GPU): outputs and lse of both kernels against the float64 reference on
odd shapes (L in 1, 77, 1000, 4097; D 64 and 128; causal and not; GQA), held to twice the error
of dense attention in the same precision plus one rounding of the exact answer (as
test_backends_gpu.py); gradients through the Triton backward the autograd Function calls.  The
warp-specialised kernel first runs once in a child process with a time limit, so that a barrier
deadlock fails the tests instead of hanging the GPU.  The worst errors are printed at the end of
the session (also under -q).

Shape legend: q (B, H, L, D), k and v (B, HKV, L, D), lse (B, H, L).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
MIN_TRITON = (3, 6)  # as gluon_flash.MIN_TRITON (that module needs torch; the child does not)
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one sm_90 block may opt in to (227 KiB)


def _triton_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("triton") is None:
        return None
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2])


def _gluon_fwd():
    """kernels/gluon_fwd.py loaded by path (torch-free: the genoformer package imports torch)."""
    spec = importlib.util.spec_from_file_location("gluon_fwd", KERNELS / "gluon_fwd.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def descriptor_signature(gluon_fwd, rows: int, head_dim: int, dtype: str) -> str:
    """The signature type of a kernel's tensor-descriptor argument (what the launcher's
    ``TensorDescriptor`` mangles to; test_launcher_descriptors_match_the_compiled_signature)."""
    return f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}],{gluon_fwd.descriptor_layout(rows, head_dim)!r}>"


def _cases() -> list[tuple[str, str, int, bool, str]]:
    """(id, table, head dim, causal, dtype): both tables' configurations, causal, bf16, and the
    warp-specialised D 128 one bidirectional (which only drops the diagonal's mask); fp16 changes
    only the element type (checked on the GPU).  Five compiles keep the test near 30 s on CI."""
    out = [(f"{table}-d{d}-causal-bf16", table, d, True, "bf16") for table in ("ws", "plain") for d in (64, 128)]
    return out + [("ws-d128-bidir-bf16", "ws", 128, False, "bf16")]


# --------------------------------------------------------------------------------------------
# The child process: compile and report (triton only)
# --------------------------------------------------------------------------------------------


def _ptxas_report(ptx: str, capability: int) -> dict:
    """ptxas -v of the PTX with the ptxas Triton uses: registers, spill bytes, wgmma warnings."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        ptx_file = Path(tmp, "k.ptx")
        ptx_file.write_text(ptx)
        report = subprocess.run([get_ptxas(capability).path, "-v", f"--gpu-name={sm_arch_from_capability(capability)}",
                                 str(ptx_file), "-o", str(Path(tmp, "k.cubin"))],
                                check=True, capture_output=True, text=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"regs": int(re.search(r"Used (\d+) registers", report).group(1)),
            "spill_stores_B": int(spills.group(1)), "spill_loads_B": int(spills.group(2)),
            "wgmma_serialized": "wgmma" in report and "serializ" in report}


def _compile_one(case: tuple) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    case_id, table, d, causal, dtype = case
    gluon_fwd = _gluon_fwd()
    cfg = (gluon_fwd.WS_CONFIGS if table == "ws" else gluon_fwd.PLAIN_CONFIGS)[d]
    kernel = gluon_fwd.attn_fwd_ws_kernel if cfg.warp_specialized else gluon_fwd.attn_fwd_tma_kernel
    constexprs = {"HEAD_DIM": d, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages,
                  "CAUSAL": causal, "num_warps": cfg.num_warps}
    options = {"num_warps": cfg.num_warps}
    if cfg.warp_specialized:
        constexprs.update(PINGPONG=cfg.pingpong, CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs)
        options["maxnreg"] = cfg.maxnreg
    signature = {"q_desc": descriptor_signature(gluon_fwd, cfg.block_m, d, dtype),
                 "k_desc": descriptor_signature(gluon_fwd, cfg.block_n, d, dtype),
                 "v_desc": descriptor_signature(gluon_fwd, cfg.block_n, d, dtype),
                 "o_desc": descriptor_signature(gluon_fwd, cfg.block_m, d, dtype),
                 "LSE": "*fp32", "H": "i32", "GROUP": "i32", "Lq": "i32", "Lk": "i32", "qk_scale": "fp32",
                 **{name: "constexpr" for name in constexprs}}
    attrs = {(kernel.arg_names.index("LSE"), ): [["tt.divisibility", 16]]}  # a torch allocation
    try:
        source = GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as error:  # reported to the parent test, which fails with it
        return {"id": case_id, "error": f"{type(error).__name__}: {error}"}
    ptx = compiled.asm["ptx"]
    return {"id": case_id, "triton": triton.__version__, "shared_B": compiled.metadata.shared,
            **_ptxas_report(ptx, 90),
            "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global", ptx))}


def _compile_all() -> list[dict]:
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_compile_one, _cases()))


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------

needs_gluon = pytest.mark.skipif(
    _triton_version() is None or _triton_version() < MIN_TRITON,
    reason=f"the Gluon kernels need triton >= {'.'.join(map(str, MIN_TRITON))} (found "
           f"{'none' if _triton_version() is None else '.'.join(map(str, _triton_version()))}): pip install -U triton",
)


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"the compile child process failed:\n{proc.stderr[-4000:]}")
    return {r["id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.mark.slow
@needs_gluon
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_compiles_for_sm90_within_shared_memory_without_spills(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, f"{case[0]} does not compile for sm_90: {result.get('error')}"
    assert result["shared_B"] <= SM90_SHARED_LIMIT, (
        f"{case[0]} needs {result['shared_B']} B of shared memory, over sm_90's {SM90_SHARED_LIMIT} B: "
        f"lower its stages in kernels/gluon_fwd.py")
    assert result["spill_stores_B"] == 0 and result["spill_loads_B"] == 0, (
        f"{case[0]} spills ({result['spill_stores_B']} B stored, {result['spill_loads_B']} B loaded, "
        f"{result['regs']} registers): shrink its tiles or raise consumer_regs")
    assert not result["wgmma_serialized"], f"{case[0]}: ptxas serialised the wgmma chain (a register hazard)"
    assert result["wgmma"] > 0 and result["tma_loads"] > 0, f"{case[0]}: no wgmma or no TMA load in the PTX"


@pytest.mark.slow
@needs_gluon
@pytest.mark.parametrize("case", [c for c in _cases() if c[1] == "ws"], ids=lambda c: c[0])
def test_warp_specialised_kernel_moves_registers_to_its_consumers(compiled, case):
    result = compiled[case[0]]
    assert "error" not in result, result.get("error")
    cfg = _gluon_fwd().WS_CONFIGS[case[2]]
    moves = {tuple(m) for m in result["setmaxnreg"]}
    assert ("inc", str(cfg.consumer_regs)) in moves and ("dec", str(cfg.producer_regs)) in moves, (
        f"{case[0]}: setmaxnreg {sorted(moves)}, expected the consumers raised to {cfg.consumer_regs} and the "
        f"producer lowered to {cfg.producer_regs}")


@needs_gluon
def test_launcher_descriptors_match_the_compiled_signature():
    """The launcher's TensorDescriptor mangles to the type the compile test builds its kernels with."""
    import torch
    from triton.runtime.jit import mangle_type

    from genoformer.kernels import gluon_flash

    gluon_fwd = _gluon_fwd()
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for d in (64, 128):
            t = torch.empty(2, 3, 77, d, dtype=dtype)
            assert mangle_type(gluon_flash._descriptor(t, 64)) == descriptor_signature(gluon_fwd, 64, d, name)


@needs_gluon
def test_unsupported_inputs_get_a_reason():
    import torch

    from genoformer.kernels import gluon_flash

    q = torch.empty(1, 4, 33, 96, dtype=torch.bfloat16)
    assert "head dim 96" in gluon_flash.unsupported_reason(q, q, q, causal=False)
    q = torch.empty(1, 4, 33, 64, dtype=torch.float32)
    assert "float16 or bfloat16" in gluon_flash.unsupported_reason(q, q, q, causal=False)
    q = torch.empty(1, 4, 33, 64, dtype=torch.bfloat16)
    k = torch.empty(1, 3, 33, 64, dtype=torch.bfloat16)
    assert "multiple of key/value heads" in gluon_flash.unsupported_reason(q, k, k, causal=False)
    assert "CUDA" in gluon_flash.unsupported_reason(q, q, q, causal=True)
    with pytest.raises(ValueError, match="gluon attention cannot run these inputs"):
        gluon_flash.gluon_attention(q, q, q)


# --------------------------------------------------------------------------------------------
# GPU tests
# --------------------------------------------------------------------------------------------

ERRORS: list[dict] = []  # printed at the end of the session


def _on_hopper() -> bool:
    if importlib.util.find_spec("torch") is None:  # the compile child may run without torch
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


on_hopper = pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 (Hopper) GPU: the Gluon kernels use wgmma and TMA")

WS_SMOKE = textwrap.dedent("""
    import torch
    from genoformer.kernels import gluon_flash, gluon_fwd
    for d, cfg in gluon_fwd.WS_CONFIGS.items():
        for causal in (True, False):
            q = torch.randn(1, 2, 300, d, device="cuda", dtype=torch.bfloat16)
            gluon_flash.gluon_fwd_launch(q, q, q, causal, d ** -0.5, cfg)
    torch.cuda.synchronize()
    print("ok")
""")


@pytest.fixture(scope="module")
def ws_runs():
    """The warp-specialised kernel finished once in a child process (60 s): else the tests fail
    with the reason instead of waiting on a barrier that never completes."""
    try:
        proc = subprocess.run([sys.executable, "-c", WS_SMOKE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the warp-specialised Gluon kernel did not finish within 120 s at L=300 (a barrier deadlock?): "
                    "run the plain kernel (gluon_fwd.PLAIN_CONFIGS) until it is fixed")
    if proc.returncode != 0 or "ok" not in proc.stdout:
        pytest.fail(f"the warp-specialised Gluon kernel failed in its child process:\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="module", autouse=True)
def error_report(request):
    """The worst errors of the GPU tests, printed at the end (pytest -q hides passing tests' output)."""
    yield
    if ERRORS:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("")
        reporter.write_line("Gluon forward: max |error| against float64 (ours / same-precision dense / bound)")
        for e in ERRORS:
            reporter.write_line(f"  {e['case']:<44} " + "  ".join(
                f"{k} {v[0]:.3g} / {v[1]:.3g} / {v[2]:.3g}" for k, v in e.items() if k != "case"))


def _shapes() -> list[tuple[str, tuple[int, int, int, int, int], bool]]:
    """(id, (B, H, HKV, L, D), causal): L in 1, 77, 1000, 4097, seeded random batch and heads (GQA
    in some), both head dims, causal and not."""
    rng = random.Random(30)
    out = []
    for d in (64, 128):
        for causal in (True, False):
            for L in (1, 77, 1000, 4097):
                hkv = rng.choice((1, 2))
                h = hkv * rng.choice((1, 2, 3))
                b = 1 if L > 1000 else rng.choice((1, 2, 3))
                out.append((f"d{d}-{'causal' if causal else 'bidir'}-L{L}-B{b}H{h}KV{hkv}", (b, h, hkv, L, d), causal))
    return out


def _bound(value, naive, truth) -> tuple[float, float, float]:
    """(error, same-precision error, bound): the bound is 2 * naive error + one rounding of truth to
    value's dtype (the rounding of a bf16 output's exact answer; 1e-4 for an fp32 lse)."""
    import torch

    err = (value.double() - truth).abs().max().item()
    naive_err = (naive.double() - truth).abs().max().item()
    rounding = ((truth.to(value.dtype).double() - truth).abs().max().item() if value.dtype != torch.float32
                else 1e-4)
    return err, naive_err, 2 * naive_err + rounding


def _naive(q, k, v, causal):
    """Dense attention in q's dtype (the same-precision baseline) and its lse from fp32 scores."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores32 = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        scores32 = scores32.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores32, -1)


@pytest.mark.gpu
@needs_gluon
@on_hopper
@pytest.mark.parametrize("shape", _shapes(), ids=lambda s: s[0])
@pytest.mark.parametrize("table", ["ws", "plain"])
def test_output_and_lse_match_float64(request, attn, table, shape):
    import torch

    from genoformer.kernels import gluon_flash, gluon_fwd
    from genoformer.kernels.reference import reference_attention

    if table == "ws":
        request.getfixturevalue("ws_runs")
    case, (B, H, HKV, L, D), causal = shape
    cfg = (gluon_fwd.WS_CONFIGS if table == "ws" else gluon_fwd.PLAIN_CONFIGS)[D]
    q, k, v, _ = (t.cuda() for t in attn.make_qkv(B=B, Hq=H, Hkv=HKV, L=L, D=D, dtype=torch.bfloat16, seed=L + D))
    with torch.no_grad():
        out, lse = gluon_flash.gluon_attention(q, k, v, causal=causal, return_lse=True, config=cfg)
        exact, exact_lse = reference_attention(*(t.double() for t in (q, k, v)), causal=causal, return_lse=True)
        naive, naive_lse = _naive(q, k, v, causal)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any(), "NaN in the output or the lse"
    errors = {"out": _bound(out, naive, exact), "lse": _bound(lse, naive_lse, exact_lse)}
    ERRORS.append({"case": f"{table} {case}", **errors})
    for name, (err, naive_err, bound) in errors.items():
        assert err <= bound, f"{table} {case} {name}: error {err:.3g}, same-precision {naive_err:.3g}, bound {bound:.3g}"


GRAD_CASES = {
    "d128-causal-gqa-L1000": ((2, 4, 2, 1000, 128), True, "ws"),
    "d64-bidir-L77": ((3, 2, 2, 77, 64), False, "ws"),
    "d128-bidir-gqa-L4097-plain": ((1, 2, 1, 4097, 128), False, "plain"),
}


@pytest.mark.gpu
@needs_gluon
@on_hopper
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_through_the_triton_backward_match_float64(request, attn, monkeypatch, case):
    import torch

    from genoformer.kernels import gluon_flash, gluon_fwd

    (B, H, HKV, L, D), causal, table = GRAD_CASES[case]
    if table == "ws":
        request.getfixturevalue("ws_runs")
    monkeypatch.setenv("GENOFORMER_TRITON_AUTOTUNE", "0")  # the backward's first configuration: no tuning time
    cfg = (gluon_fwd.WS_CONFIGS if table == "ws" else gluon_fwd.PLAIN_CONFIGS)[D]
    q, k, v, dout = (t.cuda() for t in attn.make_qkv(B=B, Hq=H, Hkv=HKV, L=L, D=D, dtype=torch.bfloat16, seed=7))
    exact = attn.reference(*(t.double() for t in (q, k, v, dout)), causal=causal)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, causal=causal)
    result = attn.run_with_grads(gluon_flash.gluon_attention, q, k, v, dout, causal=causal, config=cfg)
    errors = {name: _bound(value, naive.tensors()[name], exact.tensors()[name])
              for name, value in result.tensors().items()}
    ERRORS.append({"case": f"grad {case}", **errors})
    for name, (err, naive_err, bound) in errors.items():
        assert not result.tensors()[name].isnan().any(), f"{case} {name} has NaN"
        assert err <= bound, f"{case} {name}: error {err:.3g}, same-precision {naive_err:.3g}, bound {bound:.3g}"


@pytest.mark.gpu
@needs_gluon
@on_hopper
def test_fp16_matches_float64(request, attn):
    import torch

    from genoformer.kernels import gluon_flash, gluon_fwd
    from genoformer.kernels.reference import reference_attention

    for table in ("ws", "plain"):
        if table == "ws":
            request.getfixturevalue("ws_runs")
        cfg = (gluon_fwd.WS_CONFIGS if table == "ws" else gluon_fwd.PLAIN_CONFIGS)[128]
        q, k, v, _ = (t.cuda() for t in attn.make_qkv(B=2, Hq=4, Hkv=2, L=333, D=128, dtype=torch.float16))
        with torch.no_grad():
            out = gluon_flash.gluon_attention(q, k, v, causal=True, config=cfg)
            exact = reference_attention(*(t.double() for t in (q, k, v)), causal=True)
            naive, _ = _naive(q, k, v, True)
        err = _bound(out, naive, exact)
        ERRORS.append({"case": f"{table} fp16 d128-causal-gqa-L333", "out": err})
        assert err[0] <= err[2], f"{table} fp16: error {err[0]:.3g}, same-precision {err[1]:.3g}, bound {err[2]:.3g}"


if __name__ == "__main__":
    print(json.dumps(_compile_all()))


# ---------------------------------------------------------------------------- behind dispatch
@pytest.mark.parametrize("kwargs, says", [
    (dict(kv_lens=True), "not key padding"),
    (dict(cu_seqlens=True), "not packed documents"),
    (dict(layout=True), "not block-sparse layouts"),
    (dict(), "CUDA tensors"),
])
def test_dispatch_gluon_backend_refuses_what_it_cannot_run_with_the_reason(kwargs, says):
    torch = pytest.importorskip("torch")
    from genoformer.kernels import Backend, BlockLayout, attention

    q = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    built = {"kv_lens": torch.tensor([100]), "cu_seqlens": torch.tensor([0, 100, 256], dtype=torch.int32),
             "layout": BlockLayout.sliding_window(256, 128, 128)}
    with pytest.raises(ValueError, match=f"backend 'gluon' cannot run these inputs: .*{says}"):
        attention(q, q, q, backend=Backend.GLUON, **{name: built[name] for name in kwargs})
