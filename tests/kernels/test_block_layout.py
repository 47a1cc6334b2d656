"""Block layouts: builders on known small patterns, transforms, indices, plotting and specs.

Shape legend: mask (H_l, Mb, Nb); token masks (H_l, L, S).
"""

from __future__ import annotations

import pytest
import torch
from genoformer.kernels import BigBird, BlockLayout, GlobalTokens, LayoutSpec, SlidingWindow, Strided, Union


def _random_layout(L=97, S=None, bs=16, heads=3, density=0.4, seed=0) -> BlockLayout:
    S = L if S is None else S
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(heads, -(-L // bs), -(-S // bs), generator=g) < density
    mask[0, 1] = False  # an empty row
    return BlockLayout.from_block_mask(mask, L, S, bs)


def test_sliding_window_known_patterns():
    tridiagonal = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(BlockLayout.sliding_window(64, 16, block_size=16).mask[0], tridiagonal)
    assert torch.equal(BlockLayout.sliding_window(64, 1, block_size=16).mask[0], tridiagonal)
    assert torch.equal(BlockLayout.sliding_window(64, 0, block_size=16).mask[0], torch.eye(4, dtype=torch.bool))
    radius2 = BlockLayout.sliding_window(64, 17, block_size=16).mask[0]
    assert radius2[0, 2] and not radius2[0, 3]


@pytest.mark.parametrize("window", [0, 5, 16, 40])
def test_sliding_window_covers_every_pair_within_window(window):
    layout = BlockLayout.sliding_window(100, window, block_size=16)
    i = torch.arange(100)
    within = (i[:, None] - i[None, :]).abs() <= window
    tokens = layout.token_mask()[0]
    assert tokens[within].all()
    assert not tokens[(i[:, None] - i[None, :]).abs() > window + 2 * 16 - 2].any()


def test_global_tokens_pattern_and_density():
    layout = BlockLayout.global_tokens(64, 1, block_size=16)
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[0, :] = expected[:, 0] = True
    assert torch.equal(layout.mask[0], expected)
    assert layout.density == pytest.approx(7 / 16)
    assert BlockLayout.dense(64, block_size=16).density == 1.0


def test_random_blocks_seeded_counts_and_per_head():
    a = BlockLayout.random_blocks(160, 3, block_size=16, seed=1, num_heads=4)
    assert a == BlockLayout.random_blocks(160, 3, block_size=16, seed=1, num_heads=4)
    assert a != BlockLayout.random_blocks(160, 3, block_size=16, seed=2, num_heads=4)
    assert a.num_heads == 4 and (a.mask.sum(-1) == 3).all()
    assert not all(torch.equal(a.mask[0], a.mask[h]) for h in range(1, 4))


def test_bigbird_is_window_global_plus_random_outside_them():
    fixed = BlockLayout.sliding_window(160, 16, 16) | BlockLayout.global_tokens(160, 1, 16)
    layout = BlockLayout.bigbird(160, 16, 1, 2, block_size=16, seed=3, num_heads=2)
    assert layout.num_heads == 2
    assert (layout.mask >= fixed.mask).all()
    extra = (layout.mask & ~fixed.mask).sum(-1)
    candidates = (~fixed.mask).sum(-1)
    assert torch.equal(extra, torch.minimum(candidates, torch.tensor(2)).expand_as(extra))


def test_strided_and_dilated_patterns():
    layout = BlockLayout.strided(96, 2, block_size=16)
    m, n = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(layout.mask[0], (m - n) % 2 == 0)
    dilated = BlockLayout.strided(96, 2, block_size=16, max_steps=1)
    assert torch.equal(dilated.mask[0], ((m - n) % 2 == 0) & ((m - n).abs() <= 2))


def test_from_block_mask_shapes_copy_and_errors():
    mask = torch.ones(2, 3, dtype=torch.bool)
    layout = BlockLayout.from_block_mask(mask, 20, 40, block_size=16)
    assert layout.mask.shape == (1, 2, 3) and (layout.q_len, layout.kv_len) == (20, 40)
    mask[0, 0] = False
    assert layout.mask.all(), "the layout must own a copy of the mask"
    with pytest.raises(ValueError, match="expected"):
        BlockLayout.from_block_mask(torch.ones(3, 3, dtype=torch.bool), 20, 40, 16)
    with pytest.raises(ValueError, match="bool"):
        BlockLayout.from_block_mask(torch.ones(2, 3), 20, 40, 16)
    with pytest.raises(ValueError, match="multiple of 16"):
        BlockLayout.sliding_window(64, 16, block_size=24)


def test_refine_keeps_the_token_meaning():
    layout = _random_layout(L=97, S=130, bs=64)
    fine = layout.refine(16)
    assert fine.block_size == 16 and fine.mask.shape == (3, 7, 9)
    assert torch.equal(fine.token_mask(), layout.token_mask())
    with pytest.raises(ValueError, match="divides"):
        layout.refine(48)


def test_union_with_different_block_sizes_and_heads():
    a = BlockLayout.sliding_window(100, 10, block_size=32)
    b = BlockLayout.random_blocks(100, 1, block_size=16, seed=0, num_heads=2)
    union = a | b
    assert union.block_size == 16 and union.num_heads == 2
    assert torch.equal(union.token_mask(), a.token_mask() | b.token_mask())
    with pytest.raises(ValueError, match="different lengths"):
        a | BlockLayout.sliding_window(120, 10, block_size=32)
    with pytest.raises(ValueError, match="heads"):
        b | BlockLayout.random_blocks(100, 1, block_size=16, num_heads=3)


def test_with_causal_drops_only_blocks_above_the_diagonal():
    layout = _random_layout(L=97, density=0.6)
    causal = layout.with_causal()
    assert causal is layout.with_causal(), "cached"
    assert not causal.mask.triu(1).any()
    assert torch.equal(causal.mask.tril(), layout.mask.tril())
    assert torch.equal(causal.token_mask(causal=True), layout.token_mask(causal=True))
    with pytest.raises(ValueError, match="q_len == kv_len"):
        _random_layout(L=40, S=97).with_causal()


@pytest.mark.parametrize("kind", ["kv", "q"])
def test_indices_match_the_mask(kind):
    layout = _random_layout(L=97, S=130, density=0.3)
    counts, indices = layout.kv_indices("cpu") if kind == "kv" else layout.q_indices("cpu")
    mask = layout.mask if kind == "kv" else layout.mask.transpose(1, 2)
    assert counts.dtype == indices.dtype == torch.int32
    assert indices.shape == (*mask.shape[:2], max(1, int(mask.sum(-1).max())))
    for h in range(mask.shape[0]):
        for r in range(mask.shape[1]):
            allowed = mask[h, r].nonzero().flatten().to(torch.int32)
            c = int(counts[h, r])
            assert c == len(allowed) and torch.equal(indices[h, r, :c], allowed)
            pad = allowed[-1] if c else 0
            assert (indices[h, r, c:] == pad).all()
    again = layout.kv_indices("cpu") if kind == "kv" else layout.q_indices("cpu")
    assert again[0] is counts and again[1] is indices, "cached per device"


def test_lists_first_built_while_scoring_serve_training():
    """A layout's block lists, cached on first use, may first be built under torch.inference_mode
    (a model scored, then trained further): they must be ordinary tensors, which autograd may save."""
    layout = BlockLayout.sliding_window(256, 64, 32)
    with torch.inference_mode():
        lists = [*layout.kv_indices(), *layout.q_indices()]
    assert not any(t.is_inference() for t in lists)


def test_empty_layout_indices_have_width_one():
    layout = BlockLayout.from_block_mask(torch.zeros(2, 2, dtype=torch.bool), 32, 32, 16)
    counts, indices = layout.kv_indices()
    assert indices.shape == (1, 2, 1) and (counts == 0).all() and (indices == 0).all()


def test_plot_writes_a_png(tmp_path):
    for layout in (BlockLayout.sliding_window(256, 32, 32), BlockLayout.bigbird(256, 32, 1, 1, 32, num_heads=3)):
        path = layout.plot(tmp_path / f"layout{layout.num_heads}.png")
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_specs_build_the_builders_layouts():
    assert SlidingWindow(64, 16).build(200, 4) == BlockLayout.sliding_window(200, 64, 16)
    assert GlobalTokens(2, 16).build(200, 4) == BlockLayout.global_tokens(200, 2, 16)
    assert Strided(3, None, 16).build(200, 4) == BlockLayout.strided(200, 3, 16)
    per_head = BigBird(32, 1, 2, seed=4, block_size=16, per_head=True).build(200, 4)
    assert per_head == BlockLayout.bigbird(200, 32, 1, 2, 16, seed=4, num_heads=4)
    assert BigBird(32, 1, 2, seed=4, block_size=16).build(200, 4).num_heads == 1
    union = Union([SlidingWindow(16, 32), GlobalTokens(1, 16)]).build(200, 4)
    assert union == BlockLayout.sliding_window(200, 16, 32) | BlockLayout.global_tokens(200, 1, 16)
    assert SlidingWindow(64, 16) == SlidingWindow(64, 16) and "window=64" in repr(SlidingWindow(64, 16))


def test_specs_load_from_yaml_with_class_path():
    jsonargparse = pytest.importorskip("jsonargparse", reason="jsonargparse builds model configs from YAML")
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--layout", type=LayoutSpec)
    config = parser.parse_string(
        """
        layout:
          class_path: genoformer.kernels.layout.Union
          init_args:
            parts:
              - class_path: genoformer.kernels.SlidingWindow
                init_args: {window: 256, block_size: 64}
              - class_path: BigBird
                init_args: {window: 64, num_random_blocks: 1, block_size: 32, per_head: true}
        """
    )
    spec = parser.instantiate(config).layout
    assert spec == Union([SlidingWindow(256, 64), BigBird(64, 1, 1, 0, 32, True)])
    assert spec.build(1000, 4).num_heads == 4


# ----------------------------------------------------------------------------- token windows


def test_exact_sliding_window_is_the_token_band():
    """exact=True keeps the block band and adds the token window: exactly |i - j| <= window, causal
    too; the spec builds the same layout and says so in its repr."""
    for window, L in ((0, 64), (5, 97), (16, 100), (40, 33)):
        layout = BlockLayout.sliding_window(L, window, block_size=16, exact=True)
        assert torch.equal(layout.mask, BlockLayout.sliding_window(L, window, block_size=16).mask)
        i = torch.arange(L)
        band = (i[:, None] - i[None, :]).abs() <= window
        assert torch.equal(layout.token_mask()[0], band)
        assert torch.equal(layout.with_causal().token_mask(causal=True)[0], band & (i[None, :] <= i[:, None]))
    spec = SlidingWindow(window=24, block_size=32, exact=True)
    assert spec.build(100, 4) == BlockLayout.sliding_window(100, 24, 32, exact=True)
    assert spec.build(100, 4) != BlockLayout.sliding_window(100, 24, 32)
    assert "window=(24, 24)" in repr(spec.build(100, 4))


def test_window_blocks_are_the_blocks_the_window_meets():
    """window_blocks marks a block iff one of its token pairs lies in the window (causal: and j <= i),
    and covers_window says whether the layout lists all of them."""
    for window, causal in (((10, 3), False), ((None, 0), False), ((20, 20), True), ((5, None), True)):
        layout = BlockLayout(16, torch.ones(1, 7, 7, dtype=torch.bool), 100, 100, window)
        tokens = layout.token_mask(causal)[0]
        padded = torch.zeros(112, 112, dtype=torch.bool)
        padded[:100, :100] = tokens
        expected = padded.view(7, 16, 7, 16).any(dim=(1, 3))
        assert torch.equal(layout.window_blocks(causal), expected), (window, causal)
        assert layout.covers_window(causal)
    thin = BlockLayout(16, torch.eye(7, dtype=torch.bool)[None], 100, 100, (20, 20))
    assert not thin.covers_window()
    assert not BlockLayout.sliding_window(100, 20, 16).covers_window()  # no window at all


def test_windows_move_with_crops_and_refuse_unions():
    """A crop's window is the same band in its own positions; a union keeps a shared window and
    refuses two different ones (a window applies to every block of its layout)."""
    layout = BlockLayout(16, torch.ones(1, 8, 8, dtype=torch.bool), 128, 128, (12, 5))
    full = layout.token_mask()[0]
    for q0, q1, k0, k1 in ((32, 64, 16, 48), (0, 128, 64, 128), (96, 128, 0, 32)):
        crop = layout.crop(q0, q1, k0, k1)
        assert torch.equal(crop.token_mask()[0], full[q0:q1, k0:k1]), (q0, k0)
    assert (layout | layout).window == (12, 5)
    assert layout.refine(16).window == (12, 5) and layout.with_causal().window == (12, 5)
    with pytest.raises(ValueError, match="cannot unite layouts with windows"):
        layout | BlockLayout.global_tokens(128, 1, 16)
    with pytest.raises(ValueError, match="window must be None or a pair"):
        BlockLayout(16, torch.ones(1, 8, 8, dtype=torch.bool), 128, 128, [12, 5])
