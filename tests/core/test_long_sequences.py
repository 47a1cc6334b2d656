"""The trunk's memory path for long sequences: position-wise chunks (`over_chunks`, the runtime's
sequence_chunk) give the unchunked results and gradients, recompute what they should, and RoPE
tables stay exact at positions in the millions."""

from __future__ import annotations

import math

import pytest
import torch
from genoformer.kernels.layout import GlobalTokens, SlidingWindow, Union
from model_helpers import random_tokens, tiny_config, tiny_model

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import RotaryEmbedding, over_chunks
from genoformer.genome.lm import GenoformerLM, Objective

WINDOW_GLOBAL = Union([SlidingWindow(window=16, block_size=16), GlobalTokens(1, block_size=16)])


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def _assert_same_grads(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=atol, msg=name)


def test_over_chunks_concatenates_tuples_and_sums_scalars():
    x_BLE = torch.randn(2, 10, 3)
    torch.testing.assert_close(over_chunks(lambda x: x * 2, 4, x_BLE), x_BLE * 2)
    halves = over_chunks(lambda x: (x + 1, x.sum(-1, keepdim=True)), 3, x_BLE)
    torch.testing.assert_close(halves[0], x_BLE + 1)
    torch.testing.assert_close(halves[1], x_BLE.sum(-1, keepdim=True))
    torch.testing.assert_close(over_chunks(lambda x: x.square().sum(), 4, x_BLE), x_BLE.square().sum())
    assert over_chunks(lambda x: x, None, x_BLE) is x_BLE


def test_over_chunks_recomputes_each_chunk_once_in_the_backward_pass():
    calls = []

    def fn(x_BCE):
        calls.append(x_BCE.shape[1])
        return x_BCE.sin()

    x_BLE = torch.randn(2, 10, 3, requires_grad=True)
    y_BLE = over_chunks(fn, 4, x_BLE)
    assert calls == [4, 4, 2]
    y_BLE.square().sum().backward()
    assert calls == [4, 4, 2, 2, 4, 4]  # each chunk again, in the backward pass
    torch.testing.assert_close(x_BLE.grad, 2 * x_BLE.sin() * x_BLE.cos())
    with torch.no_grad():  # nothing to recompute without autograd
        calls.clear()
        over_chunks(fn, 4, x_BLE)
        assert calls == [4, 4, 2]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_chunked_mlps_give_the_unchunked_outputs_and_gradients(checkpointing):
    tokens_BL = random_tokens(2, 97).long()
    outputs, grads, mlp_rows = [], [], []
    for chunk in (None, 40):
        model = tiny_model(
            seed=3, attention=[WINDOW_GLOBAL, None], sequence_chunk=chunk, activation_checkpointing=checkpointing
        ).train()
        rows = []
        mlp_forward = model.blocks[1].mlp.forward

        def counting(x_BLE, mlp_forward=mlp_forward, rows=rows):
            rows.append(x_BLE.shape[1])
            return mlp_forward(x_BLE)

        model.blocks[1].mlp.forward = counting
        logits_BLV = model(tokens_BL)
        torch.nn.functional.cross_entropy(logits_BLV.flatten(0, 1), tokens_BL.flatten()).backward()
        outputs.append(logits_BLV.detach())
        grads.append(_grads(model))
        mlp_rows.append(rows)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    _assert_same_grads(grads[0], grads[1])
    # never more than a chunk of positions at once; the chunks ran again in the backward pass
    # (inside a recomputed block, torch's checkpoint may stop before the last chunk's MLP)
    assert max(mlp_rows[1]) == 40 and 2 * 97 <= sum(mlp_rows[1]) <= (3 if checkpointing else 2) * 97
    assert mlp_rows[0] == [97] * (2 if checkpointing else 1)


@pytest.mark.parametrize("objective", [Objective.CAUSAL_LM, Objective.MASKED_LM])
def test_chunked_loss_gives_the_unchunked_loss_and_gradients(objective):
    tokens_BL = random_tokens(2, 90, high=5)  # N bases too: their targets are skipped
    results = []
    for chunk in (None, 32):
        torch.manual_seed(0)
        module = GenoformerLM(
            tiny_config(attention=[WINDOW_GLOBAL]), objective=objective, runtime=RuntimeSettings(sequence_chunk=chunk)
        )
        module.train()
        torch.manual_seed(1)  # the same masked positions for every chunk size
        loss, count = module.loss(tokens_BL)
        loss.backward()
        results.append((loss.detach(), int(count), _grads(module)))
    for loss, count, grads in results[1:]:
        assert count == results[0][1]
        torch.testing.assert_close(loss, results[0][0], rtol=1e-6, atol=1e-6)
        _assert_same_grads(grads, results[0][2])


