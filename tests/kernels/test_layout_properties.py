"""Property tests (hypothesis) of the layout builders: every length, block size, window, head
count and seed that hypothesis tries gives a layout whose blocks mean what its builder promises,
whose CSR index lists agree with its mask, and whose refinements and causal form keep its meaning.

Shape legend: mask (H_l, Mb, Nb); token masks (H_l, L, S).
"""

from __future__ import annotations

import torch
from genoformer.kernels.layout import BlockLayout
from hypothesis import given, settings
from hypothesis import strategies as st

BLOCKS = st.sampled_from([16, 32, 64])
LENGTHS = st.integers(min_value=1, max_value=400)
SETTINGS = settings(max_examples=60, deadline=None)


def _assert_indices_match_mask(layout: BlockLayout) -> None:
    for counts_HR, indices_HRC, mask_HRK in (
        (*layout.kv_indices(), layout.mask),
        (*layout.q_indices(), layout.mask.transpose(1, 2)),
    ):
        assert torch.equal(counts_HR, mask_HRK.sum(-1).to(torch.int32))
        for h in range(mask_HRK.shape[0]):
            for r in range(mask_HRK.shape[1]):
                expected = mask_HRK[h, r].nonzero().flatten().to(torch.int32)
                listed = indices_HRC[h, r, : counts_HR[h, r]]
                assert torch.equal(listed, expected), "listed blocks differ from the mask or are not ascending"


@SETTINGS
@given(seq_len=LENGTHS, window=st.integers(min_value=0, max_value=300), block_size=BLOCKS)
def test_sliding_window_covers_every_pair_within_the_window(seq_len, window, block_size):
    layout = BlockLayout.sliding_window(seq_len, window, block_size)
    tokens_LS = layout.token_mask()[0]
    i_L1, j_1S = torch.arange(seq_len).unsqueeze(1), torch.arange(seq_len).unsqueeze(0)
    assert tokens_LS[(i_L1 - j_1S).abs() <= window].all()
    assert torch.equal(tokens_LS, tokens_LS.T)
    _assert_indices_match_mask(layout)


@SETTINGS
@given(
    seq_len=LENGTHS,
    window=st.integers(min_value=0, max_value=200),
    num_global=st.integers(0, 3),
    num_random=st.integers(0, 4),
    block_size=BLOCKS,
    seed=st.integers(0, 2**31 - 1),
    heads=st.integers(1, 4),
)
def test_bigbird_holds_its_parts_and_its_random_blocks_per_row(
    seq_len, window, num_global, num_random, block_size, seed, heads
):
    layout = BlockLayout.bigbird(seq_len, window, num_global, num_random, block_size, seed=seed, num_heads=heads)
    fixed = BlockLayout.sliding_window(seq_len, window, block_size) | BlockLayout.global_tokens(
        seq_len, num_global, block_size
    )
    assert layout.mask.shape == (heads, fixed.num_q_blocks, fixed.num_kv_blocks)
    assert (layout.mask >= fixed.mask).all(), "a local or global block is missing"
    extra_HM = (layout.mask & ~fixed.mask).sum(-1)
    free_M = (~fixed.mask[0]).sum(-1)
    assert torch.equal(extra_HM, torch.minimum(free_M, torch.tensor(num_random)).expand_as(extra_HM))
    assert layout == BlockLayout.bigbird(
        seq_len, window, num_global, num_random, block_size, seed=seed, num_heads=heads
    ), "the same seed must give the same layout"
    _assert_indices_match_mask(layout)


@SETTINGS
@given(q_len=LENGTHS, kv_len=LENGTHS, block_size=st.sampled_from([32, 64]), heads=st.integers(1, 3), data=st.data())
def test_any_block_mask_refines_and_lists_the_same_blocks(q_len, kv_len, block_size, heads, data):
    mb, nb = -(-q_len // block_size), -(-kv_len // block_size)
    bits = data.draw(st.lists(st.booleans(), min_size=heads * mb * nb, max_size=heads * mb * nb))
    layout = BlockLayout.from_block_mask(
        torch.tensor(bits, dtype=torch.bool).reshape(heads, mb, nb), q_len, kv_len, block_size
    )
    _assert_indices_match_mask(layout)
    fine = layout.refine(16)
    assert torch.equal(fine.token_mask(), layout.token_mask()), "refining changed which tokens attend"
    _assert_indices_match_mask(fine)


@SETTINGS
@given(
    seq_len=LENGTHS,
    window=st.integers(0, 200),
    num_random=st.integers(0, 3),
    block_size=BLOCKS,
    seed=st.integers(0, 1000),
)
def test_causal_form_keeps_exactly_the_causal_token_pairs(seq_len, window, num_random, block_size, seed):
    layout = BlockLayout.bigbird(seq_len, window, 1, num_random, block_size, seed=seed)
    causal = layout.with_causal()
    assert not causal.mask.triu(diagonal=1).any(), "a block above the diagonal survived"
    assert torch.equal(causal.token_mask(causal=True), layout.token_mask(causal=True))
    _assert_indices_match_mask(causal)


@SETTINGS
@given(seq_len=LENGTHS, window=st.integers(min_value=0, max_value=300), block_size=BLOCKS, causal=st.booleans())
def test_exact_window_is_exactly_the_band_and_its_blocks_cover_it(seq_len, window, block_size, causal):
    """An exact sliding window allows exactly |i - j| <= window (and j <= i when causal), and its
    blocks hold every block that band meets: the kernels may run it as the window alone."""
    layout = BlockLayout.sliding_window(seq_len, window, block_size, exact=True)
    if causal:
        layout = layout.with_causal()
    i_L1, j_1S = torch.arange(seq_len).unsqueeze(1), torch.arange(seq_len).unsqueeze(0)
    band_LS = (i_L1 - j_1S).abs() <= window
    if causal:
        band_LS &= j_1S <= i_L1
    assert torch.equal(layout.token_mask(causal)[0], band_LS)
    assert layout.covers_window(causal)
