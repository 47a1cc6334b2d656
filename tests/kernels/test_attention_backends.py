"""Every backend available here against the float64 reference: output and dq, dk, dv.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D); layouts (H_l, Mb, Nb).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention
from genoformer.kernels import dispatch as attention_module
from genoformer.kernels.blocksparse_torch import blocksparse_attention
from genoformer.kernels.dispatch import unsupported_reason
from genoformer.kernels.reference import row_error
from jsonargparse import ArgumentParser

BACKENDS = [Backend.TORCH, Backend.SDPA]


def _random_layout(L, S, bs, heads, density, seed, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    Mb, Nb = -(-L // bs), -(-S // bs)
    mask = torch.rand(heads, Mb, Nb, generator=g) < density
    for h, m in empty_rows:
        mask[h, m] = False
    return BlockLayout.from_block_mask(mask, L, S, bs)


# Each case: shapes for make_qkv, then attention keywords built lazily (layouts need the shapes).
CASES = {
    "dense": (dict(B=2, Hq=2, Hkv=2, L=97), lambda: dict()),
    "dense_causal": (dict(B=2, Hq=2, Hkv=2, L=97), lambda: dict(causal=True)),
    "gqa_causal": (dict(B=1, Hq=4, Hkv=1, L=64), lambda: dict(causal=True)),
    "padding": (dict(B=2, Hq=2, Hkv=2, L=97), lambda: dict(kv_lens=torch.tensor([97, 33]))),
    "padding_causal_empty_batch": (
        dict(B=2, Hq=4, Hkv=2, L=50),
        lambda: dict(causal=True, kv_lens=torch.tensor([20, 0], dtype=torch.int32)),
    ),
    "cross_attention": (
        dict(B=2, Hq=2, Hkv=1, L=40, S=97),
        lambda: dict(layout=_random_layout(40, 97, 16, 1, 0.5, 3), kv_lens=torch.tensor([97, 60])),
    ),
    "shared_layout_causal": (
        dict(B=2, Hq=4, Hkv=2, L=97),
        lambda: dict(causal=True, layout=_random_layout(97, 97, 16, 1, 0.4, 1)),
    ),
    "per_head_layout_gqa_empty_rows": (
        dict(B=2, Hq=4, Hkv=2, L=97),
        lambda: dict(layout=_random_layout(97, 97, 16, 4, 0.4, 2, empty_rows=[(0, 1), (3, 6)])),
    ),
    "bigbird_causal_padding": (
        dict(B=2, Hq=4, Hkv=4, L=97),
        lambda: dict(
            causal=True,
            layout=BlockLayout.bigbird(97, 16, 1, 1, block_size=16, seed=5, num_heads=4),
            kv_lens=torch.tensor([80, 97]),
        ),
    ),
    "long_sliding_window": (
        dict(B=1, Hq=2, Hkv=1, L=1025),
        lambda: dict(causal=True, layout=BlockLayout.sliding_window(1025, 100, block_size=64)),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_backend_matches_reference_float64(attn, backend, case):
    shapes, make_kwargs = CASES[case]
    q, k, v, dout = attn.make_qkv(**shapes)
    kwargs = make_kwargs()
    expected = attn.reference(q, k, v, dout, **kwargs)
    result = attn.run_with_grads(attention, q, k, v, dout, backend=backend, **kwargs)
    attn.assert_matches_reference(result, expected)


@pytest.mark.parametrize("case", ["shared_layout_causal", "per_head_layout_gqa_empty_rows", "cross_attention"])
def test_torch_backend_chunked_and_checkpointed(attn, case):
    """A tiny chunk budget forces one query block per chunk and checkpointing of every chunk."""
    shapes, make_kwargs = CASES[case]
    q, k, v, dout = attn.make_qkv(**shapes)
    kwargs = make_kwargs()
    expected = attn.reference(q, k, v, dout, **kwargs)
    result = attn.run_with_grads(blocksparse_attention, q, k, v, dout, chunk_elements=1, **kwargs)
    attn.assert_matches_reference(result, expected)


@pytest.mark.parametrize("backend", [Backend.REFERENCE, *BACKENDS], ids=lambda b: b.value)
def test_fully_masked_rows_give_zero_output_and_zero_grad(attn, backend):
    q, k, v, dout = attn.make_qkv(B=2, Hq=2, Hkv=2, L=48)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query block 1 (tokens 16..31) sees nothing
    layout = BlockLayout.from_block_mask(mask, 48, 48, 16)
    kv_lens = torch.tensor([48, 0])  # batch 1 sees nothing at all
    result = attn.run_with_grads(attention, q, k, v, dout, layout=layout, kv_lens=kv_lens, backend=backend)
    for t in result.tensors().values():
        assert torch.isfinite(t).all()
    assert (result.out[:, :, 16:32] == 0).all() and (result.dq[:, :, 16:32] == 0).all()
    assert (result.out[1] == 0).all() and (result.dq[1] == 0).all()
    assert (result.dk[1] == 0).all() and (result.dv[1] == 0).all()
    assert result.out[0, :, :16].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_low_precision_error_within_twice_naive_error(attn, backend, dtype):
    """Error against the float64 reference is at most 2x that of dense attention in the same dtype.

    Plus the error of rounding the exact answer to the dtype, which no implementation can beat
    (at bfloat16 one rounding of a gradient of size ~8 is already 1/64).
    """
    q, k, v, dout = attn.make_qkv(B=1, Hq=4, Hkv=2, L=97, dtype=dtype)
    kwargs = dict(causal=True, layout=BlockLayout.bigbird(97, 16, 1, 1, block_size=16, num_heads=4))
    q64, k64, v64, dout64 = (t.to(torch.float64) for t in (q, k, v, dout))
    exact = attn.reference(q64, k64, v64, dout64, **kwargs)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, **kwargs)
    result = attn.run_with_grads(attention, q, k, v, dout, backend=backend, **kwargs)
    _assert_within_twice_naive_error(result, naive, exact, dtype)


def _assert_within_twice_naive_error(result, naive, exact, dtype):
    for name, value in result.tensors().items():
        assert value.dtype == dtype and not value.isnan().any()
        err = (value.double() - exact.tensors()[name]).abs().max()
        naive_err = (naive.tensors()[name].double() - exact.tensors()[name]).abs().max()
        rounding_err = (exact.tensors()[name].to(dtype).double() - exact.tensors()[name]).abs().max()
        assert err <= 2 * naive_err + rounding_err, (
            f"{name}: error {err:.3g}, same-precision error {naive_err:.3g}, rounding {rounding_err:.3g}"
        )


def test_layout_means_the_same_at_every_block_size(attn):
    """A layout and its refinement give the same attention in every backend."""
    q, k, v, dout = attn.make_qkv(B=1, Hq=2, Hkv=2, L=130)
    coarse = BlockLayout.bigbird(130, 32, 1, 1, block_size=32, seed=7)
    fine = coarse.refine(16)
    expected = attn.reference(q, k, v, dout, causal=True, layout=coarse)
    for backend in [Backend.REFERENCE, *BACKENDS]:
        for layout in (coarse, fine, coarse.with_causal()):
            result = attn.run_with_grads(attention, q, k, v, dout, causal=True, layout=layout, backend=backend)
            attn.assert_matches_reference(result, expected)


def test_custom_scale_and_string_backend(attn):
    q, k, v, dout = attn.make_qkv(B=1, Hq=2, Hkv=2, L=40)
    expected = attn.reference(q, k, v, dout, scale=0.3)
    for backend in ("torch", "sdpa", "auto"):
        result = attn.run_with_grads(attention, q, k, v, dout, scale=0.3, backend=backend)
        attn.assert_matches_reference(result, expected)


def test_auto_choice_logged_once_per_situation(attn, caplog, monkeypatch):
    monkeypatch.setattr(attention_module, "_logged_choices", set())  # forget what earlier tests logged
    q, k, v, _ = attn.make_qkv(B=1, Hq=2, Hkv=2, L=64, S=64, D=16)
    sparse = BlockLayout.sliding_window(64, 16, block_size=16)
    full = BlockLayout.dense(64, block_size=16)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        for _ in range(3):
            attention(q, k, v, layout=sparse, scale=0.123)
            attention(q, k, v, layout=full, scale=0.123)
    messages = [r.getMessage() for r in caplog.records if r.name == "genoformer.kernels"]
    assert sum("block-sparse, bidirectional: backend 'torch'" in m for m in messages) == 1
    assert sum("dense, bidirectional: backend 'sdpa'" in m for m in messages) == 1
    assert len(messages) == len(set(messages)) == 2


def _recording(entry, backend, log):
    def load():
        fn = entry.load()

        def run(*args, **kwargs):
            log.append(backend)
            return fn(*args, **kwargs)

        return run

    return dataclasses.replace(entry, load=load)


def test_auto_situations_pick_expected_backends(monkeypatch):
    """auto on CPU: sdpa for dense (and cheap key padding), torch for layouts or a large padding mask."""
    chosen = []
    for backend, entry in list(attention_module.BACKENDS.items()):
        monkeypatch.setitem(attention_module.BACKENDS, backend, _recording(entry, backend, chosen))
    q = torch.randn(1, 2, 64, 16)
    lens = torch.tensor([30])
    attention(q, q, q)
    attention(q, q, q, kv_lens=lens)
    attention(q, q, q, layout=BlockLayout.sliding_window(64, 16, 16))
    attention(q, q, q, layout=BlockLayout.dense(64, block_size=16))
    monkeypatch.setattr(attention_module, "SDPA_MASK_ELEMENTS", 10)
    attention(q, q, q, kv_lens=lens)
    assert chosen == [Backend.SDPA, Backend.SDPA, Backend.TORCH, Backend.SDPA, Backend.TORCH]


TRITON_CASES = {
    "dense_causal": (dict(B=2, Hq=2, Hkv=2, L=64), lambda: dict(causal=True)),
    "gqa_padding_empty_batch": (dict(B=2, Hq=2, Hkv=1, L=64), lambda: dict(kv_lens=torch.tensor([40, 0]))),
    "per_head_layout_empty_rows": (
        dict(B=1, Hq=2, Hkv=1, L=64),
        lambda: dict(causal=True, layout=_random_layout(64, 64, 16, 2, 0.5, 4, empty_rows=[(1, 2)])),
    ),
    "odd_length_bigbird": (
        dict(B=1, Hq=2, Hkv=2, L=97),
        lambda: dict(layout=BlockLayout.bigbird(97, 16, 1, 1, block_size=16, seed=6), kv_lens=torch.tensor([90])),
    ),
}


@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_triton_matches_reference_when_it_can_run_here(attn, case):
    """Runs on a CPU only when the session started with TRITON_INTERPRET=1 (else skipped, saying why)."""
    shapes, make_kwargs = TRITON_CASES[case]
    q, k, v, dout = attn.make_qkv(D=16, dtype=torch.bfloat16, **shapes)
    kwargs = make_kwargs()
    reason = unsupported_reason(Backend.TRITON, q, k, v, **kwargs)
    if reason is not None:
        pytest.skip(f"triton backend unavailable: {reason}")
    exact = attn.reference(*(t.to(torch.float64) for t in (q, k, v, dout)), **kwargs)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, **kwargs)
    result = attn.run_with_grads(attention, q, k, v, dout, backend=Backend.TRITON, **kwargs)
    _assert_within_twice_naive_error(result, naive, exact, torch.bfloat16)


def test_gpu_fallback_is_a_warning_once_with_the_reason(caplog):
    """auto leaving our kernels on a GPU costs speed: WARNING (once, with the reason); other
    choices stay at INFO. (No GPU here: the logging step is called as `_choose` calls it.)"""
    reason = "head dim 72 is not supported by the Triton kernels (supported: (16, 32, 64, 128, 256)); pad the head dim"
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        for _ in range(3):
            attention_module._log_once("cuda", Backend.SDPA, "dense, causal (test)", reason)
            attention_module._log_once("cuda", Backend.TRITON, "dense, causal (test)", None)
    records = [r for r in caplog.records if r.name == "genoformer.kernels" and "(test)" in r.getMessage()]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and reason in warnings[0].getMessage() and "'sdpa'" in warnings[0].getMessage()
    assert [r.levelno for r in records if r not in warnings] == [logging.INFO]


def test_plan_attention_resolves_auto_and_checks_explicit_backends():
    shape = dict(batch=2, q_heads=4, kv_heads=2, q_len=64, kv_len=64, head_dim=16, device=torch.device("cpu"))
    window = BlockLayout.sliding_window(64, 32, block_size=16).with_causal()
    full = BlockLayout.dense(64, block_size=16)
    assert attention_module.plan_attention("auto", dtype=torch.float32, causal=True, **shape).backend is Backend.SDPA
    plan = attention_module.plan_attention(Backend.AUTO, dtype=torch.float32, causal=True, layout=window, **shape)
    assert plan == attention_module.AttentionPlan(Backend.TORCH, window)
    # a layout that allows every block is dense to auto
    assert attention_module.plan_attention("auto", dtype=torch.float32, layout=full, **shape).layout is None
    with pytest.raises(ValueError, match="backend 'triton' cannot run these inputs: .*float16 or bfloat16"):
        attention_module.plan_attention("triton", dtype=torch.float32, **shape)


def test_plan_attention_prepares_the_triton_block_lists():
    """Compiled callers find the layout's block lists built (outside the graph)."""
    layout = BlockLayout.sliding_window(64, 32, block_size=16)
    shape = dict(batch=1, q_heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=16, device=torch.device("cpu"))
    plan = attention_module.plan_attention("triton", dtype=torch.bfloat16, layout=layout, **shape)
    assert plan.backend is Backend.TRITON
    assert layout.kv_indices("cpu") is layout.kv_indices("cpu")  # cached, not rebuilt
    assert {key[0] for key in layout._cache if isinstance(key, tuple)} >= {"kv", "q"}


