"""The flash-attn 2 and flash-attn-4 adapters on a CPU, against fake packages (fake_flash_attn.py).

The fakes compute the documented flash-attn semantics in float64, so every case below checks
that our adapters map our semantics (causal, GQA, key padding, packed documents, layouts) onto
flash-attn's (bottom-right causal alignment, varlen, block lists) exactly: output and all three
gradients against the float64 reference. Then the messages, and auto's measured table.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D); layouts (H_l, Mb, Nb).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys

import fake_flash_attn  # tests/kernels/fake_flash_attn.py: the stand-in packages
import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention, dispatch, flash_attn_backend
from genoformer.kernels.flash_attn_backend import FlashAttn, flash_attn_attention
from genoformer.kernels.reference import reference_attention


@pytest.fixture
def fakes_sm90(monkeypatch):
    """Both fake installs, and a GPU the checks take for an H200 (sm_90), with its real table of
    the head dims flash-attn-4 is trusted with."""
    fake_flash_attn.install(monkeypatch)
    monkeypatch.setattr(flash_attn_backend, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    yield monkeypatch
    flash_attn_backend.import_error.cache_clear()


@pytest.fixture
def fakes(fakes_sm90):
    """As `fakes_sm90`, with head dim 16 trusted too: the fakes are exact at every head dim, and
    D = 16 keeps these CPU tests fast (the real table is tested with `fakes_sm90`)."""
    trusted = flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS[(9, 0)] | {16}
    fakes_sm90.setitem(flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS, (9, 0), trusted)
    return fakes_sm90


def _triton_reason(monkeypatch, reason) -> None:
    """Make the triton backend's check answer `reason` (None: it runs) on these faked GPUs."""
    entry = dispatch.BACKENDS[Backend.TRITON]
    replaced = dataclasses.replace(entry, unsupported_reason=lambda q, k, v, **conditions: reason)
    monkeypatch.setitem(dispatch.BACKENDS, Backend.TRITON, replaced)


def _per_document_reference(q, k, v, cu_seqlens, **kwargs):
    """Independent judge for packed rows: each document alone through the float64 reference."""
    B, Hq, L, D = q.shape
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        b, s, e = start // L, start % L, start % L + (end - start)
        out[b, :, s:e] = reference_attention(
            q[b : b + 1, :, s:e], k[b : b + 1, :, s:e], v[b : b + 1, :, s:e], **kwargs
        )[0]
    return out


