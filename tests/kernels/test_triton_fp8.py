"""FP8 attention (inference): the Triton kernel against its emulation, the emulation against the
float64 reference, the quantization's error model, and the dispatcher's fp8 backend.

The criterion is not the 2x rule: FP8 rounds q, k, v and p to 3 mantissa bits, so its error is
about ten times bf16's by design. The kernel is judged against ``emulated_fp8_attention``, the
same arithmetic in PyTorch tile by tile (same quantization, same running max at which p is
rounded): they differ by the output's rounding to bf16/fp16, and where fp32 summation order moves
a p across an e4m3 rounding boundary (rare, and by one e4m3 step). The
emulation itself is judged against the float64 reference: its error must stay within the bound
the rounding of q, k, v and p gives (``_fp8_bound``). On a CPU the kernel runs in Triton's
interpreter (TRITON_INTERPRET=1); the GPU test takes the full sizes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed: pip install triton")

from genoformer.kernels import BlockLayout, attention, dispatch  # noqa: E402
from genoformer.kernels.reference import reference_attention  # noqa: E402
from genoformer.kernels.triton_fp8 import (  # noqa: E402
    E4M3_MAX,
    INTERPRETED,
    Fp8Config,
    emulated_fp8_attention,
    fp8_fwd,
    quantize_blocks,
    unsupported_reason,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not INTERPRETED:
    pytest.skip(
        "genoformer.kernels.triton_fp8 was imported before TRITON_INTERPRET=1 was set; "
        "run `pytest tests/kernels/test_triton_fp8.py` on its own",
        allow_module_level=True,
    )


def _inputs(B, H, HKV, L, S, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(shape, generator=g, dtype=torch.float64) for shape in ((B, H, L, D), (B, HKV, S, D), (B, HKV, S, D))
    ]


def _assert_same_fp8_arithmetic(got, emulated, v):
    """got and emulated differ by the output's rounding (2 ulps of the largest value), except in rows
    where fp32 summation order moved a p across an e4m3 rounding boundary: at most 1 row in 50, by
    less than one e4m3 step (2^-4) of the largest value."""
    diff = (got.double().cpu() - emulated.double().cpu()).abs()
    ulp = torch.finfo(got.dtype).eps * emulated.abs().max().item()
    rows = (diff > 2 * ulp).any(-1).double().mean().item()
    assert rows <= 1 / 50, f"{rows:.1%} of the rows differ: more than rounding flips explain"
    assert diff.max().item() <= 2.0**-4 * v.abs().max().item()


# name -> (B, H, HKV, L, S, D, causal, kv_lens)
CASES = {
    "causal_gqa_ragged": (2, 4, 2, 100, 100, 64, True, None),
    "cross_padding_d32": (2, 2, 1, 70, 150, 32, False, [120, 0]),
    "causal_padding_two_blocks": (2, 2, 2, 129, 129, 64, True, [129, 50]),
}


@pytest.mark.parametrize("p_fp8", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_equals_its_emulation(name, dtype, p_fp8):
    B, H, HKV, L, S, D, causal, lens = CASES[name]
    q, k, v = (t.to(dtype) for t in _inputs(B, H, HKV, L, S, D, seed=len(name)))
    kv_lens = None if lens is None else torch.tensor(lens)
    got = fp8_fwd(
        q.to(DEVICE),
        k.to(DEVICE),
        v.to(DEVICE),
        None if kv_lens is None else kv_lens.to(DEVICE),
        causal,
        D**-0.5,
        p_fp8=p_fp8,
    ).cpu()
    block_n = 32 if INTERPRETED else 128  # the interpreter's configuration walks keys 32 at a time
    emulated = emulated_fp8_attention(
        q, k, v, causal=causal, kv_lens=kv_lens, scale=D**-0.5, p_fp8=p_fp8, block_n=block_n
    )
    assert got.dtype == dtype and not got.isnan().any()
    _assert_same_fp8_arithmetic(got, emulated, v)
    if lens is not None and 0 in lens:
        assert (got[lens.index(0)] == 0).all(), "a row without keys outputs 0"


def _fp8_bound(q, k, v, scale):
    """A bound of FP8's error per output element: e4m3 keeps 3 mantissa bits (relative rounding
    2^-4), so each score moves by at most 2 * 2^-4 * |q| |k| * scale (q and k rounded), each p by
    2^-4 relative, and each value by 2^-4 of its block's amax: the output moves by at most
    exp(max score error) - 1 plus 2^-4 of the largest value, twice over for p and v."""
    eps = 2.0**-4
    score_err = 2 * eps * (q.norm(dim=-1).max() * k.norm(dim=-1).max() * scale).item()
    v_max = v.abs().max().item()
    return (2 * (torch.tensor(score_err).exp().item() - 1) + 2 * eps) * v_max


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulation_error_within_fp8_rounding(name):
    """The emulated FP8 attention lies within the bound of its roundings from the float64 result,
    and above bf16's error (it does round to 3 bits)."""
    B, H, HKV, L, S, D, causal, lens = CASES[name]
    q, k, v = _inputs(B, H, HKV, L, S, D, seed=3)
    kv_lens = None if lens is None else torch.tensor(lens)
    exact = reference_attention(q, k, v, causal=causal, kv_lens=kv_lens)
    emulated = emulated_fp8_attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal, kv_lens=kv_lens, scale=D**-0.5
    )
    bf16 = reference_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal, kv_lens=kv_lens)
    err = (emulated.double() - exact).abs().max().item()
    assert err <= _fp8_bound(q, k, v, D**-0.5)
    assert err > (bf16.double() - exact).abs().max().item()


