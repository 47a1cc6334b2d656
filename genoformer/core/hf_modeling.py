"""Genoformer DNA models for Hugging Face transformers (`trust_remote_code=True`).

This file is copied as `modeling_genoformer.py` into every directory that `genoformer export --format hf`
writes for a DNA model (genoformer.core.hf), beside genoformer's block-sparse layouts
(genoformer.kernels.layout, copied as `genoformer_layout.py`; the export rewrites the one import
line that names it), so it imports torch and transformers only: whoever loads the model needs no
genoformer. It is the pure-PyTorch path of genoformer's trunk (genoformer.core.transformer) with
attention through torch's scaled_dot_product_attention:

    pre-norm blocks  x + attn(rms_norm(x)), then x + swiglu_mlp(rms_norm(x)); final rms_norm
    attention        grouped key/value heads (query head h reads key/value head h // (H / K)),
                     RoPE in the half-split convention, causal or bidirectional per the config;
                     a block-sparse layer builds its layout as genoformer does and runs it as a
                     token mask (L x L per layout head: the reference path, memory grows as L^2)
    elementwise      RMSNorm and RoPE computed in float32 and cast back to the input dtype

Fine-tuned models (`genoformer finetune`) carry their head in `config.head`:
`GenoformerForSequenceClassification` (classes, labels or values per sequence) and
`GenoformerForTokenClassification` (a class or value per base) compute genoformer's head on the
same features: a causal model reads both strands (the reverse complement's hidden states, read
back into forward positions, beside the sequence's own), a masked model one. Their `logits` are
those of the sequence as given (values in the data's units); `predict` averages both strands as
`genoformer classify` and `annotate` do.

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
from transformers.modeling_outputs import (
    BaseModelOutput,
    CausalLMOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from genoformer.kernels.layout import BigBird, BlockLayout, GlobalTokens, SlidingWindow, Strided, Union

IGNORE = -100
"""Label value that the losses skip (transformers' convention)."""
COMPLEMENT = (3, 2, 1, 0, 4, 5, 6, 7)
"""Token id of each token's complement (A<->T, C<->G; N and the special tokens stay)."""
LAYOUT_SPECS = {cls.__name__: cls for cls in (SlidingWindow, GlobalTokens, BigBird, Strided, Union)}
"""genoformer's layout spec classes by name (config.attention names them by class_path)."""


class GenoformerConfig(PretrainedConfig):
    """Architecture of a genoformer model (the fields of genoformer's TransformerConfig).

    `attention` lists each layer's pattern, repeated cyclically over the layers: None (dense) or
    a layout spec as genoformer writes it ({"class_path": ..., "init_args": ...}). `alphabet` maps
    each token to its id; `genoformer` holds the kind tag and format version of the checkpoint the
    export came from; `head` describes a fine-tuned model's head (kind, outputs, pooling,
    both_strands, layer, and mean/std of value targets), None for a language model.
    """

    model_type = "genoformer"
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "max_position_embeddings": "max_seq_len",
    }

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
        head: Optional[dict[str, Any]] = None,
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
        self.head = head
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


class AttentionMask:
    """Which keys each query may read: `allowed` (B or 1, H_l, L, L) bool for SDPA (H_l is 1 or the
    query heads), and `empty` (same leading shape, L, 1) marking queries that may read no key
    (their output is 0), or None when every query has a key."""

    def __init__(self, allowed: torch.Tensor, empty: Optional[torch.Tensor] = None) -> None:
        self.allowed = allowed
        self.empty = empty