def _layout_128(L, heads, density, seed, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    n = -(-L // 128)
    mask = torch.rand(heads, n, n, generator=g) < density
    for h, m in empty_rows:
        mask[h, m] = False
    return BlockLayout.from_block_mask(mask, L, L, 128)


# Each case: shapes, then attention keywords (built lazily), then the installs that run it.
BOTH = (FlashAttn.V2, FlashAttn.V4)
CASES = {
    "dense": (dict(B=2, Hq=2, Hkv=2, L=97), lambda: dict(), BOTH),
    "dense_causal_gqa": (dict(B=2, Hq=4, Hkv=1, L=97), lambda: dict(causal=True), BOTH),
    "cross_attention": (dict(B=2, Hq=2, Hkv=1, L=40, S=97), lambda: dict(), BOTH),
    "padding": (dict(B=3, Hq=2, Hkv=2, L=50, S=70), lambda: dict(kv_lens=torch.tensor([70, 33, 0])), BOTH),
    # causal with key padding: the bottom-right alignment of flash-attn must not leak in
    "padding_causal_gqa": (
        dict(B=3, Hq=4, Hkv=2, L=50),
        lambda: dict(causal=True, kv_lens=torch.tensor([50, 17, 0], dtype=torch.int32)),
        BOTH,
    ),
    "padding_causal_full": (
        dict(B=2, Hq=2, Hkv=2, L=33),
        lambda: dict(causal=True, kv_lens=torch.tensor([33, 33])),
        BOTH,
    ),
    "full_layout_is_dense": (
        dict(B=1, Hq=2, Hkv=2, L=64),
        lambda: dict(causal=True, layout=BlockLayout.dense(64, block_size=16)),
        BOTH,
    ),
}


@pytest.mark.parametrize(
    "version, case",
    [(version, case) for case, (_, _, versions) in CASES.items() for version in versions],
    ids=lambda x: getattr(x, "name", x),
)
def test_adapter_maps_every_case_onto_flash_attn(attn, fakes, version, case):
    """(Neither install runs block-sparse layouts: test_messages_say_why_and_what_to_do checks
    that each says so.)"""
    shapes, make_kwargs, _ = CASES[case]
    q, k, v, dout = attn.make_qkv(**shapes)
    kwargs = make_kwargs()
    expected = attn.reference(q, k, v, dout, **kwargs)
    result = attn.run_with_grads(functools.partial(flash_attn_attention, (version,)), q, k, v, dout, **kwargs)
    attn.assert_matches_reference(result, expected)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("version", list(FlashAttn), ids=lambda v: v.name)
def test_packed_rows_map_to_varlen(attn, fakes, version, causal):
    """cu_seqlens: documents of 30, 1, 19 tokens in row 0 and one of 50 in row 1 (GQA)."""
    q, k, v, dout = attn.make_qkv(B=2, Hq=4, Hkv=2, L=50)
    cu_seqlens = torch.tensor([0, 30, 31, 50, 100], dtype=torch.int32)

    def per_document(q, k, v, **kwargs):
        return _per_document_reference(q, k, v, cu_seqlens, causal=causal)

    expected = attn.run_with_grads(per_document, q, k, v, dout)
    adapter = functools.partial(flash_attn_attention, (version,))
    result = attn.run_with_grads(adapter, q, k, v, dout, causal=causal, cu_seqlens=cu_seqlens)
    attn.assert_matches_reference(result, expected)


def test_attention_entry_point_takes_packed_rows(attn, fakes):
    q, k, v, dout = attn.make_qkv(B=2, Hq=2, Hkv=1, L=40, dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0, 7, 40, 41, 80], dtype=torch.int32)
    for backend in ("flash_attn_2", "flash_attn_4", "flash_attn"):
        result = attn.run_with_grads(attention, q, k, v, dout, causal=True, cu_seqlens=cu_seqlens, backend=backend)
        expected = attn.run_with_grads(
            attention, q, k, v, dout, causal=True, cu_seqlens=cu_seqlens, backend="reference"
        )
        for name, value in result.tensors().items():
            torch.testing.assert_close(value, expected.tensors()[name], msg=lambda m: f"{backend} {name}: {m}")
    layout = BlockLayout.global_tokens(80, 1, block_size=128)
    reason = dispatch.unsupported_reason("flash_attn_4", q, k, v, layout=layout, cu_seqlens=cu_seqlens)
    assert reason is None  # one block: the layout is dense


def test_compiled_callers_run_flash_attn_outside_the_graph(attn, fakes):
    """torch.compile breaks the graph around the flash-attn entry points instead of tracing them."""
    q, k, v, dout = attn.make_qkv(B=1, Hq=2, Hkv=1, L=64, dtype=torch.bfloat16)

    def causal_attention(q, k, v):
        return attention(q, k, v, causal=True, backend="flash_attn_4") * 2

    eager = attn.run_with_grads(causal_attention, q, k, v, dout)
    compiled = attn.run_with_grads(torch.compile(causal_attention, backend="aot_eager"), q, k, v, dout)
    for name, value in compiled.tensors().items():
        assert torch.equal(value, eager.tensors()[name]), name


def test_fake_aligns_causal_to_the_bottom_right(fakes):
    """The fakes keep the trap the adapters must avoid: with fewer keys than queries, causal in
    flash-attn shifts the diagonal (query i sees j <= i + S - L), unlike our j <= i."""
    q = torch.randn(1, 6, 1, 8, dtype=torch.float64)
    k = v = torch.randn(1, 4, 1, 8, dtype=torch.float64)
    out = fake_flash_attn.v2_flash_attn_func(q, k, v, causal=True)
    assert (out[0, :2] == 0).all() and (out[0, 2:] != 0).all()
    ours = reference_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False, kv_lens=torch.tensor([4])
    )
    assert (ours[0, 0, :2] != 0).all()


