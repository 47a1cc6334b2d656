"""``attn_implementation="genoformer"``: transformers models on our kernels give the logits and the
gradients of ``attn_implementation="sdpa"``.

Tiny randomly initialised models of four architectures: Llama (causal, GQA), Mistral (causal,
a sliding window shorter than the sequence), ESM with rotary positions (bidirectional, the
Nucleotide Transformer's architecture) and Gemma 2 (softcap, alternating windows). In float32 on the CPU the registered names run our
float64 reference ("genoformer_reference") and the default backend choice ("genoformer": SDPA
under our entry point on a CPU); in bfloat16 the Triton kernels in Triton's interpreter
("genoformer_triton") are held to the 2x rule against the float64 model. Padding (right and left),
packed sequences, generation with a cache, and the fallbacks with their warnings are covered too.
"""

from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

transformers = pytest.importorskip("transformers")

from genoformer.kernels import transformers_attention  # noqa: E402
from genoformer.kernels.backend import Backend  # noqa: E402
from transformers import (  # noqa: E402
    AutoModel,
    AutoModelForCausalLM,
    EsmConfig,
    EsmForMaskedLM,
    LlamaConfig,
    MistralConfig,
)

REFERENCE = transformers_attention.register("genoformer_reference", Backend.REFERENCE)
TRITON = transformers_attention.register("genoformer_triton", Backend.TRITON)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def llama_config(**overrides):
    values = dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    return LlamaConfig(**{**values, **overrides})


def mistral_config():
    return MistralConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        sliding_window=8,
        pad_token_id=0,
    )


def esm_config():
    return EsmConfig(
        vocab_size=33,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        position_embedding_type="rotary",
        pad_token_id=1,
        mask_token_id=32,
        max_position_embeddings=256,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )


def model_pair(make, config, implementation, dtype=torch.float32):
    """The same random weights under `implementation` and under sdpa."""
    torch.manual_seed(0)
    ours = make(config, attn_implementation=implementation).to(dtype)
    sdpa = make(copy.deepcopy(config), attn_implementation="sdpa").to(dtype)
    sdpa.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == implementation
    return ours.eval(), sdpa.eval()


def causal_lm(config, attn_implementation):
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def masked_lm(config, attn_implementation):
    return EsmForMaskedLM._from_config(config, attn_implementation=attn_implementation)


def tokens(batch, length, high=30, seed=1):
    return torch.randint(2, high, (batch, length), generator=torch.Generator().manual_seed(seed))


def padding_mask(lengths, length, left=False):
    mask = torch.zeros(len(lengths), length, dtype=torch.long)
    for row, n in enumerate(lengths):
        if left:
            mask[row, length - n :] = 1
        else:
            mask[row, :n] = 1
    return mask


CASES = {
    "llama_gqa": (causal_lm, llama_config, 40),
    "mistral_window": (causal_lm, mistral_config, 30),
    "esm_rotary": (masked_lm, esm_config, 37),
}


@pytest.mark.parametrize("implementation", ["genoformer", REFERENCE])
@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_equal_sdpa(name, implementation):
    make, config, length = CASES[name]
    ours, sdpa = model_pair(make, config(), implementation)
    ids = tokens(2, length)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, sdpa(ids).logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_padded_batches_equal_sdpa_on_the_valid_tokens(name, left):
    """Right padding runs as key lengths, left padding as documents (or each row's first key in a
    window); the valid tokens' logits are sdpa's."""
    make, config, length = CASES[name]
    ours, sdpa = model_pair(make, config(), REFERENCE)
    ids = tokens(3, length, seed=2)
    mask = padding_mask([length, length - 9, 5], length, left=left)
    with torch.no_grad():
        got, expected = ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], expected[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_step_gradients_equal_sdpa(name, caplog):
    """One training step's loss and every parameter's gradient, as sdpa gives them (Mistral's
    sliding window under autograd on the reference's exact token window), nothing falling back."""
    make, config, length = CASES[name]
    ours, sdpa = model_pair(make, config(), REFERENCE)
    ids = tokens(2, length, seed=3)
    mask = padding_mask([length, length - 6], length)
    with caplog.at_level(logging.WARNING, logger="genoformer.kernels"):
        losses = []
        for model in (ours, sdpa):
            model.train()
            loss = model(ids, attention_mask=mask, labels=ids).loss
            loss.backward()
            losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (param, a), (_, b) in zip(ours.named_parameters(), sdpa.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{param}: {m}")
    assert "runs transformers' SDPA" not in caplog.text, caplog.text


def gemma2_config():
    return transformers.Gemma2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        attn_logit_softcapping=20.0,
        final_logit_softcapping=None,
        query_pre_attn_scalar=16,
        pad_token_id=0,
    )


def test_softcap_and_alternating_windows_equal_eager():
    """Gemma 2 caps its scores with tanh (softcap 20) and alternates sliding-window and global layers:
    inference (the decoding path) and a training step's gradients (the reference) equal transformers'
    eager attention (SDPA refuses softcap)."""
    torch.manual_seed(0)
    ours = causal_lm(gemma2_config(), REFERENCE)
    eager = causal_lm(gemma2_config(), "eager")
    eager.load_state_dict(ours.state_dict())
    ids = tokens(2, 30, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids).logits, eager.eval()(ids).logits, rtol=1e-4, atol=1e-5)
    for model in (ours, eager):
        model.train()
        model(ids, labels=ids).loss.backward()
    for (param, a), (_, b) in zip(ours.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{param}: {m}")


def test_attention_dropout_trains_on_our_path(caplog):
    """ESM with attention dropout 0.2 in training: our dropout (no fallback), a seed repeats a step,
    dropout changes the loss, and in eval mode the logits are sdpa's."""
    config = esm_config()
    config.attention_probs_dropout_prob = 0.2
    ours, sdpa = model_pair(masked_lm, config, REFERENCE)
    ids = tokens(2, 25, seed=10)
    ours.train()
    with caplog.at_level(logging.WARNING, logger="genoformer.kernels"):
        losses = []
        for seed in (1, 1, 2):
            torch.manual_seed(seed)
            losses.append(ours(ids, labels=ids).loss.item())
    assert "runs transformers' SDPA" not in caplog.text
    assert losses[0] == losses[1] != losses[2]
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids).logits, sdpa(ids).logits, rtol=1e-4, atol=1e-5)


