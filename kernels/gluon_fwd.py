"""Hopper-native FlashAttention forward kernels in Gluon (``triton.experimental.gluon``), sm_90 only.

Two kernels share the tile step (``_softmax_update``) and the epilogue (``_store_rows``):

* ``attn_fwd_tma_kernel`` (the plain one): one warpgroup per program, BLOCK_M query rows; K and V
  arrive by TMA into a STAGES-deep ring of shared-memory buffers (one mbarrier per stage), S = Q K^T
  and O += P V run as asynchronous wgmma, the next tiles' copies in flight while a tile is computed.
* ``attn_fwd_ws_kernel`` (the FlashAttention-3 schedule): three partitions under ``warp_specialize``:
  a producer warp that only issues TMA copies (Q once, then K and V into the ring, waiting on each
  stage's "empty" barrier), and two consumer warpgroups, each with its own BLOCK_M query rows of the
  program's 2 * BLOCK_M, that read the same K/V stages.  Registers are moved from the producer to
  the consumers (``worker_num_regs`` / ``maxnreg``: setmaxnreg).  Inside a consumer tile t's
  S = Q K^T is issued before P_{t-1} V_{t-1} (FlashAttention-3's intra-warpgroup overlap: the softmax
  of tile t runs while the tensor cores do P_{t-1} V_{t-1}); with QK_AHEAD also S_{t+1} is issued
  before the softmax of tile t, which then overlaps both matmuls.  With PINGPONG the two consumers
  also take turns at the tensor cores (a pair of mbarriers orders their matmul issues, so one's
  softmax overlaps the other's matmuls).  Barrier use never decides a result: every wait pairs with
  an arrive of the same count in the same number of steps on every partition.

Launch configurations (``GluonConfig``, one table per kernel) are here too; the launcher, input
checks and autograd live in ``gluon_flash.py``.  This module imports no torch, so the kernels
compile for sm_90 on a machine with triton alone (tests/kernels/test_gluon.py).  H, GROUP, Lq and
Lk are not specialised on (a length of 1 or a multiple of 16 compiles no kernel of its own).

Legend: B batch, H query heads, HKV key/value heads, GROUP = H // HKV (query head h reads kv head
h // GROUP), Lq / Lk query / key lengths, D head dim (64 or 128).
  q, o (B, H, Lq, D); k, v (B, HKV, Lk, D); lse (B, H, Lq) fp32.  The tensor descriptors are 4-D
  over these tensors with (1, 1, rows, D) boxes, so TMA clips every box at its own head's length:
  rows past Lq or Lk read as zeros and are never written.
Scores are kept in base 2 as in ``triton_flash_fwd``: s2 = (q . k) * scale * log2(e), p = exp2(s2 - m),
lse = m + log2(l) (base 2; +inf for a row with no allowed key, never the case for the dense
layouts here), which is exactly what ``triton_flash_bwd`` reads back.
"""

from __future__ import annotations

import dataclasses

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# Triton 3.7 renamed the TMA copies (3.6, the GPU image's, has only the old names; 3.9 only the new).
if hasattr(tma, "async_load"):
    tma_load, tma_store = tma.async_load, tma.async_store
else:
    tma_load, tma_store = tma.async_copy_global_to_shared, tma.async_copy_shared_to_global

HEAD_DIMS = (64, 128)
"""Head dims the kernels are built for (the wgmma tiles and the shared-memory budget assume them)."""


@dataclasses.dataclass(frozen=True)
class GluonConfig:
    """One launch configuration.

    warp_specialized: the FlashAttention-3 schedule (``attn_fwd_ws_kernel``: producer warp, two
        consumer warpgroups of block_m rows each, 2 * block_m query rows per program), else the
        plain TMA + wgmma kernel (one partition of num_warps warps, block_m rows).
    stages: K/V tiles in flight (shared memory: 2 * stages * block_n * D * 2 bytes, plus Q).
    pingpong: (warp-specialised only) the consumers take turns at the tensor cores.
    num_warps: the plain kernel's warps (block_m = 16 * num_warps); 4 for the warp-specialised one.
    consumer_regs, producer_regs: (warp-specialised only) registers per thread after setmaxnreg;
        maxnreg, the kernel's cap before it, is what three warpgroups can hold (65536 / 384 = 168).
    qk_ahead: (warp-specialised only) issue the next key tile's S = Q K^T before this tile's softmax,
        so that the softmax of tile t overlaps both P_{t-1} V_{t-1} and S_{t+1} (two score tiles live
        in a consumer's registers).  A consumer then holds key tiles t - 1 to t + 1 at once: it needs
        stages >= 3 (with 2 it deadlocks: K_{t+1} would wait for a stage the consumer itself
        releases later), and 4 keep the producer one tile ahead as the default schedule's 3 do.
    """

    warp_specialized: bool
    block_m: int
    block_n: int
    stages: int
    pingpong: bool = False
    num_warps: int = 4
    consumer_regs: int = 240
    producer_regs: int = 24
    maxnreg: int = 168
    qk_ahead: bool = False

    def __post_init__(self):
        if self.qk_ahead and not (self.warp_specialized and self.stages >= 3):
            raise ValueError(
                f"qk_ahead needs the warp-specialised kernel and stages >= 3 (a consumer holds three "
                f"key tiles at once), got warp_specialized={self.warp_specialized}, stages={self.stages}"
            )

    @property
    def rows(self) -> int:
        """Query rows per program."""
        return 2 * self.block_m if self.warp_specialized else self.block_m