def test_attention_entry_point_runs_both_installs_in_bfloat16(attn, fakes):
    """Through `attention`: the checks pass, the backends route, the 2x error rule holds."""
    q, k, v, dout = attn.make_qkv(B=1, Hq=4, Hkv=2, L=384, D=16, dtype=torch.bfloat16)
    exact = attn.reference(*(t.double() for t in (q, k, v, dout)), causal=True)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, causal=True)
    for backend in ("flash_attn_2", "flash_attn_4", "flash_attn"):
        result = attn.run_with_grads(attention, q, k, v, dout, causal=True, backend=backend)
        for name, value in result.tensors().items():
            err = (value.double() - exact.tensors()[name]).abs().max()
            naive_err = (naive.tensors()[name].double() - exact.tensors()[name]).abs().max()
            rounding = (exact.tensors()[name].to(torch.bfloat16).double() - exact.tensors()[name]).abs().max()
            assert value.dtype == torch.bfloat16 and err <= 2 * naive_err + rounding, (backend, name)
    layout = BlockLayout.sliding_window(384, 0, block_size=128) | BlockLayout.global_tokens(384, 1, block_size=128)
    with pytest.raises(ValueError, match="backend 'flash_attn_2' cannot run these inputs: flash-attn 2 has no"):
        attention(q, k, v, layout=layout, backend="flash_attn_2")
    with pytest.raises(ValueError, match="backend 'flash_attn_4' cannot run these inputs: genoformer does not run"):
        attention(q, k, v, layout=layout, backend="flash_attn_4")


def test_flash_attn_prefers_flash_attn_4_and_falls_back_to_flash_attn_2(fakes):
    q = torch.randn(1, 2, 64, 16, dtype=torch.bfloat16)
    assert (
        flash_attn_backend.first_runnable((FlashAttn.V4, FlashAttn.V2), q, q, q, causal=True, layout=None, kv_lens=None)
        is FlashAttn.V4
    )
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (8, 0))  # an A100
    assert (
        flash_attn_backend.first_runnable((FlashAttn.V4, FlashAttn.V2), q, q, q, causal=True, layout=None, kv_lens=None)
        is FlashAttn.V2
    )
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (7, 5))
    reason = dispatch.unsupported_reason("flash_attn", q, q, q, causal=True)
    assert reason.startswith("no flash-attn install here can run these inputs: (1) flash-attn-4 trains on Hopper")
    assert "(2) flash-attn 2 needs an Ampere or newer GPU (sm_80+), this one is sm_75" in reason


def _reason(backend, shape=(1, 2, 256, 16), dtype=torch.bfloat16, **kwargs):
    q = torch.zeros(shape, dtype=dtype)
    return dispatch.unsupported_reason(backend, q, q, q, **kwargs)


def test_messages_say_why_and_what_to_do(fakes):
    assert _reason("flash_attn_2") is None and _reason("flash_attn_4") is None
    # no GPU
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: None)
    assert _reason("flash_attn_4") == (
        "flash-attn-4 runs on CUDA GPUs only (inputs are on cpu); use backend 'sdpa' or 'torch'."
    )
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (8, 0))
    assert (
        "this one is sm_80; flash-attn 2 is for A100 and older GPUs: pip install flash-attn --no-build-isolation"
        in _reason("flash_attn_4")
    )
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (9, 0))
    assert "float16 and bfloat16 only (got torch.float32)" in _reason("flash_attn_2", dtype=torch.float32)
    assert "head dim that is a multiple of 8 from 8 to 256 (got 12)" in _reason("flash_attn_4", shape=(1, 2, 64, 12))
    # layouts
    window = BlockLayout.sliding_window(256, 64, block_size=64)
    assert "window_size is a token band" in _reason("flash_attn_2", layout=window)
    layout = BlockLayout.global_tokens(256, 1, block_size=128)
    assert "flash-attn 2 has no block-sparse layouts" in _reason("flash_attn_2", layout=layout)
    for not_dense in (window, layout):
        assert _reason("flash_attn_4", layout=not_dense) == (
            "genoformer does not run block-sparse layouts on flash-attn-4 (its block-sparse forward failed on "
            "an H200 with our block lists, see docs/flash_attn.md); use backend 'triton', which runs them."
        )
    assert _reason("flash_attn_4", layout=BlockLayout.dense(256, block_size=128)) is None  # dense: runs
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (10, 0))
    assert "a multiple of 8 from 8 to 128, or 256 (got 192)" in _reason("flash_attn_4", shape=(1, 2, 64, 192))


