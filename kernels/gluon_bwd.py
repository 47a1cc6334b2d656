"""Hopper-native FlashAttention backward kernels in Gluon (``triton.experimental.gluon``), sm_90 only.

Three launches, in reading order:
  1. ``bwd_preprocess_kernel``: delta = rowsum(dO * O) - log2(e) * dlse (B, H, Lq) fp32, and the
     fp32 dQ accumulator zeroed (the main kernel adds into it);
  2. ``attn_bwd_kernel`` (FlashAttention-3's loop order and operand layout): one program per (key
     tile of BLOCK_N rows, batch, kv head).  K and V arrive once by TMA and stay in shared
     memory; the program walks the query tiles that see its keys, for each of the GROUP query heads
     of its kv head in turn, with Q and dO tiles arriving by TMA into a STAGES-deep ring (one
     mbarrier per stage, refilled STAGES tiles ahead) and lse, delta by pointers.  Per query tile,
     five asynchronous wgmma, keys as the rows of every accumulator (the transposed layout: P^T and
     dS^T come out of their matmuls in the registers that feed the next as operand A):
        S^T = K Q^T,  dP^T = V dO^T          (BLOCK_N, BLOCK_M)
        dV += P^T dO, dK += dS^T Q          (BLOCK_N, D), fp32 in registers for the whole program
        dQ_part = dS K                      (BLOCK_M, D), dS^T through shared memory
     and dQ_part is added to the fp32 accumulator with relaxed atomics (the only sum over programs).
     With WARP_SPECIALIZED a producer warp issues the Q, dO loads (``_bwd_producer``) and the
     consumer warps hand each used stage back by an mbarrier; else the consumers refill it;
  3. ``bwd_postprocess_kernel``: dQ = scale * accumulator, in the inputs' dtype.
dK and dV are summed over the GROUP heads inside one program (a plain loop: deterministic); dQ is
not (the atomic adds' order varies run to run in the last bits, as in FlashAttention-2 and -3).

Why atomics rather than a second kernel for dQ (our Triton backward's choice): a dQ kernel computes
S and dP again, 3 matmuls per tile pair on top of these 5 (8 / 5 = 1.6x the tensor-core work), where
the atomic adds cost BLOCK_M * D * 4 bytes of L2 traffic per tile pair, the size of its Q and dO
tiles.  Triton 3.9 has a TMA reduce-add (``tma.async_atomic_add``, FlashAttention-3's way); 3.6,
the GPU image's, has not, so the adds go through pointers.

Masks: the causal diagonal and keys past Lk (whose zero-filled K rows would otherwise give
p = exp2(-lse)) need one.  Query rows past Lq read Q = dO = 0 (TMA zero fill) and lse = +inf,
delta = 0 (masked loads), so their p and dS are exactly 0 and they add nothing.

Launch configurations (``BwdConfig``) are here; so is the launcher (``gluon_bwd_launch``), whose
torch import is local so that the kernels above it compile with triton alone
(tests/kernels/test_gluon_bwd.py cross-compiles them for sm_90 on a CPU).

Legend: B batch, H query heads, HKV key/value heads, GROUP = H // HKV (query head h reads kv head
h // GROUP), Lq / Lk query / key lengths, D head dim (64 or 128).
  q, o, do, dq (B, H, Lq, D); k, v, dk, dv (B, HKV, Lk, D); lse, delta (B, H, Lq) fp32;
  dq_acc (B, H, Lq, D) fp32.  The tensor descriptors are 4-D with (1, 1, rows, D) boxes, as the
  forward's (``gluon_fwd``): TMA clips each box at its head's length.
Scores in base 2 as the forward saved them: p = exp2(s * qk_scale - lse), qk_scale = scale * log2(e);
with dS = p * (dP - delta) the gradient of the natural-log scores s = scale * q . k:
  dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K   (as ``triton_flash_bwd``).
"""

from __future__ import annotations

