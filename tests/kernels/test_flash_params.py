"""flash-attn's parameters in the Triton kernels, judged by the float64 reference (``triton_judge``:
errors held to twice the same-precision error, output and all three gradients, NaN never passes).

Covered: token-exact sliding windows (left, right) with causal, key padding, packed documents and
inside block-sparse layouts; causal with Lq != Lk aligned to the bottom-right corner; ALiBi slopes
per head and per batch row; softcap; dropout from a seed and offset (the reference applies the same
mask, ``genoformer.kernels.dropout``); variable-length batches with separate query and key offsets;
head dims that are no multiple of 8.  On a CPU the kernels run under Triton's interpreter at tiny
shapes; ``@pytest.mark.gpu`` holds the sweep at real tile sizes with random shapes.
test_flash_params_drawn.py draws shapes and parameters with hypothesis.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D); varlen batches (1, H, total, D).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed: pip install triton")

from genoformer.kernels import dispatch  # noqa: E402
from genoformer.kernels.dropout import RESOLUTION, draw_rng, dropout_threshold, keep_mask  # noqa: E402
from genoformer.kernels.layout import BlockLayout  # noqa: E402
from genoformer.kernels.triton_flash import INTERPRETED, Varlen, triton_attention  # noqa: E402
from triton_judge import DEVICE, assert_close_to_reference, inputs  # noqa: E402

if DEVICE.type == "cpu" and not INTERPRETED:
    pytest.skip(
        "genoformer.kernels.triton_flash was imported before TRITON_INTERPRET=1 was set; "
        "run `pytest tests/kernels/test_flash_params.py` on its own",
        allow_module_level=True,
    )

F16, BF16 = torch.float16, torch.bfloat16


def _rng(seed: int, offset: int = 0) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64, device=DEVICE)


def _cu(*lengths: int) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _varlen(q_lengths, k_lengths) -> Varlen:
    return Varlen(_cu(*q_lengths), _cu(*k_lengths), max(q_lengths), max(k_lengths))


def _windowed(layout: BlockLayout, window) -> BlockLayout:
    """The layout's blocks with a token window."""
    return BlockLayout(layout.block_size, layout.mask, layout.q_len, layout.kv_len, window)