def test_quantization_keeps_three_mantissa_bits_per_block():
    """Each block of 128 rows is scaled to e4m3's full range (its amax maps to 448) and every
    element keeps 2^-4 relative precision (2^-9 of the scale below e4m3's normal range)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 300, 32, generator=g) * torch.tensor([1.0, 1e-3, 1e3]).view(1, 3, 1, 1)
    x8, scales = quantize_blocks(x, 128)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == (2, 3, 384, 32) and scales.shape == (2, 3, 3)
    back = x8.float() * scales.repeat_interleave(128, -1)[..., None]
    assert (back[:, :, 300:] == 0).all()
    err = (back[:, :, :300] - x).abs()
    bound = x.abs() * 2.0**-4 + scales.repeat_interleave(128, -1)[..., :300, None] * 2.0**-9
    assert (err <= bound).all()
    amax = x8.float().abs().amax(dim=-1).view(2, 3, 3, 128).amax(-1)
    assert torch.equal(amax[:, :, :2], torch.full((2, 3, 2), E4M3_MAX))
    xt, _ = quantize_blocks(x, 128, transpose=True)
    assert xt.shape == (2, 3, 32, 384) and xt.is_contiguous() and torch.equal(xt.transpose(-1, -2).float(), x8.float())


def test_fp8_backend_through_the_entry_point():
    """backend="fp8" runs the emulation on a CPU (under no grad): the emulation's result; what it
    cannot run is refused with the reason."""
    q, k, v = (t.float() for t in _inputs(1, 2, 1, 40, 40, 16))
    with torch.no_grad():
        got = attention(q, k, v, causal=True, backend="fp8")
    expected = emulated_fp8_attention(q, k, v, causal=True, kv_lens=None, scale=16**-0.5)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="for inference"):
        attention(q.requires_grad_(), k, v, backend="fp8")
    q = q.detach()
    layout = BlockLayout.sliding_window(40, 16, block_size=16)
    with pytest.raises(ValueError, match="block-sparse"):
        attention(q, k, v, layout=layout, backend="fp8")
    with pytest.raises(ValueError, match="packed documents"):
        attention(q, k, v, cu_seqlens=torch.tensor([0, 10, 40], dtype=torch.int32), backend="fp8")
    with pytest.raises(ValueError, match="log-sum-exp"):
        attention(q, k, v, return_lse=True, backend="fp8")
    with pytest.raises(ValueError, match="ALiBi"):
        attention(q, k, v, alibi_slopes=torch.ones(2), backend="fp8")
    with pytest.raises(ValueError, match="windows"):
        attention(q, k, v, layout=BlockLayout.sliding_window(40, 8, block_size=64, exact=True), backend="fp8")
    with pytest.raises(ValueError, match="Lq == Lk only"):
        attention(q[:, :, :10], k, v, causal=True, backend="fp8")
    assert "fp8" not in [b.value for order in dispatch.FASTEST_FIRST.values() for b in order.dense]


def test_kernel_refuses_what_it_cannot_run():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16, device=DEVICE)
    assert unsupported_reason(q, q, q, layout=None, kv_lens=None, cu_seqlens=None, return_lse=False) is None
    assert "float16 or bfloat16" in unsupported_reason(
        q.float(), q.float(), q.float(), layout=None, kv_lens=None, cu_seqlens=None, return_lse=False
    )
    q48 = torch.zeros(1, 2, 16, 48, dtype=torch.bfloat16, device=DEVICE)
    assert "head dims" in unsupported_reason(
        q48, q48, q48, layout=None, kv_lens=None, cu_seqlens=None, return_lse=False
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_kernel_equals_its_emulation_at_length(D, causal):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89 or newer")
    q, k, v = (t.bfloat16().cuda() for t in _inputs(2, 8, 2, 2000, 2000, D, seed=D))
    got = fp8_fwd(q, k, v, None, causal, D**-0.5, config=Fp8Config(128, 128, 8, 3))  # keys 128 at a time
    emulated = emulated_fp8_attention(q, k, v, causal=causal, kv_lens=None, scale=D**-0.5, block_n=128)
    _assert_same_fp8_arithmetic(got, emulated, v)
