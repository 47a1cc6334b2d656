"""Decoding over a key/value cache: the Triton decoding kernel and ``flash_attn_with_kvcache``
against the float64 reference (``genoformer.kernels.kvcache.kvcache_reference``).

Criterion (the 2x rule of ``test_triton_attention``): the kernel's largest error against the
float64 reference is at most twice the error of the same computation done in PyTorch at the same
precision, plus one unit in the last place of the largest reference value; NaN never passes. The
lse (natural log) is held to the same rule against the float32 PyTorch computation's.

The cases cover what decoding meets: one query and several (bottom-right causal), GQA groups of 1
to 8, the cache cut in several splits (merged by log-sum-exp) or one, per-row lengths, rows with no
key at all, left padding, cache rows named by index, paged caches, sliding windows, ALiBi and
softcap, head dims that are not powers of two. On a CPU the kernel runs in Triton's interpreter
(TRITON_INTERPRET=1, set before Triton's kernels are imported); ``@pytest.mark.gpu`` holds a
wider sweep.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed: pip install triton")

from genoformer.kernels import kvcache  # noqa: E402
from genoformer.kernels.triton_decode import INTERPRETED, decode_fwd, decode_op, unsupported_reason  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not INTERPRETED:
    pytest.skip(
        "genoformer.kernels.triton_decode was imported before TRITON_INTERPRET=1 was set; "
        "run `pytest tests/kernels/test_triton_decode.py` on its own",
        allow_module_level=True,
    )
LN2 = 0.6931471805599453


def _case(
    B=2, H=4, HKV=2, Lq=1, C=150, D=32, *, paged=None, seed=0, lengths=None, leftpad=None, batch_idx=False, alibi=False
):
    """float64 CPU inputs: q (B, H, Lq, D), a cache (Bc, HKV, C, D) or pages, and the options."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g, dtype=torch.float64)
    options = {}
    if paged:
        pages_per_row = -(-C // paged)
        pages = B * pages_per_row + 3
        k = torch.randn(pages, HKV, paged, D, generator=g, dtype=torch.float64)
        order = torch.randperm(pages, generator=g)[: B * pages_per_row]
        options["block_table"] = order.view(B, pages_per_row).to(torch.int32)
    else:
        k = torch.randn(B + 1 if batch_idx else B, HKV, C, D, generator=g, dtype=torch.float64)
    v = torch.randn(k.shape, generator=g, dtype=torch.float64)
    if lengths is None:
        lengths = torch.randint(Lq, C + 1, (B,), generator=g).tolist()
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    if leftpad is not None:
        options["leftpad_B"] = torch.tensor(leftpad, dtype=torch.int32)
    if batch_idx:
        options["batch_idx_B"] = torch.arange(B, 0, -1, dtype=torch.int32)
    if alibi:
        options["alibi_slopes"] = torch.rand(H, generator=g) * 0.2
    return q, k, v, seqlens, options


def _device(options: dict) -> dict:
    return {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for name, value in options.items()}


def _kernel(q, k, v, seqlens, dtype, **options):
    """The launcher on DEVICE in `dtype`: (out, lse natural log) on the CPU."""
    names = {"leftpad_B": "leftpad", "batch_idx_B": "batch_idx"}
    kwargs = {names.get(n, n): value for n, value in _device(options).items()}
    out, lse2 = decode_fwd(*(t.to(dtype).to(DEVICE) for t in (q, k, v)), seqlens.to(DEVICE), **kwargs)
    return out.cpu(), torch.where(lse2 == float("inf"), float("-inf"), lse2 * LN2).cpu()


def _assert_two_x(q, k, v, seqlens, dtype, **options):
    kernel_options = {n: value for n, value in options.items()}
    out, lse = _kernel(q, k, v, seqlens, dtype, **kernel_options)
    options.pop("num_splits", None)
    exact, exact_lse = kvcache.kvcache_reference(q, k, v, seqlens, **options)
    low = [t.to(dtype) for t in (q, k, v)]
    gathered = [
        kvcache._gathered(t, options.get("batch_idx_B"), options.get("block_table"), q.shape[0]) for t in low[1:]
    ]
    allowed = kvcache.allowed_keys(
        seqlens,
        q.shape[2],
        gathered[0].shape[2],
        causal=options["causal"],
        window=options.get("window", (-1, -1)),
        leftpad_B=options.get("leftpad_B"),
    )
    naive, naive_lse = kvcache._attend(
        low[0],
        *gathered,
        allowed,
        seqlens_B=seqlens,
        scale=options["scale"],
        softcap=options.get("softcap", 0.0),
        alibi_slopes=options.get("alibi_slopes"),
        dtype=dtype,
    )
    assert out.dtype == dtype and not out.isnan().any()
    err = (out.double() - exact).abs().max().item()
    base = (naive.double() - exact).abs().max().item()
    floor = torch.finfo(dtype).eps * exact.abs().max().item()
    assert err <= 2 * base + floor, f"out: kernel error {err:.3e} > 2 x PyTorch {dtype} error {base:.3e} + {floor:.1e}"
    empty = exact_lse == float("-inf")
    assert torch.equal(lse == float("-inf"), empty), "rows without a key must have lse -inf, the others a finite one"
    assert (out[empty.unsqueeze(-1).expand_as(out)] == 0).all(), "rows without a key must output 0"
    lse_err = (lse.double() - exact_lse).masked_fill(empty, 0).abs().max().item()
    lse_base = (naive_lse.double() - exact_lse).masked_fill(empty, 0).abs().max().item()
    assert lse_err <= 2 * lse_base + 1e-5, f"lse: kernel error {lse_err:.3e} > 2 x {lse_base:.3e}"


# name -> (case arguments, options)
CPU_CASES = {
    "one_query_gqa4_splits": (dict(B=3, H=8, HKV=2, Lq=1, C=300), dict(causal=True, num_splits=3)),
    "one_query_mha_unsplit": (dict(B=2, H=2, HKV=2, Lq=1, C=97, D=64), dict(causal=False, num_splits=1)),
    "several_queries_causal_gqa": (dict(B=2, H=4, HKV=1, Lq=7, C=130), dict(causal=True, num_splits=2)),
    "queries_longer_than_keys": (dict(B=2, H=2, HKV=1, Lq=6, C=40, lengths=[3, 40]), dict(causal=True, num_splits=2)),
    "empty_rows": (
        dict(B=3, H=2, HKV=2, Lq=2, C=64, lengths=[0, 64, 5], leftpad=[0, 64, 0]),
        dict(causal=False, num_splits=2),
    ),
    "window_and_leftpad": (
        dict(B=2, H=4, HKV=2, Lq=3, C=200, leftpad=[17, 0]),
        dict(causal=False, window=(40, 1), num_splits=3),
    ),
    "causal_window_bf16": (
        dict(B=1, H=8, HKV=8, Lq=4, C=160, D=48),
        dict(causal=True, window=(25, -1), num_splits=2, dtype=torch.bfloat16),
    ),
    "paged_gqa8": (dict(B=2, H=8, HKV=1, Lq=1, C=200, paged=32), dict(causal=True, num_splits=3)),
    "batch_idx_alibi_softcap_bf16": (
        dict(B=2, H=4, HKV=2, Lq=2, C=120, batch_idx=True, alibi=True),
        dict(causal=True, softcap=4.0, num_splits=2, dtype=torch.bfloat16),
    ),
    "head_dim_24": (dict(B=1, H=2, HKV=1, Lq=1, C=70, D=24), dict(causal=True, num_splits=2)),
}


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_decoding_kernel_against_float64(name):
    case, options = CPU_CASES[name]
    q, k, v, seqlens, extra = _case(**case)
    options = {**options}
    dtype = options.pop("dtype", torch.float16)
    _assert_two_x(q, k, v, seqlens, dtype, scale=q.shape[-1] ** -0.5, **options, **extra)


def test_splits_merge_to_one_program_result():
    """The log-sum-exp merge of 1, 2 and 5 splits gives one result (up to fp32 rounding in the merge)."""
    q, k, v, seqlens, extra = _case(B=2, H=4, HKV=2, Lq=3, C=320, seed=3)
    results = [
        _kernel(q, k, v, seqlens, torch.float16, scale=0.2, causal=True, num_splits=s, **extra) for s in (1, 2, 5)
    ]
    for out, lse in results[1:]:
        torch.testing.assert_close(out, results[0][0], rtol=0, atol=2e-3)
        torch.testing.assert_close(lse, results[0][1], rtol=0, atol=1e-5)


def test_refusals_say_what_to_change():
    q = torch.randn(1, 2, 1, 32, dtype=torch.float16, device=DEVICE)
    k = torch.randn(1, 2, 16, 32, dtype=torch.float16, device=DEVICE)
    lens = torch.tensor([16], dtype=torch.int32, device=DEVICE)
    assert "float16 or bfloat16" in unsupported_reason(q.float(), k.float(), k.float())
    assert "head dim 20" in unsupported_reason(
        q[..., :20].contiguous(), k[..., :20].contiguous(), k[..., :20].contiguous()
    )
    with pytest.raises(ValueError, match="int32 tensor of shape"):
        decode_fwd(q, k, k, lens.long(), scale=0.1, causal=True)
    with pytest.raises(ValueError, match="multiple of HKV"):
        decode_fwd(torch.randn(1, 3, 1, 32, dtype=torch.float16, device=DEVICE), k, k, lens, scale=0.1, causal=True)


def test_custom_op_compiles_into_one_graph():
    """torch.compile traces the decoding op through its fake implementation without a graph break."""
    q = torch.randn(2, 4, 1, 32, dtype=torch.float16, device=DEVICE)
    k = torch.randn(2, 2, 64, 32, dtype=torch.float16, device=DEVICE)
    lens = torch.tensor([64, 10], dtype=torch.int32, device=DEVICE)

    def step(q, k, v, lens):
        out, _ = decode_op(q, k, v, lens, 0.2, True, -1, -1, None, None, None, None, 0.0, 2)
        return out * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, k, lens), step(q, k, k, lens))


