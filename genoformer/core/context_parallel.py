"""Context parallelism (CP): every sequence split over several processes, each holding one part.

A 1M-token window does not fit one GPU's activations; with CP the `cp` processes of a group
each hold 1/cp of it, and the layers' attention runs over the whole sequence through a ring
(`genoformer.kernels.ring`): keys and values travel from process to process, partial results
merge by log-sum-exp. Everything else in a transformer works position by position and runs on
the part as it is.

The processes: W = dp x cp ranks in a `torch.distributed.DeviceMesh` with dimensions ("dp",
"cp"), cp innermost, as torchtitan lays out its meshes: ranks g * cp .. g * cp + cp - 1 form
replica g, whose processes share every window, and the dp replicas train on different windows.

One step, applied in one place (`ContextParallelStrategy`, a Lightning strategy chosen in YAML
with `context_parallel: N`); the model code stays single-device:

- data: each process reads only its part of each window from the store (GenomeDataModule asks
  the strategy, `genoformer.data.genome.datamodule.WindowSplit`), and samples are sharded over
  the dp replicas;
- sharding: `sequence_sharding` cuts a sequence as the ring expects (`kernels.ring.Sharding`):
  zigzag for causal models (process r holds chunks r and 2 cp - 1 - r of 2 cp, so that each
  does the same causal work), chunk bounds on the block size of every block-sparse layer, equal
  parts;
- model: while `sharded` has set the trunk's `sequence_shard`, RoPE rotates each token at its
  position in the whole sequence and each layer's attention is `SequenceShard.attention`, the ring
  over the cp group with the whole sequence's layout (genoformer.core.transformer);
- loss: the language model's targets are the next token in the whole sequence
  (`SequenceShard.next_tokens`, which gathers the group's tokens: one byte per position), and its
  loss sum and target count are summed over the group (`SequenceShard.sum`: every part's in the
  value, this part's in the gradient), so every process reports the one-process loss;
- gradients: DDP over all W ranks with a communication hook that sums over the cp processes
  (each holds its part's share of one sequence's gradient) and averages over the dp replicas.

Why not torch.distributed.tensor.experimental.context_parallel. It routes only
F.scaled_dot_product_attention, through DTensor dispatch of the CUDA flash / efficient / cuDNN
SDPA ops; on a CPU it stops at `aten._scaled_dot_product_flash_attention_for_cpu`, which has no
sharding strategy (checked with torch 2.13 on two gloo processes). Its ring
(`_templated_ring_attention`) is private, calls ops with the signature of aten's SDPA forward
and backward, knows masks only as is_causal true/false/skip, and balances only causal
sequences (head-tail chunks). Our kernels (block-sparse layouts, Triton) would need that
signature and a layout cut per pair of chunks. ring-flash-attn calls flash-attn's CUDA
functions directly, also without layouts. So the engine we build on is PyTorch's process-group
machinery (DeviceMesh, DDP and its communication hooks, Lightning's DDP strategy), and the ring
is ours (kernels/ring.py), which runs every backend of `genoformer.kernels.attention`.

Not yet: FSDP x CP (Lightning refuses FSDP without a GPU, so it waits for the GPU part), packed
documents and key padding of bidirectional models across parts (the ring has neither),
prediction (embeddings) under CP.

Shape legend: B batch, L whole sequence, P this process's part of it (positions), H / K query /
key-value heads, D head dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from genoformer.core.transformer import TransformerTrunk
from genoformer.kernels.dispatch import Backend
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.ring import Sharding, ring_attention


def sequence_sharding(trunk: TransformerTrunk, seq_len: int, parts: int) -> Sharding:
    """How `trunk` cuts a sequence of `seq_len` tokens over `parts` processes: zigzag when it is
    causal, chunk bounds on multiples of every block-sparse layer's block size, equal parts (so
    that each process knows the whole length from its own part). ValueError saying what to change
    when seq_len does not divide so."""
    block_sizes = {
        layout.block_size
        for layout in (trunk.layout(i, seq_len) for i in range(trunk.config.n_layers))
        if layout is not None
    }
    granule = math.lcm(1, *block_sizes)
    sharding = Sharding(seq_len, parts, zigzag=trunk.config.causal, granule=granule)
    step = sharding.num_chunks * granule
    if seq_len % step:
        raise ValueError(
            f"a sequence of {seq_len} tokens cannot be cut into {parts} equal parts of whole "
            f"{sharding.num_chunks} chunks{' (zigzag: two per process)' if sharding.zigzag else ''} of "
            f"{granule}-token blocks: use a window that is a multiple of {step} (e.g. "
            f"{max(step, seq_len // step * step)}), or another context_parallel."
        )
    return sharding


class _SumOverGroup(torch.autograd.Function):
    """The value summed over a process group; the gradient flows to this process's value only."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        total = value.detach().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