# name -> (B, Hq, Hkv, L, S, D, dtype, kwargs factory): tiny, for the interpreter (tiles of 16 and 32)
CASES = {
    # token-exact windows: both sides, one side, with causal, with key padding, across lengths
    "window_both_sides": (1, 2, 1, 100, 100, 32, F16, lambda: {"window": (20, 9)}),
    "window_left_causal_gqa": (1, 4, 2, 80, 80, 16, BF16, lambda: {"window": (33, None), "causal": True}),
    "window_right_only": (1, 2, 2, 80, 80, 16, F16, lambda: {"window": (-1, 5)}),
    "window_two_keys": (1, 2, 1, 70, 70, 16, BF16, lambda: {"window": (1, 0)}),
    "window_key_padding": (
        2,
        2,
        1,
        90,
        90,
        16,
        F16,
        lambda: {"window": (25, 10), "kv_lens": torch.tensor([90, 41], device=DEVICE)},
    ),
    "window_cross_causal": (1, 2, 1, 50, 120, 16, F16, lambda: {"window": (30, 4), "causal": True}),
    # causal with Lq != Lk: bottom-right aligned (rows of a long q before the keys see nothing)
    "causal_short_queries": (1, 2, 1, 17, 130, 32, F16, lambda: {"causal": True}),
    "causal_long_queries": (1, 2, 1, 130, 45, 32, BF16, lambda: {"causal": True}),
    # windows with packed documents and inside layouts (covering: run dense; strided: sparse + band)
    "window_packed_documents": (
        2,
        2,
        1,
        97,
        97,
        32,
        F16,
        lambda: {"window": (16, 0), "causal": True, "cu_seqlens": _cu(30, 1, 66, 97)},
    ),
    "exact_window_layout_causal": (
        1,
        2,
        1,
        150,
        150,
        16,
        BF16,
        lambda: {"layout": BlockLayout.sliding_window(150, 40, 32, exact=True), "causal": True},
    ),
    "window_in_strided_layout": (
        1,
        2,
        1,
        160,
        160,
        16,
        F16,
        lambda: {"layout": _windowed(BlockLayout.strided(160, 2, 32), (70, 50))},
    ),
    "exact_window_layout_packed": (
        1,
        2,
        2,
        128,
        128,
        16,
        F16,
        lambda: {
            "layout": BlockLayout.sliding_window(128, 20, 32, exact=True),
            "cu_seqlens": _cu(50, 78),
            "causal": True,
        },
    ),
    "window_layout_and_argument": (
        1,
        2,
        1,
        96,
        96,
        16,
        BF16,
        lambda: {"layout": BlockLayout.sliding_window(96, 30, 32, exact=True), "window": (12, 3)},
    ),
    # ALiBi per head (GQA) and per batch row; with causal, windows, cross lengths and layouts
    "alibi_per_head_gqa": (1, 4, 2, 70, 70, 32, F16, lambda: {"alibi_slopes": torch.rand(4, device=DEVICE) * 0.3}),
    "alibi_per_row_causal_window": (
        2,
        2,
        1,
        90,
        90,
        16,
        BF16,
        lambda: {"alibi_slopes": torch.rand(2, 2, device=DEVICE), "causal": True, "window": (30, 0)},
    ),
    "alibi_cross_causal": (
        1,
        2,
        1,
        40,
        90,
        32,
        F16,
        lambda: {"alibi_slopes": torch.rand(2, device=DEVICE), "causal": True},
    ),
    "alibi_bigbird": (
        1,
        2,
        1,
        128,
        128,
        16,
        BF16,
        lambda: {
            "alibi_slopes": torch.rand(2, device=DEVICE) * 0.2,
            "layout": BlockLayout.bigbird(128, 32, 1, 1, block_size=32),
        },
    ),
    # softcap on scores well past the cap (scale 1 on unit vectors of 32), with ALiBi and causal
    "softcap": (1, 2, 1, 70, 70, 32, BF16, lambda: {"softcap": 4.0, "scale": 1.0}),
    "softcap_alibi_causal_gqa": (
        1,
        4,
        2,
        66,
        66,
        16,
        F16,
        lambda: {"softcap": 2.5, "scale": 0.7, "causal": True, "alibi_slopes": torch.rand(4, device=DEVICE)},
    ),
    # dropout: the reference applies the kernels' mask (same seed and offset)
    "dropout": (1, 2, 1, 70, 70, 32, F16, lambda: {"dropout_p": 0.25, "dropout_rng": _rng(12345, 7)}),
    "dropout_causal_window_gqa": (
        2,
        4,
        2,
        64,
        64,
        16,
        BF16,
        lambda: {"dropout_p": 0.1, "dropout_rng": _rng(-9, 2**33 + 3), "causal": True, "window": (20, 0)},
    ),
    "dropout_bigbird_padding": (
        2,
        2,
        1,
        64,
        64,
        16,
        F16,
        lambda: {
            "dropout_p": 0.4,
            "dropout_rng": _rng(3),
            "layout": BlockLayout.bigbird(64, 16, 1, 1, block_size=32),
            "kv_lens": torch.tensor([64, 50], device=DEVICE),
        },
    ),
    # head dims that are no multiple of 8 (zero-padded in the launcher)
    "d8_causal": (1, 2, 1, 60, 60, 8, F16, lambda: {"causal": True}),
    "d59_window_alibi": (
        1,
        2,
        1,
        50,
        70,
        59,
        BF16,
        lambda: {"window": (10, 10), "alibi_slopes": torch.rand(2, device=DEVICE)},
    ),
    "d111_causal_gqa": (1, 4, 2, 40, 40, 111, F16, lambda: {"causal": True}),
}