WS_CONFIGS = {
    64: GluonConfig(True, block_m=64, block_n=128, stages=3, pingpong=True),
    128: GluonConfig(True, block_m=64, block_n=128, stages=2, pingpong=True),
}
"""The warp-specialised kernel's configuration per head dim (FlashAttention-3's schedule)."""
PLAIN_CONFIGS = {
    64: GluonConfig(False, block_m=128, block_n=128, stages=3, num_warps=8),
    128: GluonConfig(False, block_m=128, block_n=128, stages=2, num_warps=8),
}
"""The plain kernel's configuration per head dim."""
AHEAD_CONFIGS = {
    64: GluonConfig(True, block_m=64, block_n=128, stages=4, pingpong=True, qk_ahead=True),
}
"""The warp-specialised kernel with ``qk_ahead``: 0.94-0.98 of WS_CONFIGS' time on the H200 at 16k
(beside a training run; not the default before a clean measurement).  D 64 only: at
D 128 four stages of K and V do not fit the shared memory, and with three the consumers spill
(the second score tile beside the 128-wide accumulator; 32 B in the sm_90 cross-compile)."""

PLAIN_FASTER = {(64, False)}
"""(head dim, causal) where the plain kernel beat the warp-specialised one on the H200
(docs/design/gluon.md, "Numbers": D 64 bidirectional, 0.86-0.89 of its time at 8k to 32k)."""


def default_config(head_dim: int, causal: bool, masked: bool = False) -> GluonConfig:
    """The configuration the launcher takes when given none: the faster kernel of the measured table;
    the warp-specialised one for a layout or key padding (masked), which only it runs."""
    plain = (head_dim, causal) in PLAIN_FASTER and not masked
    return (PLAIN_CONFIGS if plain else WS_CONFIGS)[head_dim]


@gluon.constexpr_function
def mma_layout(block_n, num_warps):
    """The wgmma accumulator layout of a (rows, block_n) fp32 tile over `num_warps` warps (a
    multiple of 4, 16 rows per warp): instruction m16 x n(block_n) x k16 for 16-bit operands."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


def descriptor_layout(block_rows: int, head_dim: int, bitwidth: int = 16) -> gl.NVMMASharedLayout:
    """Shared layout of a (1, 1, block_rows, head_dim) TMA box of `bitwidth`-bit elements, which the
    launcher gives its tensor descriptors and the kernels their buffers (128-byte swizzle for head
    dims of 64 and 128)."""
    return gl.NVMMASharedLayout(
        swizzle_byte_width=min(128, head_dim * bitwidth // 8), element_bitwidth=bitwidth, rank=4
    )


@gluon.jit
def _tile_bounds(start_m, rows, Lk, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(t_full, t_end) of the query rows [start_m, start_m + rows): key tiles [0, t_full) are
    allowed for every row (no mask), [t_full, t_end) hold the causal diagonal or the ragged key
    tail (masked), later ones are never visited."""
    if CAUSAL:
        full_end = gl.minimum(start_m + 1, Lk)
        hi = gl.minimum(start_m + rows, Lk)
    else:
        full_end = Lk
        hi = Lk
    return full_end // BLOCK_N, gl.cdiv(hi, BLOCK_N)


SCAN = gl.constexpr(128)
"""Layout entries inspected per step when counting a key-block list (``_tiles_before``)."""


@gluon.jit
def _tile_start(t, idx_row, BS: gl.constexpr, BLOCK_N: gl.constexpr, SPARSE: gl.constexpr):
    """First key of the t-th key tile a program visits: idx_row + t * BLOCK_N (dense: idx_row the first
    key, 0 or with packed documents the first tile's), or with a layout the t-th tile of its row's
    key-block list idx_row (ascending layout blocks of BS keys, BS // BLOCK_N tiles each)."""
    if SPARSE:
        TPB: gl.constexpr = BS // BLOCK_N
        entry = t // TPB
        start = gl.load(idx_row + entry) * BS + (t - entry * TPB) * BLOCK_N
    else:
        start = idx_row + t * BLOCK_N
    return start


