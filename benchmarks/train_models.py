"""The models `benchmarks/train.py` trains: genoformer's, built as `genoformer fit` builds it, and the
plain-PyTorch anchor of the same architecture (SDPA FlashAttention-2 or FlexAttention).

Shape legend: B batch, L tokens, E width, H heads, D head dim, F SwiGLU hidden width, V vocabulary,
R = D // 2 rotary pairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from genoformer.kernels.layout import BlockLayout
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from benchmarks.common import argv, flex_block_mask
from genoformer.core.transformer import RotaryEmbedding, TransformerConfig, apply_rotary
from genoformer.genome.lm import GenoformerLM
from genoformer.shipped import compose_config
from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"
WINDOW_CONFIG = CONFIGS / "genome_8k_gpu.yaml"
"""Its `model.transformer.attention` is the sliding-window pattern the benchmark runs."""
REFERENCE_CONFIG = CONFIGS / "models" / "reference_85m.yaml"
"""The reference model's sizes, as the long-context configs include them."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The sizes of a benchmark model."""

    d_model: int
    n_layers: int
    n_heads: int

    @classmethod
    def from_config(cls, path: Path) -> Architecture:
        """The sizes a config file (or a fragment) sets in `model.transformer`."""
        transformer = compose_config(path)["model"]["transformer"]
        return cls(**{field.name: transformer[field.name] for field in dataclasses.fields(cls)})


REFERENCE = Architecture.from_config(REFERENCE_CONFIG)
SMOKE = Architecture(d_model=64, n_layers=2, n_heads=2)


def base_config(context: int) -> Path:
    """The shipped config a run at `context` tokens starts from: its own where one exists."""
    tag = f"{context // 1024}k"
    own = CONFIGS / f"genome_{tag}_gpu.yaml"
    return own if context >= 32768 and own.is_file() else WINDOW_CONFIG


def window_pattern() -> list:
    """configs/genome_8k_gpu.yaml's attention list (layout specs as YAML mappings, null = dense)."""
    return compose_config(WINDOW_CONFIG)["model"]["transformer"]["attention"]


def fit_arguments(
    arch: Architecture, context: int, batch: int, window: bool, compiled: bool, fused: bool, checkpointing: bool = False
) -> list[str]:
    """The `genoformer fit` arguments of one benchmark model (the config first, then overrides).
    Values that are null (dense layers, no grouped heads) travel in an inline second config: the
    model's class_path mode takes no null from a single command-line option."""
    pattern = window_pattern() if window else [None]
    nulls = {"model": {"transformer": {"attention": pattern, "n_kv_heads": None}}}
    return argv(
        "--config {config} --config {nulls} --model.transformer.d_model {width} --model.transformer.n_layers {layers} "
        "--model.transformer.n_heads {heads} --model.transformer.max_seq_len {context} "
        "--model.runtime.fused_elementwise {fused} --model.runtime.activation_checkpointing {checkpointing} "
        "--model.runtime.compile {compiled} --data.init_args.batch_size {batch}",
        config=base_config(context).relative_to(REPO_ROOT),
        nulls=json.dumps(nulls),
        width=arch.d_model,
        layers=arch.n_layers,
        heads=arch.n_heads,
        context=context,
        fused=str(fused).lower(),
        checkpointing=str(checkpointing).lower(),
        compiled=str(compiled).lower(),
        batch=batch,
    )


def build_genoformer(arguments: list[str]) -> GenoformerLM:
    """The LightningModule exactly as `genoformer fit ARGUMENTS` builds it (on the CPU, fp32);
    config paths are relative to the repository root, wherever this runs from."""
    arguments = [
        str(REPO_ROOT / value)
        if previous == "--config" and not value.startswith("{") and not Path(value).is_absolute()
        else value
        for previous, value in zip([None, *arguments], arguments)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        cli = training_cli(
            arguments
            + argv(
                "--trainer.accelerator cpu --trainer.precision 32-true --trainer.default_root_dir {tmp} "
                "--data.init_args.store {store} --model.total_steps 1000",
                tmp=tmp,
                store=f"{tmp}/store.zarr",
            ),
            run=False,
        )
    return cli.model


# ------------------------------------------------------------------------ the plain anchor
class PlainBlock(nn.Module):
    """Pre-norm block written plainly: RMSNorm, RoPE (float32), attention, SwiGLU."""

    def __init__(self, config: TransformerConfig, attention: str, flex) -> None:
        super().__init__()
        E, F_ = config.d_model, config.mlp_dim
        self.n_heads, self.head_dim, self.attention, self.flex = config.n_heads, config.head_dim, attention, flex
        self.attn_norm, self.mlp_norm = nn.RMSNorm(E, eps=config.norm_eps), nn.RMSNorm(E, eps=config.norm_eps)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(E, E, bias=False) for _ in range(4))
        self.w_gate_up, self.w_down = nn.Linear(E, 2 * F_, bias=False), nn.Linear(F_, E, bias=False)

    def forward(
        self, x_BLE: torch.Tensor, cos_LR: torch.Tensor, sin_LR: torch.Tensor, block_mask: Optional[BlockMask]
    ) -> torch.Tensor:
        B, L, E = x_BLE.shape
        h_BLE = self.attn_norm(x_BLE)
        q_BHLD, k_BHLD, v_BHLD = (
            w(h_BLE).view(B, L, self.n_heads, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        q_BHLD, k_BHLD = apply_rotary(q_BHLD, cos_LR, sin_LR), apply_rotary(k_BHLD, cos_LR, sin_LR)
        if self.attention == "flex":
            o_BHLD = self.flex(q_BHLD, k_BHLD, v_BHLD, block_mask=block_mask)
        elif self.attention == "math":
            with sdpa_kernel([SDPBackend.MATH]):
                o_BHLD = F.scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, is_causal=True)
        else:  # the caller restricts SDPA to FlashAttention-2 on a GPU (sdpa_flash_only)
            o_BHLD = F.scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, is_causal=True)
        x_BLE = x_BLE + self.wo(o_BHLD.transpose(1, 2).reshape(B, L, E))
        gate_BLF, up_BLF = self.w_gate_up(self.mlp_norm(x_BLE)).chunk(2, dim=-1)
        return x_BLE + self.w_down(F.silu(gate_BLF) * up_BLF)