import dataclasses

from genoformer.kernels.gluon_fwd import HEAD_DIMS, tma_load, tma_store
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The CTA-wide barrier (inside a warp_specialize partition: its warps only, a named barrier) was
# renamed: 3.6, the GPU image's, has only thread_barrier, 3.9 only barrier.
cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

LOG2E = 1.4426950408889634  # 1 / ln(2): a gradient g2 on the base-2 lse is g2 * log2(e) on the natural-log one


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """One launch configuration of ``attn_bwd_kernel``.

    block_n: key rows per program (the rows of dK, dV, held in registers: 2 * block_n * D fp32).
    block_m: query rows per step (Q, dO tiles; the columns of S^T, dP^T).
    stages: Q / dO tiles in flight (shared memory 2 * stages * block_m * D * 2 bytes, plus K, V
        2 * block_n * D * 2 and dS^T block_n * block_m * 2).
    num_warps: 4 (one warpgroup) or 8 (two, of block_n / 2 key rows each; block_n 128).
    warp_specialized: a producer warp issues the Q, dO loads (the consumers, num_warps warps, release
        each stage by an mbarrier) instead of the consumers between their steps.
    producer_regs, maxnreg: (warp-specialised only) the producer's registers after setmaxnreg, and the
        kernel's cap before it: what num_warps + 4 warps (the producer's warpgroup) may hold, 65536 /
        (32 * (num_warps + 4)) rounded down to 8; the consumers get the rest.
    """

    block_m: int
    block_n: int
    stages: int
    num_warps: int = 8
    warp_specialized: bool = False
    producer_regs: int = 24
    maxnreg: int = 168


WIDE_CONFIGS = {
    64: BwdConfig(block_m=64, block_n=128, stages=3),
    128: BwdConfig(block_m=64, block_n=128, stages=2),
}
"""Two warpgroups share a 128-key tile (FlashAttention-3's shape): one CTA per SM (registers)."""
NARROW_CONFIGS = {
    64: BwdConfig(block_m=64, block_n=64, stages=3, num_warps=4),
    128: BwdConfig(block_m=64, block_n=64, stages=2, num_warps=4),
}
"""One warpgroup per 64-key tile: two CTAs per SM (registers and shared memory allow it), whose
warpgroups drift apart, so one's softmax overlaps the other's matmuls; twice the Q, dO reads and dQ
adds of the wide tiles."""
WS_CONFIGS = {
    64: BwdConfig(block_m=64, block_n=128, stages=3, warp_specialized=True),
    128: BwdConfig(block_m=64, block_n=128, stages=2, warp_specialized=True),
}
"""The wide tiles with a producer warp (consumers at (65536 - 128 * 24) / 256 = 240 registers)."""
CONFIGS = WIDE_CONFIGS
"""The configuration per head dim the launcher takes when given none."""

PRE_ROWS = 64
"""Rows per program of the pre- and postprocess kernels."""


@gluon.constexpr_function
def acc_layout(rows, cols, num_warps):
    """The wgmma accumulator layout of a (rows, cols) fp32 tile over `num_warps` warps: 16 rows per
    warp along the rows as far as they go (a warpgroup takes 64), the remaining warps split the
    columns (a (64, D) tile over 8 warps: two warpgroups of D / 2 columns each)."""
    warps_m = min(num_warps, rows // 16)
    warps_n = num_warps // warps_m
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, cols // warps_n, 16]
    )


@gluon.constexpr_function
def row_layout(head_dim, num_warps):
    """A blocked layout of (rows, head_dim) tiles for the pointer loads of the small kernels:
    8 consecutive elements (16 bytes of a 16-bit tensor) per thread."""
    lanes_d = head_dim // 8
    return gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[32 // lanes_d, lanes_d], warps_per_cta=[num_warps, 1], order=[1, 0]
    )


# --------------------------------------------------------------------------------------------
# Pre- and postprocess
# --------------------------------------------------------------------------------------------


