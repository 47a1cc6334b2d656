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
from typing import Any, Optional

from genoformer.kernels.dispatch import Backend

RUNTIME_FIELDS = (
    "attention_backend",
    "activation_checkpointing",
    "fused_elementwise",
    "compile",
    "sequence_chunk",
    "cuda_graphs",
)
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
            memory, about 30% more compute): a step keeps only each block's input. Training only.
        fused_elementwise: On CUDA, run RMSNorm, RoPE and the SwiGLU gate (and the language
            model's loss) of an eager model's training steps as small torch.compile'd regions
            (compiled on first use, a few seconds); False runs the plain PyTorch reference ops.
            No effect on a CPU, in inference or inside a compiled model.
        compile: Compile every transformer block with torch.compile when training or evaluating
            through a Trainer: faster steps after a first step that compiles (tens of seconds on
            a GPU); the attention kernels run inside the compiled graph.
        sequence_chunk: Tokens per chunk of the position-wise parts: each block's MLP (with its
            norm) and the language model's output head and loss run over chunks of at most this
            many positions, and in training each chunk is recomputed in the backward pass, so that
            their largest intermediates (the SwiGLU's (L, 2F), the logits and their float32
            softmax) exist for one chunk at a time and are never kept. None: the whole sequence at
            once, intermediates kept. With activation_checkpointing it is what keeps the memory of
            a step linear in the length with a small slope (docs/long_context.md); alone it is a
            selective recomputation of the MLPs. Results equal the unchunked ones up to float
            rounding. Inference runs the same chunks (bounded memory over a whole chromosome).
        cuda_graphs: With compile, the compiled blocks record CUDA graphs and replay them
            (torch.compile's "reduce-overhead" mode): one launch per block instead of one per
            kernel, for small models whose steps the host's launches hold back. Needs fixed
            shapes (a recording per shape) and memory for the recorded buffers; no effect
            without compile.
    """

    attention_backend: Backend = Backend.AUTO
    activation_checkpointing: bool = False
    fused_elementwise: bool = True
    compile: bool = False
    sequence_chunk: Optional[int] = None
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        self.attention_backend = Backend(self.attention_backend)
        if self.sequence_chunk is not None and (
            isinstance(self.sequence_chunk, bool) or not isinstance(self.sequence_chunk, int) or self.sequence_chunk < 1
        ):
            raise ValueError(
                f"sequence_chunk must be a positive number of tokens or null (no chunks), got "
                f"{self.sequence_chunk!r}; e.g. 65536"
            )

    @classmethod
    def for_inference(
        cls, backend: Backend | str = Backend.AUTO, sequence_chunk: Optional[int] = None
    ) -> RuntimeSettings:
        """Settings for running trained weights: the given backend, nothing recomputed or compiled;
        `sequence_chunk` as the field (long windows: bounded memory)."""
        return cls(
            attention_backend=Backend(backend),
            activation_checkpointing=False,
            compile=False,
            sequence_chunk=sequence_chunk,
        )

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
