"""Decoding over a key/value cache: flash-attn's ``flash_attn_with_kvcache``, and the decode step of our models.

    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens, causal=True)

``flash_attn_with_kvcache`` has flash-attn 2's signature, layout and return values: q (B, Lq, H, D),
a cache (Bc, C, HKV, D) (or paged: (pages, page_size, HKV, D) with ``block_table``), new keys and
values appended to the cache in place at ``cache_seqlens``, rotary embeddings applied to them on
the way in, and the attention of q over each row's cache.  It runs everywhere: the Triton decoding
kernel (``genoformer.kernels.triton_decode``, the cache split across programs and merged by
log-sum-exp) where it can run, a PyTorch path elsewhere (a CPU), judged alike by the float64
``kvcache_reference``.  ``decode_attention`` is the same attention in our (B, H, L, D) layout,
which ``genoformer.core.transformer`` decodes with.

Semantics (flash-attn's; the reference is the written-out form).  Row b's keys are the cache
positions [lo_b, hi_b): lo_b = cache_leftpad[b] (or 0) and hi_b = cache_seqlens[b] plus the new
keys' count (or the cache's capacity without cache_seqlens), read from cache row
cache_batch_idx[b] (or b), through the row's pages when paged.  Query i sits at position
pos_i = hi_b - Lq + i (bottom-right alignment): causal lets it see keys j <= pos_i, a window
(left, right) keys pos_i - left <= j <= pos_i + right (-1: unbounded; causal sets right to 0).
softcap > 0 replaces each scaled score s by softcap * tanh(s / softcap); ALiBi slopes subtract
slope_h * |pos_i - j|.  A query with no allowed key outputs 0; its lse is +inf in
``flash_attn_with_kvcache`` (flash-attn's convention) and -inf in ``decode_attention`` (ours,
``genoformer.kernels.dispatch``).  Rotary embeddings (rotary_cos, rotary_sin (seqlen_ro,
rotary_dim / 2)) rotate the new keys at their cache positions cache_seqlens[b] + t (left padding
included, as flash-attn does), and the queries at the same positions when causal or windowed, else
all at cache_seqlens[b]; interleaved pairs (0, 1), (2, 3), ... or halves (GPT-NeoX) as
rotary_interleaved says. window_size's bounds may be ints or one-element tensors.

What is refused (ValueError naming the parameter): paged caches with cache_batch_idx, rotary
embeddings without new keys; positions past the cache's end (CacheOverflow, also a RuntimeError as
flash-attn raises for a block_table too short).

Shape legend: B batch, Bc cache rows, H query heads, HKV key/value heads (H % HKV == 0), Lq queries
per row, Ln new keys per row, C cache positions per row, D head dim, R rotary_dim / 2.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch
import torch.nn.functional as F
from genoformer.kernels.backend import Backend
from genoformer.kernels.reference import lse_dtype

LN2 = math.log(2.0)


class CacheOverflow(ValueError, RuntimeError):
    """Keys past the cache's end: a ValueError like our other refusals, and the RuntimeError that
    flash-attn raises for it, so that code written against either catches it."""


# ---------------------------------------------------------------------------------- the mask
def allowed_keys(
    seqlens_B: torch.Tensor,
    q_len: int,
    capacity: int,
    *,
    causal: bool,
    window: tuple[int, int],
    leftpad_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, 1, Lq, C) bool: query i of row b may attend cache position j (the module docstring's rule)."""
    keys_C = torch.arange(capacity, device=seqlens_B.device)
    hi_B11 = seqlens_B.long().view(-1, 1, 1)
    lo_B11 = torch.zeros_like(hi_B11) if leftpad_B is None else leftpad_B.long().view(-1, 1, 1)
    pos_BL1 = hi_B11 - q_len + torch.arange(q_len, device=seqlens_B.device).view(1, -1, 1)
    left, right = window
    if causal:
        right = 0
    allowed_BLC = ((keys_C >= lo_B11) & (keys_C < hi_B11)).expand(-1, q_len, -1)
    if left >= 0:
        allowed_BLC = allowed_BLC & (keys_C >= pos_BL1 - left)
    if right >= 0:
        allowed_BLC = allowed_BLC & (keys_C <= pos_BL1 + right)
    return allowed_BLC.unsqueeze(1)