def test_flash_attn_4_alone_breaks_the_flash_attn_2_import_and_says_so(monkeypatch):
    """With flash-attn-4 alone, `import flash_attn` works and `from flash_attn import
    flash_attn_func` does not: the flash-attn 2 backend says which package to install."""
    fake_flash_attn.install(monkeypatch, v2=False, v4=True)
    monkeypatch.setattr(flash_attn_backend, "device_capability", lambda device: (9, 0))
    try:
        reason = _reason("flash_attn_2")
        assert reason.startswith("flash-attn 2 does not import (from flash_attn import flash_attn_func failed: ")
        assert reason.endswith(
            "flash-attn 2 is for A100 and older GPUs: pip install flash-attn --no-build-isolation "
            "(on Hopper or Blackwell install flash-attn-4 instead: pip install flash-attn-4)."
        )
        trusted = (1, 2, 256, 64)  # a head dim flash-attn-4 runs (FLASH_ATTN_4_HEAD_DIMS)
        assert _reason("flash_attn_4", shape=trusted) is None and _reason("flash_attn", shape=trusted) is None
        fake_flash_attn.install(monkeypatch, v2=True, v4=False)
        assert _reason("flash_attn_4").startswith("flash-attn-4 does not import (import flash_attn.cute failed: ")
        assert "pip install flash-attn-4 (on an A100 or older" in _reason("flash_attn_4")
    finally:
        flash_attn_backend.import_error.cache_clear()


@pytest.mark.parametrize(
    "layout, expected",
    [
        (BlockLayout.sliding_window(512, 100, block_size=64), True),
        (BlockLayout.sliding_window(512, 100, block_size=64).with_causal(), True),
        (BlockLayout.global_tokens(512, 1, block_size=64), False),
        (BlockLayout.from_block_mask(torch.zeros(4, 4, dtype=torch.bool), 256, 256, 64), False),
    ],
)
def test_block_band_detection(layout, expected):
    assert flash_attn_backend.is_block_band(layout) is expected


# ------------------------------------------------------------------------------ auto's table
def _auto(q, **conditions):
    """The backend auto takes on this (faked) GPU for causal inputs shaped like q."""
    B, H, L, D = q.shape
    shape = dict(batch=B, q_heads=H, kv_heads=H, q_len=L, kv_len=L, head_dim=D, dtype=q.dtype, device=q.device)
    return dispatch.plan_attention("auto", causal=True, **shape, **conditions).backend