@gluon.jit
def bwd_preprocess_kernel(
    O,
    DO,
    DLSE,
    DELTA,
    DQ_ACC,
    n_rows,
    HEAD_DIM: gl.constexpr,
    ROWS: gl.constexpr,
    HAS_DLSE: gl.constexpr,
    num_warps: gl.constexpr,
):
    # grid: (cdiv(B * H * Lq, ROWS),) over the rows of contiguous O, DO (B * H * Lq, D); DLSE the
    # gradient of the base-2 lse (HAS_DLSE only), DELTA (B * H * Lq,), DQ_ACC zeroed here
    layout: gl.constexpr = row_layout(HEAD_DIM, num_warps)
    offs_r = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    row_ok = offs_r < n_rows
    offs = gl.expand_dims(offs_r.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(offs_d, 0)  # (ROWS, HEAD_DIM)
    ok = gl.expand_dims(row_ok, 1)
    o = gl.load(O + offs, mask=ok, other=0.0).to(gl.float32)
    do = gl.load(DO + offs, mask=ok, other=0.0).to(gl.float32)
    delta = gl.sum(o * do, 1)
    if HAS_DLSE:
        delta -= gl.load(DLSE + offs_r, mask=row_ok, other=0.0) * 1.4426950408889634  # log2(e)
    gl.store(DELTA + offs_r, delta, mask=row_ok)
    gl.store(DQ_ACC + offs, gl.zeros([ROWS, HEAD_DIM], gl.float32, layout), mask=ok)


@gluon.jit
def bwd_postprocess_kernel(
    DQ_ACC, DQ, n_rows, sm_scale, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr, num_warps: gl.constexpr
):
    # grid: (cdiv(B * H * Lq, ROWS),): dq = sm_scale * dq_acc over contiguous (B * H * Lq, D) rows
    layout: gl.constexpr = row_layout(HEAD_DIM, num_warps)
    offs_r = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(offs_r.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(offs_d, 0)  # (ROWS, HEAD_DIM)
    ok = gl.expand_dims(offs_r < n_rows, 1)
    dq = gl.load(DQ_ACC + offs, mask=ok, other=0.0) * sm_scale
    gl.store(DQ + offs, dq.to(DQ.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------------------------
# The main kernel: dK, dV per key tile, dQ by atomic adds
# --------------------------------------------------------------------------------------------


@gluon.jit
def _load_step(
    it,
    per_head,
    j_first,
    q_desc,
    do_desc,
    q_bufs,
    do_bufs,
    ready,
    b,
    h0,
    BLOCK_M: gl.constexpr,
    STAGES: gl.constexpr,
    pred,
):
    """Issue the TMA loads of step `it` (query head h0 + it // per_head, query tile
    j_first + it % per_head) into stage it % STAGES (when pred)."""
    stage = it % STAGES
    h = h0 + it // per_head
    start_m = (j_first + it % per_head) * BLOCK_M
    bar = ready.index(stage)
    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=pred)
    tma_load(q_desc, [b, h, start_m, 0], bar, q_bufs.index(stage), pred=pred)
    tma_load(do_desc, [b, h, start_m, 0], bar, do_bufs.index(stage), pred=pred)


@gluon.jit
def _bwd_steps(
    dk,
    dv,
    it,
    j_first,
    n_m,
    per_head,
    n_steps,
    q_desc,
    do_desc,
    q_bufs,
    do_bufs,
    ready,
    empty,
    k_op,
    v_op,
    ds_smem,
    LSE,
    DELTA,
    DQ_ACC,
    b,
    h0,
    bh,
    start_n,
    Lq,
    Lk,
    qk_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    WS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Query tiles j_first..n_m of the query head of (B * H) row `bh`, as steps it, it + 1, ... of
    the ring (a counter over the program's heads and tiles); returns dk, dv and the next step's
    counter.  A used stage is refilled here, or with WS released to the producer warp (`empty`).
    Every step masks the causal diagonal (key > query) and keys past Lk (p = 0): one loop
    body rather than a masked and an unmasked copy, whose loop-carried dK, dV made ptxas spill; the
    mask is 2 compares and a select per element of S^T, beside an exp2 and 2 matmuls'.
    Query rows past Lq need no mask: their lse = +inf gives p = 0."""
    s_layout: gl.constexpr = acc_layout(BLOCK_N, BLOCK_M, num_warps)  # S^T, dP^T (BLOCK_N, BLOCK_M)
    kv_layout: gl.constexpr = acc_layout(BLOCK_N, HEAD_DIM, num_warps)  # dK, dV (BLOCK_N, HEAD_DIM)
    dq_layout: gl.constexpr = acc_layout(BLOCK_M, HEAD_DIM, num_warps)  # dQ_part (BLOCK_M, HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    dtype: gl.constexpr = q_desc.dtype
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])  # lse, delta (BLOCK_M,)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    row_base = bh.to(gl.int64) * Lq
    for j in range(j_first, n_m):
        stage = it % STAGES
        start_m = j * BLOCK_M
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
        q_smem = q_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do_smem = do_bufs.index(stage).reshape([BLOCK_M, HEAD_DIM])
        zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        sT = warpgroup_mma(k_op, q_smem.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dpT = warpgroup_mma(v_op, do_smem.permute((1, 0)), zeros, use_acc=False, is_async=True)
        # lse, delta (BLOCK_M,) loaded in a compact layout, then spread to the columns of S^T
        # through shared memory: 16 addresses a thread fewer each (ptxas spills less at D 128);
        # rows past Lq: lse = +inf makes their p exactly 0
        offs_c = start_m + gl.arange(0, BLOCK_M, layout=vec_layout)
        lse = gl.load(LSE + row_base + offs_c, mask=offs_c < Lq, other=float("inf"))
        delta = gl.load(DELTA + row_base + offs_c, mask=offs_c < Lq, other=0.0)
        lse = gl.convert_layout(lse, gl.SliceLayout(0, s_layout))
        delta = gl.convert_layout(delta, gl.SliceLayout(0, s_layout))
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))  # S^T done, dP^T may run on
        pT = gl.exp2(sT * qk_scale - gl.expand_dims(lse, 0))  # (BLOCK_N, BLOCK_M)
        keep = gl.expand_dims(offs_n < Lk, 1)
        if CAUSAL:
            keep = keep & (gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1))
        pT = gl.where(keep, pT, 0.0)
        p_op = gl.convert_layout(pT.to(dtype), a_layout)
        dv = warpgroup_mma(p_op, do_smem, dv, is_async=True)
        dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))  # dP^T done, dV may run on
        dsT = (pT * (dpT - gl.expand_dims(delta, 0))).to(dtype)  # (BLOCK_N, BLOCK_M)
        ds_smem.store(dsT)  # both matmuls below read dS^T from shared memory: no registers held for it
        fence_async_shared()
        dk = warpgroup_mma(ds_smem, q_smem, dk, is_async=True)
        dq = warpgroup_mma(
            ds_smem.permute((1, 0)),
            k_op,
            gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout),
            use_acc=False,
            is_async=True,
        )
        dv, dk, dq, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, p_op))
        # every warp is done with the stage and dS^T: refill the stage with the step STAGES ahead
        # (or hand it to the producer), and the next step may overwrite dS^T
        cta_barrier()
        if WS:
            mbarrier.arrive(empty.index(stage), count=1)
        else:
            _load_step(
                it + STAGES,
                per_head,
                j_first,
                q_desc,
                do_desc,
                q_bufs,
                do_bufs,
                ready,
                b,
                h0,
                BLOCK_M,
                STAGES,
                it + STAGES < n_steps,
            )
        offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
        offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
        ptrs = DQ_ACC + (row_base + gl.expand_dims(offs_qm, 1)) * HEAD_DIM + gl.expand_dims(offs_d, 0)
        gl.atomic_add(ptrs, dq, mask=gl.expand_dims(offs_qm < Lq, 1), sem="relaxed")
        it += 1
    return dk, dv, it


@gluon.jit
def _bwd_consumer(
    q_desc,
    do_desc,
    dk_desc,
    dv_desc,
    k_smem,
    v_smem,
    q_bufs,
    do_bufs,
    ds_smem,
    kv_bar,
    ready,
    empty,
    LSE,
    DELTA,
    DQ_ACC,
    H,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    sm_scale,
    b,
    hk,
    h0,
    start_n,
    j_first,
    n_m,
    per_head,
    n_steps,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    WS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Every step of the program (GROUP heads x their query tiles), then dK, dV through the K, V
    buffers (no longer read) and TMA stores clipped at Lk."""
    dtype: gl.constexpr = q_desc.dtype
    kv_layout: gl.constexpr = acc_layout(BLOCK_N, HEAD_DIM, num_warps)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)  # stays in registers
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)  # stays in registers
    mbarrier.wait(kv_bar, 0)
    k_op = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_op = v_smem.reshape([BLOCK_N, HEAD_DIM])
    it = 0
    for g in range(GROUP):
        bh = b * H + h0 + g
        dk, dv, it = _bwd_steps(
            dk,
            dv,
            it,
            j_first,
            n_m,
            per_head,
            n_steps,
            q_desc,
            do_desc,
            q_bufs,
            do_bufs,
            ready,
            empty,
            k_op,
            v_op,
            ds_smem,
            LSE,
            DELTA,
            DQ_ACC,
            b,
            h0,
            bh,
            start_n,
            Lq,
            Lk,
            qk_scale,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_N,
            STAGES,
            CAUSAL,
            WS,
            num_warps,
        )
    k_op.store((dk * sm_scale).to(dtype))
    v_op.store(dv.to(dtype))
    fence_async_shared()
    tma_store(dk_desc, [b, hk, start_n, 0], k_smem)
    tma_store(dv_desc, [b, hk, start_n, 0], v_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _bwd_producer(
    q_desc,
    do_desc,
    q_bufs,
    do_bufs,
    ready,
    empty,
    b,
    h0,
    j_first,
    per_head,
    n_steps,
    BLOCK_M: gl.constexpr,
    STAGES: gl.constexpr,
):
    """The producer warp (WS): step it's Q and dO into stage it % STAGES once the consumers released
    it (`empty`; the first wait of each stage passes: a fresh barrier counts its previous phase as
    complete)."""
    for it in range(n_steps):
        stage = it % STAGES
        mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
        _load_step(it, per_head, j_first, q_desc, do_desc, q_bufs, do_bufs, ready, b, h0, BLOCK_M, STAGES, True)


@gluon.jit(do_not_specialize=["H", "HKV", "GROUP", "Lq", "Lk"])
def attn_bwd_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dk_desc,
    dv_desc,
    LSE,
    DELTA,
    DQ_ACC,
    H,
    HKV,
    GROUP,
    Lq,
    Lk,
    qk_scale,
    sm_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    WARP_SPECIALIZED: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    # grid: (key tiles, B * HKV), key tile 0 (the longest causal column) launched first.
    # WARP_SPECIALIZED: the num_warps consumer warps are the default partition and one producer
    # warp (PRODUCER_REGS registers after setmaxnreg) issues the Q, dO loads; launched with maxnreg
    # (what the warpgroups together may hold); else the consumers issue them themselves
    start_n = gl.program_id(0) * BLOCK_N
    bhk = gl.program_id(1)
    b = bhk // HKV
    hk = bhk % HKV
    h0 = hk * GROUP  # the first query head of this kv head
    dtype: gl.constexpr = q_desc.dtype
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(
        swizzle_byte_width=min(128, BLOCK_M * 2), element_bitwidth=16, rank=2
    )

    k_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)  # stays in SRAM
    v_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)  # stays in SRAM
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)  # dS^T of the current step
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())  # WS only
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        if WARP_SPECIALIZED:
            mbarrier.init(empty.index(i), count=1)  # one arrive from the consumers' partition

    # query tiles that see this key tile: causal, from the one holding query start_n
    n_m = gl.cdiv(Lq, BLOCK_M)
    if CAUSAL:
        j_first = start_n // BLOCK_M
    else:
        j_first = 0
    per_head = n_m - j_first
    n_steps = GROUP * per_head

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [b, hk, start_n, 0], kv_bar, k_smem)
    tma_load(v_desc, [b, hk, start_n, 0], kv_bar, v_smem)
    if WARP_SPECIALIZED:
        gl.warp_specialize(
            [
                (
                    _bwd_consumer,
                    (
                        q_desc,
                        do_desc,
                        dk_desc,
                        dv_desc,
                        k_smem,
                        v_smem,
                        q_bufs,
                        do_bufs,
                        ds_smem,
                        kv_bar,
                        ready,
                        empty,
                        LSE,
                        DELTA,
                        DQ_ACC,
                        H,
                        GROUP,
                        Lq,
                        Lk,
                        qk_scale,
                        sm_scale,
                        b,
                        hk,
                        h0,
                        start_n,
                        j_first,
                        n_m,
                        per_head,
                        n_steps,
                        HEAD_DIM,
                        BLOCK_M,
                        BLOCK_N,
                        STAGES,
                        CAUSAL,
                        True,
                        num_warps,
                    ),
                ),
                (
                    _bwd_producer,
                    (
                        q_desc,
                        do_desc,
                        q_bufs,
                        do_bufs,
                        ready,
                        empty,
                        b,
                        h0,
                        j_first,
                        per_head,
                        n_steps,
                        BLOCK_M,
                        STAGES,
                    ),
                ),
            ],
            [1],
            [PRODUCER_REGS],
        )
    else:
        for i in gl.static_range(STAGES):  # fill the ring
            _load_step(
                i, per_head, j_first, q_desc, do_desc, q_bufs, do_bufs, ready, b, h0, BLOCK_M, STAGES, i < n_steps
            )
        _bwd_consumer(
            q_desc,
            do_desc,
            dk_desc,
            dv_desc,
            k_smem,
            v_smem,
            q_bufs,
            do_bufs,
            ds_smem,
            kv_bar,
            ready,
            empty,
            LSE,
            DELTA,
            DQ_ACC,
            H,
            GROUP,
            Lq,
            Lk,
            qk_scale,
            sm_scale,
            b,
            hk,
            h0,
            start_n,
            j_first,
            n_m,
            per_head,
            n_steps,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_N,
            STAGES,
            CAUSAL,
            False,
            num_warps,
        )


