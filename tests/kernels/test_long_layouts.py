"""Layouts and the Triton launchers at a million tokens and beyond, checked on the CPU without
running attention: the block lists of the long-context recipes' window + global layout, the
builders' buffers (nothing of n x n blocks wider than a bool), the kernels' 32-bit row offsets
and CUDA's grid limit at a whole bacterial chromosome."""

from __future__ import annotations

import pytest
import torch
from genoformer.kernels import triton_flash
from genoformer.kernels import triton_flash_configs as configs
from genoformer.kernels.layout import BigBird, BlockLayout, GlobalTokens, SlidingWindow, Strided, Union, _padded_lists
from genoformer.kernels.triton_flash import bwd_tiles, fwd_tiles, grid_fitting, rows_fit_int32, split_plan
from torch.utils._python_dispatch import TorchDispatchMode

ECOLI = 4_641_652
"""E. coli K-12 MG1655's chromosome, in bases: the whole-chromosome window."""


def _reference_lists(mask_HRK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout contract written plainly, row by row."""
    H, R, _ = mask_HRK.shape
    rows = [[torch.nonzero(mask_HRK[h, r]).flatten().tolist() for r in range(R)] for h in range(H)]
    width = max(1, max(len(row) for head in rows for row in head))
    indices = [[row + [row[-1] if row else 0] * (width - len(row)) for row in head] for head in rows]
    counts = [[len(row) for row in head] for head in rows]
    return torch.tensor(counts, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32)


@pytest.mark.parametrize("shape", [(1, 7, 9), (3, 12, 5), (2, 1, 1)])
def test_block_lists_follow_the_layout_contract(shape):
    mask_HRK = torch.rand(shape, generator=torch.Generator().manual_seed(sum(shape))) < 0.3
    mask_HRK[0, 0] = False  # an empty row
    for layout_mask in (mask_HRK, mask_HRK.transpose(1, 2)):
        layout = BlockLayout(16, layout_mask.contiguous(), 16 * layout_mask.shape[1], 16 * layout_mask.shape[2])
        counts, indices = layout.kv_indices()
        expected = _reference_lists(layout.mask)
        assert torch.equal(counts, expected[0]) and torch.equal(indices, expected[1])
        counts, indices = layout.q_indices()
        expected = _reference_lists(layout.mask.transpose(1, 2))
        assert torch.equal(counts, expected[0]) and torch.equal(indices, expected[1])
    counts, indices = _padded_lists(*(torch.empty(0, dtype=torch.long),) * 3, heads=2, rows=3)
    assert counts.shape == (2, 3) and indices.shape == (2, 3, 1) and not indices.any()


class _WidestBuffer(TorchDispatchMode):
    """Records the bytes of the largest tensor any operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.widest = (0, "")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.widest[0]:
                self.widest = (t.numel() * t.element_size(), f"{func} {t.dtype} {tuple(t.shape)}")
        return out


@pytest.mark.parametrize(
    "spec",
    [
        Union([SlidingWindow(window=2048, block_size=128), GlobalTokens(1, block_size=128)]),
        Strided(stride=4, max_steps=3, block_size=128),
        BigBird(window=1024, num_global_blocks=1, num_random_blocks=0, block_size=128),
    ],
    ids=["window+global", "strided", "bigbird-without-random-blocks"],
)
def test_layout_builders_and_key_lists_keep_to_bool_sized_buffers(spec):
    n = 512  # 64k tokens: index arithmetic over n x n blocks in int64 would take 8 n^2 bytes
    with _WidestBuffer() as widest:
        layout = spec.build(n * 128, 4).with_causal()
        layout.kv_indices()
        assert layout.density < 0.1
    assert widest.widest[0] <= n * n, widest.widest[1]


def test_window_global_lists_at_a_million_tokens():
    # the recipes' layout (configs/base/genome_million_gpu.yaml) at 1,048,576 tokens: 8,192 blocks a side
    length = 1 << 20
    layout = Union([SlidingWindow(window=2048, block_size=128), GlobalTokens(1, block_size=128)]).build(length, 4)
    layout = layout.with_causal()
    n = length // 128
    kv_counts, kv_indices = layout.kv_indices()
    q_counts, q_indices = layout.q_indices()
    assert kv_indices.dtype == q_indices.dtype == torch.int32
    # each query block: the global block and up to 17 blocks of its causal window
    assert kv_indices.shape == (1, n, 18) and int(kv_counts.max()) == 18 and int(kv_counts[0, 0]) == 1
    assert kv_indices[0, n - 1, :2].tolist() == [0, n - 17] and int(kv_indices[0, n - 1, -1]) == n - 1
    # the global key block is attended by every query block: the one list as long as the layout
    assert int(q_counts[0, 0]) == n and q_indices.shape == (1, n, n)
    assert torch.equal(q_indices[0, 0], torch.arange(n, dtype=torch.int32))
    assert int(q_counts[0, 1:].max()) == 17 and int(q_indices[0, n - 1, 0]) == n - 1
    # the forward splits the long rows, the backward the global column; plans stay small
    assert split_plan(kv_counts, 1, triton_flash.SPLIT_MIN_CHUNK) is None
    plan = split_plan(q_counts, 1, triton_flash.SPLIT_MIN_CHUNK)
    assert plan is not None and plan.items.shape[1] < 2 * n and plan.slots < n // 8


def test_row_offsets_past_32_bits_are_found_on_views_of_the_model_layout():
    # the model's values are a (B, L, H, D) buffer viewed as (B, H, L, D): row stride H * D
    for length, heads, head_dim, fits in (
        (1 << 20, 4, 64, True),
        (1 << 20, 8, 128, True),
        (1 << 20, 16, 128, False),
        (ECOLI, 12, 64, False),
        ((1 << 21) + 1, 16, 64, False),
    ):
        v_BHLD = torch.empty(1, length, heads, head_dim, device="meta").transpose(1, 2)
        assert rows_fit_int32(v_BHLD) is fits, (length, heads, head_dim)
        assert rows_fit_int32(v_BHLD.contiguous())  # a contiguous copy: row stride D


def test_the_launchers_copy_values_whose_row_offsets_overflow(monkeypatch):
    pytest.importorskip("triton")
    if not triton_flash.INTERPRETED:
        pytest.skip(
            "runs the Triton kernels on the CPU: start the session with TRITON_INTERPRET=1 (tests/conftest.py does)"
        )
    seen = []
    fwd = triton_flash.flash_fwd

    def spying(q, k, v, *args, **kwargs):
        seen.append(v.stride())
        return fwd(q, k, v, *args, **kwargs)

    monkeypatch.setattr(triton_flash, "flash_fwd", spying)
    g = torch.Generator().manual_seed(0)
    q, k, v_BLHD = (torch.randn(1, 40, 2, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    v = v_BLHD.transpose(1, 2)  # row stride 32
    reference = triton_flash.triton_attention(q, k, v.contiguous(), causal=True)
    triton_flash.triton_attention(q, k, v, causal=True)
    assert seen[-1] == v.stride()  # read in place while its rows fit
    # as if the rows overflowed: a row stride of 32 (with the launchers' margin of 256 rows) passes
    # the limit, one of 16 does not
    monkeypatch.setattr(triton_flash, "INT32_OFFSETS", 300 * 16 + 16)
    out = triton_flash.triton_attention(q, k, v, causal=True)
    assert seen[-1] == (40 * 16 * 2, 40 * 16, 16, 1)  # copied: row stride D
    torch.testing.assert_close(out, reference)


def test_a_whole_chromosome_fits_the_grid_with_larger_tiles():
    hopper = configs.fwd_candidates(configs.HOPPER, 64)
    assert fwd_tiles(hopper[0], ECOLI, 0, 1) > triton_flash.MAX_GRID_Y  # the default 64-row tile does not fit
    fitting = grid_fitting(hopper, lambda c: (fwd_tiles(c, ECOLI, 0, 1),), "forward")
    assert fitting and all(c.block_m == 128 for c in fitting)
    assert grid_fitting(hopper, lambda c: (fwd_tiles(c, 1 << 20, 0, 1),), "forward") == hopper
    # a layout of 128-token blocks: 36,263 rows of one or two tiles each
    rows = -(-ECOLI // 128)
    fitting = grid_fitting(
        tuple(configs.fit_fwd(c, 128) for c in hopper), lambda c: (fwd_tiles(c, ECOLI, rows, 128),), "forward"
    )
    assert all(fwd_tiles(c, ECOLI, rows, 128) <= triton_flash.MAX_GRID_Y for c in fitting)
    backward = configs.bwd_candidates(configs.HOPPER, 64)
    fitting = grid_fitting(backward, lambda c: bwd_tiles(c, ECOLI, ECOLI, 0, 0, 1), "backward")
    assert fitting and all(
        c.heads_outer or max(bwd_tiles(c, ECOLI, ECOLI, 0, 0, 1)) <= triton_flash.MAX_GRID_Y for c in fitting
    )
    assert len(fitting) < len(backward)
    with pytest.raises(ValueError, match="cannot launch .* tiles per head"):
        grid_fitting(hopper, lambda c: (fwd_tiles(c, 64 * ECOLI, 0, 1),), "forward")
