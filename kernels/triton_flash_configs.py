"""Launch configurations for the Triton FlashAttention kernels, per GPU generation and tile width.

The kernels take every head dim that is a multiple of 8 from 16 to 256 (``HEAD_DIMS``).  Their
tiles are ``tile_dim(D)`` wide in the head dim, the next power of two (``TILE_DIMS``): Triton's
block shapes are powers of two, so a head dim of 96 runs in 128-wide tiles whose last 32 columns
the loads fill with zeros and the stores skip (masks on the head dim, nothing copied).  The tables
below are keyed by that tile width: a padded head dim uses the configurations of its tile, whose
registers and shared memory it needs (see docs/design/kernels.md for the costs).

Every configuration listed here can be chosen at run time, so every one must compile for its
generation within that generation's shared-memory limit (the first of each list runs untuned; a
later one that does not run is left out of the tuning with a warning);
``tests/kernels/test_triton_compile.py`` cross-compiles them on the CPU and checks
``compiled.metadata.shared``: in CI the first of each list and the sm_90 variants, with
GENOFORMER_COMPILE=all (``bash benchmarks/gpu_kernels.sh tests``) every one.

Tile names (the same in the kernels):
  fwd : BLOCK_M query rows x BLOCK_N key rows per step, one program per (batch*head, query tile).
  dkdv: BLOCK_N1 key rows per program (the accumulators dK, dV live in registers),
        BLOCK_M1 query rows per step.
  dq  : BLOCK_M2 query rows per program (dQ in registers), BLOCK_N2 key rows per step.

Variants (sm_90 only; each a field of the configuration, a constexpr of the kernels):
  tma         : tiles streamed through the loop (k, v in the forward and dQ; q, dO in dK/dV) are
                read with tensor descriptors (``tl.make_tensor_descriptor``, TMA on Hopper) instead
                of pointer tiles; out-of-range rows and head-dim padding come back as zeros.
                Needs 16-byte aligned bases and strides (the launcher falls back to pointers).
                Triton's interpreter cannot run it: the interpreter configurations keep pointers.
  rescale_tau : forward only; > 0 rescales the accumulator only when some row's running max grew
                by more than rescale_tau (base 2) since the last rescale (FA4's conditional
                rescaling); 0 rescales every step.
  heads_outer : backward only; the grid puts the tile index first and (batch, head) second, so the
                programs that run at one time belong to one head and share its q, k, v, dO in L2
                (FlexAttention's order); the default order runs one tile of every head at a time.
                Each head's tiles keep their longest-first order (the layout's ORDER, or DOC_ORDER
                for dense packed rows): the kernels index it by the tile axis, whichever it is.
  dq_stream   : backward only, a launch option (the kernels are those of the same configuration
                without it); the dQ kernel runs on a second CUDA stream beside the dK/dV kernel, so
                dQ programs fill the SMs that dK/dV's last wave leaves idle (FlexAttention gets the
                same by running both kinds of program in one launch). The caller's stream waits for
                both before the backward returns.
  dv_late     : backward only; the dK/dV loop issues the dV matmul after dP = v . dO^T (beside dK's)
                instead of before it: the same matmuls of the same tiles, bit-equal results, fewer
                registers live at once (no spills in the D 128 step loop on sm_90, by ptxas -v of
                the cross-compile); on the H200, 0.907x the default's time on the
                sliding window's D 128 backward at 16k (docs/design/kernels.md).
Every variant runs with packed documents (cu_seqlens) too: they change the loads, the rescaling
and the grid, not which tiles a program visits or how they are masked.

The first candidate of each list is the default (always a plain configuration, no variant); when
autotuning is on (the default on a GPU, see ``triton_flash.autotune_enabled``) the launcher times
every candidate once per key and caches the fastest, so a variant is used where it measured
faster; ``benchmarks/kernel_variants.py`` times every candidate side by side.  Hopper numbers:
docs/design/kernels.md.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # k, v through tensor descriptors
    rescale_tau: float = 0.0  # conditional rescaling threshold (base 2); 0: rescale every step


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    block_m1: int  # dK/dV kernel: query rows per step
    block_n1: int  # dK/dV kernel: key rows per program
    warps1: int
    stages1: int
    block_m2: int  # dQ kernel: query rows per program
    block_n2: int  # dQ kernel: key rows per step
    warps2: int
    stages2: int
    tma: bool = False  # q, dO (dK/dV) and k, v (dQ) through tensor descriptors
    heads_outer: bool = False  # grid (tiles, batch * heads): co-running programs share one head
    dq_stream: bool = False  # the dQ kernel on a second CUDA stream, beside dK/dV
    dv_late: bool = False  # dK/dV loop: the dV matmul after dP's, not before it (fewer registers)


@dataclasses.dataclass(frozen=True)
class Generation:
    """A family of GPUs that share one table of configurations."""

    name: str
    compile_capability: int  # the compute capability the compile test builds for
    shared_limit: int  # bytes of shared memory one program may use (opt-in maximum)


HOPPER = Generation("sm_90", 90, 232448)  # H100 / H200: 227 KB per block
AMPERE = Generation("sm_80", 80, 166912)  # A100: 163 KB per block
SMALL_SMEM = Generation("sm_86+", 86, 101376)  # sm_86/89/120 consumer parts: 99 KB per block

TILE_DIMS = (16, 32, 64, 128, 256)
HEAD_DIMS = tuple(range(16, 257, 8))
"""Head dims the kernels take: the multiples of 8 from 16 to 256."""


def tile_dim(head_dim: int) -> int:
    """The width of the kernels' tiles in the head dim: the smallest of TILE_DIMS >= head_dim."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not a multiple of 8 from 16 to 256")
    return next(t for t in TILE_DIMS if t >= head_dim)