def layout_spec(value: Any) -> Any:
    """A layout spec of config.attention (plain data, as genoformer writes it) as a spec object."""
    if isinstance(value, dict) and "class_path" in value:
        name = str(value["class_path"]).rpartition(".")[2]
        if name not in LAYOUT_SPECS:
            raise ValueError(
                f"unknown attention layout {value['class_path']!r}; this modeling file builds "
                f"{', '.join(LAYOUT_SPECS)}."
            )
        return LAYOUT_SPECS[name](**{key: layout_spec(arg) for key, arg in (value.get("init_args") or {}).items()})
    if isinstance(value, list):
        return [layout_spec(item) for item in value]
    return value


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
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        mask: Optional[AttentionMask],
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
            q_BHLD,
            k_BHLD,
            v_BHLD,
            attn_mask=None if mask is None else mask.allowed,
            is_causal=causal and mask is None,
        )
        if mask is not None and mask.empty is not None:  # a query with no allowed key gives 0, as in genoformer
            o_BHLD = o_BHLD.masked_fill(mask.empty, 0.0)
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
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        mask: Optional[AttentionMask],
        causal: bool,
    ) -> torch.Tensor:
        x_BLE = x_BLE + self.drop(self.attn(self.attn_norm(x_BLE), cos_LR, sin_LR, mask, causal))
        return x_BLE + self.drop(self.mlp(self.mlp_norm(x_BLE)))


class GenoformerPreTrainedModel(PreTrainedModel):
    config_class = GenoformerConfig
    base_model_prefix = "model"
    _no_split_modules = ["GenoformerBlock"]
    _supports_sdpa = True


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
        self.layout_specs = [layout_spec(value) for value in config.attention]  # read once, built per length
        self._layouts: dict[tuple[int, int], BlockLayout] = {}
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
        masks = self._attention_masks(attention_mask, B, L, x_BLE.device)
        x_BLE = self.drop(x_BLE)
        states = [x_BLE]
        for i, block in enumerate(self.blocks):
            x_BLE = block(x_BLE, cos_LR, sin_LR, masks[i % len(masks)], self.config.causal)
            if i == len(self.blocks) - 1:
                x_BLE = self.norm(x_BLE)
            states.append(x_BLE)
        hidden_states = tuple(states) if output_hidden_states else None
        if not return_dict:
            return tuple(value for value in (x_BLE, hidden_states) if value is not None)
        return BaseModelOutput(last_hidden_state=x_BLE, hidden_states=hidden_states)

    def _layout(self, index: int, spec: Any, L: int) -> BlockLayout:
        """The layout of config.attention[index] for L tokens (without the blocks above the
        diagonal for a causal model), built once per length as genoformer builds it."""
        if (index, L) not in self._layouts:
            layout = spec.build(L, self.config.n_heads)
            self._layouts[index, L] = layout.with_causal() if self.config.causal else layout
        return self._layouts[index, L]

    def _attention_masks(
        self, attention_mask: Optional[torch.Tensor], B: int, L: int, device: torch.device
    ) -> list[Optional[AttentionMask]]:
        """The mask of each pattern in config.attention (None: plain dense or causal attention)."""
        keys_B11L = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keys_B11L = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
        masks = []
        for index, spec in enumerate(self.layout_specs):
            if spec is None and keys_B11L is None:
                masks.append(None)
                continue
            if spec is None:
                allowed = keys_B11L.expand(B, 1, L, L)
                if self.config.causal:
                    allowed = allowed & torch.ones(L, L, dtype=torch.bool, device=device).tril()
                # a padding query with no key before it would give NaN: let it see every key (its output is unused)
                masks.append(AttentionMask(allowed | ~allowed.any(-1, keepdim=True)))
                continue
            layout = self._layout(index, spec, L)
            allowed = layout.token_mask(causal=self.config.causal).to(device)[None]  # (1, H_l, L, L)
            if keys_B11L is not None:
                allowed = allowed & keys_B11L
            empty = ~allowed.any(-1, keepdim=True)
            masks.append(AttentionMask(allowed | empty, empty if bool(empty.any()) else None))
        return masks


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
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
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


