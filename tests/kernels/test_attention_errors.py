"""Bad inputs and unavailable backends fail with messages that say what to do."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention

flash_attn_backend = importlib.import_module("genoformer.kernels.flash_attn_backend")


def _qkv(B=2, Hq=4, Hkv=2, L=32, S=None, D=16, dtype=torch.float32):
    S = L if S is None else S
    q = torch.randn(B, Hq, L, D, dtype=dtype)
    return q, torch.randn(B, Hkv, S, D, dtype=dtype), torch.randn(B, Hkv, S, D, dtype=dtype)


@pytest.mark.parametrize(
    "make, kwargs, match",
    [
        (lambda: (torch.randn(2, 32, 16), *_qkv()[1:]), {}, r"4-D \(B, H, L, D\)"),
        (lambda: _qkv(Hq=3, Hkv=2), {}, "multiple of key/value heads"),
        (lambda: (_qkv()[0], *_qkv(B=3)[1:]), {}, "batch size and head dim"),
        (lambda: (_qkv()[0], *_qkv(D=8)[1:]), {}, "batch size and head dim"),
        (lambda: (_qkv()[0], _qkv()[1], _qkv(S=30)[2]), {}, "same shape"),
        (lambda: _qkv(dtype=torch.float64)[:2] + (_qkv()[2],), {}, "one dtype"),
        (lambda: tuple(t.long() for t in _qkv()), {}, "float tensor"),
        (lambda: _qkv(S=40), {"causal": True, "layout": BlockLayout.dense(32, 40, 16)}, "Lq == Lk"),
        (lambda: _qkv(), {"alibi_slopes": torch.ones(3)}, r"shape \(4,\) or \(2, 4\)"),
        (lambda: _qkv(), {"layout": BlockLayout.sliding_window(64, 16, 16)}, "built for q_len=64"),
        (lambda: _qkv(), {"layout": BlockLayout.random_blocks(32, 1, 16, num_heads=3)}, "1 \\(shared\\) or Hq=4"),
        (lambda: _qkv(), {"layout": "sliding"}, "spec.build"),
        (lambda: _qkv(), {"kv_lens": torch.tensor([3])}, r"shape \(2,\)"),
        (lambda: _qkv(), {"kv_lens": torch.tensor([3.0, 4.0])}, "integer tensor"),
        (lambda: _qkv(), {"kv_lens": torch.tensor([3, 33])}, r"\[0, Lk=32\]"),
        (lambda: _qkv(), {"kv_lens": torch.tensor([-1, 3])}, r"\[0, Lk=32\]"),
        (lambda: _qkv(), {"scale": float("nan")}, "finite float"),
        (lambda: _qkv(), {"backend": "cudnn"}, "unknown attention backend 'cudnn'; choose one of"),
    ],
)
def test_bad_inputs_raise_clear_errors(make, kwargs, match):
    q, k, v = make()
    with pytest.raises((ValueError, TypeError), match=match):
        attention(q, k, v, **kwargs)


def _pretend_installed(monkeypatch, package: str, installed: bool) -> None:
    real_find_spec = importlib.util.find_spec
    fake_spec = None if not installed else object()
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: fake_spec if name == package else real_find_spec(name, *a)
    )


def test_flash_attn_not_installed_says_how_to_install(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, None)  # neither install: each import fails
    flash_attn_backend.import_error.cache_clear()
    try:
        with pytest.raises(ValueError, match="pip install flash-attn-4") as raised:
            attention(*_qkv(), backend=Backend.FLASH_ATTN)
        assert "pip install flash-attn --no-build-isolation" in str(raised.value)
    finally:
        flash_attn_backend.import_error.cache_clear()


def test_triton_not_installed_says_how_to_install(monkeypatch):
    _pretend_installed(monkeypatch, "triton", installed=False)
    with pytest.raises(ValueError, match="pip install triton"):
        attention(*_qkv(), backend="triton")


def _bf16(B=1, H=2, HKV=1, L=32, S=None, D=16):
    S = L if S is None else S
    return (
        torch.randn(B, H, L, D, dtype=torch.bfloat16),
        torch.randn(B, HKV, S, D, dtype=torch.bfloat16),
        torch.randn(B, HKV, S, D, dtype=torch.bfloat16),
    )


@pytest.mark.parametrize(
    "make, kwargs, match",
    [
        (lambda: tuple(t.float() for t in _bf16()), {}, "take float16 or bfloat16, got torch.float32"),
        (lambda: _bf16()[:2] + (_bf16()[2].half(),), {}, "must share one dtype"),
        (lambda: tuple(t.to("meta") for t in _bf16()), {}, "run on CUDA tensors, got a tensor on meta"),
        (lambda: _bf16(D=264), {}, r"head dim 264 is not supported by the Triton kernels \(they take 1 to 256"),
        (lambda: (_bf16()[0], *_bf16(B=2)[1:]), {}, r"k and v must be \(B=1, HKV, Lk, D=16\)"),
        (lambda: _bf16(H=3, HKV=2), {}, r"query heads \(3\) must be a multiple of key/value heads \(2\)"),
        (
            lambda: _bf16(S=48),
            {"causal": True, "layout": BlockLayout.dense(32, 48, 16)},
            "causal attention with a layout needs Lq == Lk",
        ),
        (lambda: _bf16(), {"kv_lens": torch.tensor([3.0])}, "kv_lens must be an int32/int64 tensor"),
        (lambda: _bf16(), {"layout": BlockLayout.sliding_window(64, 16, 16)}, "build the layout for these lengths"),
        (lambda: _bf16(L=0), {}, "empty input"),
        (
            lambda: _bf16(),
            {"kv_lens": torch.tensor([3]), "cu_seqlens": torch.tensor([0, 32], dtype=torch.int32)},
            "cu_seqlens and kv_lens cannot be combined",
        ),
        (
            lambda: _bf16(S=48),
            {"cu_seqlens": torch.tensor([0, 32], dtype=torch.int32)},
            "needs Lq == Lk, got 32 and 48",
        ),
        (
            lambda: _bf16(),
            {"cu_seqlens": torch.tensor([0, 32])},
            r"cu_seqlens must be an int32 tensor of shape \(N\+1,\)",
        ),
        (lambda: _bf16(), {"alibi_slopes": torch.ones(3)}, r"alibi_slopes must be a float tensor of shape \(2,\)"),
        (lambda: _bf16(), {"softcap": -1.0}, "softcap must be a finite float >= 0"),
        (lambda: _bf16(), {"dropout_p": 1.0}, r"dropout_p must be a float in \[0, 1\)"),
        (
            lambda: _bf16(),
            {"dropout_p": 0.1, "dropout_rng": torch.zeros(2, dtype=torch.int32)},
            "dropout_rng must be an int64 tensor",
        ),
        (lambda: _bf16(), {"window": (3, 2.5)}, r"window must be a pair \(left, right\)"),
    ],
    ids=[
        "dtype",
        "mixed_dtype",
        "device",
        "head_dim",
        "shape",
        "gqa_heads",
        "causal_lengths",
        "kv_lens_dtype",
        "layout_size",
        "empty",
        "cu_seqlens_with_kv_lens",
        "cu_seqlens_lengths",
        "cu_seqlens_dtype",
        "alibi_shape",
        "softcap",
        "dropout_p",
        "dropout_rng",
        "window",
    ],
)
def test_triton_launcher_says_what_is_supported(make, kwargs, match):
    """The launcher's checks, through the public function (kernels interpreted on a CPU)."""
    triton_flash = pytest.importorskip("genoformer.kernels.triton_flash", reason="needs the triton package")
    q, k, v = make()
    with pytest.raises(ValueError, match=f"triton attention cannot run these inputs: .*{match}"):
        triton_flash.triton_attention(q, k, v, **kwargs)


def test_triton_launchers_refuse_a_strided_head_dim():
    triton_flash = pytest.importorskip("genoformer.kernels.triton_flash", reason="needs the triton package")
    q, k, v = _bf16()
    strided = torch.randn(1, 2, 32, 32, dtype=torch.bfloat16)[..., ::2]  # head dim with stride 2
    with pytest.raises(ValueError, match=r"q must be contiguous in its last \(head\) dim.*call .contiguous\(\)"):
        triton_flash.flash_fwd(strided, k, v, None, None, None, 0, False, 0.25)
    o, lse = torch.empty_like(q), torch.zeros(1, 2, 32)
    with pytest.raises(ValueError, match=r"do must be contiguous in its last \(head\) dim"):
        triton_flash.flash_bwd(strided, q, k, v, o, lse, None, None, None, None, None, 0, False, 0.25)
    with pytest.raises(ValueError, match="scale must be a positive float"):
        triton_flash.flash_fwd(q, k, v, None, None, None, 0, False, -1.0)