# (generation name, tile width) -> candidates, default first.  sm_90 rows for head dims 64 and 128
# come from the H200 timings in docs/design/kernels.md (L=16k, bf16, causal); the others are
# scaled from them (fewer stages or smaller tiles where shared memory or registers run short).
_FWD: dict[tuple[str, int], tuple[FwdConfig, ...]] = {
    ("sm_90", 16): (FwdConfig(64, 64, 4, 3),),
    ("sm_90", 32): (FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 4, 3)),
    ("sm_90", 64): (
        FwdConfig(64, 64, 4, 3),
        FwdConfig(128, 64, 4, 3),
        FwdConfig(64, 64, 4, 3, tma=True),
        FwdConfig(64, 64, 4, 3, rescale_tau=8.0),
        # one more stage in flight (the custom pattern at 32k: 0.90x the 128x64 tile's time)
        FwdConfig(64, 64, 4, 4),
        # FlexAttention's H100 tile for D64 (causal at 32k: 0.89x the default's time, the
        # window 0.96x)
        FwdConfig(128, 128, 4, 3),
    ),
    ("sm_90", 128): (
        FwdConfig(128, 128, 8, 3),
        FwdConfig(128, 64, 8, 4),
        FwdConfig(128, 128, 8, 3, tma=True),
        FwdConfig(128, 128, 8, 3, rescale_tau=8.0),
        # short key lists (the custom pattern at 16k: 0.92x the default's time; the
        # 64x32 tile 0.94x of the 64x64 one)
        FwdConfig(64, 64, 4, 3),
        FwdConfig(64, 32, 4, 3),
    ),
    ("sm_90", 256): (FwdConfig(128, 64, 8, 2), FwdConfig(64, 64, 4, 2)),
    ("sm_80", 16): (FwdConfig(64, 64, 4, 3),),
    ("sm_80", 32): (FwdConfig(64, 64, 4, 3),),
    ("sm_80", 64): (FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 4, 3)),
    ("sm_80", 128): (FwdConfig(128, 64, 8, 3), FwdConfig(128, 32, 4, 3)),
    ("sm_80", 256): (FwdConfig(64, 64, 4, 2), FwdConfig(64, 32, 4, 2)),
    ("sm_86+", 16): (FwdConfig(64, 64, 4, 2),),
    ("sm_86+", 32): (FwdConfig(64, 64, 4, 2),),
    ("sm_86+", 64): (FwdConfig(64, 64, 4, 2),),
    ("sm_86+", 128): (FwdConfig(64, 32, 4, 2),),
    ("sm_86+", 256): (FwdConfig(32, 32, 4, 1),),
}

# BwdConfig(dK/dV: block_m1, block_n1, warps, stages,  dQ: block_m2, block_n2, warps, stages)
_BWD: dict[tuple[str, int], tuple[BwdConfig, ...]] = {
    ("sm_90", 16): (BwdConfig(64, 64, 4, 3, 128, 64, 8, 2),),
    ("sm_90", 32): (BwdConfig(64, 64, 4, 3, 128, 64, 8, 2), BwdConfig(32, 128, 4, 3, 64, 64, 4, 3)),
    ("sm_90", 64): (
        BwdConfig(64, 64, 4, 3, 128, 64, 8, 2),
        BwdConfig(32, 128, 4, 3, 64, 64, 4, 3),
        BwdConfig(64, 64, 4, 3, 128, 64, 8, 2, tma=True),
        BwdConfig(64, 64, 4, 3, 128, 64, 8, 2, heads_outer=True),
        BwdConfig(32, 128, 4, 3, 64, 64, 4, 3, dq_stream=True),
        BwdConfig(64, 64, 4, 3, 128, 64, 8, 2, heads_outer=True, dq_stream=True),
    ),
    ("sm_90", 128): (
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3),
        BwdConfig(32, 128, 8, 3, 128, 32, 4, 3),
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, tma=True),
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, heads_outer=True),
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, dq_stream=True),
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, heads_outer=True, dq_stream=True),
        # the default's tiles without its register spills in the dK/dV loop; with
        # heads_outer and dq_stream the fastest at 16k for the window and custom patterns
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, dv_late=True),
        BwdConfig(64, 128, 8, 3, 128, 64, 8, 3, heads_outer=True, dq_stream=True, dv_late=True),
    ),
    ("sm_90", 256): (BwdConfig(32, 64, 8, 2, 64, 32, 8, 2),),
    ("sm_80", 16): (BwdConfig(64, 64, 4, 3, 128, 64, 8, 2),),
    ("sm_80", 32): (BwdConfig(64, 64, 4, 3, 128, 64, 8, 2),),
    ("sm_80", 64): (BwdConfig(64, 64, 4, 3, 128, 64, 8, 2), BwdConfig(32, 128, 4, 3, 128, 32, 4, 3)),
    ("sm_80", 128): (BwdConfig(64, 128, 8, 2, 128, 64, 8, 2), BwdConfig(32, 128, 4, 2, 128, 32, 4, 2)),
    ("sm_80", 256): (BwdConfig(32, 64, 8, 1, 64, 32, 8, 1),),
    ("sm_86+", 16): (BwdConfig(32, 64, 4, 2, 64, 32, 4, 2),),
    ("sm_86+", 32): (BwdConfig(32, 64, 4, 2, 64, 32, 4, 2),),
    ("sm_86+", 64): (BwdConfig(32, 64, 4, 2, 64, 32, 4, 2),),
    ("sm_86+", 128): (BwdConfig(32, 64, 4, 1, 64, 32, 4, 1),),
    ("sm_86+", 256): (BwdConfig(16, 32, 4, 1, 32, 16, 4, 1),),
}

