"""Block-sparse attention layouts shared by every attention backend.

A layout says, block by block, which keys each query may look at. Every backend (reference,
pure-PyTorch block-sparse, SDPA, Triton) reads the same `BlockLayout` and gives it the same
meaning, so a layout built once in the model config means the same thing everywhere.

Shape legend (used in names and comments throughout this file):
    H_l   layout heads: 1 (one pattern shared by all query heads) or Hq (one per query head)
    bs    block_size: tokens per block side (a multiple of 16, what the Triton kernels tile by)
    Mb    query blocks  = ceil(q_len / bs)
    Nb    key blocks    = ceil(kv_len / bs)
    C     the largest number of allowed blocks in one row (or column) of the mask

Semantics: query token i may attend key token j (for query head h) iff
    mask[h_l, i // bs, j // bs]          with h_l = h if H_l == Hq else 0,
    and i - left <= j <= i + right       when the layout has a window (left, right) (None: unbounded),
further restricted by causality (j <= i) and key padding (j < kv_lens[b]) given to `attention`.
The last block row/column may be partial when a length is not a multiple of bs; its tokens
beyond q_len / kv_len simply do not exist.

Layouts are block-granular: a sliding window of `window` tokens becomes "every key block within
ceil(window / bs) blocks of the query block", which covers every pair with |i - j| <= window
and some pairs up to window + 2 * bs - 2 tokens apart. A layout may also carry a token window
(`BlockLayout.window = (left, right)`): then, within its blocks, query i attends key j only if
i - left <= j <= i + right, to the token (`sliding_window(..., exact=True)`, `SlidingWindow(exact=True)`).
The Triton kernels mask such a window per token on the boundary tiles only and visit only the
tiles it meets, so an exact window costs what its tokens cost; every backend honours it through
`token_mask`. Builders are deterministic: the random ones draw from a `torch.Generator` seeded by
their `seed` argument.

Two ways to get a layout:
  * builders on `BlockLayout` (`sliding_window`, `global_tokens`, `random_blocks`, `bigbird`,
    `strided`, `from_block_mask`, `dense`), combined with `|` and `with_causal()`;
  * small spec classes (`SlidingWindow`, `BigBird`, `Strided`, `GlobalTokens`, `Union`) that a
    model config names with `class_path` and that build the layout once the sequence length
    and head count are known: `spec.build(seq_len, num_heads)`.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "BlockLayout",
    "LayoutSpec",
    "SlidingWindow",
    "GlobalTokens",
    "BigBird",
    "Strided",
    "Union",
]


def _num_blocks(length: int, block_size: int) -> int:
    return -(-length // block_size)


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size <= 0 or block_size % 16 != 0:
        raise ValueError(
            f"block_size must be a positive multiple of 16 (the Triton tile granularity), got "
            f"{block_size!r}; use 16, 32, 64 or 128."
        )


def _check_positive_length(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int number of tokens, got {value!r}.")


def _check_window(window) -> None:
    if window is None:
        return
    if not (
        isinstance(window, tuple)
        and len(window) == 2
        and all(side is None or (isinstance(side, int) and not isinstance(side, bool)) for side in window)
    ):
        raise ValueError(
            f"window must be None or a pair (left, right) of ints or None (None: unbounded on that side), got "
            f"{window!r}; e.g. (256, 256) lets query i attend keys i - 256 .. i + 256."
        )


def _padded_lists(
    head_Z: torch.Tensor, row_Z: torch.Tensor, col_Z: torch.Tensor, heads: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR lists of Z allowed blocks (head, row, column), given sorted by (head, row, column):
    counts (heads, rows) int32 and indices (heads, rows, max(1, C)) int32, each row's columns
    ascending and padded with its last valid index (or 0 when the row is empty), as the layout
    contract says. Work and memory are O(Z + the padded output)."""
    flat_Z = head_Z * rows + row_Z
    counts_N = torch.bincount(flat_Z, minlength=heads * rows)  # N = heads * rows lists
    width = max(1, int(counts_N.max()) if counts_N.numel() else 1)
    first_N = torch.cumsum(counts_N, 0) - counts_N  # each list's first entry among the Z
    slot_Z = torch.arange(col_Z.numel()) - first_N[flat_Z]
    last_N = torch.zeros_like(counts_N)
    filled_N = counts_N > 0
    last_N[filled_N] = col_Z[(first_N + counts_N - 1)[filled_N]]
    indices_NC = last_N.to(torch.int32).unsqueeze(1).repeat(1, width)  # padding: the row's last index
    indices_NC[flat_Z, slot_Z] = col_Z.to(torch.int32)
    return counts_N.view(heads, rows).to(torch.int32), indices_NC.view(heads, rows, width)