class PlainDecoder(nn.Module):
    """The anchor: genoformer's architecture (same parameter count) in plain PyTorch, causal LM.

    attention "sdpa": SDPA's FlashAttention-2, causal (it has no sliding window: window patterns
    run dense causal there). "math": SDPA's math backend (the L x L scores in memory; the
    memory probe). "flex": FlexAttention with a BlockMask per layer built from the same layouts
    genoformer runs; `flex` is the flex_attention callable (compiled for an eager model, plain
    inside a compiled one).
    """

    def __init__(self, config: TransformerConfig, attention: str, flex=flex_attention) -> None:
        super().__init__()
        self.config, self.attention = config, attention
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(PlainBlock(config, attention, flex) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.embed.weight
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_seq_len)
        self._masks: dict[tuple[int, int], BlockMask] = {}
        for weight in self.parameters():
            if weight.ndim > 1:
                nn.init.normal_(weight, std=config.init_std)

    def block_mask(self, layer: int, seq_len: int, device: torch.device) -> Optional[BlockMask]:
        """Flex's BlockMask of block `layer` (None for the SDPA kinds)."""
        if self.attention != "flex":
            return None
        spec = self.config.pattern(layer)
        key = (-1 if spec is None else self.config.attention.index(spec), seq_len)
        if key not in self._masks:
            layout = BlockLayout.dense(seq_len, block_size=128) if spec is None else spec.build(seq_len, 1)
            self._masks[key] = flex_block_mask(layout, True, self.config.n_heads, device)
        return self._masks[key]

    def loss(self, tokens_BL: torch.Tensor) -> torch.Tensor:
        tokens_BL = tokens_BL.long()
        B, L = tokens_BL.shape
        x_BLE = self.embed(tokens_BL)
        cos_LR, sin_LR = self.rotary.cos_sin(L, x_BLE.device)
        for i, block in enumerate(self.blocks):
            x_BLE = block(x_BLE, cos_LR, sin_LR, self.block_mask(i, L, x_BLE.device))
        logits_BLV = self.head(self.norm(x_BLE))[:, :-1]
        return F.cross_entropy(logits_BLV.reshape(-1, logits_BLV.shape[-1]).float(), tokens_BL[:, 1:].reshape(-1))


def sdpa_flash_only() -> None:
    """Let SDPA run only its FlashAttention-2 backend on CUDA (eager and compiled alike); the math
    probe still picks its own backend inside `sdpa_kernel`."""
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)


def parameter_count(model: nn.Module) -> int:
    """Parameters, tied weights once."""
    return sum(p.numel() for p in model.parameters())


def model_flops_per_token(config: TransformerConfig, parameters: int, seq_len: int, window: bool) -> float:
    """Training FLOPs per token: 6 x parameters + 12 x E x (mean keys per query) per layer.

    With causal dense attention the mean is (L + 1) / 2, which gives the issue's 6 N + 6 n_layers
    E L; with a layout it counts the allowed pairs (whole blocks, the diagonal ones half).
    """
    per_layer = []
    for layer in range(config.n_layers):
        spec = config.pattern(layer) if window else None
        if spec is None:
            mean_keys = (seq_len + 1) / 2
        else:
            layout = spec.build(seq_len, 1).with_causal()
            bs = layout.block_size
            mask_MN = layout.mask[0]
            diagonal = int(mask_MN.diagonal().sum())
            mean_keys = ((int(mask_MN.sum()) - diagonal) * bs * bs + diagonal * bs * (bs + 1) / 2) / seq_len
        per_layer.append(12 * config.d_model * mean_keys)
    return 6 * parameters + sum(per_layer)


def check_flops_formula(config: TransformerConfig, parameters: int, seq_len: int) -> None:
    """The causal-dense count equals the issue's formula (a guard against drift)."""
    issue = 6 * parameters + 6 * config.n_layers * config.d_model * seq_len
    ours = model_flops_per_token(config, parameters, seq_len, window=False)
    if not math.isclose(ours, issue, rel_tol=1e-3):
        raise AssertionError(f"FLOPs per token {ours:.4g} differ from the issue's formula {issue:.4g}")
