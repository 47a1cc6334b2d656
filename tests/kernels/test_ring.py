"""Ring attention (genoformer.kernels.ring) against one process: the sharding contract, the lse
merge, and 2 and 3 CPU processes over gloo, forward and gradients.

Each multi-process case shards one random sequence by the contract, runs `ring_attention` on every
rank with the loss <out, dout> + <lse, dlse>, and compares each rank's out, lse and dq, dk, dv with
its shard of the same sequence through `attention` in one process (the same backend, float64:
1e-10; float32: 1e-5). Three processes start once (`ring_results`) and run every case on the ring
of all three and on a two-rank subgroup (which tests `group=`).

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, L, D); a rank's shard has Lr positions.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from genoformer.kernels import Backend, BlockLayout, attention
from genoformer.kernels.ring import Sharding, _pairs, merge_partials, ring_attention, shard_positions


# ------------------------------------------------------------------------------ sharding
@pytest.mark.parametrize(
    "seq_len, world, zigzag, granule", [(97, 3, False, 1), (97, 3, True, 1), (200, 2, True, 16), (16 * 7, 3, False, 16)]
)
def test_shards_partition_the_sequence_and_unshard_inverts_shard(seq_len, world, zigzag, granule):
    sharding = Sharding(seq_len, world, zigzag=zigzag, granule=granule)
    positions = torch.cat([sharding.positions(r) for r in range(world)])
    assert torch.equal(positions.sort().values, torch.arange(seq_len))
    for rank in range(world):
        positions = shard_positions(seq_len, world, rank, zigzag=zigzag, granule=granule)
        assert torch.equal(positions, sharding.positions(rank))
        assert all(start % granule == 0 for start, _ in sharding.chunks(rank))
        assert sharding.length(rank) == len(sharding.positions(rank))
    x = torch.randn(2, seq_len, 3)
    shards = [sharding.shard(x, r, dim=1) for r in range(world)]
    assert torch.equal(shards[1], x[:, sharding.positions(1)])
    assert torch.equal(sharding.unshard(shards, dim=1), x)


def test_sharding_follows_the_written_rule():
    """tensor_split of the units: the first (units % C) chunks one unit longer; zigzag r, 2W-1-r."""
    assert Sharding(97, 3).chunk_bounds == ((0, 33), (33, 65), (65, 97))
    zigzag = Sharding(100, 2, zigzag=True, granule=16)  # 7 units of 16 into 4 chunks: 2, 2, 2, 1
    assert zigzag.chunk_bounds == ((0, 32), (32, 64), (64, 96), (96, 100))
    assert zigzag.chunks(0) == ((0, 32), (96, 100)) and zigzag.chunks(1) == ((32, 64), (64, 96))
    with pytest.raises(ValueError, match="fewer than the 6 chunks"):
        Sharding(80, 3, zigzag=True, granule=16)


def test_pairs_skip_what_causal_and_layouts_leave_empty():
    """Rank 0 of a causal contiguous ring computes only with its own shard; a layout with no block
    between two shards leaves their pair out; zigzag balances the causal pairs."""
    q = torch.zeros(1, 2, 33, 16)
    contiguous = Sharding(97, 3)
    counts = [
        len(_pairs(q, q, contiguous, 0, owner, causal=True, layout=None, backend=Backend.TORCH)) for owner in range(3)
    ]
    assert counts == [1, 0, 0]
    assert [p.causal for p in _pairs(q, q, contiguous, 2, 2, causal=True, layout=None, backend=Backend.TORCH)] == [True]
    mask = torch.ones(7, 7, dtype=torch.bool)
    mask[3:5, 0:3] = False  # rank 1 (blocks 3-4, tokens 48-79) never sees rank 0 (blocks 0-2)
    layout = BlockLayout.from_block_mask(mask, 112, 112, 16)
    blocks = Sharding(112, 3, granule=16)
    q1 = torch.zeros(1, 2, blocks.length(1), 16)
    assert _pairs(q1, q1, blocks, 1, 0, causal=False, layout=layout, backend=Backend.TORCH) == []
    zigzag = Sharding(96, 2, zigzag=True)
    work = [
        sum(
            (p.q1 - p.q0) * (p.k1 - p.k0)
            for owner in range(2)
            for p in _pairs(
                torch.zeros(1, 2, 48, 16),
                torch.zeros(1, 2, 48, 16),
                zigzag,
                rank,
                owner,
                causal=True,
                layout=None,
                backend=Backend.TORCH,
            )
        )
        for rank in range(2)
    ]
    assert work[0] == work[1]


# ------------------------------------------------------------------------------- merging
def test_merge_of_two_key_halves_is_attention_over_all_keys():
    """Rows split over two disjoint key sets merge to attention over all of them; a row that
    neither set reaches stays 0 / -inf, and gradients through the merge stay finite."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    keep = torch.ones(10, 10, dtype=torch.bool)
    keep[3] = False  # row 3 sees no key
    keep[5, :6] = False  # row 5 sees only keys of the second half
    full_out, full_lse = _masked(q, k, v, keep)
    a = _masked(q, k[:, :, :6], v[:, :, :6], keep[:, :6])
    b = _masked(q, k[:, :, 6:], v[:, :, 6:], keep[:, 6:])
    out, lse = merge_partials(*a, *b)
    torch.testing.assert_close(out, full_out)
    torch.testing.assert_close(lse, full_lse)
    grads = torch.autograd.grad((out * 2).sum() + torch.where(lse.isfinite(), lse, 0).sum(), (q, k, v))
    assert all(torch.isfinite(grad).all() for grad in grads)