def _gathered(
    cache: torch.Tensor, batch_idx_B: torch.Tensor | None, block_table: torch.Tensor | None, batch: int
) -> torch.Tensor:
    """Each batch row's cache as (B, HKV, C, D): its cache row, or its pages laid end to end.
    cache: (Bc, HKV, C, D), or paged (pages, HKV, page_size, D)."""
    if block_table is not None:
        pages_BPKSD = cache[block_table.long()]  # (B, pages, HKV, page_size, D)
        B, P, K, S, D = pages_BPKSD.shape
        return pages_BPKSD.transpose(1, 2).reshape(B, K, P * S, D)
    if batch_idx_B is not None:
        return cache[batch_idx_B.long()]
    return cache[:batch]


def _attend(q_BHLD, k_BKCD, v_BKCD, allowed_B1LC, *, seqlens_B, scale, softcap, alibi_slopes, dtype):
    """softmax over the allowed keys, computed in `dtype`: (out (B, H, Lq, D) in q's dtype, lse (B, H, Lq)
    natural log in ``lse_dtype``, -inf for a row with no allowed key)."""
    B, H, Lq, _ = q_BHLD.shape
    C = k_BKCD.shape[2]
    group = H // k_BKCD.shape[1]
    k_BHCD = k_BKCD.to(dtype).repeat_interleave(group, dim=1)
    v_BHCD = v_BKCD.to(dtype).repeat_interleave(group, dim=1)
    scores_BHLC = torch.matmul(q_BHLD.to(dtype), k_BHCD.transpose(-1, -2)) * scale
    if softcap > 0:
        scores_BHLC = softcap * torch.tanh(scores_BHLC / softcap)
    if alibi_slopes is not None:
        pos_BL1 = seqlens_B.long().view(-1, 1, 1) - Lq + torch.arange(Lq, device=q_BHLD.device).view(1, -1, 1)
        distance_B1LC = (pos_BL1 - torch.arange(C, device=q_BHLD.device)).abs().unsqueeze(1).to(dtype)
        scores_BHLC = scores_BHLC - alibi_slopes.to(dtype).view(-1, H, 1, 1) * distance_B1LC
    scores_BHLC = scores_BHLC.masked_fill(~allowed_B1LC, torch.finfo(dtype).min)
    probs_BHLC = torch.softmax(scores_BHLC, dim=-1) * allowed_B1LC
    out_BHLD = torch.matmul(probs_BHLC, v_BHCD).to(q_BHLD.dtype)
    lse_BHL = torch.logsumexp(scores_BHLC, dim=-1).masked_fill(~allowed_B1LC.any(-1), float("-inf"))
    return out_BHLD, lse_BHL.to(lse_dtype(q_BHLD.dtype))


