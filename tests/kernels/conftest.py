"""Shared helpers for the attention tests: inputs, and comparison against the float64 reference.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D), out (B, Hq, L, D).
Packed rows: `docs` lists each row's document lengths, e.g. [[30, 67], [97]] for B=2, L=97.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from genoformer.kernels.dropout import keep_mask
from genoformer.kernels.reference import alibi_bias, allowed_mask, reference_attention


@dataclass
class Result:
    out: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"out": self.out, "dq": self.dq, "dk": self.dk, "dv": self.dv}


def make_qkv(B=2, Hq=4, Hkv=2, L=97, S=None, D=16, dtype=torch.float64, seed=0):
    """Random q, k, v and an upstream gradient dout, all in `dtype` on CPU."""
    S = L if S is None else S
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    dout = torch.randn(B, Hq, L, D, generator=g, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, k, v, dout))


def run_with_grads(fn, q, k, v, dout, **kwargs) -> Result:
    """out = fn(q, k, v, **kwargs) and the gradients of <out, dout> w.r.t. q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kwargs)
    out.backward(dout)
    return Result(out.detach(), q.grad, k.grad, v.grad)


def naive_attention(
    q,
    k,
    v,
    *,
    causal=False,
    layout=None,
    kv_lens=None,
    scale=None,
    cu_seqlens=None,
    window=None,
    alibi_slopes=None,
    softcap=0.0,
    dropout_p=0.0,
    dropout_rng=None,
    varlen=None,
    first_row=0,
):
    """Dense attention computed in the inputs' own dtype: the same-precision baseline (every
    parameter of `genoformer.kernels.reference.reference_attention`, the same dropout mask)."""
    if varlen is not None:
        cu_q, cu_k = varlen.cu_seqlens_q.tolist(), varlen.cu_seqlens_k.tolist()
        outs = []
        for s in range(len(cu_q) - 1):
            slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s]
            rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
            outs.append(
                naive_attention(
                    q[:, :, rows],
                    k[:, :, keys],
                    v[:, :, keys],
                    causal=causal,
                    scale=scale,
                    window=window,
                    alibi_slopes=slopes,
                    softcap=softcap,
                    dropout_p=dropout_p,
                    dropout_rng=dropout_rng,
                    first_row=s,
                )
            )
        return torch.cat(outs, dim=2)
    B, Hq, L, D = q.shape
    S = k.shape[2]
    group = Hq // k.shape[1]
    scale = D**-0.5 if scale is None else scale
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes.to(q.device), B, L, S, q.dtype)
    mask = allowed_mask(
        L,
        S,
        causal=causal,
        layout=layout,
        kv_lens=kv_lens,
        device=q.device,
        cu_seqlens=cu_seqlens,
        batch=B,
        window=window,
    )
    if mask is None:
        probs = torch.softmax(scores, -1)
    else:
        probs = torch.softmax(scores.masked_fill(~mask, torch.finfo(q.dtype).min), -1) * mask
    if dropout_p > 0:
        probs = probs * keep_mask(dropout_rng, dropout_p, B, Hq, L, S, first_row).to(q.device) / (1 - dropout_p)
    return probs @ v


def cu_seqlens_of(docs: list[list[int]]) -> torch.Tensor:
    """The (N+1,) int32 cu_seqlens of rows packed with documents of the given lengths."""
    lengths = [n for row in docs for n in row]
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def per_document(q, k, v, docs: list[list[int]], *, causal=False, layout=None, scale=None):
    """Attention of each document alone, written back in place: the independent judge of packing.

    Every document [s, e) of row b runs through `masked_attention` as its own sequence; with a
    layout, its (e-s) x (e-s) corner of the layout's token mask is passed as an explicit mask,
    since a layout applies to positions within the row. Differentiable.
    """
    rows = []
    for b, lengths in enumerate(docs):
        pieces, start = [], 0
        for n in lengths:
            end = start + n
            mask = None if layout is None else layout.token_mask(causal)[:, start:end, start:end]
            q1, k1, v1 = (t[b : b + 1, :, start:end] for t in (q, k, v))
            pieces.append(masked_attention(q1, k1, v1, causal=causal, mask=mask, scale=scale))
            start = end
        assert start == q.shape[2], f"row {b}: documents cover {start} of {q.shape[2]} tokens"
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0)


def masked_attention(q, k, v, *, causal=False, mask=None, scale=None):
    """Dense attention of one sequence with an optional explicit (Hm, L, S) bool mask, in q's dtype."""
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    L, S = scores.shape[-2:]
    allowed = torch.ones(L, S, dtype=torch.bool).tril() if causal else torch.ones(L, S, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    probs = torch.softmax(scores.masked_fill(~allowed, torch.finfo(q.dtype).min), -1) * allowed
    return probs @ v


def reference(q, k, v, dout, **kwargs) -> Result:
    """The float64 reference's output and gradients; it takes every parameter of the Triton
    kernels' (windows, softcap, dropout, varlen batches), beyond those of `attention`."""
    return run_with_grads(reference_attention, q, k, v, dout, **kwargs)


def assert_matches_reference(result: Result, expected: Result, atol=1e-10, rtol=1e-8) -> None:
    """float64 comparison of output and all three gradients; NaN never passes."""
    for name, value in result.tensors().items():
        assert not value.isnan().any(), f"{name} has NaN"
        torch.testing.assert_close(value, expected.tensors()[name], atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


@pytest.fixture
def attn():
    """The helpers above, as one object: attn.make_qkv, attn.reference, ..."""
    helpers = (
        make_qkv,
        run_with_grads,
        naive_attention,
        reference,
        assert_matches_reference,
        cu_seqlens_of,
        per_document,
        masked_attention,
    )
    return SimpleNamespace(**{fn.__name__: fn for fn in helpers})