def test_crop_is_the_layouts_rectangle():
    layout = BlockLayout.random_blocks(100, 2, 16, seed=1, num_heads=2)
    crop = layout.crop(32, 100, 16, 64)
    assert (crop.q_len, crop.kv_len) == (68, 48)
    assert torch.equal(crop.token_mask(), layout.token_mask()[:, 32:100, 16:64])
    assert layout.crop(32, 100, 16, 64) is crop  # cached
    with pytest.raises(ValueError, match="start on a block"):
        layout.crop(8, 100, 0, 100)


def _masked(q, k, v, keep_LS):
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    filled = scores.masked_fill(~keep_LS, torch.finfo(scores.dtype).min)
    lse = torch.logsumexp(filled, -1).masked_fill(~keep_LS.any(-1), float("-inf"))
    return (torch.softmax(filled, -1) * keep_LS) @ v, lse


def test_a_world_of_one_is_attention():
    """Without torch.distributed the ring is one rank: attention itself, gradients included."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 37, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = ring_attention(q, k, v, causal=True, backend="torch", return_lse=True)
    expected, expected_lse = attention(q, k, v, causal=True, backend="torch", return_lse=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)
    grads = torch.autograd.grad((out.sum(), lse.sum()), (q, k, v))
    expected_grads = torch.autograd.grad((expected.sum(), expected_lse.sum()), (q, k, v))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)


def test_ring_refuses_a_shard_off_the_contract():
    q = torch.zeros(1, 2, 40, 8)
    with pytest.raises(ValueError, match="Sharding.shard"):
        ring_attention(q, q, q, sharding=Sharding(97, 1))
    layout = BlockLayout.dense(40, 40, 16)
    with pytest.raises(ValueError, match="granule=16"):
        ring_attention(q, q, q, layout=layout, sharding=Sharding(40, 1, zigzag=True))


# ------------------------------------------------------------------------------- processes
def _layout(L, bs, heads, density, seed):
    g = torch.Generator().manual_seed(seed)
    n = -(-L // bs)
    mask = torch.rand(heads, n, n, generator=g) < density
    mask[:, :, 0] = True  # every query block sees the first key block ...
    mask[:, 1] = False  # ... but one, which sees no key at all: out 0, lse -inf
    return BlockLayout.from_block_mask(mask, L, L, bs)


# name -> (L, Hq, Hkv, dtype, zigzag, ring_attention keywords built lazily)
RING_CASES = {
    "causal_gqa_odd": (97, 4, 2, torch.float64, False, lambda: dict(causal=True, backend="torch")),
    "causal_zigzag_odd": (97, 2, 1, torch.float64, True, lambda: dict(causal=True, backend="sdpa")),
    "bidirectional_odd": (101, 2, 2, torch.float64, False, lambda: dict(backend="reference", scale=0.2)),
    "block_sparse_causal_zigzag": (
        200,
        2,
        1,
        torch.float64,
        True,
        lambda: dict(causal=True, backend="torch", layout=_layout(200, 16, 1, 0.4, 3)),
    ),
    "block_sparse_per_head": (150, 2, 2, torch.float64, False, lambda: dict(layout=_layout(150, 16, 2, 0.3, 4))),
    "causal_zigzag_float32_auto": (90, 2, 2, torch.float32, True, lambda: dict(causal=True)),
}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def _ring_worker(rank: int, init_file: str, out_dir: str) -> None:
    """One of three processes: every case on the ring of all three (the default group) and on the
    ring of ranks 0 and 1 (a subgroup; rank 2 waits), its errors against its shard of the
    one-process run written to a JSON file."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    pair = dist.new_group([0, 1])  # every rank takes part in making it
    errors = {}
    for world, group in ((3, None), (2, pair)):
        if rank >= world:
            continue
        for name, (L, Hq, Hkv, dtype, zigzag, make) in RING_CASES.items():
            kwargs = make()
            layout = kwargs.get("layout")
            sharding = Sharding(L, world, zigzag=zigzag, granule=layout.block_size if layout is not None else 1)
            g = torch.Generator().manual_seed(len(name))
            shapes = [(1, Hq, L, 16), (1, Hkv, L, 16), (1, Hkv, L, 16), (1, Hq, L, 16), (1, Hq, L)]
            q, k, v, dout, dlse = (torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)
            full = _with_grads(attention, q, k, v, dout, dlse, **kwargs)
            mine = [sharding.shard(t, rank, dim=2) for t in (q, k, v, dout, dlse)]
            got = _with_grads(ring_attention, *mine, group=group, sharding=sharding, **kwargs)
            expected = [sharding.shard(t, rank, dim=2) for t in full]
            errors[f"{world}-{name}"] = {
                label: _error(a, b) for label, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected)
            }
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(errors, f)
    dist.barrier()
    dist.destroy_process_group()