# The TRITON_INTERPRET=1 CPU path: one small configuration, pipelining means nothing there.
INTERPRETER_FWD = FwdConfig(32, 32, 4, 1)
INTERPRETER_BWD = BwdConfig(16, 32, 4, 1, 32, 16, 4, 1)

GENERATIONS = (HOPPER, AMPERE, SMALL_SMEM)


def generation_for(capability: tuple[int, int]) -> Generation:
    """The configuration family for a CUDA compute capability (major, minor)."""
    major, minor = capability
    if major == 9 or major == 10:  # Hopper; datacenter Blackwell has at least Hopper's shared memory
        return HOPPER
    if (major, minor) == (8, 0) or (major, minor) == (8, 7):  # A100/A800/A30; Orin has 163 KB too
        return AMPERE
    return SMALL_SMEM


def fwd_candidates(generation: Generation, head_dim: int) -> tuple[FwdConfig, ...]:
    """Forward candidates for a head dim (those of its tile width), the default first."""
    return _FWD[(generation.name, tile_dim(head_dim))]


def bwd_candidates(generation: Generation, head_dim: int) -> tuple[BwdConfig, ...]:
    """Backward candidates for a head dim (those of its tile width), the default first."""
    return _BWD[(generation.name, tile_dim(head_dim))]


def _largest_dividing(tile: int, block_size: int) -> int:
    """The largest power of two <= tile that divides block_size (a layout block holds whole tiles)."""
    while block_size % tile:
        tile //= 2
    return tile


def fit_fwd(config: FwdConfig, block_size: int | None) -> FwdConfig:
    """Shrink tiles so that they divide a layout's block size (only ever smaller: fewer bytes)."""
    if block_size is None:
        return config
    return dataclasses.replace(
        config,
        block_m=_largest_dividing(config.block_m, block_size),
        block_n=_largest_dividing(config.block_n, block_size),
    )


def fit_bwd(config: BwdConfig, block_size: int | None) -> BwdConfig:
    if block_size is None:
        return config
    return dataclasses.replace(
        config,
        block_m1=_largest_dividing(config.block_m1, block_size),
        block_n1=_largest_dividing(config.block_n1, block_size),
        block_m2=_largest_dividing(config.block_m2, block_size),
        block_n2=_largest_dividing(config.block_n2, block_size),
    )


DROPOUT_TILE = 128 * 128
"""Dropout's mask, drawn eight keys to a Philox call and interleaved by joins, reaches the
probabilities' layout through a (rows, keys) int8 tile of shared memory: 16 KB beside the 128 x 128
forward tiles, which on sm_90 at D 128 fill shared memory with three stages already."""


def fit_dropout(config: FwdConfig) -> FwdConfig:
    """A forward configuration with room for dropout's mask: one stage fewer for tiles of
    DROPOUT_TILE elements and more (tests/kernels/test_triton_compile.py builds the defaults with it)."""
    if config.block_m * config.block_n >= DROPOUT_TILE and config.num_stages > 2:
        return dataclasses.replace(config, num_stages=config.num_stages - 1)
    return config


SPLIT_SUM_BLOCK = 64
"""Rows per program of ``split_sum_kernel`` (at most; a divisor of the layout block): it only adds
a few fp32 tiles, default warps and no pipelining."""


def split_sum_block(block_size: int) -> int:
    """The rows per program of ``split_sum_kernel`` for a layout's block size."""
    return _largest_dividing(SPLIT_SUM_BLOCK, block_size)


def all_configs() -> list[tuple[Generation, int, FwdConfig | BwdConfig]]:
    """Every (generation, tile width, configuration) that the launcher can pick."""
    out: list[tuple[Generation, int, FwdConfig | BwdConfig]] = []
    for gen in GENERATIONS:
        for d in TILE_DIMS:
            out.extend((gen, d, c) for c in fwd_candidates(gen, d))
            out.extend((gen, d, c) for c in bwd_candidates(gen, d))
    return out