@gluon.jit
def _tiles_before(
    x,
    count,
    idx_row,
    BS: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPARSE: gl.constexpr,
    ENDING: gl.constexpr,
    num_warps: gl.constexpr,
):
    """How many of a program's key tiles (in visiting order, ``_tile_start``) end at or before key x
    (ENDING) or start before it; the list holds `count` layout blocks.  Both are prefixes of the
    visiting order, the list being ascending."""
    if SPARSE:
        TPB: gl.constexpr = BS // BLOCK_N
        scan_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        n = count * 0  # layout blocks of the list that end by x (ENDING) / start before x
        for c in range(0, count, SCAN):
            offs = c + gl.arange(0, SCAN, layout=scan_layout)
            valid = offs < count
            blk = gl.load(idx_row + offs, mask=valid, other=0)
            if ENDING:
                hit = valid & ((blk + 1) * BS <= x)
            else:
                hit = valid & (blk * BS < x)
            n += gl.sum(hit.to(gl.int32), axis=0)
        t = n * TPB
        if ENDING:
            if n < count:  # the first block that does not end by x: its tiles that do
                t += gl.minimum(gl.maximum(x - gl.load(idx_row + n) * BS, 0) // BLOCK_N, TPB)
        else:
            if n > 0:  # the last block that starts before x: its tiles that do
                t += gl.minimum(gl.cdiv(x - gl.load(idx_row + n - 1) * BS, BLOCK_N), TPB) - TPB
    else:
        if ENDING:
            t = gl.maximum(x - idx_row, 0) // BLOCK_N
        else:
            t = gl.cdiv(gl.maximum(x - idx_row, 0), BLOCK_N)
    return t


@gluon.jit
def _softmax_update(
    s,
    m_i,
    l_i,
    start_m,
    start_n,
    key_hi,
    key_lo,
    qk_scale,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    MASK: gl.constexpr,
    s_layout: gl.constexpr,
):
    """One tile of the online softmax: from the raw scores s (BLOCK_M, BLOCK_N) fp32 (q . k) of the
    keys [start_n, start_n + BLOCK_N) and the running max m_i and sum l_i (BLOCK_M,), the
    probabilities p (fp32), the factor alpha that rescales what was accumulated with the old max, and
    the new m_i, l_i.  MASK applies the causal diagonal (key > query) and the key end (key >= key_hi:
    Lk, the row's kv_lens, or 0 for a program with no allowed key); with packed documents key_lo and
    key_hi are per row (BLOCK_M,), its document's span [key_lo, key_hi) (else key_lo is None); a row
    with nothing allowed yet keeps m = -inf and subtracts 0 instead (no inf - inf)."""
    if MASK:
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        if key_lo is not None:
            keys = gl.expand_dims(offs_n, 0)
            keep = (keys >= gl.expand_dims(key_lo, 1)) & (keys < gl.expand_dims(key_hi, 1))
        else:
            keep = gl.expand_dims(offs_n < key_hi, 0)
        if CAUSAL:
            keep = keep & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
        s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_sub = m_new
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_sub, 1))  # (BLOCK_M, BLOCK_N)
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _store_rows(
    acc,
    l_i,
    m_i,
    o_desc,
    o_smem,
    LSE,
    bh,
    b,
    h,
    start_m,
    Lq,
    BLOCK_M: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    s_layout: gl.constexpr,
):
    """Normalise and store finished query rows: o = acc / l through shared memory and a TMA store
    (the box is clipped at Lq), lse = m + log2(l) by pointers; a row with no allowed key (l == 0)
    gets o = 0 and lse = +inf.  o_smem (1, 1, BLOCK_M, HEAD_DIM) is free to overwrite (its Q tile
    is no longer read)."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("inf"), m_i + gl.log2(l_safe))
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(LSE + bh.to(gl.int64) * Lq + offs_m, lse, mask=offs_m < Lq)
    o_layout: gl.constexpr = acc.type.layout
    inv_l = gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))
    o = acc * gl.expand_dims(inv_l, 1)
    o_smem.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_desc.dtype))
    fence_async_shared()
    tma_store(o_desc, [b, h, start_m, 0], o_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _store_partial(
    acc,
    l_i,
    m_i,
    PO_row,
    PM_row,
    PL_row,
    start_m,
    Lq,
    BLOCK_M: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    s_layout: gl.constexpr,
):
    """A split row's chunk: the unnormalised acc (BLOCK_M, HEAD_DIM) and the running max and sum of
    its rows, fp32, by pointers (the Triton forward's partials: PO_row + r * HEAD_DIM + d, PM_row + r,
    PL_row + r for a query position r; the kernel offsets them by the slot and the layout row)."""
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(PM_row + offs_m, m_i, mask=offs_m < Lq)
    gl.store(PL_row + offs_m, l_i, mask=offs_m < Lq)
    o_layout: gl.constexpr = acc.type.layout
    rows = gl.expand_dims(start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout)), 1)
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout)), 0)
    gl.store(PO_row + rows * HEAD_DIM + cols, acc, mask=rows < Lq)


# --------------------------------------------------------------------------------------------
# The plain kernel: one warpgroup, TMA ring, asynchronous wgmma
# --------------------------------------------------------------------------------------------


@gluon.jit
def _tma_steps(
    acc,
    m_i,
    l_i,
    t_lo,
    t_hi,
    q_op,
    k_bufs,
    v_bufs,
    ready,
    k_desc,
    v_desc,
    b,
    hk,
    start_m,
    Lk,
    n_tiles,
    qk_scale,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    MASK: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Key tiles t_lo..t_hi of the plain kernel.  Tile t lives in stage t % STAGES; when its
    matmuls are done, the stage is refilled with tile t + STAGES (its barrier's next phase)."""
    s_layout: gl.constexpr = mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    for t in range(t_lo, t_hi):
        stage = t % STAGES
        mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
        k_op = k_bufs.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))  # (HEAD_DIM, BLOCK_N)
        v_op = v_bufs.index(stage).reshape([BLOCK_N, HEAD_DIM])
        s = warpgroup_mma(q_op, k_op, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_update(
            s, m_i, l_i, start_m, t * BLOCK_N, Lk, None, qk_scale, BLOCK_M, BLOCK_N, CAUSAL, MASK, s_layout
        )
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_op = gl.convert_layout(p.to(v_desc.dtype), p_layout)
        acc = warpgroup_mma(p_op, v_op, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        # the stage is read: refill it with the tile STAGES steps ahead
        nxt = t + STAGES
        bar = ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=nxt < n_tiles)
        tma_load(k_desc, [b, hk, nxt * BLOCK_N, 0], bar, k_bufs.index(stage), pred=nxt < n_tiles)
        tma_load(v_desc, [b, hk, nxt * BLOCK_N, 0], bar, v_bufs.index(stage), pred=nxt < n_tiles)
    return acc, m_i, l_i


@gluon.jit(do_not_specialize=["H", "GROUP", "Lq", "Lk"])
def attn_fwd_tma_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    LSE,
    H,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    num_warps: gl.constexpr,
):
    # grid: (query tiles, B * H), the last query tiles (the longest causal rows) launched first
    start_m = (gl.num_programs(0) - 1 - gl.program_id(0)) * BLOCK_M
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = mma_layout(BLOCK_N, num_warps)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, num_warps)

    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    t_full, t_end = _tile_bounds(start_m, BLOCK_M, Lk, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, start_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):  # fill the ring
        bar = ready.index(i)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=i < t_end)
        tma_load(k_desc, [b, hk, i * BLOCK_N, 0], bar, k_bufs.index(i), pred=i < t_end)
        tma_load(v_desc, [b, hk, i * BLOCK_N, 0], bar, v_bufs.index(i), pred=i < t_end)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))  # running max of s2
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))  # running sum of exp2(s2 - m)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    q_op = q_smem.reshape([BLOCK_M, HEAD_DIM])
    acc, m_i, l_i = _tma_steps(
        acc,
        m_i,
        l_i,
        0,
        t_full,
        q_op,
        k_bufs,
        v_bufs,
        ready,
        k_desc,
        v_desc,
        b,
        hk,
        start_m,
        Lk,
        t_end,
        qk_scale,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        False,
        num_warps,
    )
    acc, m_i, l_i = _tma_steps(
        acc,
        m_i,
        l_i,
        t_full,
        t_end,
        q_op,
        k_bufs,
        v_bufs,
        ready,
        k_desc,
        v_desc,
        b,
        hk,
        start_m,
        Lk,
        t_end,
        qk_scale,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        True,
        num_warps,
    )
    _store_rows(acc, l_i, m_i, o_desc, q_smem, LSE, bh, b, h, start_m, Lq, BLOCK_M, HEAD_DIM, s_layout)


