"""Genoformer DNA language models for Hugging Face transformers (`trust_remote_code=True`).

This file is copied as `modeling_genoformer.py` into every directory that `genoformer export --format hf`
writes (genoformer.core.hf), so it imports torch and transformers only: whoever loads the model
needs no genoformer. It is the pure-PyTorch path of genoformer's trunk
(genoformer.core.transformer) with dense attention through torch's scaled_dot_product_attention:

    pre-norm blocks  x + attn(rms_norm(x)), then x + swiglu_mlp(rms_norm(x)); final rms_norm
    attention        grouped key/value heads (query head h reads key/value head h // (H / K)),
                     RoPE in the half-split convention, causal or bidirectional per the config
    elementwise      RMSNorm and RoPE computed in float32 and cast back to the input dtype

Token ids are genoformer's: A 0, C 1, G 2, T 3, N 4, PAD 5, MASK 6, BOS 7 (the tokenizer saved
beside this file maps them). `attention_mask` (B, L) with 0 at padding masks those keys, as
genoformer's per-row lengths do; outputs at padded positions are meaningless.

Shape legend (suffixes on tensor names):
    B  batch                  L  sequence length (tokens)
    E  model width (d_model)  F  SwiGLU hidden width
    H  query heads            K  key/value heads (H % K == 0)
    D  head dim               R  D // 2 (rotary frequency pairs)
    V  vocabulary size
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput, MaskedLMOutput

IGNORE = -100
"""Label value that the losses skip (transformers' convention)."""


class GenoformerConfig(PretrainedConfig):
    """Architecture of a genoformer model (the fields of genoformer's TransformerConfig).

    `attention` lists each layer's pattern, repeated cyclically over the layers; only dense
    layers (None) run here. `alphabet` maps each token to its id; `genoformer` holds the kind
    tag and format version of the checkpoint the export came from.
    """

    model_type = "genoformer"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "max_position_embeddings": "max_seq_len"}

    def __init__(
        self,
        vocab_size: int = 8,
        d_model: int = 256,
        n_layers: int = 4,
        n_heads: int = 4,
        n_kv_heads: Optional[int] = None,
        mlp_hidden: Optional[int] = None,
        max_seq_len: int = 8192,
        rope_theta: float = 10000.0,
        dropout: float = 0.0,
        causal: bool = True,
        attention: Optional[list] = None,
        tie_embeddings: bool = True,
        norm_eps: float = 1e-6,
        init_std: float = 0.02,
        alphabet: Optional[dict[str, int]] = None,
        genoformer: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.mlp_hidden = mlp_hidden
        self.max_seq_len = max_seq_len
        self.rope_theta = rope_theta
        self.dropout = dropout
        self.causal = causal
        self.attention = [None] if attention is None else list(attention)
        self.tie_embeddings = tie_embeddings
        self.norm_eps = norm_eps
        self.init_std = init_std
        self.alphabet = alphabet
        self.genoformer = genoformer
        kwargs.setdefault("pad_token_id", 5)
        kwargs.setdefault("mask_token_id", 6)
        kwargs.setdefault("bos_token_id", 7)
        kwargs["tie_word_embeddings"] = tie_embeddings
        super().__init__(**kwargs)
        if d_model % n_heads != 0 or (d_model // n_heads) % 2 != 0:
            raise ValueError(f"d_model={d_model} must split into n_heads={n_heads} heads of an even dim (RoPE).")
        if n_heads % self.kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={self.kv_heads}.")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def mlp_dim(self) -> int:
        return 64 * math.ceil(8 * self.d_model / 3 / 64) if self.mlp_hidden is None else self.mlp_hidden


# ------------------------------------------------------------------- elementwise work
def rms_norm(x_BLE: torch.Tensor, weight_E: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, returned in x's dtype."""
    y_BLE = F.rms_norm(x_BLE.float(), (x_BLE.shape[-1],), weight_E.float(), eps)
    return y_BLE.to(x_BLE.dtype)


def rotary_tables(positions_L: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos_LR, sin_LR) float32 for integer positions (L,), computed in float64."""
    inv_freq_R = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions_L.device) / head_dim)
    angle_LR = positions_L.to(torch.float64)[..., None] * inv_freq_R
    return angle_LR.cos().float(), angle_LR.sin().float()


def apply_rotary(x_BHLD: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., r], x[..., r + D/2]) by angle position * theta^(-2r/D), in float32."""
    x1_BHLR, x2_BHLR = x_BHLD.float().chunk(2, dim=-1)
    y_BHLD = torch.cat((x1_BHLR * cos_LR - x2_BHLR * sin_LR, x1_BHLR * sin_LR + x2_BHLR * cos_LR), dim=-1)
    return y_BHLD.to(x_BHLD.dtype)


class GenoformerRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLE: torch.Tensor) -> torch.Tensor:
        return rms_norm(x_BLE, self.weight, self.eps)


class GenoformerAttention(nn.Module):
    """Multi-head self-attention with grouped key/value heads and RoPE (torch SDPA)."""

    def __init__(self, config: GenoformerConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def forward(
        self, x_BLE: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor, mask_B1LL: Optional[torch.Tensor],
        causal: bool,
    ) -> torch.Tensor:
        B, L, _ = x_BLE.shape
        q_BHLD = self.wq(x_BLE).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k_BKLD = self.wk(x_BLE).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BKLD = self.wv(x_BLE).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q_BHLD, k_BKLD = apply_rotary(q_BHLD, cos_LR, sin_LR), apply_rotary(k_BKLD, cos_LR, sin_LR)
        group = self.n_heads // self.n_kv_heads
        k_BHLD = k_BKLD.repeat_interleave(group, dim=1)
        v_BHLD = v_BKLD.repeat_interleave(group, dim=1)
        o_BHLD = F.scaled_dot_product_attention(
            q_BHLD, k_BHLD, v_BHLD, attn_mask=mask_B1LL, is_causal=causal and mask_B1LL is None
        )
        return self.wo(o_BHLD.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim))


class GenoformerMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up share one matmul."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x_BLE: torch.Tensor) -> torch.Tensor:
        gate_BLF, up_BLF = self.w_gate_up(x_BLE).chunk(2, dim=-1)
        return self.w_down(F.silu(gate_BLF) * up_BLF)


class GenoformerBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GenoformerConfig) -> None:
        super().__init__()
        self.attn_norm = GenoformerRMSNorm(config.d_model, config.norm_eps)
        self.attn = GenoformerAttention(config)
        self.mlp_norm = GenoformerRMSNorm(config.d_model, config.norm_eps)
        self.mlp = GenoformerMLP(config.d_model, config.mlp_dim)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self, x_BLE: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor, mask_B1LL: Optional[torch.Tensor],
        causal: bool,
    ) -> torch.Tensor:
        x_BLE = x_BLE + self.drop(self.attn(self.attn_norm(x_BLE), cos_LR, sin_LR, mask_B1LL, causal))
        return x_BLE + self.drop(self.mlp(self.mlp_norm(x_BLE)))


