"""flash-attn 2's functions over genoformer's kernels: swap the import, keep the calls.

    from flash_attn import flash_attn_func, flash_attn_varlen_func            # before
    from genoformer.kernels.flash_attn_compat import flash_attn_func, flash_attn_varlen_func  # after

Every function takes flash-attn 2's arguments in flash-attn 2's order, the (batch, seqlen, heads,
headdim) layout (varlen: (total_tokens, heads, headdim) with cumulative lengths), and returns what
flash-attn 2 returns: the output in that layout, and with return_attn_probs also (softmax_lse,
S_dmask). It runs everywhere: on CUDA tensors the Triton kernels (``genoformer.kernels.triton_flash``),
on CPU tensors the float64 reference (``genoformer.kernels.reference``; small inputs), each with
every parameter below, dropout included.

Parameters, as flash-attn 2 defines them (see ``genoformer.kernels.reference`` for the formulas):
    dropout_p          attention dropout; the mask comes from a seed drawn from torch's generator for
                       the inputs' device (``genoformer.kernels.dropout``), so torch.manual_seed makes a
                       call repeatable, and the backward regenerates the same mask
    softmax_scale      default 1 / sqrt(headdim)
    causal             bottom-right aligned when seqlen_q != seqlen_k
    window_size        (left, right), -1 for an unbounded side; exact to the token
    softcap            > 0: softcap * tanh(scores / softcap)
    alibi_slopes       (nheads,) or (batch_size, nheads) fp32: -slope * |i + seqlen_k - seqlen_q - j|
    deterministic      accepted; the backward here is always deterministic
    return_attn_probs  also returns softmax_lse (batch, nheads, seqlen_q) fp32 (varlen: (nheads,
                       total_q)), +inf for a row with no key, and S_dmask: with dropout_p > 0 the
                       probabilities (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up
                       to 128) scaled per block of ATTN_PROBS_BLOCK_N keys by exp(-running max) as
                       flash-attn stores them, negative where dropped; without dropout an empty
                       tensor, as flash-attn returns. flash-attn calls this option "for testing only";
                       here S_dmask is computed beside the kernels in PyTorch (memory O(L^2)).
Head dims 1 to 256 (no multiple of 8 is needed: the launcher pads), fp16 and bf16 on GPUs.

flash_attn_with_kvcache (decoding over a key/value cache, paged or not) is
``genoformer.kernels.kvcache``'s, re-exported here. flash_attn_varlen_func's block_table (a paged
cache, forward only in flash-attn) gathers the pages into contiguous keys first: right, not fast.
`UnsupportedFeature` is what a flash-attn feature this module lacks raises, naming the parameter;
new entry points build on `_flash_call`.

Shape legend: B batch, L / S query / key length, T total tokens of a varlen batch, H / Hk query /
key-value heads, D head dim; suffixes name a tensor's layout (q_BLHD, q_BHLD).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from genoformer.kernels.dropout import draw_rng, keep_mask
from genoformer.kernels.kvcache import flash_attn_with_kvcache
from genoformer.kernels.reference import alibi_bias, reference_attention, window_mask

ATTN_PROBS_BLOCK_N = 128
"""Keys per block of return_attn_probs' S_dmask scaling (flash-attn's `_get_block_size_n`)."""
ATTN_PROBS_ROUND = 128
"""S_dmask's lengths are rounded up to a multiple of this, as flash-attn 2's are."""

__all__ = [
    "ATTN_PROBS_BLOCK_N",
    "UnsupportedFeature",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "pad_input",
    "unpad_input",
]


class UnsupportedFeature(NotImplementedError):
    """A flash-attn feature this module does not have: its message names the parameter."""

    def __init__(self, parameter: str, feature: str) -> None:
        self.parameter = parameter
        super().__init__(
            f"genoformer.kernels.flash_attn_compat does not support {parameter} ({feature}) yet; call without it, "
            f"or use flash-attn itself for it."
        )


# ------------------------------------------------------------------------------ the one call
def _window(window_size) -> tuple[int | None, int | None] | None:
    """flash-attn's window_size (ints or a tensor of two; -1 unbounded) as (left, right), None-unbounded."""
    left, right = (int(side) for side in window_size)
    if left < 0 and right < 0:
        return None
    return (None if left < 0 else left, None if right < 0 else right)


