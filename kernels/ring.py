"""Ring attention: one sequence split across the ranks of a process group, merged by log-sum-exp.

Shape legend:
    B    batch       Hq / Hkv  query / key-value heads      D   head dim
    L    the whole sequence (every rank's shard together)   Lr  this rank's shard
    Ls   the shard of the rank whose keys and values are held at a step
    W    ranks in the group (the world of the ring)          C   chunks: W, or 2 W when zigzag

Sharding contract (what a data loader or a context-parallel strategy must do, `Sharding`):
    The L positions are cut into C chunks. With `granule` g (1, or a layout's block size) the
    ceil(L / g) units of g tokens are split as `torch.tensor_split` splits them: the first
    (units % C) chunks get one unit more; chunk bounds are unit bounds times g, the last cut at L.
    contiguous (zigzag=False): C = W, rank r holds chunk r.
    zigzag (zigzag=True):      C = 2 W, rank r holds chunks r and 2W - 1 - r, in that order. Under
                               a causal mask every rank then does the same work (chunk r sees
                               r + 1 chunks, chunk 2W - 1 - r sees 2W - r of them).
    A rank's shard is its chunks concatenated in ascending position: `Sharding.shard(x, rank, dim)`
    cuts a full tensor (tokens, labels, positions for RoPE, a loss mask) the same way, and
    `Sharding.positions(rank)` lists the global positions of the shard's tokens (`shard_positions`
    is the same as a function). Every tensor that lives along the sequence is sharded by the same
    rule; q, k and v of one rank are (B, H, Lr, D) with the shard's positions in that order.
    Block-sparse layouts are over global positions, so chunk bounds must fall on the layout's
    blocks: build the sharding with granule=layout.block_size (ring_attention checks this).
    Every chunk holds at least one unit (L >= C * g), or `Sharding` refuses.

What each rank computes: `ring_attention(q, k, v, ...)` returns the rows of its shard of
    attention(q_full, k_full, v_full, causal=..., layout=...) on the whole sequence, for the same
    backend, and gradients for its q, k, v shard; with return_lse also the rows' lse.

How: keys and values travel around the ring (rank r sends to r + 1 and receives from r - 1 with
`torch.distributed.batch_isend_irecv`, the next step's transfer running while the current step
computes); at step t rank r holds the shard of rank (r - t) mod W. Each (query chunk, key chunk)
pair is one `attention(..., return_lse=True)` call: causal on a chunk with itself, unmasked for a
key chunk wholly before the query chunk, skipped when wholly after it; a layout gives each pair the
sub-layout of its blocks (`BlockLayout.crop`), and a pair with no allowed block is skipped. Partials
merge by log-sum-exp (`merge_partials`):
    lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
with a row no key has reached kept at out 0, lse -inf.

Backward (an autograd Function): keys and values go around the ring again, and with them fp32
accumulators of their dK and dV, which reach their owner after the last step (one more transfer).
Each pair is recomputed (one extra forward per pair: memory stays that of one pair) and
differentiated through its own out and lse: with w = exp(lse_pair - lse),
    d out_pair = w dO,    d lse_pair = w (rowsum(dO * (out_pair - out)) + d lse),
which is the pair's share of the whole sequence's gradient (the softmax of the whole row, applied
to the pair's keys). Every backend that returns a differentiable lse can run a ring (reference,
torch, sdpa, triton; flash-attn returns lse without a gradient and is refused under autograd).

Not yet here: key padding (kv_lens) and packed documents (cu_seqlens) across shards; a Triton
backward fed the merged out and lse directly, which would save the recompute.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed as dist
from genoformer.kernels import dispatch
from genoformer.kernels.dispatch import AttentionPlan, Backend
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.reference import lse_dtype

__all__ = ["Sharding", "shard_positions", "ring_attention", "merge_partials"]


# ----------------------------------------------------------------------------- sharding
@dataclasses.dataclass(frozen=True)
class Sharding:
    """How one sequence of `seq_len` tokens is cut over `world` ranks (the contract above).

    Attributes:
        seq_len: L, the whole sequence.
        world: W, ranks in the ring's group.
        zigzag: two chunks per rank (r and 2W - 1 - r), which balances causal work.
        granule: chunk bounds fall on multiples of it (a layout's block size for block-sparse
            attention), except the end of the sequence.
    """

    seq_len: int
    world: int
    zigzag: bool = False
    granule: int = 1

    def __post_init__(self) -> None:
        for name in ("seq_len", "world", "granule"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Sharding.{name} must be a positive int, got {value!r}.")
        units = -(-self.seq_len // self.granule)
        if units < self.num_chunks:
            raise ValueError(
                f"a sequence of {self.seq_len} tokens has {units} units of {self.granule} tokens, fewer than the "
                f"{self.num_chunks} chunks of {self.world} ranks{' (zigzag: two each)' if self.zigzag else ''}; "
                "use fewer ranks, a longer sequence or a smaller granule."
            )

    @property
    def num_chunks(self) -> int:
        """C: W, or 2 W when zigzag."""
        return 2 * self.world if self.zigzag else self.world

    @functools.cached_property
    def chunk_bounds(self) -> tuple[tuple[int, int], ...]:
        """The C chunks' [start, end) global positions, in order along the sequence."""
        units = -(-self.seq_len // self.granule)
        base, extra = divmod(units, self.num_chunks)
        bounds, start = [], 0
        for c in range(self.num_chunks):
            end = start + base + (c < extra)
            bounds.append((start * self.granule, min(end * self.granule, self.seq_len)))
            start = end
        return tuple(bounds)

    def chunk_ids(self, rank: int) -> tuple[int, ...]:
        """The chunks rank holds, in ascending position: (r,) or (r, 2W - 1 - r)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in a world of {self.world}.")
        return (rank, self.num_chunks - 1 - rank) if self.zigzag else (rank,)

    def chunks(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The global [start, end) ranges rank holds, in the order its shard stores them."""
        return tuple(self.chunk_bounds[c] for c in self.chunk_ids(rank))

    def length(self, rank: int) -> int:
        """Lr: tokens in rank's shard."""
        return sum(end - start for start, end in self.chunks(rank))

    def positions(self, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """(Lr,) int64: the global position of each token of rank's shard, in shard order."""
        return torch.cat([torch.arange(start, end, device=device) for start, end in self.chunks(rank)])

    def shard(self, x: torch.Tensor, rank: int, dim: int = -2) -> torch.Tensor:
        """rank's shard of x, a tensor holding the whole sequence along `dim` (L long)."""
        if x.shape[dim] != self.seq_len:
            raise ValueError(f"x has {x.shape[dim]} positions along dim {dim}, the sharding {self.seq_len}.")
        return torch.cat([x.narrow(dim, start, end - start) for start, end in self.chunks(rank)], dim=dim)

    def unshard(self, shards: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
        """The whole sequence from every rank's shard (shards[r] of rank r), the inverse of `shard`."""
        if len(shards) != self.world:
            raise ValueError(f"unshard needs one shard per rank ({self.world}), got {len(shards)}.")
        pieces: list[tuple[int, torch.Tensor]] = []
        for rank, x in enumerate(shards):
            offset = 0
            for start, end in self.chunks(rank):
                pieces.append((start, x.narrow(dim, offset, end - start)))
                offset += end - start
        return torch.cat([piece for _, piece in sorted(pieces, key=lambda p: p[0])], dim=dim)


def shard_positions(seq_len: int, world: int, rank: int, *, zigzag: bool = False, granule: int = 1) -> torch.Tensor:
    """(Lr,) int64 global positions of rank's shard: `Sharding(seq_len, world, zigzag, granule).positions(rank)`."""
    return Sharding(seq_len, world, zigzag, granule).positions(rank)


# ------------------------------------------------------------------------------ merging
def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of rows over two disjoint key sets, from each set's (out, lse): (out, lse).

    out_* (..., L, D), lse_* (..., L) (the `attention(return_lse=True)` convention); out comes
    in the promoted dtype of out_* and the lse. A row neither set reaches (both lse -inf) stays
    out 0, lse -inf. Differentiable without NaN, also for such rows.
    """
    m = torch.maximum(lse_a, lse_b)
    m = m.masked_fill(m == float("-inf"), 0.0)  # a row no key reached: both weights below are 0
    e_a, e_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = e_a + e_b
    empty = total == 0
    total = total.masked_fill(empty, 1.0)
    out = (e_a / total).unsqueeze(-1) * out_a + (e_b / total).unsqueeze(-1) * out_b
    return out, (m + torch.log(total)).masked_fill(empty, float("-inf"))


# ------------------------------------------------------------------------------ the ring
@dataclasses.dataclass(frozen=True)
class _Pair:
    """One attention call of a step: this rank's query rows [q0, q1) of its shard against the
    held shard's key rows [k0, k1), run as `plan` says (causal only for a chunk with itself)."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    plan: AttentionPlan


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    layout: BlockLayout | None = None,
    scale: float | None = None,
    backend: Backend | str = Backend.AUTO,
    sharding: Sharding | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of attention over a sequence sharded across `group` (module docstring).

    Args:
        q: (B, Hq, Lr, D) this rank's shard of the queries, in shard order (`Sharding.shard`).
        k, v: (B, Hkv, Lr, D) its shard of the keys and values (Hq % Hkv == 0).
        group: the ring's process group (None: the default group; without an initialised
            torch.distributed, a world of one).
        causal: key j visible to query i iff j <= i, in global positions.
        layout: block-sparse pattern over the whole sequence (q_len == kv_len == L); the
            sharding's chunks must start on its blocks (granule=layout.block_size).
        scale: multiplier of q k^T; default 1 / sqrt(D).
        backend: what runs each chunk pair, as for `attention` (resolved once per pair, in the
            caller's grad mode; the backward needs one whose lse has a gradient).
        sharding: how the sequence is cut; None means contiguous, with L = layout.q_len or the sum
            of every rank's Lr (one all_gather), and granule = layout.block_size with a layout.
        return_lse: also return this rank's rows of the lse (B, Hq, Lr).

    Returns:
        (B, Hq, Lr, D) in q's dtype, or (out, lse) with return_lse; differentiable in q, k, v
        (and through lse).
    """
    world, rank = _world(group)
    backend = dispatch._as_backend(backend)
    _check_shards(q, k, v)
    sharding = _sharding(sharding, q, layout, group, world, rank)
    scale = q.shape[-1] ** -0.5 if scale is None else dispatch._check_scale(scale)
    schedule = [
        _pairs(q, k, sharding, rank, owner, causal=causal, layout=layout, backend=backend) for owner in range(world)
    ]
    out, lse = _RingAttention.apply(q, k, v, _Ring(group, world, rank, sharding), schedule, scale)
    return (out, lse) if return_lse else out


@dataclasses.dataclass(frozen=True)
class _Ring:
    """Who this rank is in the ring, and every rank's shard length (what it receives)."""

    group: dist.ProcessGroup | None
    world: int
    rank: int
    sharding: Sharding

    def owner(self, step: int) -> int:
        """The rank whose keys and values this rank holds at `step`."""
        return (self.rank - step) % self.world

    def exchange(self, send: torch.Tensor, recv_owner: int) -> tuple[list, torch.Tensor]:
        """Start sending `send` to the next rank and receiving from the previous one a tensor like
        it whose sequence dim (-2) is `recv_owner`'s shard length; wait on the returned works."""
        shape = (*send.shape[:-2], self.sharding.length(recv_owner), send.shape[-1])
        recv = torch.empty(shape, dtype=send.dtype, device=send.device)
        ops = [
            dist.P2POp(dist.irecv, recv, group=self.group, group_peer=(self.rank - 1) % self.world),
            dist.P2POp(dist.isend, send, group=self.group, group_peer=(self.rank + 1) % self.world),
        ]
        return dist.batch_isend_irecv(ops), recv


class _RingAttention(torch.autograd.Function):
    """Forward: partials merged by lse around the ring. Backward: each pair recomputed and
    differentiated, dK and dV carried back to their owner around the ring (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, ring: _Ring, schedule: list[list[_Pair]], scale: float):
        acc_dtype = lse_dtype(q.dtype)
        B, Hq, Lr, D = q.shape
        out_BHLD = q.new_zeros((B, Hq, Lr, D), dtype=acc_dtype)
        lse_BHL = q.new_full((B, Hq, Lr), float("-inf"), dtype=acc_dtype)
        kv_2BHSD = torch.stack([k, v])
        for step in range(ring.world):
            works, arriving = ring.exchange(kv_2BHSD, ring.owner(step + 1)) if step < ring.world - 1 else ([], None)
            for pair in schedule[ring.owner(step)]:
                part_out, part_lse = _attend(q, kv_2BHSD, pair, scale)
                rows = slice(pair.q0, pair.q1)
                out_BHLD[:, :, rows], lse_BHL[:, :, rows] = merge_partials(
                    out_BHLD[:, :, rows], lse_BHL[:, :, rows], part_out, part_lse
                )
            for work in works:
                work.wait()
            kv_2BHSD = arriving
        out_BHLD = out_BHLD.to(q.dtype)
        ctx.save_for_backward(q, k, v, out_BHLD, lse_BHL)
        ctx.ring, ctx.schedule, ctx.scale = ring, schedule, scale
        ctx.set_materialize_grads(False)
        return out_BHLD, lse_BHL

    @staticmethod
    def backward(ctx, dout_BHLD, dlse_BHL):
        q, k, v, out_BHLD, lse_BHL = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        acc_dtype = lse_BHL.dtype
        if dout_BHLD is None:
            dout_BHLD = torch.zeros_like(out_BHLD)
        dout_BHLD = dout_BHLD.to(acc_dtype)
        # rowsum(dO * out), the merge's share of every pair's lse gradient
        dout_out_BHL = (dout_BHLD * out_BHLD.to(acc_dtype)).sum(-1)
        if dlse_BHL is not None:
            dout_out_BHL = dout_out_BHL - dlse_BHL.to(acc_dtype)
        dq_BHLD = torch.zeros_like(q, dtype=acc_dtype)
        kv_2BHSD = torch.stack([k, v])
        dkv_2BHSD = torch.zeros_like(kv_2BHSD, dtype=acc_dtype)  # the held shard's dK, dV so far
        for step in range(ring.world):
            works, arriving = ring.exchange(kv_2BHSD, ring.owner(step + 1)) if step < ring.world - 1 else ([], None)
            for pair in ctx.schedule[ring.owner(step)]:
                dq, dk, dv = _attend_backward(q, kv_2BHSD, pair, scale, lse_BHL, dout_BHLD, dout_out_BHL)
                dq_BHLD[:, :, pair.q0 : pair.q1] += dq
                dkv_2BHSD[0, :, :, pair.k0 : pair.k1] += dk
                dkv_2BHSD[1, :, :, pair.k0 : pair.k1] += dv
            for work in works:
                work.wait()
            # the accumulated dK, dV follow their shard; after the last step they reach its owner
            if ring.world > 1:
                dkv_works, dkv_2BHSD = ring.exchange(dkv_2BHSD, ring.owner(step + 1))
                for work in dkv_works:
                    work.wait()
            kv_2BHSD = arriving
        return dq_BHLD.to(q.dtype), dkv_2BHSD[0].to(k.dtype), dkv_2BHSD[1].to(v.dtype), None, None, None


def _attend(q, kv_2BHSD, pair: _Pair, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One pair's (out, lse) through `attention`."""
    rows, keys = slice(pair.q0, pair.q1), slice(pair.k0, pair.k1)
    return dispatch.attention(
        q[:, :, rows],
        kv_2BHSD[0, :, :, keys],
        kv_2BHSD[1, :, :, keys],
        causal=pair.causal,
        layout=pair.plan.layout,
        scale=scale,
        backend=pair.plan.backend,
        return_lse=True,
    )


def _attend_backward(q, kv_2BHSD, pair: _Pair, scale: float, lse_BHL, dout_BHLD, dout_out_BHL):
    """(dq, dk, dv) of one pair's share of the whole rows' gradient: the pair recomputed, then
    differentiated through its out and lse with w = exp(lse_pair - lse) (module docstring)."""
    rows, keys = slice(pair.q0, pair.q1), slice(pair.k0, pair.k1)
    inputs = [t.detach().requires_grad_() for t in (q[:, :, rows], kv_2BHSD[0, :, :, keys], kv_2BHSD[1, :, :, keys])]
    with torch.enable_grad():
        part_out, part_lse = dispatch.attention(
            *inputs,
            causal=pair.causal,
            layout=pair.plan.layout,
            scale=scale,
            backend=pair.plan.backend,
            return_lse=True,
        )
    part_lse_acc = part_lse.detach().to(lse_BHL.dtype)
    # a row this pair does not reach has lse -inf: weight 0 (also where no pair reaches it)
    w_BHL = torch.exp(part_lse_acc - lse_BHL[:, :, rows].masked_fill(lse_BHL[:, :, rows] == float("-inf"), 0.0))
    w_BHL = w_BHL.masked_fill(part_lse_acc == float("-inf"), 0.0)
    dout_part = dout_BHLD[:, :, rows]
    dlse_part = w_BHL * ((dout_part * part_out.detach().to(dout_part.dtype)).sum(-1) - dout_out_BHL[:, :, rows])
    grads = torch.autograd.grad(
        (part_out, part_lse),
        inputs,
        ((w_BHL.unsqueeze(-1) * dout_part).to(part_out.dtype), dlse_part.to(part_lse.dtype)),
    )
    return grads


# ------------------------------------------------------------------------------ checks
def _world(group) -> tuple[int, int]:
    """(W, this rank) of the group; (1, 0) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError(
                "a process group was given but torch.distributed is not initialised; "
                "call torch.distributed.init_process_group first."
            )
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _check_shards(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(
                f"{name} must be a 4-D tensor (B, H, Lr, D) of this rank's shard, got "
                f"{getattr(t, 'shape', type(t).__name__)}."
            )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(
            f"ring attention is self-attention over one sharded sequence: k, v (B, Hkv, Lr, D) must match q "
            f"(B, Hq, Lr, D) in batch, shard length and head dim; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}."
        )


def _sharding(sharding: Sharding | None, q, layout: BlockLayout | None, group, world: int, rank: int) -> Sharding:
    """The sharding given, or the contiguous one (module docstring), checked against this rank's
    shard and the layout."""
    granule = layout.block_size if layout is not None else 1
    if sharding is None:
        if layout is not None:
            seq_len = layout.q_len
        elif world == 1:
            seq_len = q.shape[2]
        else:
            lengths = torch.tensor([q.shape[2]], device=q.device)
            gathered = [torch.empty_like(lengths) for _ in range(world)]
            dist.all_gather(gathered, lengths, group=group)
            seq_len = int(torch.cat(gathered).sum())
        sharding = Sharding(seq_len, world, granule=granule)
    if sharding.world != world:
        raise ValueError(f"the sharding is for {sharding.world} ranks, the group has {world}.")
    if q.shape[2] != sharding.length(rank):
        raise ValueError(
            f"rank {rank} holds {q.shape[2]} positions, but {sharding} gives it {sharding.length(rank)}; cut the "
            "sequence with Sharding.shard (the contract in genoformer.kernels.ring)."
        )
    if layout is not None:
        if (layout.q_len, layout.kv_len) != (sharding.seq_len, sharding.seq_len):
            raise ValueError(
                f"the layout is {layout.q_len} x {layout.kv_len} but the sharded sequence has {sharding.seq_len} "
                "positions; build the layout for the whole sequence."
            )
        if any(start % layout.block_size for start, _ in sharding.chunk_bounds):
            raise ValueError(
                f"the sharding's chunks {sharding.chunk_bounds} do not start on the layout's blocks of "
                f"{layout.block_size}; build it with granule={layout.block_size}."
            )
    return sharding


def _pairs(
    q, k, sharding: Sharding, rank: int, owner: int, *, causal: bool, layout: BlockLayout | None, backend: Backend
) -> list[_Pair]:
    """The attention calls of this rank while it holds `owner`'s shard; empty pairs left out: key
    chunks wholly after the query chunk (causal) and pairs whose sub-layout allows no block."""
    B, Hq, _, D = q.shape
    pairs = []
    q0 = 0
    for qa, qb in sharding.chunks(rank):
        k0 = 0
        for ka, kb in sharding.chunks(owner):
            diagonal = causal and (qa, qb) == (ka, kb)
            visible = not causal or kb <= qa or diagonal  # chunks are equal or disjoint
            sub = layout.crop(qa, qb, ka, kb) if layout is not None else None
            if sub is not None and visible:
                visible = bool((sub.with_causal() if diagonal else sub).mask.any())
            if visible:
                plan = dispatch.plan_attention(
                    backend,
                    batch=B,
                    q_heads=Hq,
                    kv_heads=k.shape[1],
                    q_len=qb - qa,
                    kv_len=kb - ka,
                    head_dim=D,
                    dtype=q.dtype,
                    device=q.device,
                    causal=diagonal,
                    layout=sub,
                    return_lse=True,
                )
                pairs.append(_Pair(q0, q0 + qb - qa, k0, k0 + kb - ka, diagonal, plan))
            k0 += kb - ka
        q0 += qb - qa
    return pairs
