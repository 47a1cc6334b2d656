"""The xformers backend on a CPU against a fake package (fake_xformers.py), and on a GPU for real.

The fake computes xformers' documented semantics in float64, so the cases below check that our
adapter maps our semantics (causal, GQA, key padding, packed documents) onto xformers' masks
exactly: output and all three gradients against the float64 reference. Then auto's rule for GPUs
older than Ampere (``dispatch.PRE_AMPERE``) and the reasons it gives. On a GPU, every input of the
Triton kernel tests that the backend accepts passes the 2x rule against the float64 reference.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D).
"""

from __future__ import annotations

import logging
import sys
import types

import fake_xformers  # tests/kernels/fake_xformers.py: the stand-in package
import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention, dispatch, flash_attn_backend, xformers_backend
from genoformer.kernels.reference import reference_attention
from genoformer.kernels.xformers_backend import xformers_attention


@pytest.fixture
def fake_t4(monkeypatch):
    """The fake xformers, and a GPU the checks take for a T4 (sm_75)."""
    xformers_backend.import_error.cache_clear()
    fake_xformers.install(monkeypatch)
    monkeypatch.setattr(xformers_backend, "device_capability", lambda device: (7, 5))
    monkeypatch.setattr(flash_attn_backend, "device_capability", lambda device: (7, 5))
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    yield monkeypatch
    xformers_backend.import_error.cache_clear()


def _cu(docs):
    lengths = torch.tensor([n for row in docs for n in row])
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)


