"""Stand-ins for the flash-attn 2 and flash-attn-4 packages, for CPU tests of our adapters.

They implement the documented semantics of the real entry points, computed densely in float64
(and accept float64 inputs, so that the adapters can be judged against the reference at 1e-10):

    flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1))
        q (B, L, Hq, D), k and v (B, S, Hkv, D), GQA when Hkv < Hq. Query i may attend key j iff
        j <= i + (S - L) + right and j >= i + (S - L) - left (a bound of -1 in flash-attn 2, None
        in flash-attn-4, is no bound; causal sets right = 0): masks are aligned to the bottom
        right when L != S. A query with no allowed key gives 0.
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
        q (Tq, Hq, D), k and v (Tk, Hkv, D): sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
        of q against rows cu_seqlens_k[b]:cu_seqlens_k[b+1] of k, each with the rule above.
    flash-attn-4 returns (out, lse); its block-sparsity arguments are not used by genoformer, so
        the fake refuses them. flash-attn 2 returns (out, lse, None) with return_attn_probs=True.
        lse is the natural log, (B, H, L) or (H, T) from the varlen functions, +inf for an empty row.

`install(monkeypatch, v2=True, v4=True)` puts the chosen fakes into sys.modules the way the
real packages appear: flash-attn-4 alone makes `flash_attn` a package without flash_attn_func.
"""

from __future__ import annotations

import sys
import types

import torch


def _bound(value) -> int | None:
    return None if value is None or value < 0 else value


def _allowed_LS(L: int, S: int, *, causal: bool, window_size) -> torch.Tensor:
    left, right = _bound(window_size[0]), _bound(window_size[1])
    if causal:
        right = 0
    i_L1 = torch.arange(L).unsqueeze(1) + (S - L)  # bottom-right aligned query position
    j_1S = torch.arange(S).unsqueeze(0)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if right is not None:
        allowed &= j_1S <= i_L1 + right
    if left is not None:
        allowed &= j_1S >= i_L1 - left
    return allowed


def _attend(q_LHD, k_SHD, v_SHD, allowed_HLS, scale):
    """Dense attention of one sequence in float64 with a (1 or H, L, S) mask; empty rows give 0."""
    group = q_LHD.shape[1] // k_SHD.shape[1]
    q_HLD = q_LHD.double().transpose(0, 1)
    k_HSD = k_SHD.double().repeat_interleave(group, 1).transpose(0, 1)
    v_HSD = v_SHD.double().repeat_interleave(group, 1).transpose(0, 1)
    scale = q_LHD.shape[-1] ** -0.5 if scale is None else scale
    scores_HLS = (q_HLD @ k_HSD.transpose(1, 2)) * scale
    scores_HLS = scores_HLS.masked_fill(~allowed_HLS, torch.finfo(torch.float64).min)
    probs_HLS = torch.softmax(scores_HLS, -1) * allowed_HLS
    lse_HL = torch.logsumexp(scores_HLS, -1).masked_fill(~allowed_HLS.any(-1), float("inf"))
    return (probs_HLS @ v_HSD).transpose(0, 1).to(q_LHD.dtype), lse_HL


def _check(q, k, v):
    assert q.dtype == k.dtype == v.dtype and q.shape[-2] % k.shape[-2] == 0, "flash-attn: dtype or GQA heads"
    assert k.shape == v.shape and all(t.stride(-1) == 1 for t in (q, k, v)), "flash-attn: last dim contiguous"


def _dense(q, k, v, softmax_scale, causal, window_size):
    _check(q, k, v)
    L, S = q.shape[1], k.shape[1]
    allowed_LS = _allowed_LS(L, S, causal=causal, window_size=window_size)
    outs, lses = [], []
    for b in range(q.shape[0]):
        allowed_HLS = allowed_LS.unsqueeze(0)
        out, lse = _attend(q[b], k[b], v[b], allowed_HLS, softmax_scale)
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size):
    _check(q, k, v)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32, "flash-attn: cu_seqlens must be int32"
    assert len(cu_seqlens_q) == len(cu_seqlens_k), "flash-attn: one cu_seqlens entry per sequence"
    assert int(cu_seqlens_q[-1]) == q.shape[0] and int(cu_seqlens_k[-1]) == k.shape[0], "flash-attn: totals"
    outs, lses = [], []
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1, k0, k1 = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1]))
        assert q1 - q0 <= max_seqlen_q and k1 - k0 <= max_seqlen_k, "flash-attn: max_seqlen too small"
        allowed_LS = _allowed_LS(q1 - q0, k1 - k0, causal=causal, window_size=window_size)
        out, lse = _attend(q[q0:q1], k[k0:k1], v[k0:k1], allowed_LS.unsqueeze(0), softmax_scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


# ------------------------------------------------------------------------------ flash-attn 2
def _v2_outputs(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def v2_flash_attn_func(
    q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), return_attn_probs=False
):
    assert dropout_p == 0.0
    return _v2_outputs(*_dense(q, k, v, softmax_scale, causal, window_size), return_attn_probs)


def v2_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    return_attn_probs=False,
):
    assert dropout_p == 0.0
    outputs = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size
    )
    return _v2_outputs(*outputs, return_attn_probs)


# ------------------------------------------------------------------------------ flash-attn-4
def v4_flash_attn_func(
    q,
    k,
    v,
    qv=None,
    gather_kv_indices=None,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    return_lse=False,
):
    assert block_sparse_tensors is None and block_sparse_tensors_bwd is None
    return _dense(q, k, v, softmax_scale, causal, window_size)


def v4_flash_attn_varlen_func(
    q,
    k,
    v,
    qv=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    block_sparse_tensors=None,
    return_lse=False,
):
    assert block_sparse_tensors is None
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size)


# ------------------------------------------------------------------------------- installing
def install(monkeypatch, *, v2: bool = True, v4: bool = True) -> None:
    """Put the fake packages into sys.modules (and forget earlier import checks)."""
    from genoformer.kernels import flash_attn_backend

    flash_attn_backend.import_error.cache_clear()
    package = types.ModuleType("flash_attn")
    package.__path__ = []  # a package (namespace-like when flash-attn-4 is installed alone)
    if v2:
        package.flash_attn_func = v2_flash_attn_func
        package.flash_attn_varlen_func = v2_flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    if v4:
        cute = types.ModuleType("flash_attn.cute")
        cute.__path__ = []
        cute.flash_attn_func = v4_flash_attn_func
        cute.flash_attn_varlen_func = v4_flash_attn_varlen_func
        package.cute = cute
        monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    else:
        monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import raises ModuleNotFoundError