def test_triton_kernels_hold_the_two_x_rule():
    """bfloat16 Llama and ESM on the Triton kernels (interpreter on a CPU): their logits' error
    against the float64 model is at most twice sdpa's in bfloat16 (plus one bf16 ulp)."""
    for make, config, length in (CASES["llama_gqa"], CASES["esm_rotary"]):
        ours, sdpa = model_pair(make, config(), TRITON, dtype=torch.bfloat16)
        exact = make(config(), attn_implementation="sdpa").double().eval()
        exact.load_state_dict(ours.state_dict())
        ids = tokens(2, length, seed=4)
        mask = padding_mask([length, length - 7], length)
        with torch.no_grad():
            want = exact(ids, attention_mask=mask).logits
            got = ours.to(DEVICE)(ids.to(DEVICE), attention_mask=mask.to(DEVICE)).logits.double().cpu()
            base = sdpa(ids, attention_mask=mask).logits.double()
        valid = mask.bool()
        err = (got - want)[valid].abs().max().item()
        base_err = (base - want)[valid].abs().max().item()
        assert err <= 2 * base_err + torch.finfo(torch.bfloat16).eps * want.abs().max().item(), (err, base_err)


def test_generation_with_a_cache_equals_sdpa():
    """Greedy generation of a left-padded batch: the prefill on the dense path, each step over the
    cache on the decoding path (left padding as each row's first key); the tokens are sdpa's."""
    ours, sdpa = model_pair(causal_lm, llama_config(), "genoformer")
    ids = tokens(2, 12, seed=5)
    mask = padding_mask([12, 7], 12, left=True)
    settings = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        torch.testing.assert_close(ours.generate(ids, **settings), sdpa.generate(ids, **settings))


def test_packed_sequences_stay_inside_their_documents():
    """position_ids that restart mark packed sequences: each one's logits are those of the sequence
    run alone."""
    ours, _ = model_pair(causal_lm, llama_config(), REFERENCE)
    ids = tokens(1, 30, seed=6)
    positions = torch.cat([torch.arange(12), torch.arange(18)])[None]
    with torch.no_grad():
        packed = ours(ids, position_ids=positions).logits
        first, second = ours(ids[:, :12]).logits, ours(ids[:, 12:]).logits
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), rtol=1e-4, atol=1e-5)


def test_from_pretrained_and_fallback_warnings(tmp_path, caplog):
    """AutoModel.from_pretrained(..., attn_implementation="genoformer") runs a saved model; a custom
    4D mask pattern runs on sdpa with a warning naming the reason."""
    _, sdpa = model_pair(causal_lm, llama_config(), "genoformer")
    sdpa.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path, attn_implementation="genoformer")
    assert loaded.config._attn_implementation == "genoformer"
    ids = tokens(1, 16, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids).last_hidden_state, sdpa.model(ids).last_hidden_state, rtol=1e-4, atol=1e-5
        )
        with caplog.at_level(logging.WARNING, logger="genoformer.kernels"):
            custom = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()
            custom[..., 3] = True  # a key every query sees: no causal pattern
            torch.testing.assert_close(
                loaded(ids, attention_mask=custom).last_hidden_state,
                sdpa.model(ids, attention_mask=custom).last_hidden_state,
                rtol=1e-4,
                atol=1e-5,
            )
    assert "custom mask pattern" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_bf16_logits_within_two_x(name):
    make, config, _ = CASES[name]
    ours, sdpa = model_pair(make, config(), "genoformer", dtype=torch.bfloat16)
    exact = make(config(), attn_implementation="sdpa").double().eval()
    exact.load_state_dict(ours.state_dict())
    ids = tokens(2, 1000, seed=8)
    with torch.no_grad():
        want = exact.cuda()(ids.cuda()).logits
        got = ours.cuda()(ids.cuda()).logits.double()
        base = sdpa.cuda()(ids.cuda()).logits.double()
    err, base_err = (got - want).abs().max().item(), (base - want).abs().max().item()
    assert err <= 2 * base_err + torch.finfo(torch.bfloat16).eps * want.abs().max().item(), (err, base_err)