def _band(n: int, low: int, high: int) -> torch.Tensor:
    """(n, n) bool: True where low <= m - k <= high (m the row, k the column), built without any
    n x n integer temporary (row and column differences of a million-token layout's blocks would
    take 8 bytes each)."""
    return torch.ones(n, n, dtype=torch.bool).tril(-low).triu(-high)


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Which (query block, key block) pairs may attend, for one or for every query head.

    Immutable: the mask is copied to a contiguous CPU bool tensor at construction and must not
    be modified afterwards (derived index tensors are cached per device).

    Attributes:
        block_size: tokens per block side, a positive multiple of 16.
        mask: (H_l, Mb, Nb) bool on CPU; H_l is 1 (shared by all heads) or the number of query heads.
        q_len: query length in tokens the layout was built for; Mb == ceil(q_len / block_size).
        kv_len: key length in tokens the layout was built for; Nb == ceil(kv_len / block_size).
        window: None, or (left, right): within the listed blocks query i attends key j only if
            i - left <= j <= i + right (a side None: unbounded); positions count from each
            sequence's start, i for queries and j for keys.
    """

    block_size: int
    mask: torch.Tensor
    q_len: int
    kv_len: int
    window: tuple[int | None, int | None] | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_block_size(self.block_size)
        _check_window(self.window)
        _check_positive_length("q_len", self.q_len)
        _check_positive_length("kv_len", self.kv_len)
        if not isinstance(self.mask, torch.Tensor) or self.mask.dtype != torch.bool or self.mask.dim() != 3:
            raise ValueError(
                "mask must be a 3-D bool tensor (H_l, Mb, Nb); got "
                f"{type(self.mask).__name__} {getattr(self.mask, 'dtype', '')} "
                f"{tuple(getattr(self.mask, 'shape', ()))}. Use BlockLayout.from_block_mask for 2-D masks."
            )
        expected = (_num_blocks(self.q_len, self.block_size), _num_blocks(self.kv_len, self.block_size))
        if tuple(self.mask.shape[1:]) != expected or self.mask.shape[0] < 1:
            raise ValueError(
                f"mask shape {tuple(self.mask.shape)} does not match q_len={self.q_len}, "
                f"kv_len={self.kv_len}, block_size={self.block_size}: expected (H_l, {expected[0]}, "
                f"{expected[1]}) with H_l >= 1."
            )
        object.__setattr__(self, "mask", self.mask.detach().to("cpu", copy=True).contiguous())

    # ----------------------------------------------------------------------------- properties
    @property
    def num_heads(self) -> int:
        """H_l: 1 when the pattern is shared by all query heads, else the number of query heads."""
        return self.mask.shape[0]

    @property
    def num_q_blocks(self) -> int:
        return self.mask.shape[1]

    @property
    def num_kv_blocks(self) -> int:
        return self.mask.shape[2]

    @property
    def density(self) -> float:
        """Fraction of True blocks (1.0 is dense attention)."""
        return int(torch.count_nonzero(self.mask)) / self.mask.numel()

    def __repr__(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return (
            f"BlockLayout(block_size={self.block_size}, q_len={self.q_len}, kv_len={self.kv_len}, "
            f"heads={self.num_heads}, blocks={self.num_q_blocks}x{self.num_kv_blocks}, "
            f"density={self.density:.4f}{window})"
        )

    def __eq__(self, other: object) -> bool:
        """Same block size, lengths and mask (use `token_mask` to compare meaning across block sizes)."""
        if not isinstance(other, BlockLayout):
            return NotImplemented
        return (
            self.block_size == other.block_size
            and self.q_len == other.q_len
            and self.kv_len == other.kv_len
            and self.window == other.window
            and self.mask.shape == other.mask.shape
            and bool(torch.equal(self.mask, other.mask))
        )

    __hash__ = None  # a layout holds a tensor: compare with ==, do not use as a dict key

    # ------------------------------------------------------------------------- derived indices
    def kv_indices(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Allowed key blocks of each (head, query block), cached per device.

        Returns counts (H_l, Mb) int32 and indices (H_l, Mb, max(1, C)) int32: ascending key-block
        indices, padded with the row's last valid index (or 0 when the row is empty).
        """
        return self._cached_indices("kv", torch.device(device))

    def q_indices(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The transposed layout: for each (head, key block) the query blocks that attend to it.

        Returns counts (H_l, Nb) int32 and indices (H_l, Nb, max(1, C)) int32, ascending, padded
        like `kv_indices`. Backward kernels that accumulate dk, dv per key block walk these.
        A causal layout with global blocks lists every query block for a global key block: its
        padded width is Mb, the one part of a layout's lists that grows with the square of the
        length (4 * Mb^2 bytes: 0.27 GB at 1M tokens in blocks of 128).
        """
        return self._cached_indices("q", torch.device(device))

    @torch.inference_mode(False)  # the lists outlive the call: training after scoring saves them for backward
    def _cached_indices(self, kind: str, device: torch.device):
        key = (kind, str(device))
        if key not in self._cache:
            if "entries" not in self._cache:  # the allowed blocks (head, query block, key block), row-major
                self._cache["entries"] = self.mask.nonzero(as_tuple=True)
            head_Z, m_Z, n_Z = self._cache["entries"]
            if kind == "kv":
                counts_HR, indices_HRC = _padded_lists(head_Z, m_Z, n_Z, self.num_heads, self.num_q_blocks)
            else:  # by (head, key block); stable, so query blocks stay ascending
                order_Z = torch.argsort(head_Z * self.num_kv_blocks + n_Z, stable=True)
                counts_HR, indices_HRC = _padded_lists(
                    head_Z[order_Z], n_Z[order_Z], m_Z[order_Z], self.num_heads, self.num_kv_blocks
                )
            self._cache[key] = (counts_HR.to(device), indices_HRC.to(device))
        return self._cache[key]

    # ----------------------------------------------------------------------------- transforms
    def with_causal(self) -> BlockLayout:
        """Drop the blocks that lie entirely above the diagonal (key block n > query block m).

        Blocks on the diagonal stay; the token-level causal mask (j <= i) is applied by the
        backends when `attention(..., causal=True)`. Needs q_len == kv_len. Cached.
        """
        if self.q_len != self.kv_len:
            raise ValueError(
                f"with_causal needs q_len == kv_len (got {self.q_len} and {self.kv_len}); causal "
                "attention is only defined here for self-attention."
            )
        if "causal" not in self._cache:
            self._cache["causal"] = BlockLayout(self.block_size, self.mask.tril(), self.q_len, self.kv_len, self.window)
        return self._cache["causal"]

    def refine(self, block_size: int) -> BlockLayout:
        """The same token-level meaning at a smaller block size that divides this one."""
        _check_block_size(block_size)
        if self.block_size % block_size != 0:
            raise ValueError(f"refine needs a block size that divides {self.block_size}, got {block_size}.")
        factor = self.block_size // block_size
        if factor == 1:
            return self
        fine_HMN = self.mask.repeat_interleave(factor, 1).repeat_interleave(factor, 2)
        Mb, Nb = _num_blocks(self.q_len, block_size), _num_blocks(self.kv_len, block_size)
        return BlockLayout(block_size, fine_HMN[:, :Mb, :Nb], self.q_len, self.kv_len, self.window)

    def crop(self, q_start: int, q_end: int, kv_start: int, kv_end: int) -> BlockLayout:
        """The layout of queries [q_start, q_end) against keys [kv_start, kv_end), positions
        counted from each range's start (a ring's chunk pair, `genoformer.kernels.ring`). Cached.

        Both starts must be multiples of block_size, and each end a multiple or the length, so
        that the blocks of the range are whole blocks of this layout.  A window moves with the
        positions: j - i of the crop is that of the layout minus (kv_start - q_start)."""
        bs = self.block_size
        if (
            q_start % bs
            or kv_start % bs
            or not 0 <= q_start < q_end <= self.q_len
            or not 0 <= kv_start < kv_end <= self.kv_len
            or (q_end % bs and q_end != self.q_len)
            or (kv_end % bs and kv_end != self.kv_len)
        ):
            raise ValueError(
                f"crop({q_start}, {q_end}, {kv_start}, {kv_end}) of a {self.q_len} x {self.kv_len} layout of "
                f"blocks of {bs}: the ranges must be non-empty, inside the layout, start on a block and end on a "
                "block or at the length (shard with granule=layout.block_size)."
            )
        key = ("crop", q_start, q_end, kv_start, kv_end)
        if key not in self._cache:
            mask_HMN = self.mask[:, q_start // bs : _num_blocks(q_end, bs), kv_start // bs : _num_blocks(kv_end, bs)]
            window = None
            if self.window is not None:
                offset = kv_start - q_start
                left, right = self.window
                window = (None if left is None else left + offset, None if right is None else right - offset)
            self._cache[key] = BlockLayout(bs, mask_HMN, q_end - q_start, kv_end - kv_start, window)
        return self._cache[key]

    def token_mask(self, causal: bool = False) -> torch.Tensor:
        """(H_l, q_len, kv_len) bool token-level mask (the window applied): for references and tests
        at small sizes."""
        bs = self.block_size
        tokens_HLS = self.mask.repeat_interleave(bs, 1).repeat_interleave(bs, 2)[:, : self.q_len, : self.kv_len]
        if causal:
            if self.q_len != self.kv_len:
                raise ValueError("a causal token mask needs q_len == kv_len.")
            tokens_HLS = tokens_HLS & torch.ones(self.q_len, self.kv_len, dtype=torch.bool).tril()
        if self.window is not None:
            offset_LS = torch.arange(self.kv_len).view(1, -1) - torch.arange(self.q_len).view(-1, 1)  # j - i
            left, right = self.window
            if left is not None:
                tokens_HLS = tokens_HLS & (offset_LS >= -left)
            if right is not None:
                tokens_HLS = tokens_HLS & (offset_LS <= right)
        return tokens_HLS

    def window_blocks(self, causal: bool = False) -> torch.Tensor:
        """(Mb, Nb) bool: the blocks that hold a pair the window (with causal, capped at j <= i)
        allows; every block without a window.  Cached."""
        key = ("window_blocks", causal)
        if key not in self._cache:
            bs = self.block_size
            left, right = self.window if self.window is not None else (None, None)
            if causal:
                right = 0 if right is None else min(right, 0)
            m_M = torch.arange(self.num_q_blocks)
            n_N = torch.arange(self.num_kv_blocks)
            q_lo_M, q_hi_M = m_M * bs, torch.clamp_max(m_M * bs + bs, self.q_len) - 1
            k_lo_N, k_hi_N = n_N * bs, torch.clamp_max(n_N * bs + bs, self.kv_len) - 1
            meets_MN = torch.ones(self.num_q_blocks, self.num_kv_blocks, dtype=torch.bool)
            if left is not None:  # the block's largest j - i reaches -left
                meets_MN &= k_hi_N.view(1, -1) - q_lo_M.view(-1, 1) >= -left
            if right is not None:  # its smallest j - i is at most right
                meets_MN &= k_lo_N.view(1, -1) - q_hi_M.view(-1, 1) <= right
            self._cache[key] = meets_MN
        return self._cache[key]

    def covers_window(self, causal: bool = False) -> bool:
        """Whether every head lists every block the window (with causal) meets: the layout then
        adds nothing to its window, and a kernel may run the window alone. Cached."""
        key = ("covers_window", causal)
        if key not in self._cache:
            self._cache[key] = self.window is not None and not bool((self.window_blocks(causal) & ~self.mask).any())
        return self._cache[key]

    def __or__(self, other: BlockLayout) -> BlockLayout:
        """Union: a pair is allowed if either layout allows it.

        Lengths must match. Block sizes may differ: both are refined to their greatest common
        divisor. Head counts must be equal or one of them 1 (shared), which is broadcast. Windows
        must be equal (a window applies to every block of its layout: the union of a windowed
        layout with another kind has no single window).
        """
        if not isinstance(other, BlockLayout):
            return NotImplemented
        if self.window != other.window:
            raise ValueError(
                f"cannot unite layouts with windows {self.window} and {other.window}: a token window applies to "
                "every block of its layout; unite block-granular layouts (exact=False), or give both the same window."
            )
        if (self.q_len, self.kv_len) != (other.q_len, other.kv_len):
            raise ValueError(
                f"cannot unite layouts built for different lengths: (q_len, kv_len) "
                f"{(self.q_len, self.kv_len)} vs {(other.q_len, other.kv_len)}."
            )
        if self.num_heads != other.num_heads and 1 not in (self.num_heads, other.num_heads):
            raise ValueError(
                f"cannot unite layouts with {self.num_heads} and {other.num_heads} heads: use equal "
                "head counts or a shared (1-head) layout."
            )
        block_size = math.gcd(self.block_size, other.block_size)
        a, b = self.refine(block_size), other.refine(block_size)
        return BlockLayout(block_size, a.mask | b.mask, self.q_len, self.kv_len, self.window)

    # -------------------------------------------------------------------------------- plotting
    def plot(self, path: str | Path, max_heads: int = 16) -> Path:
        """Write a PNG of the block grid (one panel per head when per-head); returns the path.

        Uses matplotlib's Agg canvas directly, so it never touches the global pyplot backend.
        Only the first `max_heads` heads are drawn.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        path = Path(path)
        heads = min(self.num_heads, max_heads)
        cols = min(heads, 4)
        rows = -(-heads // cols)
        fig = Figure(figsize=(max(4.2, 3.2 * cols), 3.2 * rows + 0.8))
        FigureCanvasAgg(fig)
        for h in range(heads):
            ax = fig.add_subplot(rows, cols, h + 1)
            ax.imshow(self.mask[h].numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xlabel("key block")
            ax.set_ylabel("query block")
            if self.num_heads > 1:
                ax.set_title(f"head {h} ({float(self.mask[h].float().mean()):.3f})", fontsize=9)
        fig.suptitle(
            f"{self.q_len:,} x {self.kv_len:,} tokens: {self.num_q_blocks} x {self.num_kv_blocks} "
            f"blocks of {self.block_size}\ndensity {self.density:.3f}",
            fontsize=10,
        )
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
        return path

    # -------------------------------------------------------------------------------- builders
    @classmethod
    def from_block_mask(
        cls, mask: torch.Tensor, q_len: int, kv_len: int | None = None, block_size: int = 128
    ) -> BlockLayout:
        """From a block-level bool mask (Mb, Nb) (shared) or (H_l, Mb, Nb) (per head)."""
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool:
            raise ValueError(f"the block mask must be bool, got {mask.dtype}; use mask != 0.")
        if mask.dim() == 2:
            mask = mask.unsqueeze(0)
        return cls(block_size, mask, q_len, q_len if kv_len is None else kv_len)

    @classmethod
    def dense(cls, q_len: int, kv_len: int | None = None, block_size: int = 128, num_heads: int = 1) -> BlockLayout:
        """Every block allowed (dense attention expressed as a layout)."""
        kv_len = q_len if kv_len is None else kv_len
        _check_block_size(block_size)
        shape = (num_heads, _num_blocks(q_len, block_size), _num_blocks(kv_len, block_size))
        return cls(block_size, torch.ones(shape, dtype=torch.bool), q_len, kv_len)

    @classmethod
    def sliding_window(cls, seq_len: int, window: int, block_size: int = 128, exact: bool = False) -> BlockLayout:
        """Local attention: key blocks within ceil(window / block_size) blocks of the query block.

        Block-granular (exact=False): covers every pair with |i - j| <= window (window in tokens,
        >= 0), plus some pairs a little further apart (see the module docstring). exact=True: the
        same blocks with the token window (window, window): exactly the pairs |i - j| <= window.
        """
        _check_block_size(block_size)
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"window must be a non-negative number of tokens, got {window!r}.")
        radius = -(-window // block_size)
        n = _num_blocks(seq_len, block_size)
        return cls(
            block_size, _band(n, -radius, radius).unsqueeze(0), seq_len, seq_len, (window, window) if exact else None
        )

    @classmethod
    def global_tokens(cls, seq_len: int, num_global_blocks: int, block_size: int = 128) -> BlockLayout:
        """The first `num_global_blocks` blocks attend everywhere and are attended by every block."""
        _check_block_size(block_size)
        if not isinstance(num_global_blocks, int) or num_global_blocks < 0:
            raise ValueError(f"num_global_blocks must be a non-negative int, got {num_global_blocks!r}.")
        n = _num_blocks(seq_len, block_size)
        mask_MN = torch.zeros(n, n, dtype=torch.bool)
        mask_MN[:num_global_blocks, :] = True
        mask_MN[:, :num_global_blocks] = True
        return cls(block_size, mask_MN.unsqueeze(0), seq_len, seq_len)

    @classmethod
    def random_blocks(
        cls,
        seq_len: int,
        num_random_blocks: int,
        block_size: int = 128,
        seed: int = 0,
        num_heads: int = 1,
        exclude: BlockLayout | None = None,
    ) -> BlockLayout:
        """`num_random_blocks` key blocks per query block, drawn without replacement, seeded.

        num_heads > 1 draws an independent pattern per head. Blocks allowed by `exclude` are not
        drawn (BigBird draws its random blocks among those the local and global parts leave out);
        a row with fewer candidates than requested gets all of them.
        """
        _check_block_size(block_size)
        if not isinstance(num_random_blocks, int) or num_random_blocks < 0:
            raise ValueError(f"num_random_blocks must be a non-negative int, got {num_random_blocks!r}.")
        n = _num_blocks(seq_len, block_size)
        if num_random_blocks == 0:  # nothing to draw: no (heads, n, n) float scores either
            return cls(block_size, torch.zeros(num_heads, n, n, dtype=torch.bool), seq_len, seq_len)
        generator = torch.Generator().manual_seed(seed)
        score_HMN = torch.rand(num_heads, n, n, generator=generator)  # uniform in [0, 1)
        if exclude is not None:
            if exclude.block_size != block_size or (exclude.q_len, exclude.kv_len) != (seq_len, seq_len):
                raise ValueError("exclude must have the same block size and lengths as the random layout.")
            score_HMN = score_HMN.masked_fill(exclude.mask, -1.0)  # never among the candidates
        k = min(num_random_blocks, n)
        mask_HMN = torch.zeros(num_heads, n, n, dtype=torch.bool)
        if k > 0:
            top_HMK = score_HMN.topk(k, dim=-1)
            mask_HMN.scatter_(-1, top_HMK.indices, top_HMK.values >= 0)
        return cls(block_size, mask_HMN, seq_len, seq_len)

    @classmethod
    def bigbird(
        cls,
        seq_len: int,
        window: int,
        num_global_blocks: int,
        num_random_blocks: int,
        block_size: int = 128,
        seed: int = 0,
        num_heads: int = 1,
    ) -> BlockLayout:
        """BigBird: sliding window | global blocks | r seeded random blocks per query block."""
        fixed = cls.sliding_window(seq_len, window, block_size) | cls.global_tokens(
            seq_len, num_global_blocks, block_size
        )
        random = cls.random_blocks(seq_len, num_random_blocks, block_size, seed, num_heads, exclude=fixed)
        return fixed | random

    @classmethod
    def strided(cls, seq_len: int, stride: int, block_size: int = 128, max_steps: int | None = None) -> BlockLayout:
        """Strided / dilated: query block m attends key blocks n with (m - n) % stride == 0.

        `stride` is in blocks. `max_steps` limits the pattern to |m - n| <= max_steps * stride
        (a dilated sliding window); None reaches across the whole sequence.
        """
        _check_block_size(block_size)
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive number of blocks, got {stride!r}.")
        n = _num_blocks(seq_len, block_size)
        reach = n - 1 if max_steps is None else min(n - 1, max_steps * stride)
        mask_MN = torch.zeros(n, n, dtype=torch.bool)
        for offset in range(-(reach - reach % stride), reach + 1, stride):  # the diagonals m - k = offset
            mask_MN.diagonal(-offset).fill_(True)
        return cls(block_size, mask_MN.unsqueeze(0), seq_len, seq_len)


# ------------------------------------------------------------------------------------ specs
class LayoutSpec(abc.ABC):
    """A layout recipe for a model config; the model calls `build` once it knows the lengths."""

    @abc.abstractmethod
    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        """The layout for self-attention over `seq_len` tokens with `num_heads` query heads."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None


class SlidingWindow(LayoutSpec):
    """Local attention within a window of tokens (block-granular, or exact to the token)."""

    def __init__(self, window: int = 1024, block_size: int = 128, exact: bool = False) -> None:
        """
        Args:
            window: every key within this many tokens of the query is reachable (rounded up to
                blocks unless exact).
            block_size: tokens per block side, a multiple of 16.
            exact: only the keys within `window` tokens of the query (i - window <= j <= i + window,
                with causal j <= i): a token window inside the blocks, which the Triton kernels mask
                per token on the window's edges only.
        """
        self.window = window
        self.block_size = block_size
        self.exact = exact

    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        return BlockLayout.sliding_window(seq_len, self.window, self.block_size, exact=self.exact)


class GlobalTokens(LayoutSpec):
    """The first blocks attend everywhere and are attended by all."""

    def __init__(self, num_global_blocks: int = 1, block_size: int = 128) -> None:
        """
        Args:
            num_global_blocks: how many leading blocks are global.
            block_size: tokens per block side, a multiple of 16.
        """
        self.num_global_blocks = num_global_blocks
        self.block_size = block_size

    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        return BlockLayout.global_tokens(seq_len, self.num_global_blocks, self.block_size)


class BigBird(LayoutSpec):
    """Sliding window + global blocks + seeded random blocks per query block (BigBird)."""

    def __init__(
        self,
        window: int = 512,
        num_global_blocks: int = 1,
        num_random_blocks: int = 2,
        seed: int = 0,
        block_size: int = 128,
        per_head: bool = False,
    ) -> None:
        """
        Args:
            window: sliding-window radius in tokens (rounded up to blocks).
            num_global_blocks: leading blocks that attend and are attended everywhere.
            num_random_blocks: random key blocks added to each query block.
            seed: seed of the random blocks (the layout is a pure function of the arguments).
            block_size: tokens per block side, a multiple of 16.
            per_head: draw a different random pattern for every query head.
        """
        self.window = window
        self.num_global_blocks = num_global_blocks
        self.num_random_blocks = num_random_blocks
        self.seed = seed
        self.block_size = block_size
        self.per_head = per_head

    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        return BlockLayout.bigbird(
            seq_len,
            self.window,
            self.num_global_blocks,
            self.num_random_blocks,
            self.block_size,
            self.seed,
            num_heads if self.per_head else 1,
        )


class Strided(LayoutSpec):
    """Strided / dilated blocks: query block m attends key blocks n with (m - n) % stride == 0."""

    def __init__(self, stride: int = 4, max_steps: int | None = None, block_size: int = 128) -> None:
        """
        Args:
            stride: distance between attended blocks, in blocks.
            max_steps: keep only |m - n| <= max_steps * stride (a dilated window); None for all.
            block_size: tokens per block side, a multiple of 16.
        """
        self.stride = stride
        self.max_steps = max_steps
        self.block_size = block_size

    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        return BlockLayout.strided(seq_len, self.stride, self.block_size, self.max_steps)


class Union(LayoutSpec):
    """The union of several layouts (block sizes may differ: the result uses their gcd)."""

    def __init__(self, parts: list[LayoutSpec]) -> None:
        """
        Args:
            parts: the layouts to unite; a pair is allowed if any part allows it.
        """
        if not parts:
            raise ValueError("Union needs at least one part.")
        self.parts = list(parts)

    def build(self, seq_len: int, num_heads: int) -> BlockLayout:
        layout = self.parts[0].build(seq_len, num_heads)
        for part in self.parts[1:]:
            layout = layout | part.build(seq_len, num_heads)
        return layout
