"""Transformer: shapes, causality, layouts, GQA, activation checkpointing, RoPE, config."""

from __future__ import annotations

import math

import pytest
import torch

from genoformer.data.genome.alphabet import VOCAB_SIZE
from genoformer.kernels.layout import BigBird, SlidingWindow, Strided, Union
from genoformer.core.transformer import RotaryEmbedding, TransformerConfig, apply_rotary

from model_helpers import random_tokens, tiny_config, tiny_model


@pytest.mark.parametrize("length", [1, 16, 97])
def test_forward_shapes_and_hidden_states(length):
    model = tiny_model(n_layers=3, attention=[SlidingWindow(window=16, block_size=16), None])
    tokens_BL = random_tokens(2, length)
    assert model(tokens_BL).shape == (2, length, VOCAB_SIZE)
    states = model.hidden_states(tokens_BL)
    assert len(states) == 4 and all(s.shape == (2, length, 32) for s in states)
    for layer in (0, 2, -1, -4):
        torch.testing.assert_close(model.hidden_state(tokens_BL, layer=layer), states[layer])
    torch.testing.assert_close(model.head(states[-1]), model(tokens_BL))


def test_bad_inputs_raise():
    model = tiny_model()
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(2, 8))
    with pytest.raises(TypeError, match="batch, length"):
        model(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(random_tokens(1, 513))
    with pytest.raises(IndexError, match="out of range"):
        model.hidden_state(random_tokens(1, 8), layer=3)


@pytest.mark.parametrize("attention", [[None], [SlidingWindow(window=16, block_size=16), None]])
def test_causal_model_ignores_future_tokens(attention):
    model = tiny_model(n_layers=2, causal=True, attention=attention)
    tokens_BL = random_tokens(1, 97)
    changed_BL = tokens_BL.clone()
    changed_BL[0, 60] = (changed_BL[0, 60] + 1) % 4
    before, after = model(tokens_BL), model(changed_BL)
    torch.testing.assert_close(before[:, :60], after[:, :60], rtol=0, atol=1e-6)
    assert (before[:, 60:] - after[:, 60:]).abs().amax(-1).gt(1e-4).all()


def test_bidirectional_model_sees_both_sides():
    model = tiny_model(n_layers=2, causal=False)
    tokens_BL = random_tokens(1, 97)
    changed_BL = tokens_BL.clone()
    changed_BL[0, 60] = (changed_BL[0, 60] + 1) % 4
    difference_L = (model(tokens_BL) - model(changed_BL)).abs().amax(-1)[0]
    assert difference_L.gt(1e-4).all()  # every position, before and after 60


@pytest.mark.parametrize("spec", [Strided(stride=3, block_size=16), BigBird(window=16, num_random_blocks=1, block_size=16)])
def test_block_sparse_layer_respects_its_layout(spec):
    """One bidirectional layer: position i depends on token j exactly when the layout allows (i, j)."""
    model = tiny_model(n_layers=1, causal=False, attention=[spec])
    length = 97
    allowed_LL = model.layout(0, length).token_mask()[0]
    tokens_BL = random_tokens(1, length)
    base_LV = model(tokens_BL)[0]
    blind_pairs = 0
    for j in (0, 40, 96):
        changed_BL = tokens_BL.clone()
        changed_BL[0, j] = (changed_BL[0, j] + 1) % 4
        moved_L = (model(changed_BL)[0] - base_LV).abs().amax(-1)
        blind_L = ~allowed_LL[:, j]
        blind_L[j] = False  # the changed position itself always moves (residual path)
        blind_pairs += int(blind_L.sum())
        assert (moved_L[blind_L] <= 1e-6).all()
        assert moved_L[~blind_L].min() > 1e-5
    assert blind_pairs > 0


def test_layouts_are_built_once_per_length_and_cached():
    spec = SlidingWindow(window=16, block_size=16)
    model = tiny_model(n_layers=4, causal=True, attention=[spec, None])
    first = model.layout(0, 97)
    assert model.layout(2, 97) is first  # same pattern index, same length
    assert model.layout(1, 97) is None
    assert first.q_len == first.kv_len == 97
    # causal models drop the blocks above the diagonal
    assert not first.mask[0].triu(1).any()
    assert model.layout(0, 50).q_len == 50


def test_gqa_matches_multi_head_with_repeated_kv_heads():
    gqa = tiny_model(seed=3, n_heads=4, n_kv_heads=2)
    mha = tiny_model(seed=4, n_heads=4, n_kv_heads=4)
    assert gqa.blocks[0].attn.wk.weight.shape == (2 * 8, 32)
    state = gqa.state_dict()
    head_dim, groups = 8, 2
    for name, weight in list(state.items()):
        if name.endswith(("attn.wk.weight", "attn.wv.weight")):
            state[name] = weight.view(2, head_dim, 32).repeat_interleave(groups, dim=0).reshape(4 * head_dim, 32)
    mha.load_state_dict(state)
    tokens_BL = random_tokens(2, 50)
    torch.testing.assert_close(gqa(tokens_BL), mha(tokens_BL), rtol=1e-5, atol=1e-5)


def test_activation_checkpointing_gives_identical_gradients():
    tokens_BL = random_tokens(2, 64).long()
    grads, calls = [], []
    for flag in (False, True):
        model = tiny_model(seed=5, activation_checkpointing=flag, attention=[SlidingWindow(window=16, block_size=16), None])
        model.train()
        count = [0]
        mlp_forward = model.blocks[0].mlp.forward

        def counting_forward(x_BLE, mlp_forward=mlp_forward, count=count):
            count[0] += 1
            return mlp_forward(x_BLE)

        model.blocks[0].mlp.forward = counting_forward  # (module hooks do not fire in recomputation)
        loss = torch.nn.functional.cross_entropy(model(tokens_BL).flatten(0, 1), tokens_BL.flatten())
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        calls.append(count[0])
    assert calls == [1, 2]  # the checkpointed block ran again in the backward pass
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=0, atol=1e-7)