# varlen batches: (Hq, Hkv, query lengths, key lengths, D, dtype, kwargs factory)
VARLEN_CASES = {
    # an empty query sequence, and a query with no key at all
    "varlen_causal_gqa": (4, 2, (10, 0, 35, 1), (30, 3, 47, 0), 32, F16, lambda: {"causal": True}),
    "varlen_longer_queries": (2, 1, (40, 9, 70), (12, 30, 20), 16, BF16, lambda: {"causal": True}),
    "varlen_window_alibi_dropout": (
        2,
        2,
        (33, 64, 5),
        (50, 40, 5),
        16,
        F16,
        lambda: {
            "window": (9, 3),
            "alibi_slopes": torch.rand(3, 2, device=DEVICE),
            "dropout_p": 0.2,
            "dropout_rng": _rng(77, 1),
        },
    ),
    "varlen_softcap_bidirectional": (2, 1, (20, 48), (64, 17), 32, BF16, lambda: {"softcap": 3.0, "scale": 1.0}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_params_match_reference(attn, case):
    B, Hq, Hkv, L, S, D, dtype, kwargs = CASES[case]
    q, k, v, dout = inputs(B, Hq, Hkv, L, S, D, dtype, seed=list(CASES).index(case))
    assert_close_to_reference(attn, triton_attention, q, k, v, dout, dtype, **kwargs())


@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_matches_reference(attn, case):
    """Sequences of their own query and key lengths in one row, none padded to the longest."""
    Hq, Hkv, q_lengths, k_lengths, D, dtype, kwargs = VARLEN_CASES[case]
    q, k, v, dout = inputs(1, Hq, Hkv, sum(q_lengths), sum(k_lengths), D, dtype, seed=len(case))
    assert_close_to_reference(
        attn, triton_attention, q, k, v, dout, dtype, varlen=_varlen(q_lengths, k_lengths), **kwargs()
    )


# --------------------------------------------------------------------------------- dropout


def _kernel_keep_mask(p: float, rng: torch.Tensor, B: int, H: int, L: int) -> torch.Tensor:
    """The mask the kernels applied, read back from their output: with q = 0 every probability is
    1 / L, and with v the identity (L == D) output column j is keep_ij / (L (1 - p))."""
    q = torch.zeros(B, H, L, L, dtype=F16, device=DEVICE)
    v = torch.eye(L, dtype=F16, device=DEVICE).expand(B, 1, L, L).contiguous()
    out = triton_attention(q, q[:, :1], v, dropout_p=p, dropout_rng=rng)
    return out > 0


def test_kernels_drop_exactly_the_reference_mask():
    """The in-kernel Philox mask (eight keys per call, interleaved by joins) is bit for bit
    ``dropout.keep_mask``'s, for several heads, rows and a negative seed with a large offset."""
    for p, rng in ((0.3, _rng(2024, 5)), (0.5, _rng(-(2**62), 2**32 + 9))):
        got = _kernel_keep_mask(p, rng, 2, 3, 32)
        assert torch.equal(got.cpu(), keep_mask(rng.cpu(), p, 2, 3, 32, 32))


def test_keep_rate_is_one_minus_p():
    """Over 1M drawn probabilities the kept fraction is within 5 standard deviations of
    1 - round(p * 65536) / 65536, rows and heads alike; distinct seeds and offsets give distinct masks."""
    p = 0.17
    mask = keep_mask(_rng(7).cpu(), p, 4, 8, 128, 256)
    expected = 1 - dropout_threshold(p) / RESOLUTION
    assert abs(expected - (1 - p)) <= 1 / RESOLUTION
    sigma = (expected * (1 - expected) / mask.numel()) ** 0.5
    assert abs(mask.float().mean().item() - expected) < 5 * sigma
    per_head = mask.float().mean(dim=(0, 2, 3))
    assert (per_head - expected).abs().max() < 5 * (expected * (1 - expected) / mask[:, 0].numel()) ** 0.5
    other_seed = keep_mask(_rng(8).cpu(), p, 4, 8, 128, 256)
    other_offset = keep_mask(_rng(7, 1).cpu(), p, 4, 8, 128, 256)
    for other in (other_seed, other_offset):
        agree = (other == mask).float().mean().item()  # independent masks agree with p^2 + (1-p)^2
        assert abs(agree - (p**2 + (1 - p) ** 2)) < 0.01


def test_dropout_is_deterministic_for_a_seed(attn):
    """The same seed and offset give bit-equal outputs and gradients; another seed does not; a
    drawn rng follows torch.manual_seed."""
    q, k, v, dout = (t.to(F16) for t in inputs(1, 2, 1, 64, 64, 16, F16, seed=3))
    runs = [
        attn.run_with_grads(triton_attention, q, k, v, dout, causal=True, dropout_p=0.3, dropout_rng=rng)
        for rng in (_rng(11), _rng(11), _rng(12))
    ]
    for name, value in runs[0].tensors().items():
        assert torch.equal(value, runs[1].tensors()[name]), name
        assert not torch.equal(value, runs[2].tensors()[name]), name
    torch.manual_seed(5)
    first = draw_rng(DEVICE)
    torch.manual_seed(5)
    assert torch.equal(first, draw_rng(DEVICE)) and first[1] == 0


# ----------------------------------------------------------------------------- exact windows


@pytest.mark.parametrize("layout", [False, True], ids=["window", "exact_layout"])
def test_window_reads_no_tile_outside_it(attn, layout):
    """Tiles wholly outside the window are skipped, not masked: NaN in every key, value, query and
    gradient more than a tile beyond the window never reaches the rows inside it (a masked
    visit would multiply NaN by 0). Tiles are at most 32 wide in the interpreter and 128 on a GPU;
    the layout's blocks as wide."""
    tile = 32 if DEVICE.type == "cpu" else 128
    L, W = 8 * tile, 24
    q, k, v, dout = (t.to(F16) for t in inputs(1, 2, 1, L, L, 16, F16, seed=4))
    inside = slice(3 * tile, 5 * tile)
    far = W + 2 * tile  # the window plus two tiles
    for t in (q, k, v, dout):
        t[:, :, : inside.start - far] = float("nan")
        t[:, :, inside.stop + far :] = float("nan")
    if layout:
        kwargs = {"layout": BlockLayout.sliding_window(L, W, tile, exact=True)}
    else:
        kwargs = {"window": (W, W)}
    got = attn.run_with_grads(triton_attention, q, k, v, dout, **kwargs)
    for name, value in got.tensors().items():
        assert torch.isfinite(value[:, :, inside]).all(), name


def test_covering_layout_runs_as_its_window(monkeypatch):
    """A layout that lists every block its window meets runs without block lists (the window's tile
    ranges), and gives what the window alone gives; one that lists fewer runs its lists."""
    from genoformer.kernels import triton_flash

    seen = []
    launch = triton_flash.flash_fwd
    monkeypatch.setattr(triton_flash, "flash_fwd", lambda *a, **kw: seen.append(a[4] is None) or launch(*a, **kw))
    q, k, v, _ = (t.to(F16) for t in inputs(1, 2, 1, 128, 128, 16, F16, seed=6))
    covering = BlockLayout.sliding_window(128, 30, 32, exact=True)
    assert covering.covers_window(causal=True)
    got = triton_attention(q, k, v, causal=True, layout=covering)
    alone = triton_attention(q, k, v, causal=True, window=(30, 0))
    torch.testing.assert_close(got, alone, atol=0, rtol=0)
    thinner = _windowed(BlockLayout.strided(128, 2, 32), (30, 30))
    assert not thinner.covers_window()
    triton_attention(q, k, v, layout=thinner)
    assert seen == [True, True, False]


def test_dispatch_takes_exact_windows_and_alibi(attn):
    """Through `attention`: the reference, sdpa, torch and triton backends agree on an exact window
    with ALiBi (the layout carries the window), and flash-attn's adapter refuses both with reasons."""
    q, k, v, dout = (t.to(torch.float32) for t in inputs(2, 4, 2, 70, 70, 16, F16, seed=9))
    kwargs = {
        "causal": True,
        "layout": BlockLayout.sliding_window(70, 20, 16, exact=True).with_causal(),
        "alibi_slopes": dispatch.alibi_slopes(4).to(DEVICE),
    }
    expected = attn.reference(*(t.double() for t in (q, k, v, dout)), **kwargs)
    for backend in ("sdpa", "torch"):
        got = attn.run_with_grads(dispatch.attention, q, k, v, dout, backend=backend, **kwargs)
        for name, value in got.tensors().items():
            torch.testing.assert_close(value.double(), expected.tensors()[name], atol=2e-5, rtol=1e-4, msg=name)
    low = [t.to(F16) for t in (q, k, v, dout)]
    got = attn.run_with_grads(dispatch.attention, *low, backend="triton", **kwargs)
    for name, value in got.tensors().items():
        torch.testing.assert_close(value.double(), expected.tensors()[name], atol=1e-2, rtol=1e-2, msg=name)
    why = dispatch.unsupported_reason("flash_attn_2", q, k, v, **kwargs)
    assert why is not None and "ALiBi" in why


# ----------------------------------------------------------------------------- launcher


@pytest.mark.parametrize("D", [64, 59])
def test_outputs_follow_the_inputs_layout(D):
    """(B, L, H, D) inputs viewed as (B, H, L, D) give (B, L, H, D)-contiguous output and gradients;
    a head dim that is no multiple of 8 comes back at its own width (a view of the padded result,
    as flash-attn returns it)."""
    q, k, v, dout = (t.to(F16) for t in inputs(2, 3, 3, 40, 40, D, F16, seed=1))
    views = [t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    out = triton_attention(*views, causal=True, window=(7, 0))
    out.backward(dout)
    for t in (out, *(view.grad for view in views)):
        assert t.shape[-1] == D and t.stride(-1) == 1
        assert t.transpose(1, 2).is_contiguous() or D % 8


def test_compiled_call_with_every_parameter_is_one_graph(attn):
    """The custom ops take the band, ALiBi, softcap, dropout and varlen arguments: a compiled call
    with all of them is one graph (fullgraph), bit-equal to the eager call, forward and backward."""
    from torch._dynamo.backends.common import aot_autograd

    q, k, v, dout = (t.to(F16) for t in inputs(1, 2, 1, 48, 60, 16, F16, seed=2))
    varlen, rng, slopes = _varlen((20, 28), (25, 35)), _rng(3), torch.rand(2, 2, device=DEVICE)

    def f(q, k, v):
        return (
            triton_attention(
                q,
                k,
                v,
                causal=True,
                window=(9, 0),
                alibi_slopes=slopes,
                softcap=5.0,
                dropout_p=0.2,
                dropout_rng=rng,
                varlen=varlen,
            )
            * 2
        )

    graphs = []
    if DEVICE.type == "cuda":
        backend = "inductor"
    else:

        def keep(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    eager = attn.run_with_grads(f, q, k, v, dout)
    got = attn.run_with_grads(compiled, q, k, v, dout)
    for name, value in got.tensors().items():
        torch.testing.assert_close(value, eager.tensors()[name], atol=0, rtol=0, msg=name)
    if DEVICE.type == "cpu":
        code = "\n".join(str(gm.graph) for gm in graphs)
        assert "genoformer.triton_flash_fwd" in code and "genoformer.triton_flash_bwd" in code, code


# ----------------------------------------------------------------------------- GPU sweep

GPU_HEAD_DIMS = (32, 59, 64, 111, 128, 256)
GPU_KINDS = (
    "window_causal_gqa",
    "window_cross",
    "causal_cross",
    "alibi_window_padding",
    "softcap_alibi",
    "dropout_causal_gqa",
    "window_bigbird_layout",
    "varlen_all",
)


def _gpu_case(kind: str, D: int, g: torch.Generator):
    """(B, Hq, Hkv, L, S, kwargs) of one GPU case, lengths drawn from g (not tile multiples)."""
    L, S = (int(x) for x in torch.randint(700, 1300, (2,), generator=g))
    w = int(torch.randint(30, 400, (1,), generator=g))
    if kind == "window_causal_gqa":
        return 2, 8, 2, L, L, {"causal": True, "window": (w, 0)}
    if kind == "window_cross":
        return 2, 4, 4, L, S, {"window": (w, w // 3)}
    if kind == "causal_cross":
        return 2, 4, 1, L // 8, S, {"causal": True}
    if kind == "alibi_window_padding":
        return (
            2,
            4,
            2,
            L,
            L,
            {
                "window": (w, w),
                "alibi_slopes": torch.rand(2, 4, generator=g).to(DEVICE),
                "kv_lens": torch.tensor([L, L // 2], device=DEVICE),
            },
        )
    if kind == "softcap_alibi":
        return (
            1,
            4,
            4,
            L,
            L,
            {"softcap": 8.0, "scale": 0.5, "causal": True, "alibi_slopes": torch.rand(4, generator=g).to(DEVICE) * 0.1},
        )
    if kind == "dropout_causal_gqa":
        return 2, 8, 2, L, L, {"causal": True, "dropout_p": 0.17, "dropout_rng": _rng(int(L))}
    if kind == "window_bigbird_layout":
        layout = _windowed(BlockLayout.bigbird(L, 256, 0, 2, block_size=128, seed=3, num_heads=4), (w, w))
        return 1, 4, 2, L, L, {"layout": layout}
    q_lengths = [int(x) for x in torch.randint(1, 700, (4,), generator=g)]
    k_lengths = [int(x) for x in torch.randint(1, 700, (4,), generator=g)]
    return (
        1,
        4,
        2,
        sum(q_lengths),
        sum(k_lengths),
        {
            "varlen": _varlen(q_lengths, k_lengths),
            "causal": True,
            "window": (w, 0),
            "alibi_slopes": torch.rand(4, 4, generator=g).to(DEVICE),
            "dropout_p": 0.1,
            "dropout_rng": _rng(5),
        },
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the sweep at real tile sizes)")
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("D", GPU_HEAD_DIMS)
def test_gpu_sweep(attn, kind, D):
    g = torch.Generator().manual_seed(1000 * D + GPU_KINDS.index(kind))
    dtype = (F16, BF16)[(D + GPU_KINDS.index(kind)) % 2]
    B, Hq, Hkv, L, S, kwargs = _gpu_case(kind, D, g)
    q, k, v, dout = inputs(B, Hq, Hkv, L, S, D, dtype, seed=D)
    assert_close_to_reference(attn, triton_attention, q, k, v, dout, dtype, **kwargs)
