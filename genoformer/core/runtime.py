"""How a model runs, apart from what it is: one settings object, applied in one place.

A `TransformerConfig` describes the architecture (widths, layers, attention patterns); it is
what checkpoints store. `RuntimeSettings` says how to run that architecture on this machine:
which attention kernel, whether to recompute activations, whether to fuse the elementwise work
or compile the blocks. The same weights run under any settings, so checkpoints never store them
and the config (or command line) that loads a checkpoint always chooses them:

    genoformer validate --config C.yaml --ckpt_path last --model.init_args.runtime.attention_backend sdpa

Both training modules (`genoformer.genome.lm.GenoformerLM`, `genoformer.timeseries.module.
TimeSeriesForecaster`) take `runtime` and hand it to their trunk through `TransformerTrunk.
apply_runtime`; the inference classes (`Embedder`, `Scorer`, `Forecaster`) build inference settings
with `RuntimeSettings.for_inference`. Training precision is the trainer's (`trainer.precision`);
inference precision is the inference policy's (`genoformer.core.inference`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from genoformer.kernels.dispatch import Backend

RUNTIME_FIELDS = ("attention_backend", "activation_checkpointing", "fused_elementwise", "compile")
"""Names of the settings; checkpoints written before the settings had their own object stored
the first three inside the architecture, and `TransformerConfig.from_dict` drops them."""


@dataclasses.dataclass
class RuntimeSettings:
    """How to run a model (YAML: `model.init_args.runtime`); never saved into a checkpoint.

    Attributes:
        attention_backend: Attention kernel (genoformer.kernels.dispatch.Backend), written as users
            write it: auto, triton, sdpa, torch, flash_attn, flash_attn_4, ... in any case. auto
            picks per device and input, and logs why.
        activation_checkpointing: Recompute each block's activations in the backward pass (less
            memory, about 30% more compute). Training only.
        fused_elementwise: On CUDA, run RMSNorm, RoPE and the SwiGLU gate (and the language
            model's loss) of an eager model's training steps as small torch.compile'd regions
            (compiled on first use, a few seconds); False runs the plain PyTorch reference ops.
            No effect on a CPU, in inference or inside a compiled model.
        compile: Compile every transformer block with torch.compile when training or evaluating
            through a Trainer: faster steps after a first step that compiles (tens of seconds on
            a GPU); the attention kernels run inside the compiled graph.
    """

    attention_backend: Backend = Backend.AUTO
    activation_checkpointing: bool = False
    fused_elementwise: bool = True
    compile: bool = False

    def __post_init__(self) -> None:
        self.attention_backend = Backend(self.attention_backend)

    @classmethod
    def for_inference(cls, backend: Backend | str = Backend.AUTO) -> RuntimeSettings:
        """Settings for running trained weights: the given backend, nothing recomputed or compiled."""
        return cls(attention_backend=Backend(backend), activation_checkpointing=False, compile=False)

    @classmethod
    def from_mapping(cls, values: RuntimeSettings | Mapping[str, Any] | None) -> RuntimeSettings:
        """`values` as settings: a RuntimeSettings as it is, a mapping of its fields, None the defaults."""
        if values is None:
            return cls()
        if isinstance(values, RuntimeSettings):
            return values
        unknown = sorted(set(values) - set(RUNTIME_FIELDS))
        if unknown:
            raise ValueError(f"unknown runtime settings {unknown}; the settings are {list(RUNTIME_FIELDS)}")
        return cls(**values)