# ------------------------------------------------------------------------------- flash-attn's API
def _flash_inputs(B=2, H=4, HKV=2, Lq=1, C=64, D=32, Ln=1, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Lq, H, D, generator=g).to(dtype).to(DEVICE)
    k_cache = torch.randn(B, C, HKV, D, generator=g).to(dtype).to(DEVICE)
    v_cache = torch.randn(B, C, HKV, D, generator=g).to(dtype).to(DEVICE)
    k_new = torch.randn(B, Ln, HKV, D, generator=g).to(dtype).to(DEVICE)
    v_new = torch.randn(B, Ln, HKV, D, generator=g).to(dtype).to(DEVICE)
    return q, k_cache, v_cache, k_new, v_new


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_flash_attn_with_kvcache_appends_in_place_and_attends(dtype):
    """New keys land at cache_seqlens in place; the output is the attention over each row's
    cache_seqlens + Ln keys, bottom-right causal: float16 on the Triton kernel, float32 on the
    PyTorch path, both against the float64 reference."""
    q, k_cache, v_cache, k_new, v_new = _flash_inputs(Lq=3, Ln=3, dtype=dtype)
    before = k_cache.clone()
    lens = torch.tensor([10, 50], dtype=torch.int32, device=DEVICE)
    out, lse = kvcache.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True, return_softmax_lse=True
    )
    for b, n in enumerate(lens.tolist()):
        torch.testing.assert_close(k_cache[b, n : n + 3], k_new[b], rtol=0, atol=0)
        torch.testing.assert_close(v_cache[b, n : n + 3], v_new[b], rtol=0, atol=0)
        torch.testing.assert_close(k_cache[b, :n], before[b, :n], rtol=0, atol=0)
        torch.testing.assert_close(k_cache[b, n + 3 :], before[b, n + 3 :], rtol=0, atol=0)
    exact, exact_lse = kvcache.kvcache_reference(
        q.transpose(1, 2).double().cpu(),
        k_cache.transpose(1, 2).double().cpu(),
        v_cache.transpose(1, 2).double().cpu(),
        (lens + 3).cpu(),
        scale=32**-0.5,
        causal=True,
    )
    tolerance = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.transpose(1, 2).double().cpu(), exact, rtol=0, atol=tolerance)
    torch.testing.assert_close(lse.double().cpu(), exact_lse, rtol=0, atol=1e-4)
    assert out.shape == q.shape and out.dtype == dtype


