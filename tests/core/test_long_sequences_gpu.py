"""A million tokens and a whole chromosome on one GPU, checked before benchmarks/million.py times them
(bash benchmarks/gpu_training.sh million A runs this file first): the long recipes' window + global attention
at 1M, 3M and 4.6M tokens against the exact attention of sampled rows (the kernels' 32-bit row
offsets, CUDA's grid limit and the layouts' block lists at these lengths), its gradients at 1M, and a
flagship-sized training step at 128k whose chunks and recomputation give the plain step's loss and
gradients. Skipped without a CUDA GPU."""

from __future__ import annotations

import pytest
import torch
from genoformer.kernels import Backend, attention
from genoformer.kernels.layout import GlobalTokens, SlidingWindow, Union

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig
from genoformer.genome.lm import GenoformerLM, Objective

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (attention at a million tokens)"),
]

WINDOW_GLOBAL = Union([SlidingWindow(window=2048, block_size=128), GlobalTokens(1, block_size=128)])
"""configs/layouts/window_global.yaml."""
ECOLI = 4_641_652


def _rows(length: int) -> torch.Tensor:
    """Query rows to check: the global block and its edge, block edges, random rows, the last rows."""
    generator = torch.Generator().manual_seed(length)
    fixed = torch.tensor([0, 1, 127, 128, 129, 2047, 2048, 2175, 2176, 4095, length // 2, length - 2, length - 1])
    return torch.cat([fixed, torch.randint(0, length, (19,), generator=generator)]).unique()


def _exact_rows(
    q_BLHD, k_BLHD, v_BLHD, layout, rows: torch.Tensor, dtype: torch.dtype = torch.float32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each row: (the attention output over the keys the causal layout allows, computed in
    `dtype`, (H, D); those keys' positions), written plainly from the block mask."""
    bs = layout.block_size
    out = []
    for i in rows.tolist():
        blocks = torch.nonzero(layout.mask[0, i // bs]).flatten()
        keys = (blocks[:, None] * bs + torch.arange(bs)).flatten()
        keys = keys[keys <= i].to(q_BLHD.device)
        q_HD, k_NHD, v_NHD = q_BLHD[0, i].to(dtype), k_BLHD[0, keys].to(dtype), v_BLHD[0, keys].to(dtype)
        p_HN = torch.softmax(torch.einsum("hd,nhd->hn", q_HD, k_NHD) * q_HD.shape[-1] ** -0.5, dim=-1)
        out.append((torch.einsum("hn,nhd->hd", p_HN, v_NHD), keys))
    return out


def _inputs(length: int, heads: int, requires_grad: bool = False) -> list[torch.Tensor]:
    """q, k, v as the model lays them out, (1, L, H, 64) bf16; the global block's keys larger, so that
    a row that missed them would be far off."""
    torch.manual_seed(0)
    tensors = [torch.randn(1, length, heads, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    tensors[1][:, :128] *= 3
    return [t.requires_grad_(requires_grad) for t in tensors]


@pytest.mark.parametrize(
    "length, heads",
    [(1 << 20, 4), (3_000_000, 12), (ECOLI, 4)],
    ids=["1M-flagship", "3M-reference-int32-rows", "ecoli-flagship"],
)
def test_window_global_attention_at_length_gives_the_exact_rows(length, heads):
    """Inference over a whole window: at 3M tokens and 12 heads of 64 a (B, L, H, D) view's rows pass
    2^31 elements (the launcher copies), at 4.6M the query tiles pass CUDA's 65,535 grid rows."""
    q, k, v = _inputs(length, heads)
    layout = WINDOW_GLOBAL.build(length, heads).with_causal()
    with torch.inference_mode():
        o_BHLD = attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout=layout, backend=Backend.TRITON
        )
    rows = _rows(length)
    got_RHD = o_BHLD[0].transpose(0, 1)[rows.cuda()].float()
    exact_RHD = torch.stack([o for o, _ in _exact_rows(q, k, v, layout, rows)])
    torch.testing.assert_close(got_RHD, exact_RHD, atol=4e-3, rtol=2e-2)


def test_window_global_gradients_at_a_million_tokens_are_within_twice_bfloat16s_own_error():
    """The backward at 1M (its query lists and tiles): a loss on sampled rows gives their queries'
    gradients, and the keys' and values' gradients on exactly the keys those rows see, each within
    twice the error of the same rows' attention computed plainly in bfloat16 (against float64), plus
    one bfloat16 rounding of the exact value; nothing outside those rows and keys."""
    length, heads = 1 << 20, 4
    q, k, v = _inputs(length, heads, requires_grad=True)
    layout = WINDOW_GLOBAL.build(length, heads).with_causal()
    rows = _rows(length)
    weights_RHD = torch.randn(rows.numel(), heads, 64, device="cuda").bfloat16()
    o_BHLD = attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout=layout, backend=Backend.TRITON
    )
    (o_BHLD[0].transpose(0, 1)[rows.cuda()].float() * weights_RHD.float()).sum().backward()
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        rows_out = _exact_rows(*leaves, layout, rows, dtype)
        sum((o * w.to(dtype)).sum() for (o, _), w in zip(rows_out, weights_RHD)).backward()
        grads[dtype] = [t.grad for t in leaves]
    seen = torch.zeros(length, dtype=torch.bool, device="cuda")
    for _, keys in rows_out:
        seen[keys] = True
    rows_cuda = rows.cuda()
    for name, got, where, index in (("dq", q.grad, rows_cuda, 0), ("dk", k.grad, seen, 1), ("dv", v.grad, seen, 2)):
        exact, naive = grads[torch.float64][index][0, where], grads[torch.bfloat16][index][0, where].double()
        err = (got[0, where].double() - exact).abs().max()
        naive_err = (naive - exact).abs().max()
        rounding = (exact.bfloat16().double() - exact).abs().max()
        assert err <= 2 * naive_err + rounding, (
            f"{name} at 1M: error {err:.3g}, bfloat16's own error {naive_err:.3g}, rounding {rounding:.3g}"
        )
    for got in (k.grad, v.grad):
        assert not got[0, ~seen].any()
    assert not q.grad[0, ~torch.isin(torch.arange(length, device="cuda"), rows_cuda)].any()


def test_a_chunked_recomputed_step_at_128k_gives_the_plain_steps_loss_and_gradients():
    """The long recipes' runtime (blocks recomputed, MLPs, head and loss in chunks of 16,384) against
    every activation kept: the flagship's architecture on the window + global layout, bf16 autocast."""
    config = TransformerConfig(
        d_model=256, n_layers=8, n_heads=4, max_seq_len=1 << 17, rope_theta=500000.0, attention=[WINDOW_GLOBAL]
    )
    tokens_BL = torch.randint(0, 4, (1, 1 << 17), generator=torch.Generator().manual_seed(0), dtype=torch.uint8).cuda()
    results = []
    for runtime in (
        RuntimeSettings(attention_backend=Backend.TRITON),
        RuntimeSettings(attention_backend=Backend.TRITON, activation_checkpointing=True, sequence_chunk=16384),
    ):
        torch.manual_seed(0)
        module = GenoformerLM(config, objective=Objective.CAUSAL_LM, runtime=runtime).cuda().train()
        module.model.apply_runtime(module.runtime)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, count = module.loss(tokens_BL)
        loss.backward()
        results.append((loss.detach().float(), int(count), {n: p.grad.float() for n, p in module.named_parameters()}))
        del module
    (plain_loss, plain_count, plain_grads), (loss, count, grads) = results
    assert count == plain_count == (1 << 17) - 1
    torch.testing.assert_close(loss, plain_loss, atol=2e-3, rtol=0)
    for name, grad in grads.items():
        scale = plain_grads[name].abs().max().clamp_min(1e-6)
        assert (grad - plain_grads[name]).abs().max() / scale < 3e-2, name
