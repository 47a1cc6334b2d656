"""Triton decoding kernel: a few queries against a long key/value cache, the cache split across programs.

Layers, in order: the kernel ``decode_fwd_kernel`` (one program per query tile, kv head and split
of the cache), the merge ``decode_merge_kernel`` (the splits' partial results combined by
log-sum-exp), the launcher ``decode_fwd`` (checks every input, chooses the split, launches), the
torch custom op ``genoformer::triton_decode_fwd`` with a fake implementation (torch.compile sees
one opaque node), and ``unsupported_reason``, which ``genoformer.kernels.kvcache`` asks before
choosing this kernel.  There is no backward: decoding runs under inference.

Why splits.  A decoding step has one query (or a few) per sequence and a cache of thousands of
keys: one program per (batch, head) would leave most of a GPU idle while each walks the whole
cache.  Here the cache positions [0, C) are cut into ``splits`` chunks of ``chunk`` positions, each
walked by its own program, which keeps its unnormalised partial (acc, running max m, running sum
l); ``decode_merge_kernel`` then gives o = sum_s w_s acc_s / sum_s w_s l_s and
lse = m + log2(sum_s w_s l_s), w_s = exp2(m_s - m), m = max_s m_s.  The chunks are fixed by the
cache's capacity, not by the lengths, so the launch never reads a length on the host.

Grouped queries.  The GROUP = H // HKV query heads that share a kv head are walked together: a
query tile's rows are (query i, group member g) pairs, r = i * GROUP + g, so one step with one
query still fills a tile of 16 rows when GROUP >= 16 and every kv tile is read once per group.

Semantics (``genoformer.kernels.kvcache`` documents them; its float64 reference is the judge):
row b's keys are the cache positions [lo_b, hi_b) (lo_b = LEFTPAD[b] or 0, hi_b = SEQLENS[b]),
read from cache row BATCH_IDX[b] (or b), through the page table when PAGED.  Query i sits at
position pos_i = hi_b - Lq + i (the bottom-right alignment of flash-attn's kv-cache decoding): with
RIGHT_BOUND it sees keys j <= pos_i + right (causal: right = 0), with LEFT_BOUND keys
j >= pos_i - left.  SOFTCAP caps the scaled scores at +-softcap (softcap * tanh(s / softcap));
HAS_ALIBI subtracts slope_h * |pos_i - j| from them.  A row with no allowed key outputs 0 and
its lse is +inf (base 2, as the Triton forward's).

Legend: q (B, H, Lq, D) (any strides); k, v (Bc, HKV, C, D) views of the cache (any strides; paged:
(pages, HKV, page_size, D)); o (B, H, Lq, D); lse (B, H, Lq) fp32 base 2; partials po
(splits, B * H, Lq, D_TILE), pm, pl (splits, B * H, Lq) fp32; seqlens, leftpad, batch_idx (B,)
int32; block_table (B, pages per row) int32; alibi slopes (B or 1, H) fp32.

On a CPU the kernels run under Triton's interpreter when TRITON_INTERPRET=1 is set before this
module is imported (slow; for tests at small sizes only).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from genoformer.kernels.triton_flash_configs import HEAD_DIMS, tile_dim
from genoformer.kernels.triton_flash_fwd import LOG2E, load_tile, mma
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MIN_CHUNK = 256
"""The fewest cache positions one split walks (a shorter chunk spends more on its merge than it saves)."""
MAX_SPLITS = 128
WAVES = 2
"""Programs launched per streaming multiprocessor that the split aims at."""


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _key_rows(BLOCK_TABLE, b, sbt_b, cache_row, offs_n, n_ok, sk_b, sk_l, page_size, PAGED: tl.constexpr):
    """Element offsets (BLOCK_N,) int64 of cache positions offs_n of one cache row (head offset
    excluded): contiguous positions, or through the row's page table."""
    if PAGED:
        page = tl.load(BLOCK_TABLE + b.to(tl.int64) * sbt_b + offs_n // page_size, mask=n_ok, other=0)
        rows = page.to(tl.int64) * sk_b + (offs_n % page_size).to(tl.int64) * sk_l
    else:
        rows = cache_row.to(tl.int64) * sk_b + offs_n.to(tl.int64) * sk_l
    return rows


@triton.jit
def decode_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    PO,
    PM,
    PL,
    SEQLENS,
    LEFTPAD,
    BATCH_IDX,
    BLOCK_TABLE,
    ALIBI,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_l,
    sv_b,
    sv_h,
    sv_l,
    so_b,
    so_h,
    so_l,
    sbt_b,
    salibi_b,
    H,
    GROUP,
    Lq,
    chunk,
    page_size,
    qk_scale,
    softcap,
    left,
    right,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT_BOUND: tl.constexpr,
    RIGHT_BOUND: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr,
    HAS_BATCH_IDX: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # grid: (query tiles of Lq * GROUP rows, B * HKV, splits)
    HKV = H // GROUP
    b = tl.program_id(1) // HKV
    hk = tl.program_id(1) % HKV
    split = tl.program_id(2)
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows (query i, member g)
    offs_i = offs_r // GROUP
    h_r = hk * GROUP + offs_r % GROUP  # each row's query head
    row_ok = offs_i < Lq
    offs_d = tl.arange(0, D_TILE)

    hi = tl.load(SEQLENS + b)
    lo = 0
    if HAS_LEFTPAD:
        lo = tl.load(LEFTPAD + b)
    cache_row = b
    if HAS_BATCH_IDX:
        cache_row = tl.load(BATCH_IDX + b)
    pos_r = hi - Lq + offs_i  # each row's query position (bottom-right aligned)

    # the keys this program may need: its chunk, cut to [lo, hi) and to the tile's window
    k_lo = tl.maximum(split * chunk, lo)
    k_hi = tl.minimum((split + 1) * chunk, hi)
    first_i = (tl.program_id(0) * BLOCK_M) // GROUP
    last_i = tl.minimum((tl.program_id(0) * BLOCK_M + BLOCK_M - 1) // GROUP, Lq - 1)
    if LEFT_BOUND:
        k_lo = tl.maximum(k_lo, hi - Lq + first_i - left)
    if RIGHT_BOUND:
        k_hi = tl.minimum(k_hi, hi - Lq + last_i + right + 1)

    q_ptrs = (
        Q
        + b.to(tl.int64) * sq_b
        + h_r[:, None].to(tl.int64) * sq_h
        + offs_i[:, None].to(tl.int64) * sq_l
        + offs_d[None, :]
    )
    q = load_tile(q_ptrs, row_ok, offs_d, D, D_TILE, True)  # (BLOCK_M, D_TILE), stays in registers
    slope = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope = tl.load(ALIBI + b * salibi_b + h_r, mask=row_ok, other=0.0)  # times log2(e): base 2

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of the base-2 scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s2 - m)
    acc = tl.zeros([BLOCK_M, D_TILE], dtype=tl.float32)
    k_head = K + hk.to(tl.int64) * sk_h
    v_head = V + hk.to(tl.int64) * sv_h
    for start_n in range(k_lo, k_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < k_hi
        k_rows = _key_rows(BLOCK_TABLE, b, sbt_b, cache_row, offs_n, n_ok, sk_b, sk_l, page_size, PAGED)
        k = load_tile(k_head + k_rows[:, None] + offs_d[None, :], n_ok, offs_d, D, D_TILE, True)
        s = mma(q, tl.trans(k), None, DOT_F32)  # (BLOCK_M, BLOCK_N) fp32, unscaled q . k
        if SOFTCAP:  # softcap * tanh(scaled / softcap) in base 2: tanh(x) = 2 / (1 + exp2(-2 log2(e) x)) - 1,
            # qk_scale = 2 log2(e) scale / softcap and softcap arrives times log2(e) (the launcher's)
            s = softcap * (2.0 / (1.0 + tl.math.exp2(-s * qk_scale)) - 1.0)
        else:
            s = s * qk_scale
        if HAS_ALIBI:
            s -= slope[:, None] * tl.abs(pos_r[:, None] - offs_n[None, :]).to(tl.float32)
        keep = n_ok[None, :] & row_ok[:, None]
        if LEFT_BOUND:
            keep = keep & (offs_n[None, :] >= pos_r[:, None] - left)
        if RIGHT_BOUND:
            keep = keep & (offs_n[None, :] <= pos_r[:, None] + right)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: avoid inf - inf
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        v_rows = _key_rows(BLOCK_TABLE, b, sbt_b, cache_row, offs_n, n_ok, sv_b, sv_l, page_size, PAGED)
        v = load_tile(v_head + v_rows[:, None] + offs_d[None, :], n_ok, offs_d, D, D_TILE, True)
        acc = mma(p.to(v.dtype), v, acc, DOT_F32)

    bh_r = (b * H + h_r).to(tl.int64)  # each row's (batch, head)
    if SPLIT:  # the unnormalised partial of this chunk, merged by decode_merge_kernel
        part = (split.to(tl.int64) * tl.num_programs(1) * GROUP + bh_r) * Lq + offs_i
        tl.store(PO + part[:, None] * D_TILE + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(PM + part, m_i, mask=row_ok)
        tl.store(PL + part, l_i, mask=row_ok)
    else:
        _store_rows(O, LSE, acc, l_i, m_i, b, h_r, bh_r, offs_i, row_ok, offs_d, so_b, so_h, so_l, Lq, D, D_TILE)


@triton.jit
def _store_rows(
    O,
    LSE,
    acc,
    l_i,
    m_i,
    b,
    h_r,
    bh_r,
    offs_i,
    row_ok,
    offs_d,
    so_b,
    so_h,
    so_l,
    Lq,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
):
    """o = acc / l in O's dtype and lse = m + log2(l) (base 2) of finished rows; a row with no
    allowed key (l == 0) gets o = 0 and lse = +inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    o_ptrs = (
        O
        + b.to(tl.int64) * so_b
        + h_r[:, None].to(tl.int64) * so_h
        + offs_i[:, None].to(tl.int64) * so_l
        + offs_d[None, :]
    )
    if D < D_TILE:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    else:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + bh_r * Lq + offs_i, lse, mask=row_ok)


@triton.jit
def decode_merge_kernel(
    PO,
    PM,
    PL,
    O,
    LSE,
    so_b,
    so_h,
    so_l,
    H,
    Lq,
    splits,
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # grid: (B * H, row blocks of Lq).  With m = max_s m_s and w_s = exp2(m_s - m):
    # o = sum_s w_s acc_s / sum_s w_s l_s, lse = m + log2(sum_s w_s l_s), in split order
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    offs_i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row_ok = offs_i < Lq
    offs_d = tl.arange(0, D_TILE)
    rows = tl.num_programs(0).to(tl.int64) * Lq  # partial rows per split
    base = bh.to(tl.int64) * Lq + offs_i
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for s in range(splits):
        m = tl.maximum(m, tl.load(PM + s * rows + base, mask=row_ok, other=float("-inf")))
    m_sub = tl.where(m == float("-inf"), 0.0, m)  # a row no split saw a key of: every weight is 0
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, D_TILE], dtype=tl.float32)
    for s in range(splits):
        w = tl.math.exp2(tl.load(PM + s * rows + base, mask=row_ok, other=float("-inf")) - m_sub)
        l_i += w * tl.load(PL + s * rows + base, mask=row_ok, other=0.0)
        part = tl.load(PO + (s * rows + base)[:, None] * D_TILE + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        acc += w[:, None] * part
    h_r = tl.zeros([BLOCK], dtype=tl.int32) + h
    bh_r = tl.zeros([BLOCK], dtype=tl.int64) + bh
    _store_rows(O, LSE, acc, l_i, m, b, h_r, bh_r, offs_i, row_ok, offs_d, so_b, so_h, so_l, Lq, D, D_TILE)


# --------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------

# True when this module was imported with TRITON_INTERPRET=1 (the kernels are then interpreted).
INTERPRETED = isinstance(decode_fwd_kernel, InterpretedFunction)


def unsupported_reason(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """None when the decoding kernel can run these tensors here, else a sentence saying why and what to do.

    q (B, H, Lq, D), k_cache and v_cache (Bc, HKV, C, D) (paged: (pages, HKV, page_size, D))."""
    if q.device.type == "cuda":
        if INTERPRETED:
            return (
                "the Triton kernels were loaded in interpreter mode (TRITON_INTERPRET=1) and cannot take CUDA "
                "tensors; unset TRITON_INTERPRET before importing genoformer"
            )
        major, _ = torch.cuda.get_device_capability(q.device)
        if major < 8:
            return (
                f"the Triton decoding kernel needs a GPU of compute capability 8.0 or newer; "
                f"{torch.cuda.get_device_name(q.device)} is {major}.x: decode with the torch path"
            )
    elif q.device.type == "cpu":
        if not INTERPRETED:
            return (
                "the Triton kernels run on CPU tensors only under the interpreter: set TRITON_INTERPRET=1 "
                "before importing genoformer (slow, meant for tests), or use a CUDA GPU"
            )
    else:
        return f"the Triton kernels run on CUDA tensors, got a tensor on {q.device.type}"
    if q.dtype not in SUPPORTED_DTYPES:
        return f"the Triton decoding kernel takes float16 or bfloat16, got {q.dtype}: cast q and the cache"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"q and the cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
    if k_cache.device != q.device or v_cache.device != q.device:
        return f"q and the cache must be on one device, got {q.device}, {k_cache.device}, {v_cache.device}"
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return (
            f"head dim {D} is not supported by the Triton kernels (they take the multiples of 8 from 16 to 256): "
            f"decode with the torch path"
        )
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        return "q, k_cache and v_cache must be contiguous in their last (head) dim: call .contiguous() first"
    return None


def block_sizes(rows: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for a tile of `rows` = Lq * GROUP query rows: the fewest rows (16, tl.dot's
    minimum) that hold one step's queries, up to 64; keys in tiles of 64 (32 at D 256)."""
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    return block_m, 32 if tile_dim(head_dim) == 256 else 64


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def choose_splits(programs: int, capacity: int, device: torch.device) -> int:
    """Splits of the cache's `capacity` positions for a launch of `programs` programs per split:
    enough to give every multiprocessor WAVES programs, no chunk shorter than MIN_CHUNK, at most
    MAX_SPLITS; 1 off a GPU."""
    if device.type != "cuda":
        return 1
    wanted = math.ceil(WAVES * _multiprocessors(device.index or 0) / max(programs, 1))
    return max(1, min(wanted, capacity // MIN_CHUNK, MAX_SPLITS))


def _dot_f32(q: torch.Tensor) -> bool:
    """Widen bf16 tiles before tl.dot under the interpreter (see ``triton_flash_fwd.mma``)."""
    return INTERPRETED and q.dtype == torch.bfloat16


def _placeholder(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(1, dtype=dtype, device=device)


def decode_fwd(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    leftpad: torch.Tensor | None = None,
    batch_idx: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    num_splits: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The launcher: o (B, H, Lq, D) in q's dtype and lse (B, H, Lq) fp32 in base 2 (+inf: no key).

    q (B, H, Lq, D); k_cache, v_cache (Bc, HKV, C, D), or paged (pages, HKV, page_size, D) with
    block_table (B, pages per row) int32; any strides but the head dim's.  seqlens (B,) int32: row b's
    keys end at seqlens[b] (at most C, or pages per row * page_size); leftpad (B,) int32: they start
    there; batch_idx (B,) int32: the cache row of batch row b.  causal and window (left, right; -1:
    unbounded) are aligned bottom-right; alibi_slopes (H,) or (B, H) fp32; softcap > 0 caps the
    scores.  num_splits: 0 chooses (``choose_splits``), else that many.  Raises ValueError saying
    what to change for inputs it cannot run.
    """
    reason = unsupported_reason(q, k_cache, v_cache)
    if reason is not None:
        raise ValueError(f"the Triton decoding kernel cannot run these inputs: {reason}")
    B, H, Lq, D = q.shape
    HKV = k_cache.shape[1]
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != D or HKV == 0 or H % HKV:
        raise ValueError(
            f"k_cache and v_cache must be (batch or pages, HKV, positions, D={D}) with H={H} a multiple "
            f"of HKV; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    for name, t in (("seqlens", seqlens), ("leftpad", leftpad), ("batch_idx", batch_idx)):
        if t is not None and (
            t.shape != (B,) or t.dtype != torch.int32 or t.device != q.device or not t.is_contiguous()
        ):
            raise ValueError(
                f"{name} must be a contiguous int32 tensor of shape ({B},) on {q.device}, got {t.dtype} "
                f"{tuple(t.shape)} on {t.device} (strides {t.stride()}): call .contiguous() on it"
            )
    paged = block_table is not None
    if paged and (block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype != torch.int32):
        raise ValueError(
            f"block_table must be an int32 tensor of shape ({B}, pages per row), got "
            f"{block_table.dtype} {tuple(block_table.shape)}"
        )
    if alibi_slopes is not None and (
        alibi_slopes.dtype != torch.float32 or alibi_slopes.shape[-1] != H or alibi_slopes.dim() not in (1, 2)
    ):
        raise ValueError(
            f"alibi_slopes must be float32 of shape ({H},) or ({B}, {H}), got {alibi_slopes.dtype} "
            f"{tuple(alibi_slopes.shape)}"
        )
    if not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale}")
    group = H // HKV
    capacity = block_table.shape[1] * k_cache.shape[2] if paged else k_cache.shape[2]
    block_m, block_n = block_sizes(Lq * group, D)
    m_tiles = triton.cdiv(Lq * group, block_m)
    splits = num_splits if num_splits > 0 else choose_splits(m_tiles * B * HKV, capacity, q.device)
    chunk = triton.cdiv(triton.cdiv(capacity, splits), block_n) * block_n
    splits = triton.cdiv(capacity, chunk)
    d_tile = tile_dim(D)
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    if splits > 1:
        po = torch.empty((splits, B * H, Lq, d_tile), dtype=torch.float32, device=q.device)
        pm = torch.empty((splits, B * H, Lq), dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
    else:
        po = pm = pl = _placeholder(q.device, torch.float32)
    dummy = _placeholder(q.device, torch.int32)
    left, right = window
    if causal:  # causal is the window's right bound at the query's own position
        right = 0
    softcap = float(softcap)
    qk_scale = 2 * LOG2E * scale / softcap if softcap > 0 else scale * LOG2E
    alibi = alibi_slopes * LOG2E if alibi_slopes is not None else _placeholder(q.device, torch.float32)
    decode_fwd_kernel[(m_tiles, B * HKV, splits)](
        q,
        k_cache,
        v_cache,
        o,
        lse,
        po,
        pm,
        pl,
        seqlens,
        leftpad if leftpad is not None else dummy,
        batch_idx if batch_idx is not None else dummy,
        block_table if paged else dummy,
        alibi,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        block_table.stride(0) if paged else 0,
        alibi.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
        H,
        group,
        Lq,
        chunk,
        k_cache.shape[2] if paged else 1,
        qk_scale,
        softcap * LOG2E,
        max(left, 0),
        max(right, 0),
        D=D,
        D_TILE=d_tile,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        LEFT_BOUND=left >= 0,
        RIGHT_BOUND=causal or right >= 0,
        HAS_LEFTPAD=leftpad is not None,
        HAS_BATCH_IDX=batch_idx is not None,
        PAGED=paged,
        HAS_ALIBI=alibi_slopes is not None,
        SOFTCAP=softcap > 0,
        SPLIT=splits > 1,
        DOT_F32=_dot_f32(q),
        num_warps=4,
        num_stages=2,
    )
    if splits > 1:
        block = 16
        decode_merge_kernel[(B * H, triton.cdiv(Lq, block))](
            po,
            pm,
            pl,
            o,
            lse,
            o.stride(0),
            o.stride(1),
            o.stride(2),
            H,
            Lq,
            splits,
            D=D,
            D_TILE=d_tile,
            BLOCK=block,
        )
    return o, lse


# --------------------------------------------------------------------------------------------
# Custom op (torch.compile sees one opaque node)
# --------------------------------------------------------------------------------------------

_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens, float scale, bool causal, int left, "
    "int right, Tensor? leftpad, Tensor? batch_idx, Tensor? block_table, Tensor? alibi_slopes, "
    "float softcap, int num_splits) -> (Tensor, Tensor)"
)


def launch(
    q,
    k_cache,
    v_cache,
    seqlens,
    scale,
    causal,
    left,
    right,
    leftpad,
    batch_idx,
    block_table,
    alibi_slopes,
    softcap,
    num_splits,
):
    """``decode_fwd`` with the custom op's positional arguments (what eager callers run)."""
    return decode_fwd(
        q,
        k_cache,
        v_cache,
        seqlens,
        scale=scale,
        causal=causal,
        window=(left, right),
        leftpad=leftpad,
        batch_idx=batch_idx,
        block_table=block_table,
        alibi_slopes=alibi_slopes,
        softcap=softcap,
        num_splits=num_splits,
    )


decode_op = torch.library.custom_op("genoformer::triton_decode_fwd", launch, mutates_args=(), schema=_SCHEMA)


@decode_op.register_fake
def _fake(
    q,
    k_cache,
    v_cache,
    seqlens,
    scale,
    causal,
    left,
    right,
    leftpad,
    batch_idx,
    block_table,
    alibi_slopes,
    softcap,
    num_splits,
):
    B, H, Lq, D = q.shape
    return q.new_empty((B, H, Lq, D)), q.new_empty((B, H, Lq), dtype=torch.float32)
