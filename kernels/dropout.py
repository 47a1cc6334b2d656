"""Attention dropout's random mask: which probabilities a (seed, offset) keeps, in PyTorch.

The Triton kernels draw the mask inside the kernel (``triton_flash_fwd.dropout_keep``) and the
backward draws it again; this module is the same function written with tensor operations, so that
the float64 reference can apply exactly the mask the kernels applied, on any device, and so that
anything that needs the mask itself (flash-attn's ``return_attn_probs``) can have it.

The mask, for one (sequence or batch row) s, head h, query i and key j (positions counted from the
sequence's first row):
    counter = (j // 8, i, s * H + h, offset mod 2^32), key = the 64-bit seed
    words   = Philox4x32-10(counter, key)            four 32-bit words
    value   = 16-bit half (j % 2) of word (j % 8) // 2     (low half first)
    keep    = value >= threshold(p),  threshold(p) = round(p * 65536)
so P(keep) = 1 - threshold(p) / 65536, within 2^-17 of 1 - p; kept probabilities are scaled by
1 / (1 - p).  One Philox call serves eight keys.

rng: the int64 tensor (2,) (seed, offset) the kernels read on the device.  `draw_rng` takes one from
torch's generator for the tensor's device (as flash-attn draws its seed), so that
`torch.manual_seed` makes a run repeatable.

Shape legend: B batch (or sequences), H heads, L query positions, S key positions.
"""

from __future__ import annotations

import torch

PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_ROUNDS = 10
_MASK32 = 0xFFFFFFFF
RESOLUTION = 1 << 16
"""Dropout probabilities are rounded to multiples of 1 / RESOLUTION."""


def dropout_threshold(p: float) -> int:
    """The 16-bit value at and above which a probability is kept: round(p * 65536)."""
    return min(RESOLUTION, max(0, round(p * RESOLUTION)))


def draw_rng(device: torch.device | str) -> torch.Tensor:
    """A fresh (seed, offset) int64 tensor (2,) on `device`, the seed drawn from torch's generator
    for that device (no host synchronisation), the offset 0."""
    seed = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)
    return torch.cat([seed, torch.zeros(1, dtype=torch.int64, device=device)])


def _mul_hi_lo(a: int, b_T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The high and low 32-bit words of a * b for the 32-bit constant a and int64 tensor b < 2^32
    (split in 16-bit halves: an int64 product of two 32-bit values could overflow)."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b_T >> 16, b_T & 0xFFFF
    cross = a_hi * b_lo + a_lo * b_hi  # < 2^33
    low = a_lo * b_lo  # < 2^32
    t = (cross << 16) + low  # < 2^50: exact in int64
    hi = (a_hi * b_hi + (t >> 32)) & _MASK32
    return hi, t & _MASK32


def philox4x32(
    seed: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of the counters (c0, c1, c2, c3) (int64 tensors holding 32-bit values, broadcast
    together) under the 64-bit key `seed` (an int64 tensor, its two's complement bits): the four
    32-bit output words as int64 tensors, as ``triton.language.philox`` computes them."""
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    c0, c1, c2, c3 = torch.broadcast_tensors(c0 & _MASK32, c1 & _MASK32, c2 & _MASK32, c3 & _MASK32)
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    return c0, c1, c2, c3


def keep_mask(
    rng: torch.Tensor, p: float, batch: int, heads: int, q_len: int, k_len: int, first_row: int = 0
) -> torch.Tensor:
    """(batch, heads, q_len, k_len) bool: the probabilities dropout keeps for each (row or sequence,
    head, query, key) of the rows first_row .. first_row + batch - 1, positions from 0 (see the
    module docstring); on rng's device."""
    device = rng.device
    seed, offset = rng[0], rng[1]
    groups = -(-k_len // 8)
    c0_S = torch.arange(groups, device=device, dtype=torch.int64).view(1, 1, 1, groups)
    c1_L = torch.arange(q_len, device=device, dtype=torch.int64).view(1, 1, q_len, 1)
    c2_BH = torch.arange(first_row * heads, (first_row + batch) * heads, device=device, dtype=torch.int64).view(
        batch, heads, 1, 1
    )
    words = philox4x32(seed, c0_S, c1_L, c2_BH, offset)  # 4 x (B, H, L, groups)
    halves = [half for word in words for half in (word & 0xFFFF, word >> 16)]  # keys 8g + 0 .. 7
    values_BHLS = torch.stack(halves, dim=-1).reshape(batch, heads, q_len, groups * 8)[..., :k_len]
    return values_BHLS >= dropout_threshold(p)
