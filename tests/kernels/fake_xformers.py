"""A stand-in for the xformers package, for CPU tests of our adapter (kernels/xformers_backend.py).

It implements the documented semantics of the parts the adapter uses, computed densely in float64
(and accepts float64 inputs, so that the adapter can be judged against the reference at 1e-10):

    xformers.ops.memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None)
        query (B, M, H, K) or (B, M, G, H, K) (GQA: key and value (B, N, G, H, K), expanded over H),
        key and value (B, N, H, K) / (B, N, G, H, K). Returns query's shape with value's last dim.
    xformers.ops.fmha.attn_bias:
        LowerTriangularMask()                    query i sees keys j <= i (top left)
        BlockDiagonalMask.from_seqlens(q_seqlen, kv_seqlen=None)
                                                 B == 1: query block b sees key block b
        BlockDiagonalCausalMask.from_seqlens(...) and j <= i within the block (top left)
        BlockDiagonalPaddedKeysMask.from_seqlens(q_seqlen, kv_padding, kv_seqlen)
                                                 key block b starts at b * kv_padding, its first
                                                 kv_seqlen[b] keys valid
        BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(q_seqlen, kv_padding, kv_seqlen)
                                                 and j <= i + kv_seqlen[b] - q_seqlen[b] (in-block
                                                 indices: bottom right)
    A query with no allowed key gives 0 in the fake (the adapter never relies on it: it zeroes
    the rows it knows to be empty).

`install(monkeypatch)` puts the fake modules into sys.modules.
"""

from __future__ import annotations

import sys
import types

import torch


class LowerTriangularMask:
    def allowed(self, M: int, N: int) -> torch.Tensor:
        return torch.arange(N)[None, :] <= torch.arange(M)[:, None]


class _Blocks:
    """Query blocks (consecutive, of q_seqlen) against key blocks (at kv_starts, kv_seqlen keys)."""

    causal = False
    bottom_right = False

    def __init__(self, q_seqlen, kv_starts, kv_seqlen):
        self.q_seqlen, self.kv_starts, self.kv_seqlen = list(q_seqlen), list(kv_starts), list(kv_seqlen)

    def allowed(self, M: int, N: int) -> torch.Tensor:
        assert sum(self.q_seqlen) == M, f"xformers fake: queries {M} != sum of q_seqlen {sum(self.q_seqlen)}"
        allowed = torch.zeros(M, N, dtype=torch.bool)
        q0 = 0
        for q_len, k0, k_len in zip(self.q_seqlen, self.kv_starts, self.kv_seqlen):
            assert k0 + k_len <= N
            block = torch.ones(q_len, k_len, dtype=torch.bool)
            if self.causal:
                offset = k_len - q_len if self.bottom_right else 0
                block = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + offset
            allowed[q0 : q0 + q_len, k0 : k0 + k_len] = block
            q0 += q_len
        return allowed


def _starts(lengths):
    starts, total = [], 0
    for n in lengths:
        starts.append(total)
        total += n
    return starts


class BlockDiagonalMask(_Blocks):
    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen=None, *, device=None):
        kv_seqlen = list(q_seqlen) if kv_seqlen is None else kv_seqlen
        return cls(q_seqlen, _starts(kv_seqlen), kv_seqlen)


class BlockDiagonalCausalMask(BlockDiagonalMask):
    causal = True


class BlockDiagonalPaddedKeysMask(_Blocks):
    @classmethod
    def from_seqlens(cls, q_seqlen, kv_padding, kv_seqlen, causal_diagonal=None, *, device=None):
        assert all(n <= kv_padding for n in kv_seqlen)
        return cls(q_seqlen, [b * kv_padding for b in range(len(kv_seqlen))], kv_seqlen)


class BlockDiagonalCausalWithOffsetPaddedKeysMask(BlockDiagonalPaddedKeysMask):
    causal = True
    bottom_right = True


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, op=None, output_dtype=None):
    assert p == 0.0, "xformers fake: no dropout"
    assert query.dim() == key.dim() == value.dim() and query.dim() in (4, 5)
    assert key.shape == value.shape and key.shape[0] == query.shape[0] and key.shape[2:] == query.shape[2:]
    B, M = query.shape[:2]
    N, K = key.shape[1], query.shape[-1]
    q_BHMK = query.double().reshape(B, M, -1, K).transpose(1, 2)
    k_BHNK = key.double().reshape(B, N, -1, K).transpose(1, 2)
    v_BHNK = value.double().reshape(B, N, -1, K).transpose(1, 2)
    scale = K**-0.5 if scale is None else scale
    scores = (q_BHMK @ k_BHNK.transpose(-1, -2)) * scale
    if attn_bias is not None:
        assert B == 1 or not isinstance(attn_bias, _Blocks), "xformers fake: block-diagonal masks need B == 1"
        allowed = attn_bias.allowed(M, N).to(query.device)
        scores = scores.masked_fill(~allowed, torch.finfo(torch.float64).min)
        probs = torch.softmax(scores, -1) * allowed
    else:
        probs = torch.softmax(scores, -1)
    out = (probs @ v_BHNK).transpose(1, 2).reshape(query.shape)
    return out.to(query.dtype)


def install(monkeypatch) -> None:
    """Make `import xformers.ops` and `xformers.ops.fmha.attn_bias` find the fakes."""
    package = types.ModuleType("xformers")
    package.__path__ = []
    ops = types.ModuleType("xformers.ops")
    ops.__path__ = []
    ops.memory_efficient_attention = memory_efficient_attention
    fmha = types.ModuleType("xformers.ops.fmha")
    fmha.__path__ = []
    bias = types.ModuleType("xformers.ops.fmha.attn_bias")
    for cls in (
        LowerTriangularMask,
        BlockDiagonalMask,
        BlockDiagonalCausalMask,
        BlockDiagonalPaddedKeysMask,
        BlockDiagonalCausalWithOffsetPaddedKeysMask,
    ):
        setattr(bias, cls.__name__, cls)
    package.ops, ops.fmha, fmha.attn_bias = ops, fmha, bias
    for name, module in (
        ("xformers", package),
        ("xformers.ops", ops),
        ("xformers.ops.fmha", fmha),
        ("xformers.ops.fmha.attn_bias", bias),
    ):
        monkeypatch.setitem(sys.modules, name, module)