def test_rope_depends_only_on_relative_position():
    head_dim = 16
    rotary = RotaryEmbedding(head_dim, theta=10000.0, max_seq_len=4096)
    cos_LR, sin_LR = rotary.cos_sin(4096, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    q_D, k_D = torch.randn(2, head_dim, generator=generator, dtype=torch.float64).float()

    def rotated(x_D, position):
        return apply_rotary(x_D.view(1, 1, 1, head_dim), cos_LR[position : position + 1], sin_LR[position : position + 1]).flatten()

    dot = torch.dot(rotated(q_D, 7), rotated(k_D, 3))
    for shift in (1, 100, 4000 - 7):
        torch.testing.assert_close(torch.dot(rotated(q_D, 7 + shift), rotated(k_D, 3 + shift)), dot, rtol=1e-4, atol=1e-4)
    # a rotation: norms are kept; position 0 is the identity
    torch.testing.assert_close(rotated(q_D, 1234).norm(), q_D.norm())
    torch.testing.assert_close(rotated(q_D, 0), q_D)
    assert cos_LR.dtype == torch.float32


def test_rotary_keeps_bf16_inputs_in_bf16():
    rotary = RotaryEmbedding(8, 10000.0, 32)
    cos_LR, sin_LR = rotary.cos_sin(32, torch.device("cpu"))
    assert apply_rotary(torch.randn(1, 2, 32, 8, dtype=torch.bfloat16), cos_LR, sin_LR).dtype == torch.bfloat16


def test_key_padding_makes_outputs_independent_of_padding():
    model = tiny_model(causal=False, attention=[SlidingWindow(window=16, block_size=16), None])
    tokens_BL = random_tokens(1, 70)
    padded_BL = torch.cat([tokens_BL, torch.full((1, 27), 5, dtype=torch.uint8)], dim=1)
    torch.testing.assert_close(
        model(padded_BL, torch.tensor([70]))[:, :70], model(tokens_BL), rtol=1e-5, atol=1e-5
    )


def test_tied_embeddings_and_init():
    tied = tiny_model(tie_embeddings=True)
    assert tied.head.weight is tied.embed.weight
    untied = tiny_model(tie_embeddings=False)
    assert untied.head.weight is not untied.embed.weight
    std = untied.blocks[0].attn.wo.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(4), rel=0.2)


def test_config_defaults_and_validation():
    config = TransformerConfig(d_model=96, n_heads=6)
    assert config.kv_heads == 6 and config.mlp_dim == 256 and config.head_dim == 16
    assert config.n_kv_heads is None  # derived values stay derived
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="even"):
        TransformerConfig(d_model=36, n_heads=4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        TransformerConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="at least one"):
        TransformerConfig(attention=[])
    with pytest.raises(TypeError, match="LayoutSpec"):
        TransformerConfig(attention=["sliding"])


def test_config_round_trips_through_plain_dict():
    spec = Union(parts=[SlidingWindow(window=32, block_size=16), Strided(stride=4, block_size=32)])
    config = tiny_config(attention=[spec, None, BigBird(seed=3)], n_kv_heads=2)
    plain = config.to_dict()
    assert "attention_backend" not in plain  # how the model runs is not part of what it is
    assert plain["attention"][0]["class_path"] == "genoformer.kernels.layout.Union"
    assert TransformerConfig.from_dict(plain) == config
    plain["attention"][0] = {"class_path": "os.system", "init_args": {}}
    with pytest.raises(ValueError, match="LayoutSpec"):
        TransformerConfig.from_dict(plain)


def test_training_after_inference_mode_evaluation():
    """Lightning validates under torch.inference_mode before training; the cached rotary tables
    and layouts built then must still work with autograd."""
    model = tiny_model(causal=True, attention=[BigBird(window=16, num_random_blocks=1, block_size=16), None])
    tokens_BL = random_tokens(2, 80)
    with torch.inference_mode():
        model(tokens_BL)
    model.train()
    model(tokens_BL).sum().backward()
    assert model.embed.weight.grad is not None