def _rotate_reference(x_BLHD, cos, sin, positions_BL, interleaved):
    """Rotary embedding written out pair by pair, in float64."""
    out = x_BLHD.double().clone()
    R = cos.shape[1]
    for b in range(x_BLHD.shape[0]):
        for i in range(x_BLHD.shape[1]):
            p = int(positions_BL[b, i])
            for r in range(R):
                a, c = (2 * r, 2 * r + 1) if interleaved else (r, r + R)
                x1, x2 = out[b, i, :, a].clone(), out[b, i, :, c].clone()
                out[b, i, :, a] = x1 * cos[p, r] - x2 * sin[p, r]
                out[b, i, :, c] = x1 * sin[p, r] + x2 * cos[p, r]
    return out


@pytest.mark.parametrize("interleaved, causal", [(True, True), (False, False)])
def test_flash_attn_with_kvcache_rotates_new_keys_and_queries(interleaved, causal):
    """rotary_cos/sin rotate the new keys at cache_seqlens + t and the queries there too (causal),
    or all at cache_seqlens (not causal); the first rotary_dim features only."""
    q, k_cache, v_cache, k_new, v_new = _flash_inputs(B=2, Lq=2, Ln=2, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    angles = torch.rand(80, 8, generator=g, dtype=torch.float64) * 6
    cos, sin = angles.cos().float().to(DEVICE), angles.sin().float().to(DEVICE)  # rotary_dim 16 of 32
    lens = torch.tensor([5, 30], dtype=torch.int32, device=DEVICE)
    original = k_cache.clone()
    out = kvcache.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        rotary_cos=cos,
        rotary_sin=sin,
        cache_seqlens=lens,
        causal=causal,
        rotary_interleaved=interleaved,
    )
    positions = lens.cpu().long()[:, None] + torch.arange(2)
    k_rot = _rotate_reference(k_new.cpu(), cos.cpu().double(), sin.cpu().double(), positions, interleaved)
    q_positions = positions if causal else lens.cpu().long()[:, None].expand(-1, 2)
    q_rot = _rotate_reference(q.cpu(), cos.cpu().double(), sin.cpu().double(), q_positions, interleaved)
    for b, n in enumerate(lens.tolist()):
        torch.testing.assert_close(k_cache[b, n : n + 2].double().cpu(), k_rot[b], rtol=0, atol=1e-5)
    full_k = original.double().cpu().clone()
    full_v = v_cache.double().cpu()
    for b, n in enumerate(lens.tolist()):
        full_k[b, n : n + 2] = k_rot[b]
    exact, _ = kvcache.kvcache_reference(
        q_rot.transpose(1, 2),
        full_k.transpose(1, 2),
        full_v.transpose(1, 2),
        (lens + 2).cpu(),
        scale=32**-0.5,
        causal=causal,
    )
    torch.testing.assert_close(out.transpose(1, 2).double().cpu(), exact, rtol=0, atol=1e-4)


