"""GPU equivalence sweep: every backend installed here against the float64 reference.

Outputs and all three gradients, bfloat16, held to twice the error of dense attention in the
same precision (plus one rounding of the exact answer; see test_attention_backends.py). A
backend that cannot run a case is skipped with its own reason (not installed: the install
command; unsupported input: why), so `pytest -rs` lists what did not run. flash-attn-4 compiles
each new configuration on first use (seconds each).

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D).
"""

from __future__ import annotations

import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention, dispatch, flash_attn_backend
from genoformer.kernels.flash_attn_backend import FlashAttn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the sweep of installed backends)"),
]

DEVICE = torch.device("cuda")
L = 1029  # not a multiple of any tile or layout block
BACKENDS = [Backend.FLASH_ATTN_4, Backend.FLASH_ATTN_2, Backend.TRITON, Backend.GLUON, Backend.SDPA, Backend.TORCH]


def _cu(docs):
    lengths = torch.tensor([n for row in docs for n in row])
    return torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).to(DEVICE)


def _empty_rows_layout():
    mask = BlockLayout.bigbird(L, 256, 1, 1, block_size=128, seed=9, num_heads=4).mask.clone()
    mask[1, 3] = False  # query block 3 of head 1 sees nothing
    return BlockLayout.from_block_mask(mask, L, L, 128)


# Each case: (B, Hq, Hkv, S, D), then attention keywords built lazily on the GPU.
CASES = {
    "dense": ((1, 4, 4, L, 128), lambda: dict()),
    "causal_gqa": ((2, 4, 2, L, 128), lambda: dict(causal=True)),
    "causal_d64": ((2, 4, 4, L, 64), lambda: dict(causal=True)),
    "padding_causal": ((2, 4, 2, L, 128), lambda: dict(causal=True, kv_lens=torch.tensor([L, 601], device=DEVICE))),
    "padding_cross_empty_batch": ((2, 4, 2, 1100, 128), lambda: dict(kv_lens=torch.tensor([1100, 0], device=DEVICE))),
    "packed_causal_gqa": ((2, 4, 2, L, 128), lambda: dict(causal=True, cu_seqlens=_cu([[100, 1, 928], [L]]))),
    "packed_bidirectional": ((2, 4, 4, L, 128), lambda: dict(cu_seqlens=_cu([[500, 529], [7, 1022]]))),
    "window_causal": ((1, 4, 2, L, 128), lambda: dict(causal=True, layout=BlockLayout.sliding_window(L, 256, 128))),
    "bigbird_per_head": (
        (2, 4, 1, L, 128),
        lambda: dict(layout=BlockLayout.bigbird(L, 128, 1, 2, block_size=128, seed=7, num_heads=4)),
    ),
    "empty_rows_causal": ((1, 4, 2, L, 128), lambda: dict(causal=True, layout=_empty_rows_layout())),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_installed_backend_matches_float64_reference(attn, backend, case):
    (B, Hq, Hkv, S, D), make_kwargs = CASES[case]
    kwargs = make_kwargs()
    q, k, v, dout = (t.to(DEVICE) for t in attn.make_qkv(B=B, Hq=Hq, Hkv=Hkv, L=L, S=S, D=D, dtype=torch.bfloat16))
    reason = dispatch.unsupported_reason(backend, q, k, v, **kwargs)
    if reason is not None:
        pytest.skip(f"{backend.value}: {reason}")
    exact = attn.reference(*(t.double() for t in (q, k, v, dout)), **kwargs)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, **kwargs)
    result = attn.run_with_grads(attention, q, k, v, dout, backend=backend, **kwargs)
    _assert_within_twice_naive_error(result, naive, exact, f"{backend.value} {case}")


def _assert_within_twice_naive_error(result, naive, exact, what: str) -> None:
    for name, value in result.tensors().items():
        truth = exact.tensors()[name]
        assert value.dtype == torch.bfloat16 and not value.isnan().any(), name
        err = (value.double() - truth).abs().max()
        naive_err = (naive.tensors()[name].double() - truth).abs().max()
        rounding = (truth.to(torch.bfloat16).double() - truth).abs().max()
        assert err <= 2 * naive_err + rounding, (
            f"{what} {name}: error {err:.3g}, same-precision error {naive_err:.3g}, rounding {rounding:.3g}"
        )


# The head dims flash-attn-4 is trusted with, each in the situations its wrong gradients showed in:
# GQA, causal and bidirectional, packed and padded (benchmarks/flash_attn_check.py
# sweeps every head dim; these guard the table against a new flash-attn-4 release).
TRUSTED_DIMS = sorted(set().union(*flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS.values()))
TRUSTED_CASES = {
    "causal_gqa": ((2, 8, 2, 997), lambda: dict(causal=True)),
    "packed_bidirectional_gqa": ((2, 8, 2, 777), lambda: dict(cu_seqlens=_cu([[300, 477], [1, 776]]))),
    "padding_causal_gqa": (
        (2, 8, 2, 1000),
        lambda: dict(causal=True, kv_lens=torch.tensor([1000, 555], device=DEVICE)),
    ),
}


@pytest.mark.parametrize("case", list(TRUSTED_CASES))
@pytest.mark.parametrize("head_dim", TRUSTED_DIMS)
def test_flash_attn_4_at_its_trusted_head_dims_matches_float64_reference(attn, head_dim, case):
    (B, Hq, Hkv, S), make_kwargs = TRUSTED_CASES[case]
    kwargs = make_kwargs()
    q, k, v, dout = (t.to(DEVICE) for t in attn.make_qkv(B=B, Hq=Hq, Hkv=Hkv, L=S, D=head_dim, dtype=torch.bfloat16))
    reason = dispatch.unsupported_reason(Backend.FLASH_ATTN_4, q, k, v, **kwargs)
    if reason is not None:
        pytest.skip(f"flash_attn_4: {reason}")
    exact = attn.reference(*(t.double() for t in (q, k, v, dout)), **kwargs)
    naive = attn.run_with_grads(attn.naive_attention, q, k, v, dout, **kwargs)
    result = attn.run_with_grads(attention, q, k, v, dout, backend=Backend.FLASH_ATTN_4, **kwargs)
    _assert_within_twice_naive_error(result, naive, exact, f"flash_attn_4 D={head_dim} {case}")


def test_auto_follows_the_measured_table_here():
    """On a GPU with a measured row, auto takes its first backend that runs (dense causal, bf16, D 128)."""
    capability = torch.cuda.get_device_capability()
    order = dispatch.FASTEST_FIRST.get(capability, dispatch.UNMEASURED)
    shape = dict(batch=1, q_heads=16, kv_heads=16, q_len=8192, kv_len=8192, head_dim=128, dtype=torch.bfloat16)
    plan = dispatch.plan_attention("auto", device=DEVICE, causal=True, **shape)
    q = torch.empty(1, 16, 8192, 128, device=DEVICE, dtype=torch.bfloat16)
    runnable = [b for b in order.dense if dispatch.unsupported_reason(b, q, q, q, causal=True) is None]
    assert runnable, f"no backend of the sm_{capability[0]}{capability[1]} row runs here: {order.dense}"
    assert plan.backend is runnable[0]
    if capability == (9, 0) and flash_attn_backend.import_error(FlashAttn.V4) is None:
        assert plan.backend is Backend.FLASH_ATTN_4
