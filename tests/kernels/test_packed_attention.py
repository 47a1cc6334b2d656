"""Packed variable-length sequences (cu_seqlens): every document attends only inside itself.

The judge is independent of the packing code: each document run alone (`per_document`), its
outputs and gradients written back in place. Shape legend: q (B, Hq, L, D), k and v (B, Hkv, L, D);
`docs` lists each row's document lengths.
"""

from __future__ import annotations

import logging

import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention
from genoformer.kernels import dispatch as attention_module
from genoformer.kernels.documents import document_bounds

CPU_BACKENDS = [Backend.REFERENCE, Backend.TORCH, Backend.SDPA]

# Each case: shapes, the documents of each row, and the attention keywords (layouts need the shapes).
PACKED_CASES = {
    "bidirectional": (dict(B=2, Hq=2, Hkv=2, L=97), [[30, 1, 66], [97]], lambda: dict()),
    "causal_gqa": (dict(B=2, Hq=4, Hkv=2, L=97), [[17, 16, 64], [5, 92]], lambda: dict(causal=True)),
    "causal_many_short": (dict(B=1, Hq=2, Hkv=1, L=64), [[1] * 10 + [7, 15, 16, 16]], lambda: dict(causal=True)),
    "window_causal": (
        dict(B=2, Hq=2, Hkv=2, L=97),
        [[40, 57], [3, 90, 4]],
        lambda: dict(causal=True, layout=BlockLayout.sliding_window(97, 20, block_size=16)),
    ),
    "per_head_bigbird": (
        dict(B=1, Hq=2, Hkv=1, L=97),
        [[33, 33, 31]],
        lambda: dict(layout=BlockLayout.bigbird(97, 16, 1, 1, block_size=16, seed=3, num_heads=2)),
    ),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
@pytest.mark.parametrize("backend", CPU_BACKENDS, ids=lambda b: b.value)
def test_packed_equals_each_document_alone(attn, backend, case):
    shapes, docs, make_kwargs = PACKED_CASES[case]
    q, k, v, dout = attn.make_qkv(**shapes)
    kwargs = make_kwargs()
    expected = attn.run_with_grads(
        attn.per_document, q, k, v, dout, docs=docs, causal=kwargs.get("causal", False), layout=kwargs.get("layout")
    )
    result = attn.run_with_grads(
        attention, q, k, v, dout, backend=backend, cu_seqlens=attn.cu_seqlens_of(docs), **kwargs
    )
    attn.assert_matches_reference(result, expected)


def test_one_document_per_row_is_plain_attention(attn):
    q, k, v, dout = attn.make_qkv(B=2, Hq=2, Hkv=2, L=40)
    expected = attn.reference(q, k, v, dout, causal=True)
    for backend in CPU_BACKENDS:
        result = attn.run_with_grads(
            attention, q, k, v, dout, causal=True, backend=backend, cu_seqlens=attn.cu_seqlens_of([[40], [40]])
        )
        attn.assert_matches_reference(result, expected)


def test_torch_backend_chunked_and_checkpointed_packed(attn):
    from genoformer.kernels.blocksparse_torch import blocksparse_attention

    docs = [[17, 16, 64], [5, 92]]
    q, k, v, dout = attn.make_qkv(B=2, Hq=4, Hkv=2, L=97)
    cu = attn.cu_seqlens_of(docs)
    expected = attn.reference(q, k, v, dout, causal=True, cu_seqlens=cu)
    result = attn.run_with_grads(blocksparse_attention, q, k, v, dout, causal=True, cu_seqlens=cu, chunk_elements=1)
    attn.assert_matches_reference(result, expected)


def test_document_bounds_per_token():
    cu = torch.tensor([0, 2, 5, 6, 10, 12], dtype=torch.int32)  # rows of 6: [2, 3, 1] and [4, 2]
    starts_BL, ends_BL = document_bounds(cu, batch=2, seq_len=6)
    assert starts_BL.tolist() == [[0, 0, 2, 2, 2, 5], [0, 0, 0, 0, 4, 4]]
    assert ends_BL.tolist() == [[2, 2, 5, 5, 5, 6], [4, 4, 4, 4, 6, 6]]
    assert starts_BL.dtype == ends_BL.dtype == torch.int32


def _qkv(B=2, L=8):
    q = torch.randn(B, 2, L, 16)
    return q, q.clone(), q.clone()


@pytest.mark.parametrize(
    "cu_seqlens, kwargs, match",
    [
        (torch.tensor([0, 8, 16]), {}, r"int32 tensor of shape \(N\+1,\).*dtype=torch.int32"),
        (torch.tensor([[0, 8, 16]], dtype=torch.int32), {}, r"int32 tensor of shape \(N\+1,\)"),
        (torch.tensor([0], dtype=torch.int32), {}, r"N >= 1 documents"),
        (torch.tensor([1, 8, 16], dtype=torch.int32), {}, r"start at 0 and end at B\*L = 2\*8 = 16.*got 1 and 16"),
        (torch.tensor([0, 8, 15], dtype=torch.int32), {}, r"end at B\*L = 2\*8 = 16.*got 0 and 15"),
        (torch.tensor([0, 8, 8, 16], dtype=torch.int32), {}, "strictly increasing"),
        (torch.tensor([0, 6, 16], dtype=torch.int32), {}, r"each multiple of L = 8\) must be an entry.*split"),
        (torch.tensor([0, 8, 16], dtype=torch.int32), {"kv_lens": torch.tensor([8, 4])}, "cannot be combined"),
        ([0, 8, 16], {}, "must be an int32 tensor of shape \\(N\\+1,\\), got list"),
    ],
    ids=["int64", "2d", "no_documents", "first", "last", "repeated", "crosses_row", "kv_lens", "not_tensor"],
)
def test_bad_cu_seqlens_raise_clear_errors(cu_seqlens, kwargs, match):
    q, k, v = _qkv()
    with pytest.raises((ValueError, TypeError), match=match):
        attention(q, k, v, cu_seqlens=cu_seqlens, **kwargs)


def test_cu_seqlens_needs_equal_lengths():
    q = torch.randn(1, 2, 8, 16)
    kv = torch.randn(1, 2, 12, 16)
    with pytest.raises(ValueError, match="needs Lq == Lk, got 8 and 12"):
        attention(q, kv, kv, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))