# --------------------------------------------------------------------------------------------
# The warp-specialised kernel: a TMA producer warp, two consumer warpgroups
# --------------------------------------------------------------------------------------------


@gluon.jit
def _ws_producer(
    q_desc,
    k_desc,
    v_desc,
    q_bufs,
    k_bufs,
    v_bufs,
    q_bar,
    k_ready,
    v_ready,
    kv_empty,
    b,
    h,
    hk,
    start_cta,
    n_tiles,
    idx_row,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """The producer warp: both consumers' Q tiles on q_bar, then key tile t's K and V (the t-th tile
    the program visits, ``_tile_start``) into stage t % STAGES once both consumers released it
    (kv_empty; its first wait of each stage passes: a fresh barrier counts its previous phase as
    complete)."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma_load(q_desc, [b, h, start_cta, 0], q_bar, q_bufs.index(0))
    tma_load(q_desc, [b, h, start_cta + BLOCK_M, 0], q_bar, q_bufs.index(1))
    for t in range(n_tiles):
        stage = t % STAGES
        start_n = _tile_start(t, idx_row, BS, BLOCK_N, SPARSE)
        mbarrier.wait(kv_empty.index(stage), ((t // STAGES) & 1) ^ 1)
        k_bar = k_ready.index(stage)
        mbarrier.expect(k_bar, k_desc.block_type.nbytes)
        tma_load(k_desc, [b, hk, start_n, 0], k_bar, k_bufs.index(stage))
        v_bar = v_ready.index(stage)
        mbarrier.expect(v_bar, v_desc.block_type.nbytes)
        tma_load(v_desc, [b, hk, start_n, 0], v_bar, v_bufs.index(stage))


@gluon.jit
def _turn_wait(turn, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: wait before the k-th matmul issue until the other consumer has issued its k-th
    (consumer 0) or k+1-th (consumer 1): the two take turns at the tensor cores."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (k & 1) ^ (1 - WG))


@gluon.jit
def _turn_pass(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: this consumer's matmuls are issued; the other one's turn."""
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _issue_qk(
    q_op, k_bufs, k_ready, t, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr
):
    """S_t = Q K_t^T (BLOCK_M, BLOCK_N) fp32 as an asynchronous wgmma, once K_t has landed; the
    result is in flight until a warpgroup_mma_wait names it."""
    stage = t % STAGES
    mbarrier.wait(k_ready.index(stage), (t // STAGES) & 1)
    k_op = k_bufs.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))  # (HEAD_DIM, BLOCK_N)
    return warpgroup_mma(
        q_op, k_op, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout(BLOCK_N, 4)), use_acc=False, is_async=True
    )