# --------------------------------------------------------------------------------------------
# Launcher (torch imported here: the kernels above compile with triton alone)
# --------------------------------------------------------------------------------------------


def unsupported_reason(do, q, k, v, o, lse) -> str | None:
    """None when ``gluon_bwd_launch`` can run these tensors, else a sentence saying why and what to do.
    What the forward already checked (dtype, head dim, GQA, the device) is checked again: the
    launcher may be called on its own."""
    import torch

    B, H, Lq, D = q.shape
    if q.dtype not in (torch.float16, torch.bfloat16) or any(t.dtype != q.dtype for t in (k, v, o, do)):
        return (
            f"the Gluon backward takes float16 or bfloat16 q, k, v, o, do of one dtype, got "
            f"{q.dtype}, {k.dtype}, {v.dtype}, {o.dtype}, {do.dtype}"
        )
    if D not in HEAD_DIMS:
        return f"head dim {D} is not supported by the Gluon backward (only {', '.join(map(str, HEAD_DIMS))})"
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or k.shape[1] == 0 or H % k.shape[1]:
        return f"k and v must both be (B={B}, HKV, Lk, D={D}) with H={H} a multiple of HKV; got {tuple(k.shape)}"
    if o.shape != q.shape or do.shape != q.shape or tuple(lse.shape) != (B, H, Lq) or lse.dtype != torch.float32:
        return (
            f"o and do must be {tuple(q.shape)} and lse ({B}, {H}, {Lq}) float32; got o {tuple(o.shape)}, "
            f"do {tuple(do.shape)}, lse {tuple(lse.shape)} {lse.dtype}"
        )
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon backward runs on an sm_90 (Hopper) GPU only: use triton_flash.flash_bwd"
    return None