def kvcache_reference(
    q_BHLD: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_B: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    leftpad_B: torch.Tensor | None = None,
    batch_idx_B: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 judge of decoding: (out (B, H, Lq, D) in q's dtype, lse (B, H, Lq), -inf for a
    row with no allowed key). The cache as ``triton_decode.decode_fwd`` takes it: (Bc, HKV, C, D),
    or paged (pages, HKV, page_size, D) with block_table."""
    k_BKCD = _gathered(k_cache, batch_idx_B, block_table, q_BHLD.shape[0])
    v_BKCD = _gathered(v_cache, batch_idx_B, block_table, q_BHLD.shape[0])
    allowed_B1LC = allowed_keys(
        seqlens_B, q_BHLD.shape[2], k_BKCD.shape[2], causal=causal, window=window, leftpad_B=leftpad_B
    )
    return _attend(
        q_BHLD,
        k_BKCD,
        v_BKCD,
        allowed_B1LC,
        seqlens_B=seqlens_B,
        scale=scale,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        dtype=torch.float64,
    )


def _torch_decode(
    q_BHLD,
    k_cache,
    v_cache,
    seqlens_B,
    *,
    scale,
    causal,
    window,
    leftpad_B,
    batch_idx_B,
    block_table,
    alibi_slopes,
    softcap,
):
    """Decoding in PyTorch at the inputs' precision (float32 for 16-bit inputs): SDPA with a bool mask
    when nothing but the mask changes the scores, the explicit softmax otherwise."""
    k_BKCD = _gathered(k_cache, batch_idx_B, block_table, q_BHLD.shape[0])
    v_BKCD = _gathered(v_cache, batch_idx_B, block_table, q_BHLD.shape[0])
    allowed_B1LC = allowed_keys(
        seqlens_B, q_BHLD.shape[2], k_BKCD.shape[2], causal=causal, window=window, leftpad_B=leftpad_B
    )
    dtype = torch.float64 if q_BHLD.dtype == torch.float64 else torch.float32
    if softcap > 0 or alibi_slopes is not None or q_BHLD.dtype != dtype:
        return _attend(
            q_BHLD,
            k_BKCD,
            v_BKCD,
            allowed_B1LC,
            seqlens_B=seqlens_B,
            scale=scale,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            dtype=dtype,
        )
    row_ok_B1L1 = allowed_B1LC.any(-1, keepdim=True)
    gqa = q_BHLD.shape[1] != k_BKCD.shape[1]
    out_BHLD = (
        F.scaled_dot_product_attention(
            q_BHLD, k_BKCD, v_BKCD, attn_mask=allowed_B1LC | ~row_ok_B1L1, scale=scale, enable_gqa=gqa
        )
        * row_ok_B1L1
    )
    return out_BHLD, None


# ------------------------------------------------------------------------------ choosing the path
@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_reason(q_BHLD: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """None when the Triton decoding kernel can run these tensors here, else why not (without
    importing triton where it is missing)."""
    if not _triton_installed():
        return "triton is not installed: pip install triton (or the extra: pip install 'genoformer[triton]')."
    from genoformer.kernels import triton_decode

    return triton_decode.unsupported_reason(q_BHLD, k_cache, v_cache)


def _run(q_BHLD, k_cache, v_cache, seqlens_B, *, backend: Backend, want_lse: bool, **options):
    """(out, lse or None) of decoding, on the path `backend` asks for: triton (ValueError with the
    reason when it cannot run), reference (float64), auto (triton where it runs, else PyTorch), or any
    other backend's name: the PyTorch path. lse: natural log, -inf for an empty row."""
    if backend in (Backend.AUTO, Backend.TRITON):
        reason = triton_reason(q_BHLD, k_cache, v_cache)
        if reason is None:
            from genoformer.kernels import triton_decode

            left, right = options.pop("window")
            # a compiled graph traces the custom op; eager calls skip its dispatch (host time per step)
            launch = triton_decode.decode_op if torch.compiler.is_compiling() else triton_decode.launch
            out_BHLD, lse2_BHL = launch(
                q_BHLD,
                k_cache,
                v_cache,
                seqlens_B,
                options.pop("scale"),
                options.pop("causal"),
                left,
                right,
                options.pop("leftpad_B"),
                options.pop("batch_idx_B"),
                options.pop("block_table"),
                options.pop("alibi_slopes"),
                float(options.pop("softcap")),
                options.pop("num_splits"),
            )
            return out_BHLD, torch.where(lse2_BHL == float("inf"), float("-inf"), lse2_BHL * LN2)
        if backend is Backend.TRITON:
            raise ValueError(f"backend 'triton' cannot decode these inputs: {reason}")
    options.pop("num_splits")
    if backend is Backend.REFERENCE:
        return kvcache_reference(q_BHLD, k_cache, v_cache, seqlens_B, **options)
    out_BHLD, lse_BHL = _torch_decode(q_BHLD, k_cache, v_cache, seqlens_B, **options)
    if want_lse and lse_BHL is None:
        _, lse_BHL = kvcache_reference(q_BHLD, k_cache, v_cache, seqlens_B, **options)
        lse_BHL = lse_BHL.float()
    return out_BHLD, lse_BHL


def decode_attention(
    q_BHLD: torch.Tensor,
    k_cache_BKCD: torch.Tensor,
    v_cache_BKCD: torch.Tensor,
    cache_seqlens_B: torch.Tensor | None = None,
    *,
    causal: bool = True,
    scale: float | None = None,
    backend: Backend | str = Backend.AUTO,
    num_splits: int = 0,
) -> torch.Tensor:
    """Attention of Lq new queries per row over a cache that already holds their keys and values.

    q_BHLD (B, H, Lq, D); k_cache_BKCD, v_cache_BKCD (B, HKV, C, D) (views of larger buffers are
    read in place); cache_seqlens_B (B,) int32 on q's device: row b's keys are positions
    [0, cache_seqlens_B[b]), its queries the last Lq of them (causal: query i sees the keys up to
    its own position); None: every row holds all C positions (then the PyTorch path needs no mask
    for one query, or a causal one). backend: auto, fp8 and triton run the Triton kernel where it
    can (triton raises the reason where it cannot; fp8 decodes at the cache's precision), reference
    the float64 judge, any other the PyTorch path. Returns (B, H, Lq, D) in q's dtype.
    """
    backend = Backend(backend)
    if backend is Backend.FP8:  # FP8 runs the dense passes; a continuation reads the cache as stored
        backend = Backend.AUTO
    B, _, Lq, _ = q_BHLD.shape
    C = k_cache_BKCD.shape[2]
    scale = q_BHLD.shape[-1] ** -0.5 if scale is None else scale
    torch_path = backend not in (Backend.AUTO, Backend.TRITON, Backend.REFERENCE) or (
        backend is Backend.AUTO and triton_reason(q_BHLD, k_cache_BKCD, v_cache_BKCD) is not None
    )
    if cache_seqlens_B is None and torch_path:
        # every row full: SDPA unmasked for one query or none causal, else with the bottom-right causal mask
        mask_LC = None
        if causal and Lq > 1:
            mask_LC = torch.ones(Lq, C, dtype=torch.bool, device=q_BHLD.device).tril(C - Lq)
        return F.scaled_dot_product_attention(
            q_BHLD,
            k_cache_BKCD,
            v_cache_BKCD,
            attn_mask=mask_LC,
            scale=scale,
            enable_gqa=q_BHLD.shape[1] != k_cache_BKCD.shape[1],
        )
    if cache_seqlens_B is None:
        cache_seqlens_B = torch.full((B,), C, dtype=torch.int32, device=q_BHLD.device)
    out_BHLD, _ = _run(
        q_BHLD,
        k_cache_BKCD,
        v_cache_BKCD,
        cache_seqlens_B,
        backend=backend,
        want_lse=False,
        scale=scale,
        causal=causal,
        window=(-1, -1),
        leftpad_B=None,
        batch_idx_B=None,
        block_table=None,
        alibi_slopes=None,
        softcap=0.0,
        num_splits=num_splits,
    )
    return out_BHLD


# ------------------------------------------------------------------------- flash-attn's signature
def _rotate(
    x_BLHD: torch.Tensor, cos_RL: torch.Tensor, sin_RL: torch.Tensor, positions_BL: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """x with its first rotary_dim features rotated at `positions_BL`, in float32 (cos, sin (seqlen_ro, R))."""
    R = cos_RL.shape[1]
    cos_BL1R = cos_RL[positions_BL].unsqueeze(2).float()
    sin_BL1R = sin_RL[positions_BL].unsqueeze(2).float()
    rot_BLHE, rest_BLHD = x_BLHD[..., : 2 * R].float(), x_BLHD[..., 2 * R :]
    if interleaved:
        x1, x2 = rot_BLHE[..., 0::2], rot_BLHE[..., 1::2]
        turned = torch.stack((x1 * cos_BL1R - x2 * sin_BL1R, x1 * sin_BL1R + x2 * cos_BL1R), dim=-1).flatten(-2)
    else:
        x1, x2 = rot_BLHE[..., :R], rot_BLHE[..., R:]
        turned = torch.cat((x1 * cos_BL1R - x2 * sin_BL1R, x1 * sin_BL1R + x2 * cos_BL1R), dim=-1)
    return torch.cat((turned.to(x_BLHD.dtype), rest_BLHD), dim=-1)


def _int32_rows(name: str, value, batch: int, device: torch.device) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    if not isinstance(value, torch.Tensor) or value.shape != (batch,) or value.dtype != torch.int32:
        raise ValueError(
            f"{name} must be an int or an int32 tensor of shape ({batch},), got "
            f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}"
        )
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but q on {device}; move it with .to(q.device)")
    return value


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """flash-attn 2's ``flash_attn_with_kvcache``: attention of q over a key/value cache, new keys and
    values appended to it in place (see the module docstring for the semantics).

    Args:
        q: (B, Lq, H, D) queries, float16 or bfloat16 on a GPU (any float dtype on the PyTorch path).
        k_cache, v_cache: (Bc, C, HKV, D), or with block_table (pages, page_size, HKV, D); their
            last dim contiguous. Updated in place when k and v are given.
        k, v: (B, Ln, HKV, D) new keys and values, written at positions cache_seqlens[b] ... .
        rotary_cos, rotary_sin: (seqlen_ro, R) rotary tables applied to k and q (needs k and v).
        cache_seqlens: int or (B,) int32: the keys each row holds before k is appended; None: the
            whole cache.
        cache_batch_idx: (B,) int32 cache row of each batch row (not with block_table).
        cache_leftpad: (B,) int32 first valid cache position of each row.
        block_table: (B, pages per row) int32 page indices of a paged cache.
        softmax_scale: multiplier of q k^T; default 1 / sqrt(D).
        causal: bottom-right aligned causal mask.
        window_size: (left, right) sliding window, -1 unbounded.
        softcap: > 0 caps the scaled scores at +-softcap with tanh.
        rotary_interleaved: rotate pairs (0, 1), (2, 3), ... (True) or halves (False).
        alibi_slopes: (H,) or (B, H) float32 ALiBi slopes.
        num_splits: cache splits of the Triton kernel; 0 chooses.
        return_softmax_lse: also return lse (B, H, Lq) float32, natural log, +inf for an empty row.

    Returns:
        out (B, Lq, H, D) in q's dtype; with return_softmax_lse (out, lse).
    """
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(
            f"q must be (B, Lq, H, D) and k_cache, v_cache (Bc, C, HKV, D); got {q.dim()}-D, "
            f"{k_cache.dim()}-D, {v_cache.dim()}-D"
        )
    B, Lq, H, D = q.shape
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != D or H % k_cache.shape[2]:
        raise ValueError(
            f"k_cache and v_cache must be (Bc, C, HKV, D={D}) of one shape with H={H} a multiple of "
            f"HKV; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in their last (head) dim")
    if block_table is not None and cache_batch_idx is not None:
        raise ValueError("cache_batch_idx cannot be combined with block_table: a paged cache names its pages per row")
    HKV = k_cache.shape[2]
    device = q.device
    seqlens_B = _int32_rows("cache_seqlens", cache_seqlens, B, device)
    leftpad_B = _int32_rows("cache_leftpad", cache_leftpad, B, device)
    batch_idx_B = _int32_rows("cache_batch_idx", cache_batch_idx, B, device)
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    if (k is None) != (v is None):
        raise ValueError("give both k and v (the new keys and values) or neither")
    if rotary_cos is not None and k is None:
        raise ValueError("rotary_cos and rotary_sin rotate the new keys: pass k and v too")
    if seqlens_B is None:
        if k is not None:
            raise ValueError("cache_seqlens must say where the new keys go: pass the keys each row holds")
        seqlens_B = torch.full((B,), capacity, dtype=torch.int32, device=device)
    window_size = (int(window_size[0]), int(window_size[1]))  # flash-attn's callers pass ints or 0-d tensors
    Ln = 0 if k is None else k.shape[1]
    reach = int((seqlens_B.long() + Ln).max())
    if reach > capacity:
        paged = block_table is not None
        where = (
            f"the {capacity} positions of block_table's {block_table.shape[1]} pages per row"
            if paged
            else f"the cache's {capacity} positions"
        )
        raise CacheOverflow(
            f"cache_seqlens{' + the new keys' if Ln else ''} must be at most {capacity}"
            f"{' (or give block_table more pages per row)' if paged else ''}: they reach position "
            f"{reach}, past {where}"
        )
    if k is not None:
        if k.shape != (B, Ln, HKV, D) or v.shape != k.shape:
            raise ValueError(
                f"k and v must be (B={B}, Ln, HKV={HKV}, D={D}), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        positions_BL = seqlens_B.long().unsqueeze(1) + torch.arange(Ln, device=device)
        if rotary_cos is not None:
            k = _rotate(k, rotary_cos, rotary_sin, positions_BL, rotary_interleaved)
            q_positions_BL = seqlens_B.long().unsqueeze(1) + (
                torch.arange(Lq, device=device)
                if causal or window_size != (-1, -1)
                else torch.zeros(Lq, device=device, dtype=torch.long)
            )
            q = _rotate(q, rotary_cos, rotary_sin, q_positions_BL, rotary_interleaved)
        if block_table is not None:
            pages_BL = block_table.long().gather(1, positions_BL // k_cache.shape[1])
            k_cache[pages_BL, positions_BL % k_cache.shape[1]] = k
            v_cache[pages_BL, positions_BL % k_cache.shape[1]] = v
        else:
            rows_B1 = (batch_idx_B if batch_idx_B is not None else torch.arange(B, device=device)).long().unsqueeze(1)
            k_cache[rows_B1, positions_BL] = k
            v_cache[rows_B1, positions_BL] = v
        seqlens_B = seqlens_B + Ln
    scale = D**-0.5 if softmax_scale is None else float(softmax_scale)
    # (B, H, Lq, D) and (Bc, HKV, C, D) views: the kernels read any strides
    out_BHLD, lse_BHL = _run(
        q.transpose(1, 2),
        k_cache.transpose(1, 2),
        v_cache.transpose(1, 2),
        seqlens_B.to(torch.int32),
        backend=Backend.AUTO,
        want_lse=return_softmax_lse,
        scale=scale,
        causal=causal,
        window=window_size,
        leftpad_B=leftpad_B,
        batch_idx_B=batch_idx_B,
        block_table=block_table,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        num_splits=num_splits,
    )
    out = out_BHLD.transpose(1, 2)
    if not return_softmax_lse:
        return out
    return out, lse_BHL.float().masked_fill(lse_BHL == float("-inf"), float("inf"))