def test_auto_keeps_the_documents_and_says_so(attn, caplog, monkeypatch):
    """auto never drops cu_seqlens: sdpa takes them as a mask while small, torch beyond."""
    monkeypatch.setattr(attention_module, "_logged_choices", set())
    docs = [[30, 1, 66], [97]]
    q, k, v, dout = attn.make_qkv(B=2, Hq=2, Hkv=2, L=97)
    cu = attn.cu_seqlens_of(docs)
    expected = attn.reference(q, k, v, dout, causal=True, cu_seqlens=cu)
    with caplog.at_level(logging.INFO, logger="genoformer.kernels"):
        small = attn.run_with_grads(attention, q, k, v, dout, causal=True, cu_seqlens=cu)
        monkeypatch.setattr(attention_module, "SDPA_MASK_ELEMENTS", 10)
        large = attn.run_with_grads(attention, q, k, v, dout, causal=True, cu_seqlens=cu)
    attn.assert_matches_reference(small, expected)
    attn.assert_matches_reference(large, expected)
    messages = [r.getMessage() for r in caplog.records if r.name == "genoformer.kernels"]
    assert messages == [
        "attention on cpu, dense, causal, packed documents: backend 'sdpa'",
        "attention on cpu, dense, causal, packed documents: backend 'torch'",
    ]


def test_plan_attention_with_packed_inputs():
    shape = dict(batch=2, q_heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=16, device=torch.device("cpu"))
    cu = torch.tensor([0, 10, 64, 128], dtype=torch.int32)
    plan = attention_module.plan_attention("auto", dtype=torch.float32, causal=True, cu_seqlens=cu, **shape)
    assert plan.backend is Backend.SDPA
