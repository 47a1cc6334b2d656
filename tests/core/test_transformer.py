"""Transformer: shapes, causality, layouts, GQA, activation checkpointing, RoPE, config, cached decoding."""

from __future__ import annotations

import math

import pytest
import torch
from genoformer.data.genome.alphabet import VOCAB_SIZE
from genoformer.kernels.layout import BigBird, SlidingWindow, Strided, Union
from model_helpers import random_tokens, tiny_config, tiny_model

from genoformer.core.transformer import KVCache, RotaryEmbedding, TransformerConfig, apply_rotary


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


@pytest.mark.parametrize(
    "spec", [Strided(stride=3, block_size=16), BigBird(window=16, num_random_blocks=1, block_size=16)]
)
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
        model = tiny_model(
            seed=5, activation_checkpointing=flag, attention=[SlidingWindow(window=16, block_size=16), None]
        )
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
        return apply_rotary(
            x_D.view(1, 1, 1, head_dim), cos_LR[position : position + 1], sin_LR[position : position + 1]
        ).flatten()

    dot = torch.dot(rotated(q_D, 7), rotated(k_D, 3))
    for shift in (1, 100, 4000 - 7):
        torch.testing.assert_close(
            torch.dot(rotated(q_D, 7 + shift), rotated(k_D, 3 + shift)), dot, rtol=1e-4, atol=1e-4
        )
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
    torch.testing.assert_close(model(padded_BL, torch.tensor([70]))[:, :70], model(tokens_BL), rtol=1e-5, atol=1e-5)


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


# ------------------------------------------------------------------- incremental decoding
def decode_all(model, tokens_BL: torch.Tensor, prefill: int, cache: KVCache) -> torch.Tensor:
    """Logits (B, L, V) of a prefill of the first `prefill` tokens, then one decode step per token."""
    with torch.inference_mode():
        steps = [model.decode(tokens_BL[:, :prefill], cache)]
        steps += [model.decode(tokens_BL[:, i : i + 1], cache) for i in range(prefill, tokens_BL.shape[1])]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"n_layers": 3, "d_model": 48, "n_heads": 3}])
@pytest.mark.parametrize("prefill", [1, 17])
def test_cached_decoding_gives_the_logits_of_the_full_forward(overrides, prefill):
    model = tiny_model(**overrides)
    tokens_BL = random_tokens(3, 70, seed=2, high=5).long()
    cache = KVCache(80)
    cached_BLV = decode_all(model, tokens_BL, prefill, cache)
    with torch.inference_mode():
        full_BLV = model(tokens_BL)
    assert cache.length == 70
    torch.testing.assert_close(cached_BLV, full_BLV, rtol=0, atol=2e-6)  # float32 rounding only


def test_cached_decoding_rotates_keys_at_absolute_positions():
    """A step at position p must match the full forward at p (RoPE tables offset by the cache's
    length): a step rotated at position 0 instead gives other logits."""
    model = tiny_model()
    tokens_BL = random_tokens(1, 40, seed=3).long()
    with torch.inference_mode():
        cache = KVCache(40)
        model.decode(tokens_BL[:, :39], cache)
        last_1V = model.decode(tokens_BL[:, 39:], cache)[:, -1]
        full_1V = model(tokens_BL)[:, -1]
        cache.reset()
        alone_1V = model.decode(tokens_BL[:, 39:], cache)[:, -1]
    torch.testing.assert_close(last_1V, full_1V, rtol=0, atol=2e-6)
    assert (alone_1V - full_1V).abs().max() > 1e-3


def test_repeated_rows_decode_like_separate_prefills():
    model = tiny_model(n_kv_heads=2)
    prompt_1L = random_tokens(1, 12, seed=4).long()
    continuations_BL = random_tokens(3, 6, seed=5).long()
    with torch.inference_mode():
        cache = KVCache(18)
        model.decode(prompt_1L, cache)
        cache.repeat_rows(3)
        steps = [model.decode(continuations_BL[:, i : i + 1], cache) for i in range(6)]
        full_BLV = model(torch.cat([prompt_1L.expand(3, -1), continuations_BL], dim=1))
    assert cache.batch == 3
    torch.testing.assert_close(torch.cat(steps, dim=1), full_BLV[:, 12:], rtol=0, atol=2e-6)