# ------------------------------------------------------------------- fine-tuned heads
def flip_within(x_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
    """Reverse each row of x (B, L, ...) within its length; positions beyond it stay as they are."""
    position_L = torch.arange(x_BL.shape[1], device=x_BL.device)
    flipped_BL = lengths_B.long().unsqueeze(1) - 1 - position_L
    index_BL = torch.where(flipped_BL >= 0, flipped_BL, position_L)
    index = index_BL.view(*index_BL.shape, *([1] * (x_BL.ndim - 2))).expand_as(x_BL)
    return torch.gather(x_BL, 1, index)


def swap_strands(features_F: torch.Tensor) -> torch.Tensor:
    """Both-strand features (..., 2E) with the halves swapped: those of the reverse complement,
    positions reversed (f(rc x)[L-1-i] = swap(f(x)[i]))."""
    half = features_F.shape[-1] // 2
    return torch.cat([features_F[..., half:], features_F[..., :half]], dim=-1)


class GenoformerSequenceHead(nn.Module):
    """Pooled features (mean, last or attention pooling) -> K outputs per sequence."""

    def __init__(self, features: int, outputs: int, pooling: str, both_strands: bool) -> None:
        super().__init__()
        self.pooling = pooling
        self.both_strands = both_strands
        self.query = nn.Parameter(torch.zeros(features)) if pooling == "ATTENTION" else None
        self.out = nn.Linear(features, outputs)

    def pool(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        B, L, F_ = features_BLF.shape
        keep_BL = torch.arange(L, device=lengths_B.device) < lengths_B.unsqueeze(1)
        if self.pooling == "MEAN":
            keep_BL1 = keep_BL.unsqueeze(-1).to(features_BLF.dtype)
            return (features_BLF * keep_BL1).sum(1) / keep_BL1.sum(1).clamp(min=1.0)
        if self.pooling == "ATTENTION":
            scores_BL = (features_BLF.float() @ self.query.float()) / math.sqrt(F_)
            weights_BL = torch.softmax(scores_BL.masked_fill(~keep_BL, float("-inf")), dim=1)
            return torch.einsum("bl,blf->bf", weights_BL.to(features_BLF.dtype), features_BLF)
        last_BF = features_BLF[torch.arange(B, device=features_BLF.device), (lengths_B.long() - 1).clamp(min=0)]
        if not self.both_strands:
            return last_BF
        half = F_ // 2  # the reverse-complement reading has seen everything at forward position 0
        return torch.cat([last_BF[:, :half], features_BLF[:, 0, half:]], dim=-1)

    def forward(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor, other_strand: bool = False) -> torch.Tensor:
        if not other_strand:
            return self.out(self.pool(features_BLF, lengths_B).float())
        if self.pooling == "LAST":
            return self.out(swap_strands(self.pool(features_BLF, lengths_B)).float())
        return self.out(self.pool(swap_strands(features_BLF), lengths_B).float())


class GenoformerBaseHead(nn.Module):
    """Per-base features -> K outputs per base through a small MLP (dropout, linear, GELU, linear)."""

    def __init__(self, features: int, outputs: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Dropout(0.0), nn.Linear(features, features), nn.GELU(), nn.Linear(features, outputs)
        )

    def forward(self, features_BLF: torch.Tensor) -> torch.Tensor:
        return self.net(features_BLF.float())


class _GenoformerFineTuned(GenoformerPreTrainedModel):
    """The trunk plus the head described by config.head (see the module docstring)."""

    per_base: bool

    def __init__(self, config: GenoformerConfig) -> None:
        super().__init__(config)
        if not config.head:
            raise ValueError(
                "this config has no fine-tuning head (config.head); load a language model with "
                "AutoModelForCausalLM / AutoModelForMaskedLM instead."
            )
        head = config.head
        self.model = GenoformerModel(config)
        self.both_strands = bool(head["both_strands"])
        self.layer = int(head["layer"])
        self.kind = str(head["kind"])
        width = config.d_model * (2 if self.both_strands else 1)
        outputs = int(head["outputs"])
        if self.per_base:
            self.classifier = GenoformerBaseHead(width, outputs)
        else:
            self.classifier = GenoformerSequenceHead(width, outputs, str(head["pooling"]), self.both_strands)
        # plain lists, not buffers: transformers may build the model on the meta device, and a
        # buffer that is not among the weights would then never get its values
        self.value_mean = list(head.get("mean") or [0.0] * outputs)
        self.value_std = list(head.get("std") or [1.0] * outputs)
        self.strand_swap = list(head.get("strand_swap") or range(outputs))
        self.post_init()

    @property
    def values(self) -> bool:
        """Whether the head predicts values (regression) rather than classes or labels."""
        return self.kind.endswith("values")

    def features(
        self, input_ids: torch.Tensor, lengths_B: torch.Tensor, attention_mask: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """(B, L, F): the hidden state at config.head["layer"], and for a causal model the reverse
        complement's beside it, read back into forward positions."""

        def hidden(ids_BL: torch.Tensor) -> torch.Tensor:
            out = self.model(
                input_ids=ids_BL, attention_mask=attention_mask, output_hidden_states=True, return_dict=True
            )
            return out.hidden_states[self.layer]

        forward_BLE = hidden(input_ids)
        if not self.both_strands:
            return forward_BLE
        reverse_BLE = hidden(self.reverse_complement(input_ids, lengths_B))
        return torch.cat([forward_BLE, flip_within(reverse_BLE, lengths_B)], dim=-1)

    @staticmethod
    def reverse_complement(input_ids: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """The reverse complement of each right-padded row (padding stays at the end)."""
        complement = torch.tensor(COMPLEMENT, device=input_ids.device)
        return flip_within(complement[input_ids.long()], lengths_B)

    def _outputs(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor, other_strand: bool = False) -> torch.Tensor:
        if self.per_base:
            return self.classifier(swap_strands(features_BLF) if other_strand else features_BLF)
        return self.classifier(features_BLF, lengths_B, other_strand)

    def _readout(self, outputs: torch.Tensor) -> torch.Tensor:
        """Probabilities of classes (softmax) or labels (sigmoid), or values in the data's units."""
        if self.values:
            mean_K, std_K = (torch.tensor(v, device=outputs.device) for v in (self.value_mean, self.value_std))
            return outputs * std_K + mean_K
        if self.kind == "sequence_labels":
            return torch.sigmoid(outputs)
        return torch.softmax(outputs, dim=-1)

    def _lengths(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        if attention_mask is None:
            return torch.full(input_ids.shape[:1], input_ids.shape[1], device=input_ids.device)
        return attention_mask.long().sum(-1)

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ):
        if input_ids is None:
            raise ValueError("pass input_ids (the tokenizer's ids of right-padded sequences).")
        lengths_B = self._lengths(input_ids, attention_mask)
        logits = self._outputs(self.features(input_ids, lengths_B, attention_mask), lengths_B)
        if self.values:
            logits = self._readout(logits)
        loss = None if labels is None else self._loss(logits, labels.to(logits.device))
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(value for value in (loss, logits) if value is not None)
        output_class = TokenClassifierOutput if self.per_base else SequenceClassifierOutput
        return output_class(loss=loss, logits=logits)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.values:
            values = labels.float().reshape(logits.shape)
            known = torch.isfinite(values)
            return F.mse_loss(logits[known], values[known])
        if self.kind == "sequence_labels":
            return F.binary_cross_entropy_with_logits(logits, labels.float())
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), ignore_index=IGNORE)

    @torch.no_grad()
    def predict(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What `genoformer classify` / `annotate` report: class or label probabilities, or values,
        averaged over both strands; (B, K) per sequence, (B, L, K) per base (forward positions)."""
        lengths_B = self._lengths(input_ids, attention_mask)
        features_BLF = self.features(input_ids, lengths_B, attention_mask)
        readout = self._readout
        forward = readout(self._outputs(features_BLF, lengths_B))
        if self.both_strands:
            reverse = readout(self._outputs(features_BLF, lengths_B, other_strand=True))
        else:
            reverse_ids = self.reverse_complement(input_ids, lengths_B)
            reverse = readout(self._outputs(self.features(reverse_ids, lengths_B, attention_mask), lengths_B))
            if self.per_base:
                reverse = flip_within(reverse, lengths_B)
        if self.per_base:
            reverse = reverse[..., self.strand_swap]
        return 0.5 * (forward + reverse)


class GenoformerForSequenceClassification(_GenoformerFineTuned):
    """Logits (B, K) of a sequence head: classes, labels (multi-label) or values. `labels`: class
    ids (B,), 0/1 labels (B, K) or values (B, K) give cross-entropy, binary cross-entropy or MSE."""

    per_base = False


class GenoformerForTokenClassification(_GenoformerFineTuned):
    """Logits (B, L, K) of a per-base head: classes (e.g. other, CDS+, CDS-, rRNA, tRNA) or values.
    `labels` (B, L) class ids (IGNORE = -100 skipped) or values (NaN skipped)."""

    per_base = True