def _with_grads(fn, q, k, v, dout, dlse, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse.to(lse.dtype)))
    return out.detach(), lse.detach(), dq, dk, dv


def _error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |got - expected| relative to max(1, |expected|); inf when -inf entries differ or a
    NaN appears (JSON keeps inf)."""
    empty = expected == float("-inf")
    if not torch.equal(got == float("-inf"), empty) or got.isnan().any():
        return float("inf")
    got, expected = got[~empty].double(), expected[~empty].double()
    if got.numel() == 0:
        return 0.0
    return float(((got - expected).abs() / expected.abs().clamp_min(1)).max())


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    """{"world-case": {tensor: worst error over the ranks}} (the three processes run once)."""
    tmp = tmp_path_factory.mktemp("ring")
    mp.spawn(_ring_worker, args=(str(tmp / "init"), str(tmp)), nprocs=3, join=True)
    results: dict = {}
    for rank in range(3):
        for case, errors in json.loads((tmp / f"{rank}.json").read_text()).items():
            merged = results.setdefault(case, {})
            for label, error in errors.items():
                merged[label] = max(merged.get(label, 0.0), error)
    return results


@pytest.mark.parametrize("world", [2, 3], ids=["2-processes", "3-processes"])
@pytest.mark.parametrize("case", list(RING_CASES))
def test_ring_equals_one_process(ring_results, world, case):
    tolerance = TOLERANCE[RING_CASES[case][3]]
    for label, error in ring_results[f"{world}-{case}"].items():
        assert error <= tolerance, f"{world} processes, {case} {label}: error {error:.3e} > {tolerance:.0e}"