@gluon.jit
def _issue_pv(acc, p, v_bufs, v_ready, t, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """O += P_t V_t as an asynchronous wgmma, once V_t has landed: (acc, p_op), both in flight (the
    registers of p_op are read by the tensor cores until the wait)."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(HEAD_DIM, 4), k_width=2)
    stage = t % STAGES
    mbarrier.wait(v_ready.index(stage), (t // STAGES) & 1)
    p_op = gl.convert_layout(p.to(v_bufs.dtype), p_layout)
    acc = warpgroup_mma(p_op, v_bufs.index(stage).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    return acc, p_op


@gluon.jit
def _key_start(t, idx_row, BS: gl.constexpr, BLOCK_N: gl.constexpr, SPARSE: gl.constexpr, MASK: gl.constexpr):
    """The first key of tile t where the mask needs it (MASK), else 0 (an unmasked step reads no list entry)."""
    if MASK:
        start_n = _tile_start(t, idx_row, BS, BLOCK_N, SPARSE)
    else:
        start_n = 0
    return start_n


@gluon.jit
def _ws_steps(
    acc,
    p,
    m_i,
    l_i,
    t_lo,
    t_hi,
    q_op,
    k_bufs,
    v_bufs,
    k_ready,
    v_ready,
    kv_empty,
    turn,
    start_m,
    key_hi,
    key_lo,
    idx_row,
    qk_scale,
    WG: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    MASK: gl.constexpr,
    PINGPONG: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """Key tiles t_lo..t_hi (t_lo >= 1) of one consumer, one tile behind with P V: step t issues
    S_t = Q K_t^T and then O += P_{t-1} V_{t-1}, waits for S_t only, computes P_t while the second
    matmul runs, then waits for it, releases stage t - 1 and rescales O."""
    s_layout: gl.constexpr = mma_layout(BLOCK_N, 4)
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, 4)
    for t in range(t_lo, t_hi):
        start_n = _key_start(t, idx_row, BS, BLOCK_N, SPARSE, MASK)
        _turn_wait(turn, t, WG, PINGPONG)
        s = _issue_qk(q_op, k_bufs, k_ready, t, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
        acc, p_op = _issue_pv(acc, p, v_bufs, v_ready, t - 1, BLOCK_N, HEAD_DIM, STAGES)
        _turn_pass(turn, WG, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # S_t done, P_{t-1} V_{t-1} may run on
        p, alpha, m_i, l_i = _softmax_update(
            s, m_i, l_i, start_m, start_n, key_hi, key_lo, qk_scale, BLOCK_M, BLOCK_N, CAUSAL, MASK, s_layout
        )
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index((t - 1) % STAGES), count=1)  # this consumer is done with stage t - 1
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, p, m_i, l_i


@gluon.jit
def _ws_steps_ahead(
    acc,
    p,
    s,
    m_i,
    l_i,
    t_lo,
    t_hi,
    q_op,
    k_bufs,
    v_bufs,
    k_ready,
    v_ready,
    kv_empty,
    turn,
    start_m,
    key_hi,
    idx_row,
    qk_scale,
    WG: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    MASK: gl.constexpr,
    PINGPONG: gl.constexpr,
    ISSUE_NEXT: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """Key tiles t_lo..t_hi (t_lo >= 1) of one consumer with qk_ahead.  Entering step t, S_t is
    done (s) and P_{t-1} in p (16-bit); step t issues O += P_{t-1} V_{t-1} and S_{t+1} = Q K_{t+1}^T
    (ISSUE_NEXT: not for the last tile), computes P_t while both run, then waits for both, releases
    stage t - 1 and rescales O.  Nothing is in flight across steps (an accumulator carried into the
    next step in flight would be copied while the tensor cores write it, and ptxas would then
    serialise every wgmma)."""
    o_layout: gl.constexpr = mma_layout(HEAD_DIM, 4)
    s_layout: gl.constexpr = mma_layout(BLOCK_N, 4)
    for t in range(t_lo, t_hi):
        start_n = _key_start(t, idx_row, BS, BLOCK_N, SPARSE, MASK)
        _turn_wait(turn, t, WG, PINGPONG)
        acc, p_op = _issue_pv(acc, p, v_bufs, v_ready, t - 1, BLOCK_N, HEAD_DIM, STAGES)
        if ISSUE_NEXT:
            s_next = _issue_qk(q_op, k_bufs, k_ready, t + 1, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
        _turn_pass(turn, WG, PINGPONG)
        p, alpha, m_i, l_i = _softmax_update(
            s, m_i, l_i, start_m, start_n, key_hi, None, qk_scale, BLOCK_M, BLOCK_N, CAUSAL, MASK, s_layout
        )
        p = p.to(v_bufs.dtype)  # carried in 16 bits: the next step's S_{t+2} needs the registers
        if ISSUE_NEXT:
            s, acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(s_next, acc, p_op))
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index((t - 1) % STAGES), count=1)  # this consumer is done with stage t - 1
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, p, s, m_i, l_i


@gluon.jit
def _ws_last_pv(
    acc,
    p,
    v_bufs,
    v_ready,
    kv_empty,
    turn,
    n_tiles,
    WG: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    PINGPONG: gl.constexpr,
):
    """The final turn of both schedules: O += P V of the last key tile, then its stage released."""
    _turn_wait(turn, n_tiles, WG, PINGPONG)
    acc, p_op = _issue_pv(acc, p, v_bufs, v_ready, n_tiles - 1, BLOCK_N, HEAD_DIM, STAGES)
    _turn_pass(turn, WG, PINGPONG)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index((n_tiles - 1) % STAGES), count=1)
    return acc


@gluon.jit
def _ws_consumer(
    q_bufs,
    k_bufs,
    v_bufs,
    q_bar,
    k_ready,
    v_ready,
    kv_empty,
    turn,
    o_desc,
    LSE,
    AUX,
    slot,
    bh,
    b,
    h,
    start_cta,
    Lq,
    n_tiles,
    t_first,
    t_full,
    key_hi,
    idx_row,
    qk_scale,
    WG: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    QK_AHEAD: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_DOCS: gl.constexpr,
):
    """Consumer warpgroup WG (0: the default partition, 1: a worker): the query rows
    [start_cta + WG * BLOCK_M, + BLOCK_M) over all n_tiles key tiles of the program (both
    consumers release every stage; a tile past this one's causal diagonal is fully masked and
    adds nothing; tiles [t_first, t_full) run unmasked, t_first 1 but with packed documents), in
    the default schedule or with QK_AHEAD; then its rows' output and lse, or (SPLIT, slot >= 0: a
    chunk of a split row) their unnormalised state for ``triton_flash_fwd.fwd_merge_kernel``
    (``_store_partial``).  AUX: the split partials (SPLIT) or the documents' spans (HAS_DOCS: (B,
    Lq, 2) int32, each row's [start, end)), one pointer so that a worker holds one more value."""
    start_m = start_cta + WG * BLOCK_M
    q_smem = q_bufs.index(WG)
    q_op = q_smem.reshape([BLOCK_M, HEAD_DIM])
    if HAS_DOCS:  # this consumer's rows' document spans, cut at the key end
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout(BLOCK_N, 4)))
        span = AUX + (b * Lq + gl.minimum(offs_m, Lq - 1)) * 2
        key_lo = gl.load(span)
        key_hi = gl.minimum(gl.load(span + 1), key_hi)
    else:
        key_lo = None
    mbarrier.wait(q_bar, 0)
    if QK_AHEAD:
        acc, m_i, l_i = _ws_consumer_ahead(
            q_op,
            k_bufs,
            v_bufs,
            k_ready,
            v_ready,
            kv_empty,
            turn,
            start_m,
            key_hi,
            idx_row,
            n_tiles,
            t_full,
            qk_scale,
            WG,
            BLOCK_M,
            BLOCK_N,
            HEAD_DIM,
            STAGES,
            CAUSAL,
            PINGPONG,
            BS,
            SPARSE,
        )
    else:
        acc, m_i, l_i = _ws_consumer_behind(
            q_op,
            k_bufs,
            v_bufs,
            k_ready,
            v_ready,
            kv_empty,
            turn,
            start_m,
            key_hi,
            key_lo,
            idx_row,
            n_tiles,
            t_first,
            t_full,
            qk_scale,
            WG,
            BLOCK_M,
            BLOCK_N,
            HEAD_DIM,
            STAGES,
            CAUSAL,
            PINGPONG,
            BS,
            SPARSE,
        )
    if SPLIT:
        if slot >= 0:
            # this chunk's acc, m, l (``triton_flash.split_rows``), addressed by query position
            chunk = AUX + (slot.to(gl.int64) * gl.num_programs(1) + bh) * (BS * (HEAD_DIM + 2))
            row_base = start_cta // BS * BS
            _store_partial(
                acc,
                l_i,
                m_i,
                chunk - row_base * HEAD_DIM,
                chunk + BS * HEAD_DIM - row_base,
                chunk + BS * (HEAD_DIM + 1) - row_base,
                start_m,
                Lq,
                BLOCK_M,
                HEAD_DIM,
                mma_layout(BLOCK_N, 4),
            )
        else:
            _store_rows(
                acc, l_i, m_i, o_desc, q_smem, LSE, bh, b, h, start_m, Lq, BLOCK_M, HEAD_DIM, mma_layout(BLOCK_N, 4)
            )
    else:
        _store_rows(
            acc, l_i, m_i, o_desc, q_smem, LSE, bh, b, h, start_m, Lq, BLOCK_M, HEAD_DIM, mma_layout(BLOCK_N, 4)
        )


