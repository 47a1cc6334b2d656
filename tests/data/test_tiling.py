"""The one tiler: windows cover the sequence, kept ranges partition it, and each position is kept
by the window its rule names (nearest centre, or most preceding context)."""

from __future__ import annotations

import numpy as np
import pytest
from genoformer.data.tiling import Keep, tile_windows

SHAPES = [
    (1, 8, 2),
    (8, 8, 2),
    (9, 8, 2),
    (100, 16, 0),
    (1001, 64, 16),
    (997, 96, 31),
    (130, 32, 20),
    (5000, 1024, 512),
]


def check_partition(tiles, length, window, overlap):
    assert tiles[0].keep_start == 0 and tiles[-1].keep_end == length
    for tile, following in zip(tiles, tiles[1:]):
        assert tile.keep_end == following.keep_start
        assert following.start - tile.start <= window - overlap
    for tile in tiles:
        assert tile.length == min(window, length) and 0 <= tile.start and tile.end <= length
        assert tile.start <= tile.keep_start < tile.keep_end <= tile.end


@pytest.mark.parametrize("length,window,overlap", SHAPES)
def test_centre_rule_keeps_each_position_in_the_window_whose_centre_is_nearest(length, window, overlap):
    tiles = tile_windows(length, window, overlap, Keep.CENTRE)
    check_partition(tiles, length, window, overlap)
    centres = np.array([t.start + (t.end - t.start - 1) / 2 for t in tiles])
    for tile in tiles:
        positions = np.arange(tile.keep_start, tile.keep_end)
        nearest = np.abs(positions[:, None] - centres[None, :]).argmin(1)
        assert (np.array(tiles)[nearest] == tile).all()
        if tile.start > 0:
            assert tile.keep_start - tile.start >= overlap // 2
        if tile.end < length:
            assert tile.end - tile.keep_end >= overlap // 2


@pytest.mark.parametrize("length,window,overlap", SHAPES)
def test_left_rule_keeps_each_position_where_it_has_the_most_preceding_context(length, window, overlap):
    tiles = tile_windows(length, window, overlap, Keep.LEFT)
    check_partition(tiles, length, window, overlap)
    for tile in tiles:
        for position in (tile.keep_start, tile.keep_end - 1):
            covering = [t for t in tiles if t.start <= position < t.end]
            assert tile.start == min(t.start for t in covering)
        if tile.start > 0:  # every position after the first window sees >= overlap predecessors
            assert tile.keep_start - tile.start >= overlap


def test_bad_arguments_and_empty_sequences():
    assert tile_windows(0, 8, 2) == []
    with pytest.raises(ValueError, match="overlap"):
        tile_windows(10, 8, 8)
    with pytest.raises(ValueError, match="window"):
        tile_windows(10, 0, 0)