def _flash_call(
    q_BHLD: torch.Tensor,
    k_BHLD: torch.Tensor,
    v_BHLD: torch.Tensor,
    *,
    dropout_p: float,
    softmax_scale: float | None,
    causal: bool,
    window_size,
    softcap: float,
    alibi_slopes,
    return_attn_probs: bool,
    varlen=None,
):
    """Attention of (B, H, L, D) views (varlen: B = 1 and a `triton_flash.Varlen`): (out_BHLD, lse_BHL
    or None, S_dmask or None). The Triton kernels on CUDA tensors, the float64 reference elsewhere."""
    window = _window(window_size)
    rng = draw_rng(q_BHLD.device) if dropout_p > 0 else None
    kwargs: dict[str, Any] = dict(
        causal=causal,
        scale=softmax_scale,
        window=window,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        dropout_p=dropout_p,
        dropout_rng=rng,
        varlen=varlen,
        return_lse=return_attn_probs,
    )
    if q_BHLD.is_cuda:
        from genoformer.kernels.triton_flash import triton_attention

        result = triton_attention(q_BHLD, k_BHLD, v_BHLD, **kwargs)
    else:
        result = reference_attention(q_BHLD, k_BHLD, v_BHLD, **kwargs)
    if not return_attn_probs:
        return result, None, None
    out_BHLD, lse_BHL = result
    lse_BHL = lse_BHL.detach().float().masked_fill(lse_BHL == float("-inf"), float("inf"))  # flash-attn's empty row
    if dropout_p > 0:
        probs = _attn_probs(
            q_BHLD, k_BHLD, softmax_scale, causal, window, softcap, alibi_slopes, dropout_p, rng, varlen
        )
    else:
        probs = q_BHLD.new_empty((0,))
    return out_BHLD, lse_BHL, probs


def _attn_probs(q_BHLD, k_BHLD, scale, causal, window, softcap, alibi_slopes, dropout_p, rng, varlen) -> torch.Tensor:
    """S_dmask as flash-attn 2 returns it (module docstring): (B, H, L_r, S_r) in q's dtype."""
    if varlen is None:
        return _probs_of(
            q_BHLD,
            k_BHLD,
            scale,
            causal,
            window,
            softcap,
            alibi_slopes,
            dropout_p,
            rng,
            0,
            q_BHLD.shape[2],
            k_BHLD.shape[2],
        )
    cu_q, cu_k = varlen.cu_seqlens_q.tolist(), varlen.cu_seqlens_k.tolist()
    parts = []
    for s in range(len(cu_q) - 1):
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[s : s + 1]
        parts.append(
            _probs_of(
                q_BHLD[:, :, cu_q[s] : cu_q[s + 1]],
                k_BHLD[:, :, cu_k[s] : cu_k[s + 1]],
                scale,
                causal,
                window,
                softcap,
                slopes,
                dropout_p,
                rng,
                s,
                varlen.max_seqlen_q,
                varlen.max_seqlen_k,
            )
        )
    return torch.cat(parts, dim=0)