def test_flash_attn_with_kvcache_rotates_at_cache_positions_with_left_padding():
    """With cache_leftpad, rotary positions stay the cache positions cache_seqlens + t (flash-attn's
    kernel and test alike); the left padding moves only the causal alignment and the keys a row has.
    A window's bounds may come as 0-d tensors (flash-attn's test draws them with torch.randint)."""
    q, k_cache, v_cache, k_new, v_new = _flash_inputs(B=2, Lq=2, Ln=2, dtype=torch.float32)
    angles = torch.rand(80, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 6
    cos, sin = angles.cos().float().to(DEVICE), angles.sin().float().to(DEVICE)
    lens = torch.tensor([20, 30], dtype=torch.int32, device=DEVICE)
    leftpad = torch.tensor([7, 0], dtype=torch.int32, device=DEVICE)
    original = k_cache.clone()
    out = kvcache.flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        rotary_cos=cos,
        rotary_sin=sin,
        cache_seqlens=lens,
        cache_leftpad=leftpad,
        causal=True,
        window_size=(torch.tensor(9), torch.tensor(3)),
        rotary_interleaved=False,
    )
    positions = lens.cpu().long()[:, None] + torch.arange(2)
    k_rot = _rotate_reference(k_new.cpu(), cos.cpu().double(), sin.cpu().double(), positions, False)
    q_rot = _rotate_reference(q.cpu(), cos.cpu().double(), sin.cpu().double(), positions, False)
    full_k = original.double().cpu().clone()
    for b, n in enumerate(lens.tolist()):
        full_k[b, n : n + 2] = k_rot[b]
    exact, _ = kvcache.kvcache_reference(
        q_rot.transpose(1, 2),
        full_k.transpose(1, 2),
        v_cache.double().cpu().transpose(1, 2),
        (lens + 2).cpu(),
        scale=32**-0.5,
        causal=True,
        window=(9, 3),
        leftpad_B=leftpad.cpu(),
    )
    torch.testing.assert_close(out.transpose(1, 2).double().cpu(), exact, rtol=0, atol=1e-4)


