"""genoformer.kernels.flash_attn_compat: flash-attn 2's functions, layout and return values over our
kernels (the Triton kernels on a GPU; on a CPU the float64 reference, which these tests run), and
the runner that judges it with flash-attn's own test file (benchmarks/flash_params.py).

Shape legend: flash-attn's (B, L, H, D), varlen (T, H, D); ours (B, H, L, D).
"""

from __future__ import annotations

import json
import sys
import textwrap

import torch
from genoformer.kernels import flash_attn_compat as fa
from genoformer.kernels.dropout import keep_mask
from genoformer.kernels.reference import reference_attention


def _blhd(B, L, H, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, H, D, generator=g, dtype=torch.float64).to(dtype)


def test_flash_attn_func_is_the_reference_in_flash_attn_layout():
    """(B, L, H, D) in and out; every parameter means what the reference says (GQA, causal with
    Lq != Lk, a window given as a tensor, ALiBi per row, softcap); lse (B, H, L) with +inf for a
    row with no key, and an empty S_dmask without dropout, as flash-attn returns."""
    q, k, v = _blhd(2, 40, 4, 16, 0), _blhd(2, 25, 2, 16, 1), _blhd(2, 25, 2, 16, 2)
    slopes = torch.rand(2, 4)
    out, lse, probs = fa.flash_attn_func(
        q, k, v, causal=True, window_size=torch.tensor([6, 3]), softcap=2.0, alibi_slopes=slopes, return_attn_probs=True
    )
    expected, expected_lse = reference_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        causal=True,
        window=(6, 3),
        softcap=2.0,
        alibi_slopes=slopes,
        return_lse=True,
    )
    assert out.shape == (2, 40, 4, 16) and lse.shape == (2, 4, 40) and probs.numel() == 0
    torch.testing.assert_close(out, expected.transpose(1, 2))
    # rows 0..14 of 40 queries over 25 keys, bottom-right aligned: no key at all
    assert torch.isinf(lse[:, :, :15]).all() and (lse[:, :, :15] > 0).all() and (out[:, :15] == 0).all()
    torch.testing.assert_close(lse[:, :, 15:], expected_lse[:, :, 15:])


def test_packed_variants_and_their_gradients():
    """qkv- and kv-packed calls equal the unpacked one, gradients included (into the packed tensor)."""
    qkv = _blhd(1, 30, 3 * 2, 8, 3).view(1, 30, 3, 2, 8).requires_grad_()
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    expected = fa.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, expected)
    g = torch.randn_like(out)
    out.backward(g)
    expected.backward(g)
    for i, t in enumerate((q, k, v)):
        torch.testing.assert_close(qkv.grad[:, :, i], t.grad)
    kv = torch.stack([k.detach(), v.detach()], dim=2)
    torch.testing.assert_close(fa.flash_attn_kvpacked_func(q.detach(), kv, causal=True), expected.detach())


def test_varlen_functions_keep_each_sequence_apart():
    """Each sequence of a varlen call equals the dense call on it alone (its own Lq and Lk, causal
    aligned to its own corner); lse comes as (H, T_q); the packed variants agree."""
    q, k, v = _blhd(1, 23, 2, 8, 4)[0], _blhd(1, 30, 2, 8, 5)[0], _blhd(1, 30, 2, 8, 6)[0]
    cu_q = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 26, 30], dtype=torch.int32)
    out, lse, _ = fa.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 17, 17, causal=True, window_size=(4, -1), return_attn_probs=True
    )
    assert out.shape == (23, 2, 8) and lse.shape == (2, 23)
    for s in range(3):
        rows, keys = slice(int(cu_q[s]), int(cu_q[s + 1])), slice(int(cu_k[s]), int(cu_k[s + 1]))
        alone = fa.flash_attn_func(q[None, rows], k[None, keys], v[None, keys], causal=True, window_size=(4, -1))
        torch.testing.assert_close(out[rows], alone[0])
    kv = torch.stack([k, v], dim=1)
    torch.testing.assert_close(
        fa.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 17, 17, causal=True, window_size=(4, -1)), out
    )
    qkv = torch.stack([q, q, q], dim=1)
    same = fa.flash_attn_varlen_qkvpacked_func(qkv, cu_q, 17)
    torch.testing.assert_close(same, fa.flash_attn_varlen_func(q, q, q, cu_q, cu_q, 17, 17))


def test_attn_probs_encode_the_probabilities_and_the_dropout_mask():
    """S_dmask as flash-attn stores it: exp(s - running block max) per block of ATTN_PROBS_BLOCK_N
    keys, negative where dropped, padded to multiples of 128; normalised as flash-attn's tests do,
    it gives the softmax, and its signs are the dropout mask; torch.manual_seed repeats the call."""
    B, L, H, D = 1, 150, 2, 16
    q, k, v = _blhd(B, L, H, D, 7), _blhd(B, L, H, D, 8), _blhd(B, L, H, D, 9)
    torch.manual_seed(3)
    out, lse, probs = fa.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    torch.manual_seed(3)
    again = fa.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    torch.testing.assert_close(out, again, atol=0, rtol=0)
    assert probs.shape == (B, H, 256, 256)
    probs = probs[:, :, :L, :L]
    scores = torch.einsum("blhd,bshd->bhls", q, k) / D**0.5
    scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    blocks = scores.split(fa.ATTN_PROBS_BLOCK_N, dim=-1)
    running = torch.cummax(torch.stack([b.amax(-1) for b in blocks], -1).flip(-1), -1).values.flip(-1)
    normalised = torch.cat(
        [
            p * torch.exp(m - lse).unsqueeze(-1)
            for p, m in zip(probs.abs().split(fa.ATTN_PROBS_BLOCK_N, dim=-1), running.unbind(-1))
        ],
        dim=-1,
    )
    torch.testing.assert_close(normalised, torch.softmax(scores, -1), atol=1e-5, rtol=1e-4)
    torch.manual_seed(3)
    rng = torch.cat([torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64), torch.zeros(1, dtype=torch.int64)])
    kept = keep_mask(rng, 0.3, B, H, L, L)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    assert torch.equal((probs >= 0)[..., allowed], kept[..., allowed])