@gluon.jit
def _ws_consumer_behind(
    q_op,
    k_bufs,
    v_bufs,
    k_ready,
    v_ready,
    kv_empty,
    turn,
    start_m,
    key_hi,
    key_lo,
    idx_row,
    n_tiles,
    t_first,
    t_full,
    qk_scale,
    WG: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """A consumer's key tiles in the default schedule (``_ws_steps``): key tile 0 peeled (masked),
    with packed documents (key_lo not None) the masked tiles [1, t_first) at the start of its rows'
    span, then the unmasked tiles up to t_full, then the masked ones, and the last P V; (acc, m_i,
    l_i) at the end."""
    s_layout: gl.constexpr = mma_layout(BLOCK_N, 4)
    start_n = _tile_start(0, idx_row, BS, BLOCK_N, SPARSE)
    _turn_wait(turn, 0, WG, PINGPONG)
    s = _issue_qk(q_op, k_bufs, k_ready, 0, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
    _turn_pass(turn, WG, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))  # running max of s2
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))  # running sum of exp2(s2 - m)
    p, alpha, m_i, l_i = _softmax_update(
        s, m_i, l_i, start_m, start_n, key_hi, key_lo, qk_scale, BLOCK_M, BLOCK_N, CAUSAL, True, s_layout
    )
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_layout(HEAD_DIM, 4))
    if key_lo is not None:
        acc, p, m_i, l_i = _ws_steps(
            acc,
            p,
            m_i,
            l_i,
            1,
            t_first,
            q_op,
            k_bufs,
            v_bufs,
            k_ready,
            v_ready,
            kv_empty,
            turn,
            start_m,
            key_hi,
            key_lo,
            idx_row,
            qk_scale,
            WG,
            BLOCK_M,
            BLOCK_N,
            HEAD_DIM,
            STAGES,
            CAUSAL,
            True,
            PINGPONG,
            BS,
            SPARSE,
        )
    acc, p, m_i, l_i = _ws_steps(
        acc,
        p,
        m_i,
        l_i,
        t_first,
        t_full,
        q_op,
        k_bufs,
        v_bufs,
        k_ready,
        v_ready,
        kv_empty,
        turn,
        start_m,
        key_hi,
        key_lo,
        idx_row,
        qk_scale,
        WG,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        False,
        PINGPONG,
        BS,
        SPARSE,
    )
    acc, p, m_i, l_i = _ws_steps(
        acc,
        p,
        m_i,
        l_i,
        t_full,
        n_tiles,
        q_op,
        k_bufs,
        v_bufs,
        k_ready,
        v_ready,
        kv_empty,
        turn,
        start_m,
        key_hi,
        key_lo,
        idx_row,
        qk_scale,
        WG,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        True,
        PINGPONG,
        BS,
        SPARSE,
    )
    acc = _ws_last_pv(acc, p, v_bufs, v_ready, kv_empty, turn, n_tiles, WG, BLOCK_N, HEAD_DIM, STAGES, PINGPONG)
    return acc, m_i, l_i