class GenoformerPreTrainedModel(PreTrainedModel):
    config_class = GenoformerConfig
    base_model_prefix = "model"
    _no_split_modules = ["GenoformerBlock"]
    _supports_sdpa = True

    def __init__(self, config: GenoformerConfig, *args: Any, **kwargs: Any) -> None:
        dense = [spec is None for spec in config.attention]
        if not all(dense):
            raise ValueError(
                "this model has block-sparse attention layers (config.attention is not all null); this modeling "
                "file runs dense attention only: load it with genoformer instead."
            )
        super().__init__(config, *args, **kwargs)


class GenoformerModel(GenoformerPreTrainedModel):
    """Token ids (B, L) -> last hidden state (B, L, E), after the final RMSNorm (what the heads see).
    `output_hidden_states=True` also gives all n_layers + 1 states: 0 is the input embedding,
    i the output of block i, the last one after the final norm (genoformer's numbering)."""

    def __init__(self, config: GenoformerConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(GenoformerBlock(config) for _ in range(config.n_layers))
        self.norm = GenoformerRMSNorm(config.d_model, config.norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds.")
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        x_BLE = self.embed(input_ids.long()) if inputs_embeds is None else inputs_embeds
        B, L, _ = x_BLE.shape
        if L > self.config.max_seq_len:
            raise ValueError(f"sequence length {L} exceeds max_seq_len={self.config.max_seq_len}; tile longer inputs.")
        positions_L = torch.arange(L, device=x_BLE.device) if position_ids is None else position_ids
        cos_LR, sin_LR = rotary_tables(positions_L, self.config.head_dim, self.config.rope_theta)
        if cos_LR.ndim == 3:  # per-row positions (B, L, R): broadcast over the heads
            cos_LR, sin_LR = cos_LR[:, None], sin_LR[:, None]
        mask_B1LL = self._attention_mask(attention_mask, B, L, x_BLE.device)
        x_BLE = self.drop(x_BLE)
        states = [x_BLE]
        for i, block in enumerate(self.blocks):
            x_BLE = block(x_BLE, cos_LR, sin_LR, mask_B1LL, self.config.causal)
            if i == len(self.blocks) - 1:
                x_BLE = self.norm(x_BLE)
            states.append(x_BLE)
        hidden_states = tuple(states) if output_hidden_states else None
        if not return_dict:
            return tuple(value for value in (x_BLE, hidden_states) if value is not None)
        return BaseModelOutput(last_hidden_state=x_BLE, hidden_states=hidden_states)

    def _attention_mask(
        self, attention_mask: Optional[torch.Tensor], B: int, L: int, device: torch.device
    ) -> Optional[torch.Tensor]:
        """Boolean (B, 1, L, L) allowed-key mask, or None when attention is plain dense/causal."""
        if attention_mask is None or bool(attention_mask.all()):
            return None
        keys_B1LL = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :].expand(B, 1, L, L)
        if self.config.causal:
            keys_B1LL = keys_B1LL & torch.ones(L, L, dtype=torch.bool, device=device).tril()
        # a query with no allowed key (padding before every key) would give NaN: let it see all keys
        return keys_B1LL | ~keys_B1LL.any(-1, keepdim=True)


class _GenoformerLMHead(GenoformerPreTrainedModel):
    """The trunk plus a linear head to logits over the vocabulary (tied to the embedding when
    config.tie_embeddings)."""

    _tied_weights_keys = {"head.weight": "model.embed.weight"}

    def __init__(self, config: GenoformerConfig) -> None:
        super().__init__(config)
        self.model = GenoformerModel(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.head = value

    shift_labels: bool
    """Whether position i is scored against label i + 1 (causal) rather than label i (masked)."""
    output_class: type

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.LongTensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states, return_dict=True)
        logits_BLV, hidden_states = self.head(outputs.last_hidden_state), outputs.hidden_states
        loss = None
        if labels is not None:
            if self.shift_labels:
                logits_NV, labels = logits_BLV[:, :-1], labels[:, 1:]
            else:
                logits_NV = logits_BLV
            logits_NV = logits_NV.reshape(-1, logits_BLV.shape[-1]).float()
            loss = F.cross_entropy(logits_NV, labels.reshape(-1).to(logits_NV.device), ignore_index=IGNORE)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(value for value in (loss, logits_BLV, hidden_states) if value is not None)
        return self.output_class(loss=loss, logits=logits_BLV, hidden_states=hidden_states)


class GenoformerForCausalLM(_GenoformerLMHead):
    """Next-base logits (B, L, V): position i predicts token i + 1. `labels` (B, L), e.g. the
    input ids, give the mean cross-entropy in nats over positions 1..L-1 (IGNORE = -100 skipped)."""

    shift_labels = True
    output_class = CausalLMOutput


class GenoformerForMaskedLM(_GenoformerLMHead):
    """Logits (B, L, V) at every position of a bidirectional model; mask bases with MASK (6).
    `labels` (B, L): the original tokens at masked positions, IGNORE (-100) elsewhere."""

    shift_labels = False
    output_class = MaskedLMOutput
