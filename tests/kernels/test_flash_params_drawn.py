"""flash-attn's parameters in the Triton kernels at shapes and parameters hypothesis draws: every
combination of causal, a window (each side bounded or not), ALiBi, softcap and dropout, GQA, odd
lengths, Lq != Lk and head dims that run in padded tiles, judged by the float64 reference
(``triton_judge``). Tiny shapes: the interpreter runs them on a CPU.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed: pip install triton")

from genoformer.kernels.triton_flash import INTERPRETED, triton_attention  # noqa: E402
from hypothesis import HealthCheck, assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from triton_judge import DEVICE, assert_close_to_reference, inputs  # noqa: E402

if DEVICE.type == "cpu" and not INTERPRETED:
    pytest.skip(
        "genoformer.kernels.triton_flash was imported before TRITON_INTERPRET=1 was set; "
        "run `pytest tests/kernels/test_flash_params_drawn.py` on its own",
        allow_module_level=True,
    )


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # attn: stateless
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 2),
    q_len=st.integers(1, 64),
    k_len=st.integers(1, 64),
    head_dim=st.sampled_from([16, 24, 40]),
    causal=st.booleans(),
    left=st.one_of(st.none(), st.integers(0, 40)),
    right=st.one_of(st.none(), st.integers(0, 40)),
    alibi=st.booleans(),
    softcap=st.sampled_from([0.0, 3.0]),
    dropout_p=st.sampled_from([0.0, 0.2]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**31 - 1),
)
@example(  # one key: dq is exactly 0 in the reference, and the kernel's rounding is judged by the others' size
    batch=1,
    kv_heads=1,
    group=2,
    q_len=1,
    k_len=1,
    head_dim=16,
    causal=True,
    left=None,
    right=None,
    alibi=False,
    softcap=0.0,
    dropout_p=0.0,
    dtype=torch.float16,
    seed=3,
)
def test_drawn_shapes_match_reference(
    attn, batch, kv_heads, group, q_len, k_len, head_dim, causal, left, right, alibi, softcap, dropout_p, dtype, seed
):
    """hypothesis draws the shapes and every parameter together (tiny, for the interpreter)."""
    q, k, v, dout = inputs(batch, kv_heads * group, kv_heads, q_len, k_len, head_dim, dtype, seed)
    kwargs = {"causal": causal, "window": (left, right), "softcap": softcap}
    if alibi:
        kwargs["alibi_slopes"] = torch.rand(batch, kv_heads * group, device=DEVICE)
    if dropout_p:
        kwargs.update(dropout_p=dropout_p, dropout_rng=torch.tensor([seed, 0], dtype=torch.int64, device=DEVICE))
    assert_close_to_reference(attn, triton_attention, q, k, v, dout, dtype, **kwargs)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # attn: stateless
@given(
    lengths=st.lists(st.tuples(st.integers(0, 32), st.integers(0, 32)), min_size=1, max_size=3),
    causal=st.booleans(),
    left=st.one_of(st.none(), st.integers(0, 30)),
    alibi=st.booleans(),
    dropout_p=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_drawn_varlen_batches_match_reference(attn, lengths, causal, left, alibi, dropout_p, seed):
    """Variable-length batches whose sequences hypothesis draws (empty ones included), query and key
    lengths apart, with the parameters that take per-sequence positions."""
    from genoformer.kernels.triton_flash import Varlen

    q_lengths, k_lengths = zip(*lengths)
    assume(sum(q_lengths) > 0 and sum(k_lengths) > 0)

    def cu(ns):
        return torch.tensor([0, *torch.tensor(ns).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)

    q, k, v, dout = inputs(1, 4, 2, sum(q_lengths), sum(k_lengths), 16, torch.float16, seed)
    kwargs = {
        "causal": causal,
        "window": (left, None),
        "varlen": Varlen(cu(q_lengths), cu(k_lengths), max(q_lengths), max(k_lengths)),
    }
    if alibi:
        kwargs["alibi_slopes"] = torch.rand(len(lengths), 4, device=DEVICE)
    if dropout_p:
        kwargs.update(dropout_p=dropout_p, dropout_rng=torch.tensor([seed, 1], dtype=torch.int64, device=DEVICE))
    assert_close_to_reference(attn, triton_attention, q, k, v, dout, torch.float16, **kwargs)