@gluon.jit
def _ws_consumer_ahead(
    q_op,
    k_bufs,
    v_bufs,
    k_ready,
    v_ready,
    kv_empty,
    turn,
    start_m,
    key_hi,
    idx_row,
    n_tiles,
    t_full,
    qk_scale,
    WG: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """A consumer's key tiles with qk_ahead (``_ws_steps_ahead``): (acc, m_i, l_i) at the end.

    Turn 0 issues S_0 and S_1 (S_0 twice when there is one tile; the spare is never read) and
    computes P_0 while S_1 runs; steps 1..n-2 issue S_{t+1}, the last step does not (and always
    masks: its tile may hold the diagonal or the key end); the final turn issues the last P V.
    The consumer takes as many turns as in the default schedule."""
    s_layout: gl.constexpr = mma_layout(BLOCK_N, 4)
    start_n = _tile_start(0, idx_row, BS, BLOCK_N, SPARSE)
    _turn_wait(turn, 0, WG, PINGPONG)
    s = _issue_qk(q_op, k_bufs, k_ready, 0, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
    s_next = _issue_qk(q_op, k_bufs, k_ready, gl.minimum(n_tiles - 1, 1), BLOCK_M, BLOCK_N, HEAD_DIM, STAGES)
    _turn_pass(turn, WG, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # S_0 done, S_1 runs on
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))  # running max of s2
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))  # running sum of exp2(s2 - m)
    p, alpha, m_i, l_i = _softmax_update(
        s, m_i, l_i, start_m, start_n, key_hi, None, qk_scale, BLOCK_M, BLOCK_N, CAUSAL, True, s_layout
    )
    p = p.to(v_bufs.dtype)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s_next,))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_layout(HEAD_DIM, 4))
    t_mid = gl.minimum(t_full, n_tiles - 1)  # steps [1, t_mid) unmasked, [t_mid, n - 1) masked
    acc, p, s, m_i, l_i = _ws_steps_ahead(
        acc,
        p,
        s,
        m_i,
        l_i,
        1,
        t_mid,
        q_op,
        k_bufs,
        v_bufs,
        k_ready,
        v_ready,
        kv_empty,
        turn,
        start_m,
        key_hi,
        idx_row,
        qk_scale,
        WG,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        False,
        PINGPONG,
        True,
        BS,
        SPARSE,
    )
    acc, p, s, m_i, l_i = _ws_steps_ahead(
        acc,
        p,
        s,
        m_i,
        l_i,
        t_mid,
        n_tiles - 1,
        q_op,
        k_bufs,
        v_bufs,
        k_ready,
        v_ready,
        kv_empty,
        turn,
        start_m,
        key_hi,
        idx_row,
        qk_scale,
        WG,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        True,
        PINGPONG,
        True,
        BS,
        SPARSE,
    )
    acc, p, s, m_i, l_i = _ws_steps_ahead(
        acc,
        p,
        s,
        m_i,
        l_i,
        gl.maximum(n_tiles - 1, 1),
        n_tiles,
        q_op,
        k_bufs,
        v_bufs,
        k_ready,
        v_ready,
        kv_empty,
        turn,
        start_m,
        key_hi,
        idx_row,
        qk_scale,
        WG,
        BLOCK_M,
        BLOCK_N,
        HEAD_DIM,
        STAGES,
        CAUSAL,
        True,
        PINGPONG,
        False,
        BS,
        SPARSE,
    )
    acc = _ws_last_pv(acc, p, v_bufs, v_ready, kv_empty, turn, n_tiles, WG, BLOCK_N, HEAD_DIM, STAGES, PINGPONG)
    return acc, m_i, l_i