@pytest.mark.parametrize("steps", [[5, 1, 7], [13]])
def test_continuing_by_several_tokens_gives_the_logits_of_the_full_forward(steps):
    """A continuation of several tokens attends the cache and, causally, its own tokens (the
    mask aligned bottom-right): the full forward's logits at those positions."""
    model = tiny_model(n_kv_heads=2)
    tokens_BL = random_tokens(2, 30, seed=8, high=5).long()
    with torch.inference_mode():
        cache = KVCache(30)
        parts, start = [model.decode(tokens_BL[:, :17], cache)], 17
        for count in steps:
            parts.append(model.decode(tokens_BL[:, start : start + count], cache))
            start += count
        full_BLV = model(tokens_BL[:, :start])
    torch.testing.assert_close(torch.cat(parts, dim=1), full_BLV, rtol=0, atol=2e-6)


def test_shared_prefix_continued_by_several_alternatives():
    """One prefill of a prefix, its rows repeated, each continued by its own several tokens:
    every row's logits are those of its whole sequence run alone."""
    model = tiny_model()
    prefix_1L = random_tokens(1, 15, seed=9, high=5).long()
    suffixes_BL = random_tokens(4, 9, seed=10, high=5).long()
    with torch.inference_mode():
        cache = KVCache(24)
        model.decode(prefix_1L, cache)
        cache.repeat_rows(4)
        continued_BLV = model.decode(suffixes_BL, cache)
        full_BLV = model(torch.cat([prefix_1L.expand(4, -1), suffixes_BL], dim=1))
    torch.testing.assert_close(continued_BLV, full_BLV[:, 15:], rtol=0, atol=2e-6)


def test_decode_step_at_a_device_position_gives_the_logits_of_decode():
    """The graph-replayable step (position as a device tensor, the whole cache buffers read with
    per-row lengths) gives `decode`'s logits, step after step."""
    model = tiny_model(n_kv_heads=2)
    tokens_BL = random_tokens(2, 30, seed=11, high=5).long()
    with torch.inference_mode():
        expected_BLV = decode_all(model, tokens_BL, 20, KVCache(40))
        cache = KVCache(40)
        steps = [model.decode(tokens_BL[:, :20], cache)]
        position_1 = torch.tensor([20])
        for i in range(20, 30):
            steps.append(model.decode_step(tokens_BL[:, i : i + 1], cache, position_1))
            cache.advance(1)
            position_1 += 1
    torch.testing.assert_close(torch.cat(steps, dim=1), expected_BLV, rtol=0, atol=2e-6)


def test_decode_step_on_the_triton_decoding_kernel():
    """In float16 the step's attention runs the Triton decoding kernel (the interpreter on a CPU)
    over the whole cache with per-row lengths: the float32 model's logits up to fp16 rounding."""
    model = tiny_model(n_heads=2)  # head dim 16
    tokens_BL = random_tokens(3, 24, seed=12, high=5).long()
    with torch.inference_mode():
        expected_BLV = decode_all(model, tokens_BL, 16, KVCache(32))[:, 16:]
        half = tiny_model(n_heads=2).half()
        cache = KVCache(32)
        half.decode(tokens_BL[:, :16], cache)
        position_1, steps = torch.tensor([16]), []
        for i in range(16, 24):
            steps.append(half.decode_step(tokens_BL[:, i : i + 1], cache, position_1).float())
            cache.advance(1)
            position_1 += 1
    torch.testing.assert_close(torch.cat(steps, dim=1), expected_BLV, rtol=0, atol=2e-2)


def test_cache_reset_prefills_a_new_window_in_the_same_buffers():
    model = tiny_model()
    tokens_BL = random_tokens(2, 30, seed=6).long()
    cache = KVCache(30)
    decode_all(model, tokens_BL, 10, cache)
    keys = cache._keys_BKCD[0]
    cache.reset()
    window_BLV = decode_all(model, tokens_BL[:, 12:], 5, cache)
    with torch.inference_mode():
        torch.testing.assert_close(window_BLV, model(tokens_BL[:, 12:]), rtol=0, atol=2e-6)
    assert cache._keys_BKCD[0] is keys


def test_training_forward_is_unchanged_by_decoding():
    model = tiny_model()
    tokens_BL = random_tokens(2, 33, seed=7).long()
    before_BLV = model(tokens_BL)
    decode_all(model, tokens_BL, 20, KVCache(33))
    assert torch.equal(model(tokens_BL), before_BLV)


