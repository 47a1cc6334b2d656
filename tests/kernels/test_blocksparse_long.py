"""The pure-PyTorch block-sparse backend runs a 32k-token sequence on a CPU.

Dense attention at this length needs a (B, H, L, L) = 4 * 32768^2 float32 score matrix (16 GiB);
the block-sparse backend touches only the allowed blocks, a chunk at a time (see the memory
bound in genoformer/kernels/blocksparse_torch.py).
"""

from __future__ import annotations

import torch
from genoformer.kernels import Backend, BlockLayout, attention


def test_32k_sliding_window_runs_and_matches_the_reference_on_its_last_rows():
    B, H, L, D, bs, window = 1, 4, 32768, 64, 128, 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    layout = BlockLayout.sliding_window(L, window, block_size=bs)
    assert layout.density < 0.07
    with torch.no_grad():
        out = attention(q, k, v, causal=True, layout=layout, backend=Backend.TORCH)
    assert out.shape == (B, H, L, D) and torch.isfinite(out).all()

    # The last query block attends (causally) the ceil(window / bs) blocks before it and itself.
    rows = torch.arange(L - bs, L)
    keys = torch.arange(L - bs - window, L)
    allowed = keys[None, :] <= rows[:, None]  # (bs, len(keys))
    scores = (q[:, :, rows].double() @ k[:, :, keys].double().transpose(-1, -2)) * D**-0.5
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    expected = (probs @ v[:, :, keys].double()).float()
    torch.testing.assert_close(out[:, :, rows], expected, atol=1e-5, rtol=1e-4)


def test_work_follows_the_allowed_blocks_not_the_widest_row():
    """A BigBird global row attends every block; the other rows must not be padded to its width."""
    from genoformer.kernels.blocksparse_torch import _chunks_by_width

    layout = BlockLayout.bigbird(seq_len=8192, window=512, num_global_blocks=1, num_random_blocks=2, block_size=128)
    counts_M = layout.kv_indices("cpu")[0][0].long()
    allowed = int(counts_M.sum())
    assert int(counts_M.max()) == layout.num_kv_blocks  # the global row is as wide as the sequence
    chunks = _chunks_by_width(counts_M, elements_per_block_pair=1, chunk_elements=256)
    padded = sum(len(rows) * width for rows, width in chunks)
    assert padded <= 1.25 * allowed, f"{padded} block pairs computed for {allowed} allowed"
    covered = torch.sort(torch.cat([rows for rows, _ in chunks])).values
    assert torch.equal(covered, torch.arange(layout.num_q_blocks))