# ------------------------------------------------------------------------------ backend names
@pytest.mark.parametrize(
    "text, expected",
    [
        ("auto", Backend.AUTO),
        ("AUTO", Backend.AUTO),
        ("flash_attn", Backend.FLASH_ATTN),
        ("FLASH_ATTN", Backend.FLASH_ATTN),
        ("Flash_Attn_4", Backend.FLASH_ATTN_4),
        ("Triton", Backend.TRITON),
    ],
)
def test_backend_names_parse_as_users_write_them(text, expected):
    """By value or by member name, in any case, through Backend(...) and Backend[...] alike."""
    assert Backend(text) is expected and Backend[text] is expected


def test_attention_takes_backend_names_in_any_case(attn):
    q, k, v, dout = attn.make_qkv(B=1, Hq=2, Hkv=2, L=40)
    expected = attn.reference(q, k, v, dout, causal=True)
    for backend in ("SDPA", "Torch", "AUTO"):
        attn.assert_matches_reference(
            attn.run_with_grads(attention, q, k, v, dout, causal=True, backend=backend), expected
        )


def test_unknown_backend_names_say_what_to_write():
    with pytest.raises(ValueError, match="unknown attention backend 'flash'; choose one of 'auto', 'reference'"):
        attention(*(torch.zeros(1, 1, 8, 8),) * 3, backend="flash")
    with pytest.raises(KeyError):
        Backend["flash"]