CASES = {
    "dense_gqa_odd": (2, 4, 2, 37, 37, {}),
    "causal_mha": (1, 2, 2, 40, 40, {"causal": True}),
    "cross_lengths_gqa": (2, 4, 1, 20, 33, {}),
    "padding": (3, 2, 1, 30, 30, {"kv_lens": torch.tensor([30, 7, 0])}),
    "causal_padding_gqa": (3, 4, 2, 30, 30, {"causal": True, "kv_lens": torch.tensor([30, 12, 0])}),
    "packed_causal_gqa": (2, 4, 2, 29, 29, {"causal": True, "cu_seqlens": _cu([[10, 1, 18], [29]])}),
    "packed_bidirectional": (1, 2, 2, 24, 24, {"cu_seqlens": _cu([[5, 19]])}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_adapter_maps_every_case_onto_xformers(attn, fake_t4, name):
    """Output and dq, dk, dv through the adapter (float64 through the fake) equal the reference's."""
    B, Hq, Hkv, L, S, kwargs = CASES[name]
    q, k, v, dout = attn.make_qkv(B=B, Hq=Hq, Hkv=Hkv, L=L, S=S, D=16, seed=len(name))
    got = attn.run_with_grads(xformers_attention, q, k, v, dout, **kwargs)
    expected = attn.run_with_grads(reference_attention, q, k, v, dout, **kwargs)
    attn.assert_matches_reference(got, expected)


def test_entry_point_runs_xformers_in_float32(attn, fake_t4):
    """backend="xformers" through `attention` (the checks pass on the faked T4)."""
    q, k, v, dout = attn.make_qkv(B=2, Hq=4, Hkv=2, L=33, D=16, dtype=torch.float32)
    kwargs = {"causal": True, "kv_lens": torch.tensor([33, 20])}
    got = attn.run_with_grads(lambda *a, **kw: attention(*a, backend="xformers", **kw), q, k, v, dout, **kwargs)
    expected = attn.run_with_grads(reference_attention, q.double(), k.double(), v.double(), dout.double(), **kwargs)
    for name, value in got.tensors().items():
        torch.testing.assert_close(value.double(), expected.tensors()[name], rtol=0, atol=1e-5)


def _auto(q, **conditions):
    B, H, L, D = q.shape
    return dispatch.plan_attention(
        "auto",
        batch=B,
        q_heads=H,
        kv_heads=H,
        q_len=L,
        kv_len=L,
        head_dim=D,
        dtype=q.dtype,
        device=q.device,
        causal=True,
        **conditions,
    ).backend


def test_auto_takes_xformers_on_gpus_older_than_ampere(fake_t4, caplog):
    q = torch.zeros(1, 2, 256, 16, dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        assert _auto(q) is Backend.XFORMERS
        assert _auto(q, kv_lens=torch.tensor([100])) is Backend.XFORMERS
        assert _auto(q, cu_seqlens=torch.tensor([0, 100, 256], dtype=torch.int32)) is Backend.XFORMERS
        # block-sparse layouts: the PyTorch path (xformers has none, our kernels need sm_80)
        assert _auto(q, layout=BlockLayout.sliding_window(256, 64, block_size=64)) is Backend.TORCH
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert Backend.XFORMERS in dispatch.BACKENDS  # one table: what `genoformer doctor` reads


def test_auto_without_xformers_warns_with_the_install_line(monkeypatch, caplog):
    xformers_backend.import_error.cache_clear()
    monkeypatch.setitem(sys.modules, "xformers", None)  # import xformers fails
    monkeypatch.setattr(xformers_backend, "device_capability", lambda device: (7, 0))
    monkeypatch.setattr(flash_attn_backend, "device_capability", lambda device: (7, 0))
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    q = torch.zeros(1, 2, 256, 16, dtype=torch.float16)
    try:
        with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
            assert _auto(q, cu_seqlens=torch.tensor([0, 100, 256], dtype=torch.int32)) is Backend.SDPA
    finally:
        xformers_backend.import_error.cache_clear()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "backend 'sdpa', not a faster one, because 'xformers': xformers does not import" in warning
    assert "pip install xformers" in warning


def test_an_install_built_for_another_torch_is_refused_with_its_versions(fake_t4):
    """xformers' wheels are built for one PyTorch each; one built for another imports without its
    CUDA operators (xformers 0.0.35 under PyTorch 2.11 on an H100): the backend refuses it with both
    versions, and `auto` takes another backend, instead of memory_efficient_attention failing."""
    built = types.SimpleNamespace(torch_version="2.10.0+cu128", python_version="3.10.19")
    package = sys.modules["xformers"]
    fake_t4.setattr(package, "_has_cpp_library", False, raising=False)
    fake_t4.setattr(package, "__version__", "0.0.35", raising=False)
    failure = types.SimpleNamespace(build_info=built)
    fake_t4.setattr(package, "_cpp_lib", types.SimpleNamespace(_cpp_library_load_exception=failure), raising=False)
    q = torch.zeros(1, 2, 64, 16, dtype=torch.float16)
    reason = xformers_backend.unsupported_reason(q, q, q, causal=False, layout=None, kv_lens=None)
    assert "xformers 0.0.35 imports without its CUDA operators" in reason
    assert "PyTorch 2.10.0+cu128" in reason and f"this is PyTorch {torch.__version__}" in reason
    assert reason.endswith("or use backend 'sdpa'.")
    assert _auto(q) is not Backend.XFORMERS


def test_reasons_say_what_to_do(fake_t4):
    q = torch.zeros(1, 2, 64, 16, dtype=torch.float16)
    reason = lambda t, **kw: xformers_backend.unsupported_reason(  # noqa: E731
        t, t, t, causal=False, layout=kw.pop("layout", None), kv_lens=None, **kw
    )
    assert reason(q) is None
    assert "Ampere" in reason(q.bfloat16())
    assert "log-sum-exp" in reason(q, return_lse=True)
    assert "block-sparse" in reason(q, layout=BlockLayout.sliding_window(64, 16, block_size=16))
    assert "multiples of 8" in reason(torch.zeros(1, 2, 64, 12, dtype=torch.float16))
    fake_t4.setattr(xformers_backend, "device_capability", lambda device: None)
    assert "CUDA GPUs only" in reason(q)
    with pytest.raises(ValueError, match="backend 'xformers' cannot run these inputs: xformers runs on CUDA"):
        attention(q, q, q, backend="xformers")


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_every_accepted_kernel_test_input_passes_the_two_x_rule(attn):
    """The inputs of test_triton_attention's CPU cases (dense, GQA, padding, packed documents,
    layouts) that the real xformers backend accepts here: output and gradients within twice the
    same-precision PyTorch error of the float64 reference."""
    if xformers_backend.import_error() is not None:
        pytest.skip(f"xformers cannot run here: {xformers_backend.import_error()}")
    import test_triton_attention as kernel_tests

    cases = {**kernel_tests.CPU_CASES, **kernel_tests.PADDED_CPU_CASES, **kernel_tests.PACKED_CPU_CASES}
    ran = 0
    for name, (B, Hq, Hkv, L, S, D, dtype, kwargs_fn) in sorted(cases.items()):
        kwargs = {key: value for key, value in kwargs_fn().items() if key != "scale"}
        q, k, v, dout = kernel_tests._inputs(B, Hq, Hkv, L, S, D, dtype, seed=1)
        low = [t.to(dtype) for t in (q, k, v)]
        if dispatch.unsupported_reason("xformers", *low, **kwargs) is not None:
            continue
        run = lambda *a, **kw: attention(*a, backend="xformers", **kw)  # noqa: E731
        got = attn.run_with_grads(run, *low, dout.to(dtype), **kwargs)
        exact = attn.reference(*(t.cpu() for t in (q, k, v, dout)), **kernel_tests._on_cpu(kwargs))
        naive = attn.run_with_grads(
            attn.naive_attention, *(t.cpu() for t in low), dout.to(dtype).cpu(), **kernel_tests._on_cpu(kwargs)
        )
        for part, ref in exact.tensors().items():
            err = (got.tensors()[part].cpu().double() - ref).abs().max().item()
            base = (naive.tensors()[part].double() - ref).abs().max().item()
            assert err <= 2 * base + torch.finfo(dtype).eps * ref.abs().max().item(), (name, part, err, base)
        ran += 1
    assert ran >= 8, f"only {ran} kernel-test inputs ran on xformers"