def test_chunked_loss_keeps_packed_documents_apart():
    tokens_BL = random_tokens(2, 64)
    cu_seqlens = torch.tensor([0, 20, 64, 100, 128], dtype=torch.int32)
    losses = []
    for chunk in (None, 16):
        torch.manual_seed(0)
        module = GenoformerLM(tiny_config(), runtime=RuntimeSettings(sequence_chunk=chunk))
        loss, count = module.loss(tokens_BL, cu_seqlens=cu_seqlens)
        losses.append((loss.detach(), int(count)))
    # 2 x 63 next-token targets, less the first tokens of the 2 documents that start inside a row
    assert losses[0][1] == losses[1][1] == 2 * 63 - 2
    torch.testing.assert_close(losses[0][0], losses[1][0], rtol=1e-6, atol=1e-6)


def test_sequence_chunk_is_a_positive_number_of_tokens():
    for bad in (0, -5, True, 2.5):
        with pytest.raises(ValueError, match="sequence_chunk must be a positive number of tokens"):
            RuntimeSettings(sequence_chunk=bad)


def test_inference_in_chunks_gives_the_whole_window_outputs():
    tokens_BL = random_tokens(1, 150).long()
    states = []
    for chunk in (None, 32):
        model = tiny_model(seed=4, attention=[WINDOW_GLOBAL, None], sequence_chunk=chunk)
        with torch.inference_mode():
            states.append(model.hidden_states(tokens_BL))
    for whole, chunked in zip(*states):
        torch.testing.assert_close(whole, chunked, rtol=1e-5, atol=1e-6)


def test_rope_tables_keep_their_precision_at_a_million_positions():
    head_dim, length = 8, (1 << 20) + 3
    rotary = RotaryEmbedding(head_dim, theta=500000.0, max_seq_len=1 << 22)
    cos_LR, sin_LR = rotary.cos_sin(length, torch.device("cpu"))
    assert cos_LR.shape == (length, head_dim // 2)
    # tables as long as the inputs need (a power of two), not max_seq_len
    assert rotary._tables[torch.device("cpu")][0].shape[0] == 1 << 21
    for position in (length - 1, 999_983):
        for r in range(head_dim // 2):
            angle = position * 500000.0 ** (-2 * r / head_dim)
            # float32 angles would be off by up to ~0.06 rad here
            assert abs(float(cos_LR[position, r]) - math.cos(angle)) < 1e-6
            assert abs(float(sin_LR[position, r]) - math.sin(angle)) < 1e-6
    short_LR, _ = rotary.cos_sin(10, torch.device("cpu"))
    torch.testing.assert_close(short_LR, cos_LR[:10])


def test_compiled_blocks_recompute_chunks_in_one_graph_each():
    """The long-context recipes' runtime (compile, activation_checkpointing, sequence_chunk) on our
    kernels (interpreted on a CPU): no graph break, and the unchunked eager model's results."""
    from genoformer.kernels.dispatch import Backend
    from torch._dynamo.utils import counters

    from genoformer.core.transformer import Transformer, compile_blocks

    torch._dynamo.reset()
    counters.clear()
    config = tiny_config(n_layers=2, n_heads=2, max_seq_len=64, attention=[WINDOW_GLOBAL])
    torch.manual_seed(0)
    eager = Transformer(config, RuntimeSettings(attention_backend=Backend.TRITON)).to(torch.bfloat16).train()
    chunked = (
        Transformer(
            config, RuntimeSettings(attention_backend=Backend.TRITON, activation_checkpointing=True, sequence_chunk=32)
        )
        .to(torch.bfloat16)
        .train()
    )
    chunked.load_state_dict(eager.state_dict())
    compile_blocks(chunked, backend="aot_eager")
    tokens_BL = random_tokens(1, 64, seed=3)
    results = []
    for model in (eager, chunked):
        logits_BLV = model(tokens_BL)
        logits_BLV.float().square().mean().backward()
        results.append((logits_BLV.detach(), _grads(model)))
    try:
        assert dict(counters["graph_break"]) == {}
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(results[1][0], results[0][0], atol=2e-2, rtol=2e-2)
    _assert_same_grads(results[1][1], results[0][1], atol=2e-2)