def _probs_of(
    q_BHLD, k_BHLD, scale, causal, window, softcap, alibi_slopes, dropout_p, rng, first_row, max_q, max_k
) -> torch.Tensor:
    """exp(s - m) per block of ATTN_PROBS_BLOCK_N keys, m the max over that block and those after it
    (flash-attn's running max), negative where dropout dropped, zero-padded to (L_r, S_r)."""
    B, H, L, D = q_BHLD.shape
    S = k_BHLD.shape[2]
    scale = D**-0.5 if scale is None else scale
    k_BHSD = k_BHLD.float().repeat_interleave(H // k_BHLD.shape[1], dim=1)
    scores = torch.matmul(q_BHLD.float(), k_BHSD.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes.float(), B, L, S, torch.float32)
    left, right = window if window is not None else (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    allowed = window_mask(L, S, (left, right), q_BHLD.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    blocks = max(1, math.ceil(S / ATTN_PROBS_BLOCK_N))
    block_max = (
        F.pad(scores, (0, blocks * ATTN_PROBS_BLOCK_N - S), value=float("-inf"))
        .view(B, H, L, blocks, ATTN_PROBS_BLOCK_N)
        .amax(-1)
    )
    running = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)  # max over block j and those after it
    running_S = running.repeat_interleave(ATTN_PROBS_BLOCK_N, dim=-1)[..., :S]
    probs = torch.exp(scores - running_S.masked_fill(running_S == float("-inf"), 0.0))
    kept = keep_mask(rng, dropout_p, B, H, L, S, first_row).to(probs.device)
    probs = torch.where(kept, probs, -probs).to(q_BHLD.dtype)
    L_r, S_r = (-(-n // ATTN_PROBS_ROUND) * ATTN_PROBS_ROUND for n in (max_q, max_k))
    return F.pad(probs, (0, S_r - S, 0, L_r - L))


def _returns(out_BHLD: torch.Tensor, lse, probs, return_attn_probs: bool, varlen: bool):
    """flash-attn's return value: out in its layout, with (lse, S_dmask) when asked for."""
    out = out_BHLD[0].transpose(0, 1) if varlen else out_BHLD.transpose(1, 2)
    if not return_attn_probs:
        return out
    return out, (lse[0] if varlen else lse), probs


def _heads_first(t_BLHD: torch.Tensor) -> torch.Tensor:
    """A (B, L, H, D) tensor as the (B, H, L, D) view the kernels read in place."""
    return t_BLHD.transpose(1, 2)


def _varlen_heads_first(t_THD: torch.Tensor) -> torch.Tensor:
    """A (T, H, D) tensor as the (1, H, T, D) view of one row holding every sequence."""
    return t_THD.transpose(0, 1).unsqueeze(0)


def _varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    from genoformer.kernels.triton_flash import Varlen

    return Varlen(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))


# ------------------------------------------------------------------------------ flash-attn 2's API
def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_func: q (B, L, H, D), k and v (B, S, Hk, D), H % Hk == 0 ->
    out (B, L, H, D); with return_attn_probs (out, softmax_lse, S_dmask). See the module docstring."""
    out, lse, probs = _flash_call(
        _heads_first(q),
        _heads_first(k),
        _heads_first(v),
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
    )
    return _returns(out, lse, probs, return_attn_probs, varlen=False)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_kvpacked_func: q (B, L, H, D), kv (B, S, 2, Hk, D)."""
    return flash_attn_func(
        q,
        kv[:, :, 0],
        kv[:, :, 1],
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_qkvpacked_func: qkv (B, L, 3, H, D)."""
    return flash_attn_func(
        qkv[:, :, 0],
        qkv[:, :, 1],
        qkv[:, :, 2],
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


def flash_attn_varlen_func(
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
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash-attn 2's flash_attn_varlen_func: q (T_q, H, D), k and v (T_k, Hk, D), cu_seqlens_q and
    cu_seqlens_k (N + 1,) int32, each sequence with its own query and key length -> out (T_q, H, D);
    with return_attn_probs (out, softmax_lse (H, T_q), S_dmask). block_table (N, pages) int32: k and
    v are paged caches (pages, page_size, Hk, D), sequence s reading its keys through row s
    (`_gathered_pages`)."""
    if block_table is not None:
        k, v = _gathered_pages(k, v, block_table, cu_seqlens_k)
    varlen = _varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out, lse, probs = _flash_call(
        _varlen_heads_first(q),
        _varlen_heads_first(k),
        _varlen_heads_first(v),
        dropout_p=dropout_p,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        return_attn_probs=return_attn_probs,
        varlen=varlen,
    )
    return _returns(out, lse, probs, return_attn_probs, varlen=True)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_varlen_kvpacked_func: q (T_q, H, D), kv (T_k, 2, Hk, D)."""
    return flash_attn_varlen_func(
        q,
        kv[:, 0],
        kv[:, 1],
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn 2's flash_attn_varlen_qkvpacked_func: qkv (T, 3, H, D), one cu_seqlens for both."""
    return flash_attn_varlen_func(
        qkv[:, 0],
        qkv[:, 1],
        qkv[:, 2],
        cu_seqlens,
        cu_seqlens,
        max_seqlen,
        max_seqlen,
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
    )


def _gathered_pages(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, cu_seqlens_k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged caches (pages, page_size, Hk, D) read through block_table (N, pages per sequence) into
    contiguous keys and values (T_k, Hk, D): sequence s's first cu_seqlens_k[s + 1] - cu_seqlens_k[s]
    positions, position t on page block_table[s, t // page_size] (differentiable; one host read of T_k)."""
    page_size = k_cache.shape[1]
    cu = cu_seqlens_k.long()
    tokens_T = torch.arange(int(cu[-1]), device=k_cache.device)
    sequence_T = torch.searchsorted(cu, tokens_T, right=True) - 1
    position_T = tokens_T - cu[sequence_T]
    page_T = block_table.long()[sequence_T, position_T // page_size]
    return k_cache[page_T, position_T % page_size], v_cache[page_T, position_T % page_size]


# ------------------------------------------------------------------------------ padding helpers
def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """flash-attn's bert_padding.unpad_input: the tokens of a padded batch (B, L, ...) that
    attention_mask (B, L) (bool or 0/1) marks, one after another.

    Returns (hidden (T, ...), indices (T,) into the flattened B * L tokens, cu_seqlens (B + 1,)
    int32, max_seqlen int, seqused (B,) int32). unused_mask: tokens kept in the output but not
    counted in cu_seqlens' lengths (seqused counts the used ones)."""
    all_mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens_in_batch = all_mask.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_mask.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens_in_batch.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    hidden = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return hidden, indices, cu_seqlens, max_seqlen, used_seqlens_in_batch


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """flash-attn's bert_padding.pad_input: unpad_input's inverse, tokens (T, ...) back into a
    zero-padded (batch, seqlen, ...) tensor (differentiable)."""
    output = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    output = output.index_put((indices,), hidden_states)
    return output.view(batch, seqlen, *hidden_states.shape[1:])