def gluon_bwd_launch(do, q, k, v, o, lse, causal: bool, scale: float, dlse=None, config: BwdConfig | None = None):
    """Backward launcher, a drop-in for ``triton_flash.flash_bwd`` on dense inputs: returns dq, dk, dv
    (contiguous, in q's dtype) from the forward's o and base-2 lse (+inf for an empty row).

    dlse: (B, H, Lq) the gradient of that base-2 lse, None when nothing downstream used it.
    config: None for ``CONFIGS[D]``.  Raises ValueError saying what to do when it cannot run them
    (``unsupported_reason``).  dK and dV are deterministic, dQ is summed by atomic adds."""
    import torch
    import triton
    from genoformer.kernels.gluon_flash import _descriptor, _tma_ready  # (imported here: it imports this module)

    reason = unsupported_reason(do, q, k, v, o, lse)
    if reason is not None:
        raise ValueError(f"gluon backward cannot run these inputs: {reason}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal attention needs Lq == Lk, got {q.shape[2]} and {k.shape[2]}")
    q, k, v = (_tma_ready(t) for t in (q, k, v))  # read in place when TMA can
    o, do, lse = (t.contiguous() for t in (o, do, lse))  # the row kernels read them flat
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    cfg = CONFIGS[D] if config is None else config
    dq = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, HKV, Lk, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, HKV, Lk, D), dtype=v.dtype, device=q.device)
    delta = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    dq_acc = torch.empty((B, H, Lq, D), dtype=torch.float32, device=q.device)
    rows = B * H * Lq
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    bwd_preprocess_kernel[(triton.cdiv(rows, PRE_ROWS),)](
        o,
        do,
        dlse if dlse is not None else delta,
        delta,
        dq_acc,
        rows,
        HEAD_DIM=D,
        ROWS=PRE_ROWS,
        HAS_DLSE=dlse is not None,
        num_warps=4,
    )
    q_desc, do_desc = _descriptor(q, cfg.block_m), _descriptor(do, cfg.block_m)
    k_desc, v_desc = _descriptor(k, cfg.block_n), _descriptor(v, cfg.block_n)
    dk_desc, dv_desc = _descriptor(dk, cfg.block_n), _descriptor(dv, cfg.block_n)
    attn_bwd_kernel[(triton.cdiv(Lk, cfg.block_n), B * HKV)](
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        dk_desc,
        dv_desc,
        lse,
        delta,
        dq_acc,
        H,
        HKV,
        H // HKV,
        Lq,
        Lk,
        scale * LOG2E,
        scale,
        HEAD_DIM=D,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        STAGES=cfg.stages,
        CAUSAL=causal,
        WARP_SPECIALIZED=cfg.warp_specialized,
        PRODUCER_REGS=cfg.producer_regs,
        num_warps=cfg.num_warps,
        **({"maxnreg": cfg.maxnreg} if cfg.warp_specialized else {}),
    )
    bwd_postprocess_kernel[(triton.cdiv(rows, PRE_ROWS),)](
        dq_acc, dq, rows, scale, HEAD_DIM=D, ROWS=PRE_ROWS, num_warps=4
    )
    return dq, dk, dv