def test_flash_attn_with_kvcache_paged_and_int_lengths():
    """A paged cache (pages of 16 positions in any order) gives the result of the same keys laid
    out in rows; cache_seqlens may be a plain int."""
    q, k_rows, v_rows, k_new, v_new = _flash_inputs(B=2, Lq=1, C=64, Ln=1)
    table = torch.tensor([[3, 0, 6, 1], [2, 7, 4, 5]], dtype=torch.int32, device=DEVICE)
    k_pages = torch.zeros(8, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    v_pages = torch.zeros_like(k_pages)
    for b in range(2):
        for p in range(4):
            k_pages[table[b, p]] = k_rows[b, 16 * p : 16 * p + 16]
            v_pages[table[b, p]] = v_rows[b, 16 * p : 16 * p + 16]
    rows = kvcache.flash_attn_with_kvcache(q, k_rows, v_rows, k_new, v_new, cache_seqlens=40, causal=True)
    paged = kvcache.flash_attn_with_kvcache(
        q, k_pages, v_pages, k_new, v_new, cache_seqlens=40, block_table=table, causal=True
    )
    torch.testing.assert_close(paged, rows, rtol=0, atol=2e-3)
    torch.testing.assert_close(k_pages[table[1, 2], 8], k_new[1, 0], rtol=0, atol=0)  # position 40: page 2, slot 8


def test_flash_attn_with_kvcache_refusals_name_the_parameter():
    q, k_cache, v_cache, k_new, v_new = _flash_inputs()
    with pytest.raises(ValueError, match="cache_seqlens must say"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new)
    with pytest.raises(ValueError, match="rotate the new keys"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=torch.ones(4, 4), rotary_sin=torch.ones(4, 4))
    with pytest.raises(ValueError, match="past the cache's 64 positions"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=64)
    pages = torch.zeros(4, 16, 2, 32, dtype=q.dtype, device=DEVICE)
    one_page = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    for new, lengths in (((k_new, v_new), 16), ((None, None), 17)):  # flash-attn's callers catch a RuntimeError
        with pytest.raises(RuntimeError, match="give block_table more pages per row"):
            kvcache.flash_attn_with_kvcache(q, pages, pages.clone(), *new, cache_seqlens=lengths, block_table=one_page)
    assert (
        kvcache.flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=16, block_table=one_page)
        .isfinite()
        .all()
    )
    with pytest.raises(ValueError, match="give both k and v"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, cache_seqlens=3)
    table = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cannot be combined with block_table"):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=table[:, 0], block_table=table)


def test_decode_attention_paths_agree():
    """The core's decode step: the Triton kernel (fp16), the PyTorch path and the reference give
    one result for a cache every row fills, one query and several."""
    g = torch.Generator().manual_seed(4)
    for Lq in (1, 5):
        q = torch.randn(2, 4, Lq, 32, generator=g).half().to(DEVICE)
        k = torch.randn(2, 2, 90, 32, generator=g).half().to(DEVICE)
        v = torch.randn(2, 2, 90, 32, generator=g).half().to(DEVICE)
        exact = kvcache.decode_attention(q.double(), k.double(), v.double(), backend="reference")
        for backend in ("triton", "sdpa"):
            inputs = (q, k, v) if backend == "triton" else (q.float(), k.float(), v.float())
            got = kvcache.decode_attention(*inputs, backend=backend)
            torch.testing.assert_close(got.double(), exact, rtol=0, atol=2e-3)


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128, 80])
@pytest.mark.parametrize("Lq, H, HKV", [(1, 32, 8), (1, 8, 8), (4, 16, 2), (33, 8, 1)])
def test_gpu_sweep(dtype, D, Lq, H, HKV):
    for seed, C in enumerate((1000, 16384)):
        q, k, v, seqlens, extra = _case(B=3, H=H, HKV=HKV, Lq=Lq, C=C, D=D, seed=seed)
        _assert_two_x(q, k, v, seqlens, dtype, scale=D**-0.5, causal=True, num_splits=0, **extra)