def test_auto_follows_the_measured_table_on_sm90(fakes, caplog):
    q = torch.zeros(1, 2, 256, 16, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        assert _auto(q) is Backend.FLASH_ATTN_4
        assert _auto(q, cu_seqlens=torch.tensor([0, 100, 256], dtype=torch.int32)) is Backend.FLASH_ATTN_4
    assert all(r.levelno == logging.INFO for r in caplog.records)
    assert dispatch.FASTEST_FIRST[(9, 0)].dense[0] is Backend.FLASH_ATTN_4
    # layouts: our kernels only (flash-attn-4 runs no layouts here)
    assert dispatch.FASTEST_FIRST[(9, 0)].block_sparse == (Backend.TRITON,)
    _triton_reason(fakes, None)
    assert _auto(q, layout=BlockLayout.global_tokens(256, 1, block_size=128)) is Backend.TRITON


def test_auto_warns_once_when_it_passes_over_a_faster_backend(fakes, caplog):
    """Without flash-attn-4 on sm_90 (and with Triton unable to run), auto takes flash-attn 2 for
    dense inputs and torch for a layout at block 64, warning once each with the reasons."""
    fake_flash_attn.install(fakes, v2=True, v4=False)
    _triton_reason(fakes, "(test) no Triton here")
    q = torch.zeros(1, 2, 256, 16, dtype=torch.bfloat16)
    window = BlockLayout.sliding_window(256, 64, block_size=64)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        for _ in range(3):
            assert _auto(q) is Backend.FLASH_ATTN_2
            assert _auto(q, layout=window) is Backend.TORCH
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert (
        "backend 'flash_attn_2', not a faster one, because 'flash_attn_4' (measured faster on sm_90): " in warnings[0]
    )
    assert "pip install flash-attn-4" in warnings[0] and "'triton' (measured faster on sm_90): " in warnings[0]
    assert "backend 'torch', not a faster one, because 'triton' (measured faster on sm_90): (test)" in warnings[1]


def test_auto_on_an_unmeasured_generation_keeps_our_kernels_first(fakes, caplog):
    fakes.setattr(flash_attn_backend, "device_capability", lambda device: (8, 0))
    _triton_reason(fakes, "(test) no Triton here")
    assert dispatch.FASTEST_FIRST.get((8, 0), dispatch.UNMEASURED) == dispatch.UNMEASURED
    q = torch.zeros(1, 2, 256, 16, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        chosen = _auto(q)
    assert chosen is Backend.SDPA  # flash-attn is not in the (unmeasured) sm_80 order
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.endswith("backend 'sdpa', not a faster one, because 'triton': (test) no Triton here")


# --------------------------------------------------------------------- flash-attn-4's head dims
def test_flash_attn_4_runs_only_the_head_dims_a_gpu_sweep_found_right(fakes_sm90):
    """flash-attn-4 4.0.0b36 gave wrong gradients at head dims such as 80 on an H200: the backend
    refuses every head dim outside FLASH_ATTN_4_HEAD_DIMS, says which and what runs them."""
    trusted = flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS[(9, 0)]
    assert {64, 128} <= trusted and not {16, 40, 48, 80, 112} & trusted
    assert _reason("flash_attn_4", shape=(1, 2, 64, 64)) is None
    reason = _reason("flash_attn_4", shape=(1, 2, 64, 80))
    assert reason.startswith("head dim 80 is not among those whose flash-attn-4 gradients were checked on sm_90")
    assert "use backend 'triton'" in reason
    # flash_attn tries flash-attn 2 next, which has no such table
    assert _reason("flash_attn", shape=(1, 2, 64, 80)) is None
    q = torch.zeros(1, 2, 64, 80, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="backend 'flash_attn_4' cannot run these inputs: head dim 80 is not"):
        attention(q, q, q, backend="flash_attn_4")
    # a generation without a measured row trusts none
    fakes_sm90.setattr(flash_attn_backend, "device_capability", lambda device: (10, 0))
    assert "no head dim was checked" in _reason("flash_attn_4", shape=(1, 2, 64, 64))


def test_auto_takes_triton_for_unproven_head_dims_and_warns_why(fakes_sm90, caplog):
    _triton_reason(fakes_sm90, None)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        assert _auto(torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)) is Backend.FLASH_ATTN_4
        for _ in range(2):
            assert _auto(torch.zeros(1, 2, 256, 80, dtype=torch.bfloat16)) is Backend.TRITON
    levels = {r.getMessage(): r.levelno for r in caplog.records if r.name == "genoformer.kernels"}
    (warning,) = [m for m, level in levels.items() if level == logging.WARNING]
    assert (
        "backend 'triton', not a faster one, because 'flash_attn_4' (measured faster on sm_90): head dim 80" in warning
    )
    assert [m for m, level in levels.items() if level == logging.INFO] == [
        "attention on cuda, dense, causal: backend 'flash_attn_4'"
    ]


def test_partial_flash_attn_4_install_is_a_clear_message(monkeypatch):
    """A flash_attn.cute without flash_attn_func (a partial or mismatched install) is reported with
    what is missing and how to reinstall, on any device, never as an AttributeError."""
    fake_flash_attn.install(monkeypatch, v2=False, v4=True)
    monkeypatch.delattr(sys.modules["flash_attn.cute"], "flash_attn_func")
    try:
        q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
        reason = _reason("flash_attn_4", shape=q.shape)
        assert reason.startswith("flash-attn-4 does not import (import flash_attn.cute failed: flash_attn.cute")
        assert "has no flash_attn_func: a partial flash-attn-4 install" in reason
        assert "(installed: " in reason  # the versions of flash-attn-4 and flash-attn, or that there are none
        assert "pip uninstall -y flash-attn-4 && pip install flash-attn-4" in reason
        with pytest.raises(ValueError, match="backend 'flash_attn_4' cannot run these inputs: flash-attn-4 does not"):
            attention(q, q, q, backend="flash_attn_4")
        with pytest.raises(ImportError, match="has no flash_attn_func"):
            flash_attn_attention((FlashAttn.V4,), q, q, q)
    finally:
        flash_attn_backend.import_error.cache_clear()