def test_decoding_refuses_what_it_cannot_run():
    tokens_BL = random_tokens(2, 8).long()
    with torch.inference_mode():
        with pytest.raises(ValueError, match="needs a causal model"):
            tiny_model(causal=False).decode(tokens_BL, KVCache(8))
        with pytest.raises(ValueError, match="dense attention only"):
            tiny_model(attention=[SlidingWindow(window=16, block_size=16)]).decode(tokens_BL, KVCache(8))
        model, cache = tiny_model(), KVCache(9)
        model.decode(tokens_BL, cache)
        with pytest.raises(ValueError, match="continues each of the 2 rows"):
            model.decode(tokens_BL[:1, :1], cache)
        with pytest.raises(ValueError, match="exceed the cache capacity 9"):
            model.decode(tokens_BL[:, :2], cache)
        model.decode(tokens_BL[:, :1], cache)
        with pytest.raises(ValueError, match="exceed the cache capacity 9"):
            model.decode(tokens_BL[:, :1], cache)
        with pytest.raises(ValueError, match="max_seq_len 512"):
            model.decode(random_tokens(1, 513).long(), KVCache(600))
        with pytest.raises(TypeError, match="integer tensor"):
            model.decode(torch.zeros(1, 4), KVCache(4))
    with pytest.raises(ValueError, match="at least 1"):
        KVCache(0)


# ------------------------------------------------------------------- exact windows and ALiBi
def _alibi_window_model(**overrides):
    """Two causal layers with an exact 5-token window and ALiBi alone (no RoPE): the output at i
    depends on the tokens i - 10 .. i only, and on no absolute position."""
    values = dict(
        n_layers=2, causal=True, rope=False, alibi=True, attention=[SlidingWindow(window=5, block_size=16, exact=True)]
    )
    values.update(overrides)
    return tiny_model(**values)


def test_exact_window_model_reads_only_its_window():
    """Layer by layer the window adds 5 positions: a token 10 back moves position i, one 11 back
    does not; the block-granular window of the same width reads further."""
    exact = _alibi_window_model()
    blocky = _alibi_window_model(attention=[SlidingWindow(window=5, block_size=16)])
    tokens_BL = random_tokens(1, 97)
    for j, moves_exact in ((49, False), (50, True)):
        changed_BL = tokens_BL.clone()
        changed_BL[0, j] = (changed_BL[0, j] + 1) % 4
        moved = (exact(changed_BL) - exact(tokens_BL))[0, 60].abs().max().item()
        assert (moved > 1e-5) == moves_exact, (j, moved)
        assert (blocky(changed_BL) - blocky(tokens_BL))[0, 60].abs().max().item() > 1e-5  # same block band


def test_alibi_without_rope_is_shift_equivariant():
    """ALiBi's bias depends on distances only: past the first 10 positions (the receptive field), a
    sequence shifted by 7 tokens gives the same outputs shifted by 7; the bias changes them."""
    model = _alibi_window_model()
    tokens_BL = random_tokens(1, 90, seed=4)
    full_BLV, shifted_BLV = model(tokens_BL), model(tokens_BL[:, 7:])
    torch.testing.assert_close(shifted_BLV[:, 10:], full_BLV[:, 17:], rtol=0, atol=2e-6)
    assert (_alibi_window_model(alibi=False)(tokens_BL) - full_BLV).abs().max() > 1e-4


def test_alibi_decoding_gives_the_logits_of_the_full_forward():
    """Cached decoding with ALiBi: each new token's biases count from its own position (the bias is
    aligned to the bottom-right corner of a step's scores)."""
    model = tiny_model(alibi=True)
    tokens_BL = random_tokens(2, 40, seed=5, high=5).long()
    cache = KVCache(48)
    cached_BLV = decode_all(model, tokens_BL, 9, cache)
    with torch.inference_mode():
        full_BLV = model(tokens_BL)
    torch.testing.assert_close(cached_BLV, full_BLV, rtol=0, atol=2e-6)


def test_alibi_slopes_follow_the_model_and_are_never_saved():
    model = tiny_model(alibi=True, n_heads=4)
    assert model.alibi_H.tolist() == [0.25, 0.0625, 0.015625, 0.00390625]
    assert "alibi_H" not in model.state_dict() and tiny_model().alibi_H is None
    config = tiny_config(alibi=True, rope=False)
    assert TransformerConfig.from_dict(config.to_dict()) == config