@gluon.jit(do_not_specialize=["H", "GROUP", "Lq", "Lk", "scnt_h", "sidx_h", "sidx_m", "sord_h"])
def attn_fwd_ws_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    LSE,
    KV_LENS,
    CNT,
    IDX,
    ORDER,
    PART,
    DOCS,
    DOC_ORDER,
    scnt_h,
    sidx_h,
    sidx_m,
    sord_h,
    H,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    PINGPONG: gl.constexpr,
    QK_AHEAD: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    BS: gl.constexpr,
    SPARSE: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_KV_LENS: gl.constexpr,
    HAS_DOCS: gl.constexpr,
    num_warps: gl.constexpr,
):
    # grid: (query programs of 2 * BLOCK_M rows, B * H); num_warps == 4 (the default partition is
    # consumer 0); launched with maxnreg so that the three warpgroups' registers fit the SM
    # (CONSUMER_REGS twice + PRODUCER_REGS).
    # Dense: the last (longest causal) query programs launched first.  SPARSE: the layout's rows
    # (BS query rows, BS // (2 * BLOCK_M) programs each) in ORDER (per layout head, by descending
    # list length: a BigBird global row is not the last program running), and the row's
    # key-block list CNT / IDX (``BlockLayout.kv_indices``; head strides 0 for a shared layout).
    # SPLIT (sparse only; split-KV, as the Triton forward): ORDER holds a split plan's items (P, I, 4)
    # (row, first entry, end entry, slot; ``triton_flash.SplitPlan``); a program walks the entries
    # [first, end) of its row's list, and a chunk of a split row (slot >= 0) writes its unnormalised
    # acc and its running max and sum to PART (slots, B * H, BS * (HEAD_DIM + 2)) fp32
    # (``triton_flash.split_rows``), merged by ``triton_flash_fwd.fwd_merge_kernel``.
    # HAS_KV_LENS: keys >= KV_LENS[b] are padding.
    # HAS_DOCS (dense only, Lq == Lk; the default schedule): DOCS (B, Lq, 2) int32 holds each
    # token's document span [start, end) within its row; the programs run in DOC_ORDER (B, programs)
    # (longest span first) and walk the key tiles from the one holding their first row's document
    # start: a row packed with short documents costs about sum(len_i^2), not L^2.
    gl.static_assert(
        not (HAS_DOCS and (SPARSE or QK_AHEAD)), "packed documents run without a layout, in the default schedule"
    )
    pid = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    dtype: gl.constexpr = q_desc.dtype
    if SPARSE:
        PROGRAMS_PER_ROW: gl.constexpr = BS // (2 * BLOCK_M)
        unit = pid // PROGRAMS_PER_ROW
        if SPLIT:
            item = ORDER + h * sord_h + unit * 4
            row = gl.load(item)
            first = gl.load(item + 1)
            count = gl.load(item + 2) - first
            slot = gl.load(item + 3)
        else:
            row = gl.load(ORDER + h * sord_h + unit)
            first = 0
            count = gl.load(CNT + h * scnt_h + row)
            slot = -1
        start_cta = row * BS + (pid - unit * PROGRAMS_PER_ROW) * (2 * BLOCK_M)
        idx_row = IDX + h * sidx_h + row * sidx_m + first
    elif HAS_DOCS:
        start_cta = gl.load(DOC_ORDER + b * gl.num_programs(0) + pid) * (2 * BLOCK_M)
        count = 0
        slot = -1
        spans = DOCS + b * Lq * 2
        idx_row = gl.load(spans + start_cta * 2) // BLOCK_N * BLOCK_N  # the first tile holding a key it sees
    else:
        start_cta = (gl.num_programs(0) - 1 - pid) * (2 * BLOCK_M)
        count = 0
        slot = -1
        idx_row = 0
    kv_end = Lk
    if HAS_KV_LENS:
        kv_end = gl.minimum(gl.maximum(gl.load(KV_LENS + b).to(gl.int32), 0), Lk)
    # the key tiles the program visits: those starting before its last row's last allowed key
    if CAUSAL:
        hi = gl.minimum(start_cta + 2 * BLOCK_M, kv_end)
    else:
        hi = kv_end
    if HAS_DOCS:
        hi = gl.minimum(hi, gl.load(spans + (gl.minimum(start_cta + 2 * BLOCK_M, Lq) - 1) * 2 + 1))
    n_tiles = _tiles_before(hi, count, idx_row, BS, BLOCK_N, SPARSE, False, num_warps)
    # a program with no allowed key (an empty layout row, kv_lens 0) visits one tile with every key
    # masked (key_hi 0): its rows get o = 0 and lse = +inf as any empty row
    key_hi = gl.minimum(n_tiles, 1) * kv_end
    n_tiles = gl.maximum(n_tiles, 1)
    # each consumer's tiles allowed for all its rows (run unmasked): [1, t_full) after the peeled tile 0
    if CAUSAL:
        full_end0 = gl.minimum(start_cta + 1, kv_end)
        full_end1 = gl.minimum(start_cta + BLOCK_M + 1, kv_end)
    else:
        full_end0 = kv_end
        full_end1 = kv_end
    if HAS_DOCS:
        # ... and with documents the keys of every row's span: [start(last row), end(first row));
        # the tiles before the first that starts at or after start(last row) are masked too
        first1 = gl.minimum(start_cta + BLOCK_M, Lq - 1)
        last0 = gl.minimum(start_cta + BLOCK_M, Lq) - 1
        last1 = gl.minimum(start_cta + 2 * BLOCK_M, Lq) - 1
        full_end0 = gl.minimum(full_end0, gl.load(spans + start_cta * 2 + 1))
        full_end1 = gl.minimum(full_end1, gl.load(spans + first1 * 2 + 1))
        t_first0 = gl.minimum(gl.maximum(gl.cdiv(gl.load(spans + last0 * 2) - idx_row, BLOCK_N), 1), n_tiles)
        t_first1 = gl.minimum(gl.maximum(gl.cdiv(gl.load(spans + last1 * 2) - idx_row, BLOCK_N), 1), n_tiles)
    else:
        t_first0 = 1
        t_first1 = 1
    t_full0 = gl.minimum(
        gl.maximum(_tiles_before(full_end0, count, idx_row, BS, BLOCK_N, SPARSE, True, num_warps), 1), n_tiles
    )
    t_full1 = gl.minimum(
        gl.maximum(_tiles_before(full_end1, count, idx_row, BS, BLOCK_N, SPARSE, True, num_warps), 1), n_tiles
    )
    if HAS_DOCS:
        t_full0 = gl.maximum(t_full0, t_first0)
        t_full1 = gl.maximum(t_full1, t_first1)
        aux = DOCS
    else:
        aux = PART

    q_bufs = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # one arrive per consumer
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)

    gl.warp_specialize(
        [
            (
                _ws_consumer,
                (
                    q_bufs,
                    k_bufs,
                    v_bufs,
                    q_bar,
                    k_ready,
                    v_ready,
                    kv_empty,
                    turn,
                    o_desc,
                    LSE,
                    aux,
                    slot,
                    bh,
                    b,
                    h,
                    start_cta,
                    Lq,
                    n_tiles,
                    t_first0,
                    t_full0,
                    key_hi,
                    idx_row,
                    qk_scale,
                    0,
                    BLOCK_M,
                    BLOCK_N,
                    HEAD_DIM,
                    STAGES,
                    CAUSAL,
                    PINGPONG,
                    QK_AHEAD,
                    BS,
                    SPARSE,
                    SPLIT,
                    HAS_DOCS,
                ),
            ),
            (
                _ws_consumer,
                (
                    q_bufs,
                    k_bufs,
                    v_bufs,
                    q_bar,
                    k_ready,
                    v_ready,
                    kv_empty,
                    turn,
                    o_desc,
                    LSE,
                    aux,
                    slot,
                    bh,
                    b,
                    h,
                    start_cta,
                    Lq,
                    n_tiles,
                    t_first1,
                    t_full1,
                    key_hi,
                    idx_row,
                    qk_scale,
                    1,
                    BLOCK_M,
                    BLOCK_N,
                    HEAD_DIM,
                    STAGES,
                    CAUSAL,
                    PINGPONG,
                    QK_AHEAD,
                    BS,
                    SPARSE,
                    SPLIT,
                    HAS_DOCS,
                ),
            ),
            (
                _ws_producer,
                (
                    q_desc,
                    k_desc,
                    v_desc,
                    q_bufs,
                    k_bufs,
                    v_bufs,
                    q_bar,
                    k_ready,
                    v_ready,
                    kv_empty,
                    b,
                    h,
                    hk,
                    start_cta,
                    n_tiles,
                    idx_row,
                    BLOCK_M,
                    BLOCK_N,
                    STAGES,
                    BS,
                    SPARSE,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )
