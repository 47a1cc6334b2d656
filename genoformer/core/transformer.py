"""The shared trunk: a pre-norm transformer of plain nn.Modules on one device.

RMSNorm, rotary position embeddings (RoPE), SwiGLU MLP and multi-head attention with grouped
key/value heads (GQA). Attention goes through `genoformer.kernels.dispatch.attention`; each
layer's pattern (dense or a block-sparse layout spec) comes from `TransformerConfig.attention`,
applied cyclically over the layers. The model knows nothing about DDP/FSDP or mixed precision
policies: the Lightning strategy applies those.

Speed. The elementwise work (RMSNorm, RoPE, SwiGLU's gate) has a plain PyTorch reference
(`rms_norm`, `apply_rotary`, `swiglu`), which is what runs on a CPU and what a compiled model
traces. On a CUDA GPU an eager model trains with the same functions run through
`torch.compile` as small fused regions (`RuntimeSettings.fused_elementwise`): one kernel
each instead of several float32 round trips through memory. `compile_blocks` compiles every
block whole, attention included: the Triton kernels are custom ops, and `plan_attention`
resolves the backend before the blocks run, so nothing breaks the graph.

Long sequences. The memory of a training step grows linearly with the length when nothing
L x L is ever built (the attention kernels never do) and the large position-wise intermediates
are not kept: `RuntimeSettings.activation_checkpointing` keeps only each block's input and
recomputes the rest in the backward pass, and `RuntimeSettings.sequence_chunk` runs each block's
MLP (and the language model's head and loss) over chunks of positions, recomputed chunk by chunk
(`over_chunks`), so that the SwiGLU's (L, 2F) intermediates exist for one chunk at a time. RoPE
tables are built for the longest length seen so far, in float64 before the float32 cast (angles
of positions in the millions keep their precision). Inference with `sequence_chunk` also runs
the attention's projections and rotations in chunks (a whole chromosome in one window).

Packed documents. A batch may hold several documents per row (`cu_seqlens`, the cumulative
document lengths over the flattened B * L tokens, as `genoformer.kernels.dispatch.attention`
takes them): every layer's attention then stays inside each document and RoPE positions restart
at 0 at every document start (`document_positions`), so each document is computed exactly as if
it ran alone.

Context parallelism. While `sequence_shard` is set (`genoformer.core.context_parallel.sharded`
sets it for one step), the trunk's input is this process's part of every sequence, as
`genoformer.kernels.ring.Sharding` cuts it: RoPE rotates each token at its position in the whole
sequence, layouts are built for the whole sequence, and every layer's attention runs over the whole
sequence through the ring (`SequenceShard.attention`), so each part's outputs equal the same rows
of a forward pass over the whole sequence. The blocks receive the shard as an argument, so that a
recomputation (activation checkpointing) in the backward pass finds it.

Incremental decoding. `Transformer.decode` runs a causal dense model a few tokens at a time
with a `KVCache` (the rotated keys and the values of every block at the positions seen so far):
a prefill of the prompt into an empty cache, then any number of tokens per call that continue
it (one per step when generating; several when scoring alternatives after a shared prefix), each
costing their own tokens' work instead of a pass over the whole prefix; RoPE rotates each token
at its absolute position. The prefill runs the usual attention (causal over its tokens); a
continuation attends the cache through `genoformer.kernels.kvcache.decode_attention` (the Triton
decoding kernel on a GPU: the cache split across programs). Its logits equal the full forward
pass's at the same positions up to float rounding. The training forward does not touch it.

Shape legend (suffixes on tensor names):
    B  batch                  L  sequence length (tokens)
    E  model width (d_model)  F  SwiGLU hidden width
    H  query heads            K  key/value heads (H % K == 0)
    D  head dim               R  D // 2 (rotary frequency pairs)
    V  vocabulary size        N  packed documents in the batch (cu_seqlens has N + 1 entries)
    C  KVCache capacity (positions)   T  positions held after this decode step (T <= C)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from genoformer.core.runtime import RUNTIME_FIELDS, RuntimeSettings
from genoformer.kernels.dispatch import AttentionPlan, Backend, alibi_slopes, attention, plan_attention
from genoformer.kernels.documents import document_bounds
from genoformer.kernels.kvcache import decode_attention
from genoformer.kernels.layout import BlockLayout, LayoutSpec

if TYPE_CHECKING:
    from genoformer.core.context_parallel import SequenceShard


@dataclasses.dataclass
class TransformerConfig:
    """Architecture of a `Transformer` or another model on the trunk; every field can be set
    from YAML. How the model runs (attention kernel, recomputation, fusion, compile) is not part
    of it: see `genoformer.core.runtime.RuntimeSettings`.

    Attributes:
        vocab_size: Number of token ids of a token model (`Transformer`); None until the wing that
            owns the vocabulary sets it (GenoformerLM: the DNA alphabet). Unused by models whose
            inputs are not tokens.
        d_model: Model width E.
        n_layers: Number of transformer blocks.
        n_heads: Query heads H; the head dim is d_model // n_heads and must be even (RoPE).
        n_kv_heads: Key/value heads K for grouped-query attention (n_heads % n_kv_heads == 0);
            None: n_heads.
        mlp_hidden: SwiGLU hidden width F; None: 8/3 * d_model rounded up to a multiple of 64.
        max_seq_len: Longest sequence the model accepts in one forward pass (longer inputs: tile
            them, as `genoformer.genome.embeddings.Embedder` does).
        rope_theta: RoPE base; raise it (e.g. 500000) for contexts well beyond 8k tokens.
        rope: Rotate queries and keys by their positions (RoPE). Set it false with alibi for ALiBi
            alone (Press et al.): then nothing but the distance bias says where a token is.
        alibi: Add ALiBi's distance bias -slope_h * |i - j| to every layer's attention scores, with
            the slopes 2^(-8 (h + 1) / n_heads) of the paper (`genoformer.kernels.alibi_slopes`). The
            Triton kernels add it inside the tile loop; it combines with layouts, exact windows and
            packed documents (positions within a row). Not with context parallelism.
        dropout: Dropout on the embeddings and on each residual branch output.
        causal: Every layer attends only to earlier positions. GenoformerLM sets this from its
            objective (causal LM: True, masked LM: False), so leave it alone there.
        attention: Attention pattern per layer, repeated cyclically over the layers: None is
            dense; a layout spec (class_path from genoformer.kernels.layout) is block-sparse.
            Example: [spec, spec, spec, None] makes every fourth layer dense. A SlidingWindow with
            exact: true is a window to the token (i - window <= j <= i + window, with causal j <= i),
            which the Triton kernels run at the cost of its tokens.
        tie_embeddings: Share the input embedding matrix with the output projection.
        norm_eps: RMSNorm epsilon.
        init_std: Standard deviation of the normal weight initialisation.
    """

    vocab_size: Optional[int] = None
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None
    mlp_hidden: Optional[int] = None
    max_seq_len: int = 8192
    rope_theta: float = 10000.0
    rope: bool = True
    alibi: bool = False
    dropout: float = 0.0
    causal: bool = True
    attention: list[Optional[LayoutSpec]] = dataclasses.field(default_factory=lambda: [None])
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        self.attention = list(self.attention)
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}.")
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"head dim d_model // n_heads = {self.head_dim} must be even for rotary embeddings; "
                "change d_model or n_heads."
            )
        if self.n_heads % self.kv_heads != 0:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.kv_heads} (GQA groups).")
        if not self.attention:
            raise ValueError("attention must list at least one pattern; use [null] for all-dense layers.")
        for spec in self.attention:
            if spec is not None and not isinstance(spec, LayoutSpec):
                raise TypeError(
                    f"attention entries must be None (dense) or a LayoutSpec from "
                    f"genoformer.kernels.layout, got {type(spec).__name__}."
                )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """n_kv_heads, or n_heads when unset."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def mlp_dim(self) -> int:
        """mlp_hidden, or 8/3 * d_model rounded up to a multiple of 64 when unset."""
        return 64 * math.ceil(8 * self.d_model / 3 / 64) if self.mlp_hidden is None else self.mlp_hidden

    def pattern(self, layer: int) -> Optional[LayoutSpec]:
        """The attention pattern of block `layer` (None: dense)."""
        return self.attention[layer % len(self.attention)]

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (safe for `torch.load(weights_only=True)`), in the YAML layout:
        layout specs as {"class_path": ..., "init_args": ...}."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["attention"] = [_spec_to_dict(spec) for spec in self.attention]
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TransformerConfig:
        """Inverse of `to_dict`. Layout spec classes must already be imported (the built-in ones
        in genoformer.kernels.layout are); other modules are never imported from a checkpoint.
        Runtime settings that older checkpoints stored here are left out."""
        values = {key: value for key, value in values.items() if key not in RUNTIME_FIELDS}
        values["attention"] = [_spec_from_dict(spec) for spec in values.get("attention", [None])]
        return cls(**values)


def _spec_to_dict(spec: Any) -> Any:
    """A layout spec (or a value inside one) as plain data; specs keep their init args as
    attributes of the same names (the genoformer.kernels.layout convention)."""
    if isinstance(spec, LayoutSpec):
        cls = type(spec)
        init_args = {name: _spec_to_dict(value) for name, value in vars(spec).items()}
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_args}
    if isinstance(spec, (list, tuple)):
        return [_spec_to_dict(value) for value in spec]
    return spec


def _spec_from_dict(value: Any) -> Any:
    if isinstance(value, Mapping) and "class_path" in value:
        module_name, _, name = value["class_path"].rpartition(".")
        cls = getattr(sys.modules.get(module_name), name, None)
        if not (isinstance(cls, type) and issubclass(cls, LayoutSpec)):
            raise ValueError(
                f"layout spec {value['class_path']!r} does not name an imported LayoutSpec subclass; "
                "import the module that defines it before loading this config."
            )
        return cls(**{key: _spec_from_dict(arg) for key, arg in value.get("init_args", {}).items()})
    if isinstance(value, list):
        return [_spec_from_dict(item) for item in value]
    return value


# ------------------------------------------------------------------- elementwise work
def rms_norm(x_BLE: torch.Tensor, weight_E: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, returned in x's dtype (the reference)."""
    y_BLE = F.rms_norm(x_BLE.float(), (x_BLE.shape[-1],), weight_E.float(), eps)
    return y_BLE.to(x_BLE.dtype)


def apply_rotary(x_BHLD: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., r], x[..., r + D/2]) by angle position * theta^(-2r/D), in float32.
    The tables are (L, R) for positions 0..L-1 in every row, or (B, 1, L, R) for per-row positions
    (packed documents); they broadcast the same way."""
    x1_BHLR, x2_BHLR = x_BHLD.float().chunk(2, dim=-1)
    y_BHLD = torch.cat((x1_BHLR * cos_LR - x2_BHLR * sin_LR, x1_BHLR * sin_LR + x2_BHLR * cos_LR), dim=-1)
    return y_BHLD.to(x_BHLD.dtype)


def rotary_qk(
    q_BHLD: torch.Tensor, k_BKLD: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rotary` on queries and keys (one fused region on a GPU)."""
    return apply_rotary(q_BHLD, cos_LR, sin_LR), apply_rotary(k_BKLD, cos_LR, sin_LR)


def document_positions(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """int64 (B, L): each token's position within its packed document (0 at every document start),
    from a valid cu_seqlens (N + 1,); computed on its device without a host synchronisation."""
    starts_BL, _ = document_bounds(cu_seqlens, batch, seq_len)
    return torch.arange(seq_len, device=cu_seqlens.device) - starts_BL.long()


def swiglu(gate_up_BLF2: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for the two halves (gate, up) of the last dim."""
    gate_BLF, up_BLF = gate_up_BLF2.chunk(2, dim=-1)
    return F.silu(gate_BLF) * up_BLF


def attention_dtype(x_BLE: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in for hidden states x_BLE: autocast's when it is on, else x's."""
    device_type = x_BLE.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x_BLE.dtype


@functools.cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, fullgraph=True)


def fused(fn: Callable[..., Any], enabled: bool, x: torch.Tensor) -> Callable[..., Any]:
    """`fn` as one torch.compile region (compiled on first call per shape, then cached) when
    `enabled` and x is a CUDA tensor in a training step (autograd on) outside a compiled graph;
    else `fn` itself. Inference keeps the references: no compile pause before a short
    `genoformer embed`."""
    use = enabled and x.is_cuda and torch.is_grad_enabled() and not torch.compiler.is_compiling()
    return _compiled(fn) if use else fn


def over_chunks(fn: Callable[..., Any], chunk: Optional[int], *inputs_BL: torch.Tensor) -> Any:
    """`fn(*inputs_BL)` of a position-wise `fn` (row b, position l of its output depends only on
    row b, position l of each input), computed over chunks of at most `chunk` positions (dim 1).

    While autograd records (a training step), every chunk runs under activation checkpointing: its
    intermediates are not kept but recomputed in the backward pass, one chunk at a time (a
    selective recomputation that bounds the memory of fn's large intermediates by one chunk's).
    Outputs are tensors (B, L, ...) concatenated along dim 1, tuples of them concatenated element
    by element, or 0-d tensors summed (a loss). chunk None: fn on the whole inputs, kept as usual.
    The inputs are split with `Tensor.split`, whose backward concatenates the chunks' gradients
    once (a slice per chunk would write a whole-length gradient per chunk).
    """
    if chunk is None:
        return fn(*inputs_BL)
    recompute = torch.is_grad_enabled() and any(x.requires_grad for x in inputs_BL if x.is_floating_point())
    pieces = zip(*(x.split(chunk, dim=1) for x in inputs_BL))
    outs = [checkpoint(fn, *piece, use_reentrant=False) if recompute else fn(*piece) for piece in pieces]
    first = outs[0]
    if len(outs) == 1:
        return first
    if isinstance(first, tuple):
        return tuple(torch.cat(parts, dim=1) for parts in zip(*outs))
    if first.dim() == 0:
        return torch.stack(outs).sum()
    return torch.cat(outs, dim=1)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, returned in the input dtype."""

    def __init__(self, dim: int, eps: float, runtime: Optional[RuntimeSettings] = None) -> None:
        super().__init__()
        self.eps = eps
        self.runtime = RuntimeSettings() if runtime is None else runtime  # shared with the trunk
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLE: torch.Tensor) -> torch.Tensor:
        return fused(rms_norm, self.runtime.fused_elementwise, x_BLE)(x_BLE, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Cos/sin tables for RoPE (half-split convention), computed per device in float64 and stored
    in float32, for the longest length asked so far (rounded up to a power of two, at most
    max_seq_len): a model of a long max_seq_len holds tables only as long as its inputs."""

    def __init__(self, head_dim: int, theta: float, max_seq_len: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.max_seq_len = max_seq_len
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos_LR, sin_LR) float32 for positions 0..seq_len-1."""
        if seq_len > self.max_seq_len:
            raise ValueError(f"seq_len={seq_len} exceeds the rotary table size max_seq_len={self.max_seq_len}.")
        held = self._tables.get(device)
        if held is None or held[0].shape[0] < seq_len:
            self._tables[device] = held = self._build(
                min(self.max_seq_len, 1 << max(0, seq_len - 1).bit_length()), device
            )
        cos_LR, sin_LR = held
        return cos_LR[:seq_len], sin_LR[:seq_len]

    def cos_sin_at(self, positions_BL: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos_B1LR, sin_B1LR) float32 for per-row positions (B, L) below `length`, e.g.
        `document_positions`; they broadcast over the heads in `apply_rotary`."""
        cos_LR, sin_LR = self.cos_sin(length, positions_BL.device)
        return cos_LR[positions_BL].unsqueeze(1), sin_LR[positions_BL].unsqueeze(1)

    @torch.inference_mode(False)  # the cache is reused by training after eval under inference mode
    def _build(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # float64 angles: position * frequency in float32 loses ~0.06 rad at position 10^6
        inv_freq_R = self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angle_LR = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq_R[None, :]
        return (
            angle_LR.cos().to(device=device, dtype=torch.float32),
            angle_LR.sin().to(device=device, dtype=torch.float32),
        )


class KVCache:
    """The rotated keys and the values of every block at the positions a `Transformer.decode`
    has seen, for causal decoding one token at a time.

    Holds positions 0..length-1 of each of B rows in buffers of `capacity` positions per block,
    allocated by the prefill (the first decode into an empty cache) in the keys' dtype and on
    their device (bfloat16 under CUDA autocast): 2 * n_layers * B * K * capacity * D elements.
    `reset` empties it for a new prefill, reusing the buffers when the shape allows.
    """

    def __init__(self, capacity: int) -> None:
        """
        Args:
            capacity: the most positions it holds (at most the model's max_seq_len).
        """
        if capacity < 1:
            raise ValueError(f"KVCache capacity must be at least 1 position, got {capacity}.")
        self.capacity = capacity
        self.length = 0
        self._keys_BKCD: list[torch.Tensor] = []  # one per block
        self._values_BKCD: list[torch.Tensor] = []

    @property
    def batch(self) -> Optional[int]:
        """Rows held (None before the first prefill)."""
        return self._keys_BKCD[0].shape[0] if self._keys_BKCD else None

    def reset(self) -> None:
        """Forget every position (the next decode is a prefill)."""
        self.length = 0

    def store(self, layer: int, k_BKLD: torch.Tensor, v_BKLD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write block `layer`'s keys and values of L new positions after the `length` held and
        return all T = length + L of them, (B, K, T, D) each (views of the buffers). `advance`
        moves `length` on once every block has stored."""
        B, K, L, D = k_BKLD.shape
        start, stop = self.length, self.length + L
        if stop > self.capacity:
            raise ValueError(
                f"the KVCache holds {start} of its {self.capacity} positions, no room for {L} more; "
                "reset it and prefill the last positions again, or make a larger one."
            )
        if start == 0:  # a prefill: buffers of this shape, dtype and device
            shape = (B, K, self.capacity, D)
            if layer == len(self._keys_BKCD):
                self._keys_BKCD.append(k_BKLD.new_empty(shape))
                self._values_BKCD.append(v_BKLD.new_empty(shape))
            elif not _fits(self._keys_BKCD[layer], shape, k_BKLD):
                self._keys_BKCD[layer] = k_BKLD.new_empty(shape)
                self._values_BKCD[layer] = v_BKLD.new_empty(shape)
        keys_BKCD, values_BKCD = self._keys_BKCD[layer], self._values_BKCD[layer]
        keys_BKCD[:, :, start:stop] = k_BKLD
        values_BKCD[:, :, start:stop] = v_BKLD
        return keys_BKCD[:, :, :stop], values_BKCD[:, :, :stop]

    def advance(self, positions: int) -> None:
        """Count `positions` more as held (after every block stored them)."""
        self.length += positions

    def write_at(
        self, layer: int, position_1: torch.Tensor, k_BK1D: torch.Tensor, v_BK1D: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write block `layer`'s key and value of one new position, at the device index position_1
        (1,) int64, and return the whole buffers (B, K, C, D): what `Transformer.decode_step` reads,
        without the host knowing the position (a CUDA graph replays it). After a prefill only."""
        keys_BKCD, values_BKCD = self._keys_BKCD[layer], self._values_BKCD[layer]
        keys_BKCD.index_copy_(2, position_1, k_BK1D)
        values_BKCD.index_copy_(2, position_1, v_BK1D)
        return keys_BKCD, values_BKCD

    def repeat_rows(self, times: int) -> None:
        """Repeat every row `times` times in place (B -> B * times, row b's copies next to each
        other): one prefill of a prompt, then several samples decoded from it."""
        for buffers in (self._keys_BKCD, self._values_BKCD):
            for layer, held_BKCD in enumerate(buffers):
                B, K, C, D = held_BKCD.shape
                repeated_BKCD = held_BKCD.new_empty((B * times, K, C, D))
                repeated_BKCD[:, :, : self.length] = held_BKCD[:, :, : self.length].repeat_interleave(times, dim=0)
                buffers[layer] = repeated_BKCD


def _fits(buffer_BKCD: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> bool:
    return buffer_BKCD.shape == shape and buffer_BKCD.dtype == like.dtype and buffer_BKCD.device == like.device


class Attention(nn.Module):
    """Multi-head self-attention with grouped key/value heads and RoPE."""

    def __init__(self, config: TransformerConfig, runtime: RuntimeSettings) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        self.rope = config.rope
        self.runtime = runtime  # shared with the trunk
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def forward(
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        *,
        causal: bool,
        layout: Optional[BlockLayout],
        kv_lens_B: Optional[torch.Tensor],
        backend: Backend,
        cu_seqlens: Optional[torch.Tensor] = None,
        shard: Optional[SequenceShard] = None,
        alibi_H: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        q_BHLD, k_BKLD, v_BKLD = self.project(x_BLE, cos_LR, sin_LR)
        if shard is not None:  # context parallelism: this part's rows of the whole sequence's attention
            o_BHLD = shard.attention(q_BHLD, k_BKLD, v_BKLD, causal=causal, layout=layout, backend=backend)
            return self.merge_heads(o_BHLD)
        o_BHLD = attention(
            q_BHLD,
            k_BKLD,
            v_BKLD,
            causal=causal,
            layout=layout,
            kv_lens=kv_lens_B,
            backend=backend,
            cu_seqlens=cu_seqlens,
            alibi_slopes=alibi_H,
        )
        return self.merge_heads(o_BHLD)

    def project(
        self, x_BLE: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, L, D) and keys (B, K, L, D) rotated by the RoPE tables (unless the config
        turns RoPE off), and values (B, K, L, D).

        Without autograd and with `sequence_chunk` (inference over a long window), computed over
        chunks of positions: the float32 rotations of the reference ops then exist for one chunk."""
        chunk = self.runtime.sequence_chunk
        if chunk is not None and not torch.is_grad_enabled() and x_BLE.shape[1] > chunk and cos_LR.dim() == 2:
            parts = [
                self._project(x_BCE, cos_CR, sin_CR)
                for x_BCE, cos_CR, sin_CR in zip(x_BLE.split(chunk, 1), cos_LR.split(chunk), sin_LR.split(chunk))
            ]
            return tuple(torch.cat(heads, dim=2) for heads in zip(*parts))
        return self._project(x_BLE, cos_LR, sin_LR)

    def _project(
        self, x_BLE: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, L, _ = x_BLE.shape
        q_BHLD = self.wq(x_BLE).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k_BKLD = self.wk(x_BLE).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BKLD = self.wv(x_BLE).view(B, L, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            q_BHLD, k_BKLD = fused(rotary_qk, self.runtime.fused_elementwise, x_BLE)(q_BHLD, k_BKLD, cos_LR, sin_LR)
        return q_BHLD, k_BKLD, v_BKLD

    def merge_heads(self, o_BHLD: torch.Tensor) -> torch.Tensor:
        """The output projection of the heads' outputs (B, H, L, D): (B, L, E)."""
        B, _, L, _ = o_BHLD.shape
        return self.wo(o_BHLD.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim))

    def decode(
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        cache: KVCache,
        layer: int,
        backend: Backend,
        alibi_H: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Attention of new tokens (the tables hold their absolute positions) over the keys and
        values of block `layer` in `cache` and their own, which are added to it. A prefill (empty
        cache) is causal over its L tokens; a continuation's token i attends every cached position
        and the new ones up to its own (`decode_attention`, the causal mask aligned bottom-right;
        with ALiBi `attention`, whose causal mask and biases are aligned the same way)."""
        q_BHLD, k_BKLD, v_BKLD = self.project(x_BLE, cos_LR, sin_LR)
        prefill = cache.length == 0
        k_BKTD, v_BKTD = cache.store(layer, k_BKLD, v_BKLD)
        if prefill or alibi_H is not None:  # (decode_attention takes no ALiBi slopes)
            o_BHLD = attention(
                q_BHLD, k_BKTD, v_BKTD, causal=q_BHLD.shape[2] > 1, backend=backend, alibi_slopes=alibi_H
            )
        else:
            o_BHLD = decode_attention(q_BHLD, k_BKTD, v_BKTD, causal=True, backend=backend)
        return self.merge_heads(o_BHLD)

    def decode_step(
        self,
        x_B1E: torch.Tensor,
        cos_1R: torch.Tensor,
        sin_1R: torch.Tensor,
        cache: KVCache,
        layer: int,
        position_1: torch.Tensor,
        seqlens_B: torch.Tensor,
        backend: Backend,
    ) -> torch.Tensor:
        """`decode` of one token per row at the device position position_1, over the whole cache
        buffers with seqlens_B (B,) int32 = position + 1 keys per row: no host-side length."""
        q_BH1D, k_BK1D, v_BK1D = self.project(x_B1E, cos_1R, sin_1R)
        k_BKCD, v_BKCD = cache.write_at(layer, position_1, k_BK1D, v_BK1D)
        o_BH1D = decode_attention(q_BH1D, k_BKCD, v_BKCD, seqlens_B, causal=True, backend=backend)
        return self.merge_heads(o_BH1D)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up share one matmul."""

    def __init__(self, d_model: int, hidden: int, runtime: Optional[RuntimeSettings] = None) -> None:
        super().__init__()
        self.runtime = RuntimeSettings() if runtime is None else runtime  # shared with the trunk
        self.w_gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x_BLE: torch.Tensor) -> torch.Tensor:
        gate_up_BLF2 = self.w_gate_up(x_BLE)
        return self.w_down(fused(swiglu, self.runtime.fused_elementwise, gate_up_BLF2)(gate_up_BLF2))


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: TransformerConfig, runtime: RuntimeSettings) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps, runtime)
        self.attn = Attention(config, runtime)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps, runtime)
        self.mlp = SwiGLU(config.d_model, config.mlp_dim, runtime)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        causal: bool,
        layout: Optional[BlockLayout],
        kv_lens_B: Optional[torch.Tensor],
        backend: Backend,
        cu_seqlens: Optional[torch.Tensor] = None,
        shard: Optional[SequenceShard] = None,
        alibi_H: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        a_BLE = self.attn(
            self.attn_norm(x_BLE),
            cos_LR,
            sin_LR,
            causal=causal,
            layout=layout,
            kv_lens_B=kv_lens_B,
            backend=backend,
            cu_seqlens=cu_seqlens,
            shard=shard,
            alibi_H=alibi_H,
        )
        x_BLE = x_BLE + self.drop(a_BLE)
        return x_BLE + self.drop(over_chunks(self.mlp_branch, self.mlp.runtime.sequence_chunk, x_BLE))

    def mlp_branch(self, x_BLE: torch.Tensor) -> torch.Tensor:
        """mlp(norm(x)): position-wise (see `over_chunks`)."""
        return self.mlp(self.mlp_norm(x_BLE))

    def decode(
        self,
        x_BLE: torch.Tensor,
        cos_LR: torch.Tensor,
        sin_LR: torch.Tensor,
        cache: KVCache,
        layer: int,
        backend: Backend,
        alibi_H: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """`forward` for new tokens continuing those in `cache` (see `Attention.decode`)."""
        a_BLE = self.attn.decode(self.attn_norm(x_BLE), cos_LR, sin_LR, cache, layer, backend, alibi_H)
        x_BLE = x_BLE + self.drop(a_BLE)
        return x_BLE + self.drop(self.mlp(self.mlp_norm(x_BLE)))

    def decode_step(self, x_B1E, cos_1R, sin_1R, cache, layer, position_1, seqlens_B, backend) -> torch.Tensor:
        """`decode` of one token per row at a device position (see `Attention.decode_step`)."""
        a_B1E = self.attn.decode_step(
            self.attn_norm(x_B1E), cos_1R, sin_1R, cache, layer, position_1, seqlens_B, backend
        )
        x_B1E = x_B1E + self.drop(a_B1E)
        return x_B1E + self.drop(self.mlp(self.mlp_norm(x_B1E)))


class TransformerTrunk(nn.Module):
    """The block stack every model family shares: input vectors (B, L, E) -> hidden states.

    A family subclasses it, passes the module that turns its inputs into vectors (`embed`: token
    ids for `Transformer`, value patches for `genoformer.timeseries.model`), adds its heads and
    calls `run_blocks` on the embedded inputs. Hidden state numbering: 0 is the input embedding,
    i (1..n_layers) the output of block i; the last one (n_layers, or -1) is taken after the final
    RMSNorm, i.e. what the heads see.
    """

    _LAYOUT_CACHE_SIZE = 64

    def __init__(self, config: TransformerConfig, embed: nn.Module, runtime: Optional[RuntimeSettings] = None) -> None:
        super().__init__()
        self.config = config
        # One settings object shared by every submodule: `apply_runtime` changes it in place.
        self.runtime = RuntimeSettings() if runtime is None else dataclasses.replace(runtime)
        self.embed = embed
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, self.runtime) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps, self.runtime)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_seq_len)
        # ALiBi's slopes (H,): a buffer, so that they follow the model to its device; never saved
        self.register_buffer("alibi_H", alibi_slopes(config.n_heads) if config.alibi else None, persistent=False)
        # (pattern index, seq_len) -> layout, least recently used first; layouts live on the CPU.
        self._layouts: OrderedDict[tuple[int, int], BlockLayout] = OrderedDict()
        self._plans: dict[tuple, tuple[Optional[BlockLayout], AttentionPlan]] = {}  # see attention_plan
        self.sequence_shard: Optional[SequenceShard] = None  # context parallelism (module docstring)

    def reach(self, length: int) -> None:
        """Let this model run sequences of up to `length` tokens in one forward pass (inference over
        a window longer than max_seq_len, e.g. a whole chromosome): raises this instance's
        max_seq_len and RoPE limit, never lowers them. Positions beyond those seen in training rely
        on RoPE extrapolating; a checkpoint saved from the model would record the new limit."""
        if length > self.config.max_seq_len:
            self.config.max_seq_len = length
            self.rotary.max_seq_len = length

    def apply_runtime(self, settings: RuntimeSettings) -> None:
        """Run with `settings` from now on (the one place where runtime settings reach the model).
        Compiling is the training module's business (`compile_blocks`); this sets the rest."""
        for field in dataclasses.fields(RuntimeSettings):
            setattr(self.runtime, field.name, getattr(settings, field.name))
        self._plans.clear()

    def reset_blocks(self) -> None:
        """Normal(0, init_std) block weights; residual output projections scaled by 1/sqrt(2 n_layers)."""
        std = self.config.init_std
        for block in self.blocks:
            for linear in (block.attn.wq, block.attn.wk, block.attn.wv, block.mlp.w_gate_up):
                nn.init.normal_(linear.weight, std=std)
            for linear in (block.attn.wo, block.mlp.w_down):
                nn.init.normal_(linear.weight, std=std / math.sqrt(2 * self.config.n_layers))

    def layout(self, layer: int, seq_len: int) -> Optional[BlockLayout]:
        """Block-sparse layout of block `layer` for sequences of `seq_len` tokens (None: dense).

        Built on first use for each (distinct pattern, seq_len) and cached; any seq_len works (the
        last block row/column may be partial). Causal models get the layout without the blocks that lie
        entirely above the diagonal, so kernels skip them.
        """
        spec = self.config.pattern(layer)
        if spec is None:
            return None
        # Equal specs share one layout (and one compiled graph of a compiled model).
        index = self.config.attention.index(spec)
        key = (index, seq_len)
        if key in self._layouts:
            self._layouts.move_to_end(key)
            return self._layouts[key]
        with torch.inference_mode(False):  # cached layouts are reused by training after eval
            built = spec.build(seq_len, self.config.n_heads)
            if built.q_len != seq_len or built.kv_len != seq_len:
                raise ValueError(
                    f"{type(spec).__name__}.build({seq_len}, ...) returned a layout for "
                    f"q_len={built.q_len}, kv_len={built.kv_len}; it must be built for seq_len={seq_len}."
                )
            if self.config.causal:
                built = built.with_causal()
        self._layouts[key] = built
        if len(self._layouts) > self._LAYOUT_CACHE_SIZE:
            self._layouts.popitem(last=False)
        return built

    def attention_plan(
        self,
        layer: int,
        x_BLE: torch.Tensor,
        kv_lens_B: Optional[torch.Tensor],
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> AttentionPlan:
        """Backend and layout of block `layer`'s attention for the hidden state x_BLE, chosen
        eagerly (outside any compiled block): the attention inputs have x's shape split into
        heads and the autocast dtype when autocast is on; packed when cu_seqlens is given."""
        B, L, _ = x_BLE.shape
        device = x_BLE.device
        dtype = attention_dtype(x_BLE)
        config = self.config
        layout = self.layout(layer, L)
        # plans depend on these only (kv_lens by presence, dtype, device, shape); ~50 us each to make
        backend = self.runtime.attention_backend
        key = (backend, id(layout), B, L, dtype, device, config.causal, kv_lens_B is None, cu_seqlens is None)
        if key not in self._plans:
            plan = plan_attention(
                backend,
                batch=B,
                q_heads=config.n_heads,
                kv_heads=config.kv_heads,
                q_len=L,
                kv_len=L,
                head_dim=config.head_dim,
                dtype=dtype,
                device=device,
                causal=config.causal,
                layout=layout,
                kv_lens=kv_lens_B,
                cu_seqlens=cu_seqlens,
                alibi_slopes=self.alibi_H,
            )
            self._plans[key] = (layout, plan)  # the layout stays alive while its id is a key
            if len(self._plans) > self._LAYOUT_CACHE_SIZE:
                self._plans.pop(next(iter(self._plans)))
        return self._plans[key][1]

    def decode_blocks(self, x_BLE: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The last hidden state (after the final norm) of embedded inputs x_BLE that continue the
        positions `cache` holds (see `Transformer.decode`); their keys and values join the cache."""
        B, L, _ = x_BLE.shape
        config = self.config
        if not config.causal:
            raise ValueError(
                "decoding token by token needs a causal model; this one is bidirectional (a masked "
                "language model), which predicts masked bases from both sides and cannot extend a sequence."
            )
        if any(config.pattern(i) is not None for i in range(config.n_layers)):
            raise ValueError(
                "decoding with a KVCache runs dense attention only; this model has block-sparse layers "
                f"(attention: {config.attention}). Run the full forward pass on each prefix instead."
            )
        start = cache.length
        if start > 0 and cache.batch != B:
            raise ValueError(
                f"after the prefill, decode continues each of the {cache.batch} rows the cache holds, got tokens "
                f"of shape ({B}, {L}); pass {cache.batch} rows, or reset the cache to prefill again."
            )
        if start + L > min(cache.capacity, config.max_seq_len):
            raise ValueError(
                f"{start} cached + {L} new positions exceed the cache capacity {cache.capacity} or the "
                f"model's max_seq_len {config.max_seq_len}; reset the cache and prefill the last positions again."
            )
        cos_LR, sin_LR = self.rotary.cos_sin(start + L, x_BLE.device)
        cos_LR, sin_LR = cos_LR[start:], sin_LR[start:]  # the new tokens' absolute positions
        backend = self.runtime.attention_backend
        if start == 0:  # a prefill: the usual attention, causal over the new tokens
            backend = plan_attention(
                backend,
                batch=B,
                q_heads=config.n_heads,
                kv_heads=config.kv_heads,
                q_len=L,
                kv_len=L,
                head_dim=config.head_dim,
                dtype=attention_dtype(x_BLE),
                device=x_BLE.device,
                causal=L > 1,
                alibi_slopes=self.alibi_H,
            ).backend
        x_BLE = self.drop(x_BLE)
        for i, block in enumerate(self.blocks):
            x_BLE = block.decode(x_BLE, cos_LR, sin_LR, cache, i, backend, self.alibi_H)
        cache.advance(L)
        return self.norm(x_BLE)

    def decode_step_blocks(self, x_B1E: torch.Tensor, cache: KVCache, position_1: torch.Tensor) -> torch.Tensor:
        """`decode_blocks` of one embedded token per row at the device position position_1 (1,) int64
        (the cache's length, which the caller keeps; nothing here reads it on the host), so that a
        CUDA graph can replay the step (`genoformer.genome.generate`). The cache must have been
        prefilled with the rows x holds; the position must lie inside its capacity."""
        B = x_B1E.shape[0]
        cos_CR, sin_CR = self.rotary.cos_sin(cache.capacity, x_B1E.device)
        cos_1R, sin_1R = cos_CR.index_select(0, position_1), sin_CR.index_select(0, position_1)
        seqlens_B = (position_1 + 1).to(torch.int32).repeat(B)
        x_B1E = self.drop(x_B1E)
        for i, block in enumerate(self.blocks):
            x_B1E = block.decode_step(
                x_B1E, cos_1R, sin_1R, cache, i, position_1, seqlens_B, self.runtime.attention_backend
            )
        return self.norm(x_B1E)

    def resolve_layer(self, layer: int) -> int:
        """Hidden-state index in 0..n_layers for `layer` (negative counts from the end);
        IndexError when out of range."""
        n_states = self.config.n_layers + 1
        if not -n_states <= layer < n_states:
            raise IndexError(
                f"layer={layer} is out of range: this model has hidden states 0..{n_states - 1} "
                f"(0 = embeddings, {n_states - 1} = last block), or -{n_states}..-1 from the end."
            )
        return layer % n_states

    def run_blocks(
        self,
        x_BLE: torch.Tensor,
        lengths_B: Optional[torch.Tensor],
        last: int,
        *,
        keep_all: bool,
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> list[torch.Tensor]:
        """Hidden states 0..last of embedded inputs x_BLE (all of them with keep_all, else only
        the last). lengths_B: optional true length of each row of a right-padded batch; keys at
        positions >= lengths_B[b] are masked. cu_seqlens: optional int32 (N + 1,) packed documents
        (see the module docstring); not together with lengths_B (a row's padding is then its last
        document)."""
        B, L, _ = x_BLE.shape
        shard = self.sequence_shard
        seq_len = L if shard is None else shard.seq_len
        if seq_len > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_seq_len={self.config.max_seq_len}; tile longer "
                "sequences (genoformer.genome.embeddings.Embedder does) or raise max_seq_len in the config."
            )
        if shard is not None:
            if self.config.alibi:
                raise ValueError(
                    "context parallelism does not run ALiBi: the ring attends chunk pairs whose biases it would have "
                    "to shift per pair; train this model on one device per sequence, or with alibi: false."
                )
            shard.check_inputs(L, causal=self.config.causal, lengths_B=lengths_B, cu_seqlens=cu_seqlens)
            lengths_B = None  # causal: a query never reaches the padding after it (check_inputs refuses the rest)
        if lengths_B is not None and cu_seqlens is not None:
            raise ValueError(
                "give lengths or cu_seqlens, not both: in a packed batch a row's padding is its last "
                "document (end cu_seqlens' row with it) and lengths must be None."
            )
        kv_lens_B = None
        if lengths_B is not None:
            if lengths_B.shape != (B,):
                raise ValueError(f"lengths must have shape ({B},), got {tuple(lengths_B.shape)}.")
            kv_lens_B = lengths_B.to(device=x_BLE.device, dtype=torch.int32)
        x_BLE = self.drop(x_BLE)
        states = [x_BLE]
        if shard is not None:
            cos_LR, sin_LR = self.rotary.cos_sin_at(shard.positions(x_BLE.device)[None], seq_len)  # (1, 1, L, R) each
        elif cu_seqlens is None:
            cos_LR, sin_LR = self.rotary.cos_sin(L, x_BLE.device)
        else:
            cu_seqlens = cu_seqlens.to(x_BLE.device)
            cos_LR, sin_LR = self.rotary.cos_sin_at(document_positions(cu_seqlens, B, L), L)  # (B, 1, L, R) each
        for i in range(last):
            block = self.blocks[i]
            if shard is None:
                plan = self.attention_plan(i, x_BLE, kv_lens_B, cu_seqlens)
                layout, backend = plan.layout, plan.backend
            else:  # the ring cuts the whole sequence's layout per pair of parts and plans each pair
                layout, backend = self.layout(i, seq_len), self.runtime.attention_backend
            args = (cos_LR, sin_LR, self.config.causal, layout, kv_lens_B, backend, cu_seqlens, shard, self.alibi_H)
            if self.runtime.activation_checkpointing and self.training and torch.is_grad_enabled():
                x_BLE = checkpoint(block, x_BLE, *args, use_reentrant=False)
            else:
                x_BLE = block(x_BLE, *args)
            if i == self.config.n_layers - 1:
                x_BLE = self.norm(x_BLE)
            if keep_all:
                states.append(x_BLE)
            else:
                states[-1] = x_BLE
        return states


class Transformer(TransformerTrunk):
    """Token ids (B, L) -> logits (B, L, V); `hidden_state`/`hidden_states` for embeddings
    (numbered as in `TransformerTrunk`)."""

    def __init__(self, config: TransformerConfig, runtime: Optional[RuntimeSettings] = None) -> None:
        if config.vocab_size is None:
            raise ValueError(
                "a token model needs TransformerConfig.vocab_size; the wing that owns the vocabulary sets it "
                "(genoformer.genome.lm.GenoformerLM: the DNA alphabet's size)."
            )
        super().__init__(config, nn.Embedding(config.vocab_size, config.d_model), runtime)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by 1/sqrt(2 n_layers)."""
        std = self.config.init_std
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.normal_(self.head.weight, std=std)
        self.reset_blocks()

    def forward(
        self,
        tokens_BL: torch.Tensor,
        lengths_B: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Logits (B, L, V) for integer tokens (B, L).

        lengths_B: optional true length of each row of a right-padded batch; keys at positions
        >= lengths_B[b] are masked, so the outputs at positions < lengths_B[b] do not depend on the
        padding. Outputs at padded positions are meaningless.
        cu_seqlens: optional int32 (N + 1,) packed documents over the flattened B * L tokens (see
        the module docstring): each document's logits equal those of the document run alone.
        """
        return self.head(self.hidden_state(tokens_BL, lengths_B, layer=-1, cu_seqlens=cu_seqlens))

    def hidden_state(
        self,
        tokens_BL: torch.Tensor,
        lengths_B: Optional[torch.Tensor] = None,
        *,
        layer: int = -1,
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Hidden state (B, L, E) of one layer (see the class docstring for the numbering;
        negative indices count from the end). Stops after that layer."""
        return self._trunk(tokens_BL, lengths_B, self.resolve_layer(layer), keep_all=False, cu_seqlens=cu_seqlens)[-1]

    def hidden_states(
        self,
        tokens_BL: torch.Tensor,
        lengths_B: Optional[torch.Tensor] = None,
        *,
        cu_seqlens: Optional[torch.Tensor] = None,
    ) -> list[torch.Tensor]:
        """Hidden states of all n_layers + 1 layers, each (B, L, E)."""
        return self._trunk(tokens_BL, lengths_B, self.config.n_layers, keep_all=True, cu_seqlens=cu_seqlens)

    def decode(self, tokens_BL: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, L, V) of tokens that continue the positions `cache` holds, at positions
        cache.length .. cache.length + L - 1; their keys and values join the cache.

        Causal models with dense attention only. First a prefill: an empty cache (new, or after
        `reset`) and the prompt, any L up to the cache's capacity; then calls that continue every
        row the cache holds by L more tokens (L = 1 per generated token; more to score several
        continuations of one prefix after `KVCache.repeat_rows`), each costing its own tokens'
        work. The logits equal those of `forward` on all the tokens so far at the same positions,
        up to float rounding. Run it in eval mode under torch.inference_mode (or no_grad).
        """
        _check_tokens(tokens_BL)
        return self.head(self.decode_blocks(self.embed(tokens_BL.long()), cache))

    def decode_step(self, tokens_B1: torch.Tensor, cache: KVCache, position_1: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) of one token per row at the device position position_1 (1,) int64, which
        must equal cache.length: `decode` of one token without reading the length on the host, so
        that a CUDA graph replays it. The caller advances `cache` (`KVCache.advance(1)`) and the
        position. The logits are `decode`'s."""
        return self.head(self.decode_step_blocks(self.embed(tokens_B1), cache, position_1))

    def _trunk(
        self,
        tokens_BL: torch.Tensor,
        lengths_B: Optional[torch.Tensor],
        last: int,
        *,
        keep_all: bool,
        cu_seqlens: Optional[torch.Tensor],
    ) -> list[torch.Tensor]:
        _check_tokens(tokens_BL)
        return self.run_blocks(self.embed(tokens_BL.long()), lengths_B, last, keep_all=keep_all, cu_seqlens=cu_seqlens)


def _check_tokens(tokens_BL: torch.Tensor) -> None:
    if tokens_BL.ndim != 2 or tokens_BL.is_floating_point() or tokens_BL.is_complex():
        raise TypeError(
            f"tokens must be an integer tensor of shape (batch, length), got {tuple(tokens_BL.shape)} "
            f"{tokens_BL.dtype}; encode sequences with genoformer.data.genome.alphabet.encode."
        )


def compile_blocks(model: TransformerTrunk, backend: str = "inductor", mode: Optional[str] = None) -> None:
    """Compile every block of `model` and its final norm in place with torch.compile.

    `nn.Module.compile` keeps parameter names, so checkpoints stay as they are. Blocks share
    one compiled graph per kind of layer (dense or a layout; training or evaluation) with the
    attention kernels inside it. The first step compiles (tens of seconds on a GPU). `backend`
    is torch.compile's (the tests use "aot_eager", which skips code generation); `mode` is
    torch.compile's too ("reduce-overhead": CUDA graphs, `RuntimeSettings.cuda_graphs`).
    """
    # Compiled modules share the frame of nn.Module._call_impl: one cache entry per kind of layer,
    # train or eval, and shape. The default limit of 8 would send a long run back to eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for block in model.blocks:
        block.compile(backend=backend, mode=mode)
    model.norm.compile(backend=backend, mode=mode)