@dataclasses.dataclass(frozen=True)
class SequenceShard:
    """This process's part of every sequence of a batch, and what the model does with it.

    Attributes:
        sharding: how the whole sequence is cut (`sequence_sharding`).
        rank: this process's rank in `group` (its part: `sharding.chunks(rank)`).
        group: the processes that hold the parts of the same sequences (the mesh's "cp" group).
    """

    sharding: Sharding
    rank: int
    group: dist.ProcessGroup

    @property
    def seq_len(self) -> int:
        """L: the whole sequence."""
        return self.sharding.seq_len

    @property
    def part_len(self) -> int:
        """P: the positions of this process's part."""
        return self.sharding.length(self.rank)

    def positions(self, device: torch.device) -> torch.Tensor:
        """(P,) int64: each token's position in the whole sequence (what RoPE rotates by)."""
        return self.sharding.positions(self.rank, device)

    def check_inputs(
        self, part_len: int, *, causal: bool, lengths_B: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor]
    ) -> None:
        """ValueError, saying what to do, for inputs a part cannot run: another part length,
        packed documents, or key padding of a bidirectional model (the ring has neither yet;
        a causal model needs no key padding, since no query reaches the padding after it)."""
        if part_len != self.part_len:
            raise ValueError(
                f"this process holds a part of {part_len} positions, its sharding {self.part_len} "
                f"(part {self.rank} of a {self.seq_len}-token sequence); shard inputs with SequenceShard.shard."
            )
        if cu_seqlens is not None:
            raise ValueError(
                "packed documents (cu_seqlens) cannot run context-parallel yet: the ring keeps no "
                "documents apart; train without packing (data pack: false)."
            )
        if lengths_B is not None and not causal:
            raise ValueError(
                "key padding (lengths) of a bidirectional model cannot run context-parallel yet: the "
                "ring has no key padding; use whole windows, or evaluate on one process."
            )

    def shard(self, whole: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This process's part of `whole`, which holds the whole sequence along `dim`."""
        return self.sharding.shard(whole, self.rank, dim)

    def gather(self, part: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The whole sequence along `dim` from every process's part (all-gather over the group)."""
        parts = [torch.empty_like(part) for _ in range(self.sharding.world)]
        dist.all_gather(parts, part.contiguous(), group=self.group)
        return self.sharding.unshard(parts, dim)

    def next_tokens(self, tokens_BP: torch.Tensor, fill: int) -> torch.Tensor:
        """(B, P): for each token of the part, the token after it in the whole sequence (`fill`
        after the last), which may lie in another process's part. Gathers the whole (B, L) tokens."""
        whole_BL = self.gather(tokens_BP)
        next_BL = torch.cat([whole_BL[:, 1:], whole_BL.new_full((whole_BL.shape[0], 1), fill)], dim=1)
        return self.shard(next_BL)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the group; its gradient reaches this process's value only (each
        process backpropagates its own part's share of the sum)."""
        return _SumOverGroup.apply(value, self.group)

    def attention(
        self,
        q_BHPD: torch.Tensor,
        k_BKPD: torch.Tensor,
        v_BKPD: torch.Tensor,
        *,
        causal: bool,
        layout: Optional[BlockLayout],
        backend: Backend,
    ) -> torch.Tensor:
        """This part's rows (B, H, P, D) of attention over the whole sequence (`layout` built for
        it), through the ring over the group."""
        return ring_attention(
            q_BHPD,
            k_BKPD,
            v_BKPD,
            group=self.group,
            sharding=self.sharding,
            causal=causal,
            layout=layout,
            backend=backend,
        )


@contextlib.contextmanager
def sharded(trunk: TransformerTrunk, shard: SequenceShard) -> Iterator[None]:
    """Run `trunk` (and the loss of the module around it) on parts of sequences while inside."""
    if trunk.sequence_shard is not None:
        raise RuntimeError("the trunk already runs on a sequence shard; steps do not nest.")
    trunk.sequence_shard = shard
    try:
        yield
    finally:
        trunk.sequence_shard = None


def _sum_parts_mean_replicas(replicas, bucket):  # DDP checks annotations against its classes: none here
    """DDP communication hook (replicas: int, bucket: dist.GradBucket -> Future[Tensor]): a
    bucket's gradients summed over every process and divided by the number of dp replicas, i.e.
    summed over the parts of a sequence and averaged over the replicas."""
    tensor = bucket.buffer().div_(replicas)
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda future: future.value()[0])


class ContextParallelStrategy(DDPStrategy):
    """DDP x CP: `context_parallel` processes share every sequence (see the module docstring).

    Add it to a GPU config (configs/genome_256k_cp_gpu.yaml does) with
    `trainer.strategy: {class_path: genoformer.core.context_parallel.ContextParallelStrategy,
    init_args: {context_parallel: N}}`; `trainer.devices` x `trainer.num_nodes` must be a
    multiple of N. The data module must be one that reads parts of windows (GenomeDataModule
    does, asking this strategy); the module's `model` a `TransformerTrunk`.
    """

    def __init__(self, context_parallel: int = 2, **kwargs: Any) -> None:
        """
        Args:
            context_parallel: Processes that share every sequence (cp), each holding 1/cp of it.
            kwargs: DDPStrategy's arguments (gradient_as_bucket_view, timeout, ...); not
                ddp_comm_hook, which this strategy sets.
        """
        if isinstance(context_parallel, bool) or not isinstance(context_parallel, int) or context_parallel < 1:
            raise ValueError(
                f"context_parallel must be a positive int (processes per sequence), got {context_parallel!r}."
            )
        if kwargs.get("ddp_comm_hook") is not None:
            raise ValueError(
                "ContextParallelStrategy sets its own DDP communication hook (sum over the parts, "
                "mean over replicas); leave ddp_comm_hook out."
            )
        super().__init__(**kwargs)
        self.context_parallel = context_parallel
        self.mesh: Optional[DeviceMesh] = None
        self._shardings: dict[int, Sharding] = {}

    # ------------------------------------------------------------------ processes
    def setup_environment(self) -> None:
        super().setup_environment()  # the default process group
        world, cp = self.world_size, self.context_parallel
        if world % cp:
            raise ValueError(
                f"context_parallel={cp} needs a multiple of {cp} processes, this run has {world}: set "
                f"trainer.devices (times trainer.num_nodes) to a multiple of {cp}, or context_parallel to a "
                f"divisor of {world}."
            )
        self.mesh = init_device_mesh(self.root_device.type, (world // cp, cp), mesh_dim_names=("dp", "cp"))

    def _mesh(self) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("the context-parallel mesh exists once the trainer has started its processes.")
        return self.mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        replica, replicas = self.sample_replica()
        return {"num_replicas": replicas, "rank": replica}

    def setup(self, trainer: Any) -> None:
        if trainer.state.fn == TrainerFn.PREDICTING:
            raise ValueError(
                "prediction (embeddings) does not run context-parallel yet; predict on one device "
                "(--trainer.strategy auto --trainer.devices 1) with a window that fits it."
            )
        super().setup(trainer)

    def configure_ddp(self) -> None:
        super().configure_ddp()
        self.model.register_comm_hook(self._mesh()["dp"].size(), _sum_parts_mean_replicas)

    # ------------------------------------------------------------------ data (WindowSplit)
    def sample_replica(self) -> tuple[int, int]:
        """(replica, replicas): this process's dp rank and the dp size."""
        dp = self._mesh()["dp"]
        return dp.get_local_rank(), dp.size()

    def window_part(self, window: int) -> tuple[tuple[int, int], ...]:
        """The positions of a `window`-token window this process reads (its chunks)."""
        return self._sharding(window).chunks(self._mesh()["cp"].get_local_rank())

    def _sharding(self, seq_len: int) -> Sharding:
        if seq_len not in self._shardings:
            self._shardings[seq_len] = sequence_sharding(self._trunk(), seq_len, self.context_parallel)
        return self._shardings[seq_len]

    def _trunk(self) -> TransformerTrunk:
        trunk = getattr(self.lightning_module, "model", None)
        if not isinstance(trunk, TransformerTrunk):
            raise TypeError(
                f"context parallelism runs modules whose `model` is a TransformerTrunk (GenoformerLM), "
                f"got {type(self.lightning_module).__name__}."
            )
        return trunk

    # ------------------------------------------------------------------ steps
    def sequence_shard(self, batch: Any) -> SequenceShard:
        """The shard of a batch whose "tokens" (B, P) are this process's parts."""
        tokens = batch.get("tokens") if isinstance(batch, Mapping) else None
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
            raise TypeError(
                "context parallelism trains on token batches ({'tokens': (B, P), ...}, as "
                "GenomeDataModule gives them); this batch has none."
            )
        cp = self._mesh()["cp"]
        return SequenceShard(
            self._sharding(tokens.shape[1] * self.context_parallel), cp.get_local_rank(), cp.get_group()
        )

    @contextlib.contextmanager
    def _step(self, batch: Any) -> Iterator[None]:
        with sharded(self._trunk(), self.sequence_shard(batch)):
            yield

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._step(args[0]):
            return super().training_step(*args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._step(args[0]):
            return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._step(args[0]):
            return super().test_step(*args, **kwargs)
