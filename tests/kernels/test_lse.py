"""`attention(..., return_lse=True)` on every backend against float64: out, lse and dq, dk, dv.

The loss is <out, dout> + <lse, dlse> with random dout and dlse, so every gradient checked here
has a share that flows through the lse (d lse_i / d s_ij = softmax_ij). The judge is the float64
reference, itself checked against an lse written out independently (`_exact_lse`). Fully masked
rows must give out 0, lse -inf and zero gradients, whatever dlse holds there; NaN never passes.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D), lse and dlse (B, Hq, L).
"""

from __future__ import annotations

import dataclasses

import fake_flash_attn  # tests/kernels/fake_flash_attn.py: the stand-in packages
import pytest
import torch
from genoformer.kernels import Backend, BlockLayout, attention, dispatch, flash_attn_backend
from genoformer.kernels.dispatch import plan_attention, unsupported_reason
from genoformer.kernels.flash_attn_backend import FlashAttn, flash_attn_attention
from genoformer.kernels.reference import allowed_mask


@dataclasses.dataclass
class LseResult:
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def _run(fn, q, k, v, dout, dlse, **kwargs) -> LseResult:
    """(out, lse) = fn(q, k, v, return_lse=True, ...) and the gradients of <out, dout> + <lse, dlse>
    (dlse also on the rows whose lse is -inf)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v, return_lse=True, **kwargs)
    # dlse reaches every row, the -inf ones (no allowed key) too: they must pass back 0
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (dout.to(out.dtype), dlse.to(lse.dtype)))
    return LseResult(out.detach(), lse.detach(), dq, dk, dv)


def _inputs(B, Hq, Hkv, L, S=None, D=16, dtype=torch.float64, seed=0):
    S = L if S is None else S
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D), (B, Hq, L, D), (B, Hq, L)]
    q, k, v, dout, dlse = (torch.randn(s, generator=g, dtype=torch.float64) for s in shapes)
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype), dlse


def _exact_lse(q, k, *, scale=None, **conditions) -> torch.Tensor:
    """logsumexp over the allowed keys in float64 with -inf fills (torch gives -inf for a row
    with none): written without the backends' finite-fill trick."""
    B, Hq, L, D = q.shape
    k64 = k.double().repeat_interleave(Hq // k.shape[1], 1)
    scores = (q.double() @ k64.transpose(-1, -2)) * (D**-0.5 if scale is None else scale)
    mask = allowed_mask(
        L,
        k.shape[2],
        device=q.device,
        batch=B,
        causal=conditions.get("causal", False),
        layout=conditions.get("layout"),
        kv_lens=conditions.get("kv_lens"),
        cu_seqlens=conditions.get("cu_seqlens"),
    )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.logsumexp(scores, -1)


def _layout(L, bs, heads, density, seed, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    n = -(-L // bs)
    mask = torch.rand(heads, n, n, generator=g) < density
    for h, m in empty_rows:
        mask[h, m] = False
    return BlockLayout.from_block_mask(mask, L, L, bs)


def _cu(docs):
    lengths = [n for row in docs for n in row]
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


# name -> (B, Hq, Hkv, L, S), attention keywords built lazily
CASES = {
    "dense_gqa_odd": ((2, 4, 2, 97, 97), lambda: dict()),
    "causal_odd": ((1, 2, 2, 75, 75), lambda: dict(causal=True, scale=0.3)),
    "cross_padding_empty_batch": ((2, 2, 1, 40, 97), lambda: dict(kv_lens=torch.tensor([97, 0]))),
    "causal_padding": ((2, 4, 2, 50, 50), lambda: dict(causal=True, kv_lens=torch.tensor([50, 21]))),
    "block_sparse_empty_rows_gqa": (
        (1, 4, 2, 97, 97),
        lambda: dict(layout=_layout(97, 16, 4, 0.4, 2, empty_rows=[(0, 1), (3, 5)])),
    ),
    "block_sparse_causal_shared": ((2, 2, 1, 97, 97), lambda: dict(causal=True, layout=_layout(97, 16, 1, 0.5, 1))),
    "packed_causal": ((2, 2, 1, 48, 48), lambda: dict(causal=True, cu_seqlens=_cu([[5, 43], [1, 39, 8]]))),
    "packed_layout": ((1, 2, 2, 64, 64), lambda: dict(cu_seqlens=_cu([[30, 34]]), layout=_layout(64, 16, 1, 0.6, 4))),
}


def _assert_same(got: LseResult, expected: LseResult, atol: float, rtol: float) -> None:
    """Equal within tolerance; -inf lse exactly where expected; no NaN anywhere."""
    for name in ("out", "dq", "dk", "dv"):
        value = getattr(got, name)
        assert not value.isnan().any(), f"{name} has NaN"
        torch.testing.assert_close(
            value.double(),
            getattr(expected, name).double(),
            atol=atol,
            rtol=rtol,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    empty = expected.lse == float("-inf")
    assert torch.equal(got.lse == float("-inf"), empty), "lse is -inf exactly on the rows with no allowed key"
    assert not got.lse.isnan().any(), "lse has NaN"
    torch.testing.assert_close(got.lse[~empty].double(), expected.lse[~empty].double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("case", list(CASES))
def test_reference_lse_is_the_exact_logsumexp_and_its_gradient_the_softmax(case):
    """The judge itself: lse equals an independent logsumexp, and d<lse, g>/dq equals
    scale * (g * softmax) @ k with the reference's own probabilities."""
    (B, Hq, Hkv, L, S), make = CASES[case]
    q, k, v, _, dlse = _inputs(B, Hq, Hkv, L, S)
    kwargs = make()
    got = _run(attention, q, k, v, torch.zeros_like(q), dlse, backend="reference", **kwargs)
    exact = _exact_lse(q, k, **kwargs)
    assert got.lse.dtype == torch.float64
    torch.testing.assert_close(got.lse, exact, atol=1e-12, rtol=0)
    scale = kwargs.get("scale", q.shape[-1] ** -0.5)
    finite = exact.isfinite()
    probs = torch.exp(
        ((q @ k.repeat_interleave(Hq // Hkv, 1).transpose(-1, -2)) * scale)
        - torch.where(finite, exact, 0).unsqueeze(-1)
    )
    mask = allowed_mask(
        L,
        S,
        device="cpu",
        batch=B,
        causal=kwargs.get("causal", False),
        layout=kwargs.get("layout"),
        kv_lens=kwargs.get("kv_lens"),
        cu_seqlens=kwargs.get("cu_seqlens"),
    )
    probs = probs if mask is None else probs * mask
    dq = scale * (dlse.unsqueeze(-1) * probs) @ k.repeat_interleave(Hq // Hkv, 1)
    torch.testing.assert_close(got.dq, dq, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", [Backend.TORCH, Backend.SDPA])
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_backends_match_the_reference_in_float64(backend, case):
    (B, Hq, Hkv, L, S), make = CASES[case]
    q, k, v, dout, dlse = _inputs(B, Hq, Hkv, L, S, seed=1)
    kwargs = make()
    expected = _run(attention, q, k, v, dout, dlse, backend="reference", **kwargs)
    got = _run(attention, q, k, v, dout, dlse, backend=backend, **kwargs)
    _assert_same(got, expected, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("backend", [Backend.REFERENCE, Backend.TORCH, Backend.SDPA])
def test_lse_dtype_and_unchanged_output(backend):
    """lse is float32 for float32 inputs (float64 for float64); out is the same with or without it."""
    q, k, v, _, _ = _inputs(2, 2, 1, 33, dtype=torch.float32)
    layout = _layout(33, 16, 1, 0.7, 3)
    out, lse = attention(q, k, v, causal=True, layout=layout, backend=backend, return_lse=True)
    assert lse.shape == (2, 2, 33) and lse.dtype == torch.float32
    torch.testing.assert_close(out, attention(q, k, v, causal=True, layout=layout, backend=backend), atol=0, rtol=0)


def test_blocksparse_torch_lse_through_checkpointed_chunks():
    """Several chunks (each checkpointed under autograd): lse and its gradient still match."""
    from genoformer.kernels.blocksparse_torch import blocksparse_attention

    q, k, v, dout, dlse = _inputs(1, 2, 1, 97, seed=4)
    layout = BlockLayout.bigbird(97, 16, 1, 1, block_size=16, seed=5)
    expected = _run(attention, q, k, v, dout, dlse, backend="reference", causal=True, layout=layout)
    got = _run(blocksparse_attention, q, k, v, dout, dlse, causal=True, layout=layout, chunk_elements=4096)
    _assert_same(got, expected, atol=1e-10, rtol=1e-8)


def test_auto_takes_torch_for_a_large_lse_on_cpu(monkeypatch):
    """sdpa's lse needs the (B, Hq, L, S) scores: auto keeps sdpa for small ones only."""
    monkeypatch.setattr(dispatch, "SDPA_MASK_ELEMENTS", 1000)
    plan = dict(batch=1, q_heads=2, kv_heads=2, kv_len=64, head_dim=16, dtype=torch.float32, device=torch.device("cpu"))
    assert plan_attention("auto", q_len=64, **plan).backend is Backend.SDPA
    assert plan_attention("auto", q_len=64, return_lse=True, **plan).backend is Backend.TORCH
    assert plan_attention("auto", q_len=4, return_lse=True, **plan).backend is Backend.SDPA


# ------------------------------------------------------------------------------- Triton
def _triton_or_skip(q, k, v, **kwargs):
    reason = unsupported_reason(Backend.TRITON, q, k, v, return_lse=True, **kwargs)
    if reason is not None:
        pytest.skip(f"triton backend unavailable: {reason}")


def _naive(q, k, v, *, return_lse, causal=False, layout=None, kv_lens=None, cu_seqlens=None, scale=None):
    """Dense attention and lse in the inputs' own dtype: the same-precision baseline."""
    B, Hq, L, D = q.shape
    group = Hq // k.shape[1]
    scale = D**-0.5 if scale is None else scale
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    mask = allowed_mask(L, k.shape[2], causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, batch=B)
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    scores = scores.masked_fill(~mask, torch.finfo(q.dtype).min)
    lse = torch.logsumexp(scores, -1).masked_fill(~mask.any(-1), float("-inf"))
    return (torch.softmax(scores, -1) * mask) @ v, lse


TRITON_CASES = {
    "causal_gqa_odd": ((1, 4, 2, 75), torch.float16, lambda: dict(causal=True)),
    "layout_empty_rows": (
        (1, 2, 1, 96),
        torch.bfloat16,
        lambda: dict(layout=_layout(96, 16, 2, 0.5, 5, empty_rows=[(1, 2)]), scale=0.3),
    ),
    "padding_empty_batch": ((2, 2, 1, 40), torch.float16, lambda: dict(kv_lens=torch.tensor([23, 0]))),
    "packed_causal": ((2, 2, 2, 48), torch.bfloat16, lambda: dict(causal=True, cu_seqlens=_cu([[5, 43], [20, 28]]))),
}


@pytest.mark.parametrize("case", list(TRITON_CASES))
def test_triton_lse_and_its_gradient(case):
    """Each of out, lse, dq, dk, dv within twice the same-precision PyTorch error of the float64
    reference (plus one rounding of the largest value); the lse converted from the kernels'
    base-2 statistic, its gradient entering the backward through delta."""
    (B, Hq, Hkv, L), dtype, make = TRITON_CASES[case]
    q, k, v, dout, dlse = _inputs(B, Hq, Hkv, L, seed=2)
    kwargs = make()
    low = [t.to(dtype) for t in (q, k, v, dout)]
    _triton_or_skip(*low[:3], **{n: x for n, x in kwargs.items() if n != "scale"})
    exact = _run(attention, *(t.double() for t in low), dlse, backend="reference", **kwargs)
    naive = _run(_naive, *low, dlse.to(dtype), **kwargs)
    got = _run(attention, *low, dlse, backend="triton", **kwargs)
    assert got.lse.dtype == torch.float32
    empty = exact.lse == float("-inf")
    assert torch.equal(got.lse == float("-inf"), empty), "lse is -inf exactly on the rows with no allowed key"
    for name in ("out", "lse", "dq", "dk", "dv"):
        ref = getattr(exact, name).double()
        value, base = getattr(got, name).double(), getattr(naive, name).double()
        if name == "lse":
            ref, value, base = ref[~empty], value[~empty], base[~empty]
        assert not value.isnan().any(), f"{name} has NaN"
        err, base_err = (value - ref).abs().max().item(), (base - ref).abs().max().item()
        floor = torch.finfo(dtype).eps * ref.abs().max().item()
        assert err <= 2 * base_err + floor, f"{name}: triton error {err:.3e} > 2 x {base_err:.3e} + {floor:.1e}"


def test_triton_lse_without_output_gradient():
    """Only the lse differentiated (the output unused): its gradient alone reaches q and k."""
    q, k, v, _, dlse = _inputs(1, 2, 2, 40, seed=3)
    low = [t.to(torch.float16) for t in (q, k, v)]
    _triton_or_skip(*low, causal=True)
    grads = []
    for backend, inputs in (("triton", low), ("reference", [t.double() for t in low])):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        _, lse = attention(*leaves, causal=True, backend=backend, return_lse=True)
        grads.append(torch.autograd.grad((lse * dlse).sum(), leaves[:2]))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got.double(), expected, atol=2e-3, rtol=1e-2)


def test_triton_lse_compiles_into_one_graph():
    """torch.compile traces return_lse through the custom ops with fullgraph=True: the graph's
    output and gradients (through out and lse) equal the eager ones."""
    from torch._dynamo.backends.common import aot_autograd

    q, k, v, dout, dlse = _inputs(1, 2, 1, 48, seed=5)
    low = [t.to(torch.float16) for t in (q, k, v, dout)]
    _triton_or_skip(*low[:3], causal=True)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v, return_lse):
        out, lse = attention(q, k, v, causal=True, backend="triton", return_lse=return_lse)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    eager = _run(f, *low, dlse)
    got = _run(compiled, *low, dlse)
    for name in ("out", "lse", "dq", "dk", "dv"):
        torch.testing.assert_close(getattr(got, name), getattr(eager, name), atol=0, rtol=0, msg=name)
    code = "\n".join(str(gm.graph) for gm in graphs)
    assert "genoformer.triton_flash_fwd" in code and "genoformer.triton_flash_bwd" in code, code


# ------------------------------------------------------------------------------- flash-attn
@pytest.fixture
def fakes(monkeypatch):
    """Both fake flash-attn installs, a GPU the checks take for an H200, head dim 16 trusted."""
    fake_flash_attn.install(monkeypatch)
    monkeypatch.setattr(flash_attn_backend, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    trusted = flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS[(9, 0)] | {16}
    monkeypatch.setitem(flash_attn_backend.FLASH_ATTN_4_HEAD_DIMS, (9, 0), trusted)
    yield monkeypatch
    flash_attn_backend.import_error.cache_clear()


FLASH_CASES = {
    "dense_causal_gqa": ((2, 4, 1, 97, 97), lambda: dict(causal=True)),
    "cross": ((2, 2, 1, 40, 97), lambda: dict()),
    "padding_causal_empty_batch": ((2, 4, 2, 50, 50), lambda: dict(causal=True, kv_lens=torch.tensor([20, 0]))),
    "padding_cross": ((2, 2, 2, 40, 97), lambda: dict(kv_lens=torch.tensor([97, 33]))),
    "packed": ((2, 2, 1, 48, 48), lambda: dict(causal=True, cu_seqlens=_cu([[5, 43], [1, 39, 8]]))),
}


@pytest.mark.parametrize("version", list(FlashAttn), ids=lambda v: v.name)
@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_flash_attn_lse_maps_onto_ours_without_grad(fakes, version, case):
    """Dense, varlen and the two-call causal padding: flash-attn's lse ((B, H, L) or (H, T),
    +inf for an empty row) becomes ours; under no_grad, as the backend allows it. (The adapter
    is called directly: the fakes take float64, the backends' checks would not.)"""
    (B, Hq, Hkv, L, S), make = FLASH_CASES[case]
    q, k, v, _, _ = _inputs(B, Hq, Hkv, L, S, seed=6)
    kwargs = make()
    with torch.no_grad():
        out, lse = flash_attn_attention((version,), q, k, v, return_lse=True, **kwargs)
        expected_out, expected_lse = attention(q, k, v, backend="reference", return_lse=True, **kwargs)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(out, expected_out, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(lse, expected_lse.float())


def test_flash_attn_refuses_lse_under_autograd_and_auto_passes_over_it(fakes):
    """flash-attn's lse has no gradient: with grad mode on its backends give the reason and auto
    takes the next measured backend (triton here, made to run by the stand-in check)."""
    q, k, v, _, _ = _inputs(1, 2, 2, 64, dtype=torch.bfloat16)
    reason = unsupported_reason(Backend.FLASH_ATTN_4, q, k, v, return_lse=True)
    assert reason is not None and "gradient" in reason and "no_grad" in reason
    with torch.no_grad():
        assert unsupported_reason(Backend.FLASH_ATTN_4, q, k, v, return_lse=True) is None
    entry = dispatch.BACKENDS[Backend.TRITON]
    runs_here = dataclasses.replace(entry, unsupported_reason=lambda *args, **kwargs: None)
    fakes.setitem(dispatch.BACKENDS, Backend.TRITON, runs_here)
    plan = dict(
        batch=1,
        q_heads=2,
        kv_heads=2,
        q_len=64,
        kv_len=64,
        head_dim=16,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    assert plan_attention("auto", **plan).backend is Backend.FLASH_ATTN_4
    assert plan_attention("auto", return_lse=True, **plan).backend is Backend.TRITON
    with torch.no_grad():
        assert plan_attention("auto", return_lse=True, **plan).backend is Backend.FLASH_ATTN_4
    with pytest.raises(ValueError, match="without a gradient"):
        attention(q, k, v, backend=Backend.FLASH_ATTN_2, return_lse=True)


# ------------------------------------------------------------------------------- GPU
GPU_BACKENDS = [Backend.FLASH_ATTN_4, Backend.FLASH_ATTN_2, Backend.TRITON, Backend.SDPA, Backend.TORCH]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the installed backends' lse)")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_gpu_backends_lse(backend, case):
    """Every installed backend's lse (bf16 inputs) against the float64 reference on a GPU; with
    gradients through it where the backend differentiates it (flash-attn under no_grad only)."""
    (B, Hq, Hkv, L, S), make = FLASH_CASES[case]
    q, k, v, dout, dlse = (t.cuda() for t in _inputs(B, Hq, Hkv, 4 * L, 4 * S, D=128, seed=7))
    kwargs = {n: x.cuda() if isinstance(x, torch.Tensor) else x for n, x in make().items()}
    if "kv_lens" in kwargs:
        kwargs["kv_lens"] = kwargs["kv_lens"] * 4
    if "cu_seqlens" in kwargs:
        kwargs["cu_seqlens"] = kwargs["cu_seqlens"] * 4
    low = [t.to(torch.bfloat16) for t in (q, k, v, dout)]
    flash = backend in (Backend.FLASH_ATTN_2, Backend.FLASH_ATTN_4)
    with torch.no_grad() if flash else torch.enable_grad():
        reason = unsupported_reason(backend, *low[:3], return_lse=True, **kwargs)
        if reason is not None:
            pytest.skip(f"{backend.value}: {reason}")
    exact = _run(attention, *(t.double() for t in low), dlse, backend="reference", **kwargs)
    if flash:
        with torch.no_grad():
            _, lse = attention(*low[:3], backend=backend, return_lse=True, **kwargs)
        got_lse = lse
    else:
        got = _run(attention, *low, dlse, backend=backend, **kwargs)
        got_lse = got.lse
        for name in ("dq", "dk", "dv"):
            ref = getattr(exact, name)
            err = (getattr(got, name).double() - ref).abs().max().item()
            assert err <= 5e-2 * ref.abs().max().item(), f"{name}: error {err:.3e}"
    empty = exact.lse == float("-inf")
    assert torch.equal(got_lse == float("-inf"), empty)
    torch.testing.assert_close(got_lse[~empty].double(), exact.lse[~empty], atol=2e-3, rtol=1e-3)