def test_paged_keys_are_read_through_the_block_table():
    """flash_attn_varlen_func with block_table reads each sequence's keys from its pages: the same
    output as the contiguous keys; flash_attn_with_kvcache is the kvcache module's."""
    page, lengths = 4, (6, 9)
    q = _blhd(1, 15, 2, 8, 11)[0]
    k, v = _blhd(1, 15, 1, 8, 12)[0], _blhd(1, 15, 1, 8, 13)[0]
    cu = torch.tensor([0, 6, 15], dtype=torch.int32)
    table = torch.tensor([[3, 0, 7], [5, 1, 2]], dtype=torch.int32)  # pages of sequence 0, then 1
    k_pages, v_pages = torch.zeros(8, page, 1, 8), torch.zeros(8, page, 1, 8)
    for s, n in enumerate(lengths):
        for t in range(n):
            k_pages[table[s, t // page], t % page] = k[cu[s] + t]
            v_pages[table[s, t // page], t % page] = v[cu[s] + t]
    paged = fa.flash_attn_varlen_func(q, k_pages, v_pages, cu, cu, 9, 9, causal=True, block_table=table)
    torch.testing.assert_close(paged, fa.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True))
    from genoformer.kernels import kvcache

    assert fa.flash_attn_with_kvcache is kvcache.flash_attn_with_kvcache


def test_unpad_and_pad_input_round_trip():
    x = _blhd(3, 5, 2, 4, 10)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    unpadded, indices, cu, longest, used = fa.unpad_input(x, mask)
    assert unpadded.shape == (9, 2, 4) and cu.tolist() == [0, 3, 8, 9] and longest == 5 and used.tolist() == [3, 5, 1]
    back = fa.pad_input(unpadded, indices, 3, 5)
    torch.testing.assert_close(back, x * mask[..., None, None])


def test_suite_runner_records_outcomes_and_missing_features(tmp_path):
    """benchmarks/flash_attn_suite.py's run-time shim: `import flash_attn` resolves to the compatible
    module, a case that meets a missing feature is recorded as skipped with the parameter, a wrong
    assertion as failed, the rest as passed (here on a CPU, with a stand-in test file); --smoke
    collects a seeded sample of each function's cases and its result renders."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from benchmarks import flash_attn_suite
    from benchmarks.common import read_result, render

    suite = tmp_path / "test_flash_attn.py"
    suite.write_text(
        textwrap.dedent("""
        import pytest, torch
        from flash_attn import flash_attn_func, flash_attn_with_kvcache
        from flash_attn.flash_attn_interface import _get_block_size_n, flash_attn_gpu

        @pytest.mark.parametrize("causal", [False, True])
        @pytest.mark.parametrize("d", [8, 16, 24, 32])
        def test_runs(d, causal):
            q = torch.randn(1, 9, 2, d)
            assert flash_attn_func(q, q, q, causal=causal).shape == q.shape

        def test_extension():
            flash_attn_gpu.fwd(torch.zeros(1))

        def test_wrong():
            assert _get_block_size_n("cpu", 64, True, False) == -1
    """)
    )
    shim = tmp_path / "shim"
    flash_attn_suite.write_shim(shim, suite)
    results = tmp_path / "cases.jsonl"
    env = {"FA_RESULTS": str(results), "FA_SAMPLE_SCALE": "1.42", "FA_SAMPLE_MIN": "1"}  # round(1.42 sqrt(8)) = 4
    code, _ = flash_attn_suite.run_pytest(shim, ["-q"], env, 300, tmp_path / "log")
    outcomes = {
        json.loads(line)["nodeid"].split("::")[-1]: json.loads(line) for line in results.read_text().splitlines()
    }
    ran = sorted(name for name in outcomes if name.startswith("test_runs"))
    assert len(ran) == 4 and all(outcomes[name]["outcome"] == "passed" for name in ran), ran  # 4 of 8, seeded
    assert all(name.split("[")[1].split("-")[0] in ("8", "16", "24", "32") for name in ran)  # pytest's ids
    assert outcomes["test_extension"]["outcome"] == "skipped"
    assert outcomes["test_extension"]["reason"] == "missing feature: flash_attn_gpu"
    assert outcomes["test_wrong"]["outcome"] == "failed" and code == 1
    summary = flash_attn_suite.summarize(
        {
            "kind": "suite",
            "collected_only": False,
            "seconds": 1.0,
            "returncode": 1,
            "budget_s": 60,
            "scale": 1.42,
            "minimum": 1,
            "seed": 0,
            "cases": list(outcomes.values()),
            "functions": {
                "test_runs": {"selected": 4, "cases": 8},
                "test_extension": {"selected": 1, "cases": 1},
                "test_wrong": {"selected": 1, "cases": 1},
            },
        }
    )
    assert summary.failed and summary.tables[0]["rows"][-1]["passed"] == 4
    result = flash_attn_suite.BENCHMARK.main(["--smoke", "--out", str(tmp_path), "--suite-file", str(suite)])
    saved = read_result(tmp_path / "flash_attn_suite.json")
    assert saved["data"]["functions"]["test_runs"] == {
        "function": "test_runs",
        "selected": 3,
        "cases": 8,
    }  # --minimum 3
    assert render(saved).startswith(f"## {result['title']}")
