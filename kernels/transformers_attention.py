"""Our kernels as a Hugging Face transformers attention implementation: ``attn_implementation="genoformer"``.

    import genoformer.kernels.transformers_attention           # registers "genoformer"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="genoformer")

Importing this module registers the name "genoformer" with transformers' ``AttentionInterface``
(the attention function) and ``AttentionMaskInterface`` (what the model hands it as a mask), so
that every model whose attention layers call ``ALL_ATTENTION_FUNCTIONS.get_interface`` (those with
``_supports_attention_backend``: Llama, Mistral, Qwen2, Gemma, ESM / Nucleotide Transformer and
many more) runs on ``genoformer.kernels.attention`` with the backend `auto` chooses (our Triton
kernels on an Ampere or newer GPU unless a faster measured backend runs the inputs; SDPA on a
CPU). ``register(name, backend)`` registers another name with a fixed backend (the tests register
"genoformer_reference" and "genoformer_triton").

What the model hands over (flash-attn's contract in transformers, which these models keep for
``flash_attention_2``): the mask function returns the 2D padding mask (B, Lk) of the keys, or
None without padding; the attention function gets is_causal (or the module's), the model's
sliding_window, softcap, the dropout rate, and position_ids (packed sequences: a position that
does not follow its predecessor starts a document).

How it runs (``_route``), q (B, H, Lq, D) and k, v (B, HKV, Lk, D) as the model gives them:
- Lq == Lk, no window shorter than the keys, no softcap, no dropout: our attention entry point,
  causal or bidirectional, GQA as is; right padding as key lengths (kv_lens), any other padding
  whose valid keys are one run per row, and packed sequences, as documents (cu_seqlens: the
  padding of a row becomes documents of its own, whose outputs the model ignores). Autograd
  runs through it: training works.
- decoding with a cache (Lq < Lk), sliding windows and softcap, without gradients: the decoding
  path of ``genoformer.kernels.kvcache`` (the Triton decoding kernel on a GPU), the mask aligned
  at the bottom right, left padding as each row's first key.
- anything else (a custom 4D mask pattern, attention dropout in training, padding with holes, a
  window or softcap under autograd): transformers' SDPA path on the same mask, with a WARNING on
  the "genoformer.kernels" logger naming the reason once per situation.
The outputs are those of ``attn_implementation="sdpa"`` up to rounding (tests: tiny Llama,
Mistral with a sliding window, and ESM models, logits and gradients).
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

from genoformer.kernels.backend import Backend
from genoformer.kernels.dispatch import attention
from genoformer.kernels.kvcache import _run as decode_run

logger = logging.getLogger("genoformer.kernels")

NAME = "genoformer"
_warned: set[str] = set()


# ------------------------------------------------------------------------------------ masks
def genoformer_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                    mask_function: Optional[Callable] = None, attention_mask: Optional[torch.Tensor] = None,
                    use_vmap: bool = False, **kwargs) -> Optional[torch.Tensor]:
    """The mask a model hands to the attention function: the (B, Lk) bool padding mask of the keys,
    or None without padding (flash-attn's form); for a custom pattern (transformers builds those
    with use_vmap) the full (B, 1, Lq, Lk) bool mask, which the attention function runs on SDPA."""
    if use_vmap:
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         allow_is_causal_skip=False, use_vmap=True, device=kwargs.get("device", "cpu"))
    return flash_attention_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                kv_offset=kv_offset, attention_mask=attention_mask)


class Padding(NamedTuple):
    """The valid keys of each row of a 2D padding mask, when they are one run [lo_B, hi_B) per row."""

    lo_B: torch.Tensor
    hi_B: torch.Tensor
    right_only: bool
    """Every run starts at key 0 (right padding: kv_lens)."""


_PADDINGS = WeakIdKeyDictionary()  # mask tensor -> Padding or None (holes); one host read per forward pass
_DOCUMENTS = WeakIdKeyDictionary()  # position_ids tensor -> cu_seqlens or None (not packed)


def padding_runs(mask_BL: torch.Tensor) -> Optional[Padding]:
    """The one run of valid keys per row of a (B, Lk) padding mask, None when a row has holes
    (valid keys on both sides of a padded one). Read on the host once per mask tensor."""
    if mask_BL in _PADDINGS:
        return _PADDINGS[mask_BL]
    valid_BL = mask_BL.bool()
    count_B = valid_BL.sum(-1)
    lo_B = torch.where(count_B > 0, valid_BL.int().argmax(-1), 0)
    keys_L = torch.arange(valid_BL.shape[1], device=valid_BL.device)
    run_BL = (keys_L >= lo_B[:, None]) & (keys_L < (lo_B + count_B)[:, None])
    runs = None
    if bool((run_BL == valid_BL).all()):
        runs = Padding(lo_B.to(torch.int32), (lo_B + count_B).to(torch.int32), bool((lo_B == 0).all()))
    _PADDINGS[mask_BL] = runs
    return runs


def packed_documents(position_ids_BL: Optional[torch.Tensor], batch: int, length: int) -> Optional[torch.Tensor]:
    """cu_seqlens (N + 1,) int32 of sequences packed in the rows (a position that does not follow its
    predecessor by 1 starts a document; every row starts one), None when no row is packed."""
    if position_ids_BL is None or position_ids_BL.shape[-1] != length:
        return None
    if position_ids_BL in _DOCUMENTS:
        return _DOCUMENTS[position_ids_BL]
    positions_BL = position_ids_BL.expand(batch, -1)
    starts_BL = torch.ones_like(positions_BL, dtype=torch.bool)
    starts_BL[:, 1:] = positions_BL[:, 1:] != positions_BL[:, :-1] + 1
    cu_seqlens = None
    if bool(starts_BL[:, 1:].any()):
        flat = torch.nonzero(starts_BL.flatten()).flatten()
        ends = torch.tensor([batch * length], device=flat.device)
        cu_seqlens = torch.cat([flat, ends]).to(torch.int32)
    _DOCUMENTS[position_ids_BL] = cu_seqlens
    return cu_seqlens


def _documents_of_runs(runs: Padding, length: int) -> torch.Tensor:
    """cu_seqlens of rows whose valid keys are [lo, hi): each row's documents [0, lo), [lo, hi), [hi, L)
    (empty ones dropped)."""
    rows_B1 = torch.arange(len(runs.lo_B), device=runs.lo_B.device)[:, None] * length
    bounds_B3 = torch.stack([runs.lo_B, runs.hi_B, torch.full_like(runs.hi_B, length)], dim=1) + rows_B1
    starts = torch.cat([torch.zeros(1, dtype=torch.long, device=runs.lo_B.device), bounds_B3.flatten().long()])
    return torch.unique_consecutive(starts).to(torch.int32)


# ------------------------------------------------------------------------------- the routes
def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("attn_implementation=%r runs transformers' SDPA here, not our kernels: %s", NAME, reason)


def _sdpa_fallback(module, query, key, value, mask, *, causal, window, dropout, scaling, reason):
    """transformers' SDPA path on the full bool mask (B, 1, Lq, Lk) of `mask`, causal and window."""
    _warn_once(reason)
    if mask is not None and mask.dim() == 2:
        B, Lq, Lk = query.shape[0], query.shape[2], key.shape[2]
        keys_K = torch.arange(Lk, device=query.device)
        pos_L1 = (torch.arange(Lq, device=query.device) + Lk - Lq)[:, None]
        allowed_LK = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device)
        if causal:
            allowed_LK &= keys_K <= pos_L1
        if window is not None:
            allowed_LK &= keys_K > pos_L1 - window
        mask = allowed_LK & mask.bool()[:, None, None, :]
        # rows with no allowed key (padded queries): opened, their output is ignored by the model
        mask = mask | ~mask.any(-1, keepdim=True)
        causal = False
    elif mask is None and window is not None:
        return _sdpa_fallback(module, query, key, value,
                              torch.ones(query.shape[0], key.shape[2], dtype=torch.bool, device=query.device),
                              causal=causal, window=window, dropout=dropout, scaling=scaling, reason=reason)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=causal)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def make_attention_forward(backend: Backend) -> Callable:
    """The attention function registered for `backend` (see the module docstring)."""

    def genoformer_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                     scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                                     softcap: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
        B, H, Lq, D = query.shape
        Lk = key.shape[2]
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and Lq > 1
        window = sliding_window if sliding_window is not None and sliding_window < Lk else None
        scale = D ** -0.5 if scaling is None else float(scaling)
        fallback = dict(causal=causal, window=window, dropout=dropout, scaling=scaling)
        if attention_mask is not None and attention_mask.dim() == 4:
            return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                  reason="the model built a custom mask pattern (a 4D mask)")
        if dropout > 0:
            return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                  reason="attention dropout in training (our kernels have none)")
        runs = None
        if attention_mask is not None:
            runs = padding_runs(attention_mask)
            if runs is None:
                return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                      reason="a padding mask with padded keys between valid ones")
        if Lq == Lk and window is None and not softcap:
            kv_lens, cu_seqlens = None, None
            if runs is not None and runs.right_only:
                kv_lens = runs.hi_B
            elif runs is not None:
                cu_seqlens = _documents_of_runs(runs, Lk)
            else:
                cu_seqlens = packed_documents(kwargs.get("position_ids"), B, Lq)
            out_BHLD = attention(query, key, value, causal=causal, kv_lens=kv_lens, cu_seqlens=cu_seqlens,
                                 scale=scale, backend=backend)
            return out_BHLD.transpose(1, 2), None
        if _needs_grad(query, key, value):
            return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                  reason="a sliding window, softcap or a cache under autograd (our decoding path "
                                         "has no backward)")
        seqlens_B = torch.full((B,), Lk, dtype=torch.int32, device=query.device)
        leftpad_B = None
        if runs is not None:
            if not causal and window is not None:
                return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                      reason="padding with a bidirectional sliding window")
            if causal and not bool((runs.hi_B == Lk).all()) and Lq < Lk:
                return _sdpa_fallback(module, query, key, value, attention_mask, **fallback,
                                      reason="padding after the last key while decoding with a cache")
            # causal: queries sit at the last Lq keys, and the keys after a valid query are never seen;
            # bidirectional without a window: positions do not matter, the valid run is the keys
            leftpad_B = runs.lo_B
            if not causal:
                seqlens_B = runs.hi_B
        out_BHLD, _ = decode_run(query, key, value, seqlens_B, backend=backend, want_lse=False, scale=scale,
                                 causal=causal, window=(window - 1 if window else -1, window - 1 if window else -1),
                                 leftpad_B=leftpad_B, batch_idx_B=None, block_table=None, alibi_slopes=None,
                                 softcap=float(softcap or 0.0), num_splits=0)
        return out_BHLD.transpose(1, 2), None

    return genoformer_attention_forward


def register(name: str = NAME, backend: Backend | str = Backend.AUTO) -> str:
    """Register `name` with transformers' attention and mask interfaces, running on `backend`;
    returns the name to pass as attn_implementation."""
    AttentionInterface.register(name, make_attention_forward(Backend(backend)))
    AttentionMaskInterface.register(name, genoformer_mask)
    return name


register()