@dataclasses.dataclass
class _Runtime:
    attention_backend: Backend = Backend.AUTO


@pytest.mark.parametrize(
    "text, expected",
    [
        ("flash_attn", Backend.FLASH_ATTN),
        ("auto", Backend.AUTO),
        ("FLASH_ATTN", Backend.FLASH_ATTN),
        ("Triton", Backend.TRITON),
    ],
)
def test_jsonargparse_reads_a_backend_field_as_users_write_it(text, expected):
    """LightningCLI's parser reads Enum fields by member name (`Backend[text]`): configs that write
    `attention_backend: flash_attn`, as docs/flash_attn.md does, parse; a dump parses back."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(_Runtime, "runtime")
    from_yaml = parser.parse_string(f"runtime:\n  attention_backend: {text}\n")
    from_command_line = parser.parse_args([f"--runtime.attention_backend={text}"])
    assert from_yaml.runtime.attention_backend is expected
    assert from_command_line.runtime.attention_backend is expected
    assert parser.parse_string(parser.dump(from_yaml)).runtime.attention_backend is expected


def test_row_error_flags_a_wrong_row_but_not_rounding():
    """The benchmarks' check (`reference.row_error`): rounding passes, one wrong row does not."""
    expected = torch.randn(2, 3, 64, 16, generator=torch.Generator().manual_seed(0))
    rounded = expected.bfloat16().float()
    assert row_error(rounded, expected) < 1e-2
    wrong = rounded.clone()
    wrong[1, 2, 40] = torch.randn(16)  # one query's output from the wrong keys
    assert row_error(wrong, expected) > 0.3
    near_zero = expected.clone()
    near_zero[0, 0, 0] = 1e-8  # e.g. dq of the first causal query: zero up to rounding
    assert row_error(near_zero + 1e-7, near_zero) < 1e-5
    wrong[0, 0, 0, 0] = float("nan")
    assert math.isnan(row_error(wrong, expected))
