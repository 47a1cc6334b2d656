"""Context-parallel runs on CPU processes (gloo), run by test_context_parallel.py:
`python context_parallel_script.py OUT_DIR STORE`.

One fresh interpreter imports everything once, then forks the workers of each run (no second
import), which talk over gloo on localhost:

- numerics: 3 processes. A tiny language model's loss and gradients on the whole batch in every
  process (float64), then the same batch context-parallel over 2 processes (ranks 0 and 1) and over
  3, for each model of `CASES`; writes OUT_DIR/numerics.pt.
- fit: 4 processes, 2 data-parallel replicas x 2 context-parallel parts, fit through
  ContextParallelStrategy on the lambda phage STORE: 2 steps with a checkpoint after each, then a
  run resumed from the first checkpoint; plus the first step's gradients of one process on the
  same two windows. Writes OUT_DIR/fit.pt.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from genoformer.data.genome.alphabet import VOCAB_SIZE
from genoformer.data.genome.datamodule import GenomeDataModule
from genoformer.data.splits import SplitSpec
from genoformer.kernels.layout import SlidingWindow
from lightning.pytorch.callbacks import ModelCheckpoint

from genoformer.core.context_parallel import ContextParallelStrategy, SequenceShard, sequence_sharding, sharded
from genoformer.core.transformer import TransformerConfig
from genoformer.genome.lm import GenoformerLM, Objective

SEQ_LEN = 192  # 2 and 3 processes cut it into zigzag chunks of whole 16-token blocks
SLIDING = SlidingWindow(window=32, block_size=16)
CASES = {
    "causal_dense": (Objective.CAUSAL_LM, [None]),
    "causal_block_sparse": (Objective.CAUSAL_LM, [SLIDING, None]),  # a sliding-window layer, then a dense one
    "bidirectional_block_sparse": (Objective.MASKED_LM, [SLIDING]),
}
FIT_WORLD, FIT_PARTS, FIT_WINDOW = 4, 2, 128


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(worker, world: int, *args) -> None:
    mp.start_processes(_one_thread, args=(worker, world, _free_port(), *args), nprocs=world, start_method="fork")


def _one_thread(rank: int, worker, *args) -> None:
    torch.set_num_threads(1)  # several processes share two cores: more threads only contend
    worker(rank, *args)


def _tiny_lm(objective: Objective, attention: list, seed: int = 0) -> GenoformerLM:
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=VOCAB_SIZE, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=512, attention=attention
    )
    return GenoformerLM(config, objective=objective, warmup_steps=1, learning_rate=1e-3)


# ------------------------------------------------------------------------------ numerics
def _loss_and_grads(module: GenoformerLM, tokens_BL: torch.Tensor) -> tuple[float, int, dict[str, torch.Tensor]]:
    module.zero_grad()
    torch.manual_seed(1)  # the masked LM's masks: the same draws in every process
    loss, n_targets = module.loss(tokens_BL)
    loss.backward()
    return loss.item(), int(n_targets), {name: p.grad.clone() for name, p in module.named_parameters()}


def _numerics_worker(rank: int, world: int, port: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = {2: dist.new_group([0, 1]), 3: dist.group.WORLD}  # every rank creates every group
    tokens_BL = torch.randint(0, 4, (2, SEQ_LEN), generator=torch.Generator().manual_seed(5))
    results = {}
    for name, (objective, attention) in CASES.items():
        module = _tiny_lm(objective, attention).double()
        whole = _loss_and_grads(module, tokens_BL)
        for parts, group in groups.items():
            if rank >= parts:
                continue
            shard = SequenceShard(sequence_sharding(module.model, SEQ_LEN, parts), rank, group)
            if objective is Objective.MASKED_LM:  # masks drawn per part: compare the trunk's outputs instead
                result = _trunk_outputs(module, tokens_BL, shard)
            else:
                with sharded(module.model, shard):
                    loss, n_targets, grads = _loss_and_grads(module, shard.shard(tokens_BL))
                for grad in grads.values():
                    dist.all_reduce(grad, group=group)  # each part holds its share of the gradient
                result = {"loss": loss, "n_targets": n_targets, "grads": grads, "whole": whole}
            results[name, parts, rank] = result
    torch.save(results, out / f"numerics_rank{rank}.pt")
    dist.destroy_process_group()


def _trunk_outputs(module: GenoformerLM, tokens_BL: torch.Tensor, shard: SequenceShard) -> dict:
    """A bidirectional trunk's logits and a weighted sum's gradients: whole vs. part."""
    weights_BLV = torch.randn(
        *tokens_BL.shape, VOCAB_SIZE, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    module.zero_grad()
    logits_BLV = module.model(tokens_BL)
    (logits_BLV * weights_BLV).sum().backward()
    whole = {
        "logits": shard.shard(logits_BLV.detach()),
        "grads": {n: p.grad.clone() for n, p in module.named_parameters()},
    }
    module.zero_grad()
    with sharded(module.model, shard):
        part_logits_BLV = module.model(shard.shard(tokens_BL))
        (part_logits_BLV * shard.shard(weights_BLV)).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    for grad in grads.values():
        dist.all_reduce(grad, group=shard.group)
    return {"logits": part_logits_BLV.detach(), "grads": grads, "whole": whole}


# ------------------------------------------------------------------------------ fit
class Record(L.Callback):
    """Every parameter's gradient before the first optimizer step (after DDP's all-reduce), the
    sample indices and token shape of every training batch, and val/loss after each step."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}
        self.batches: list[tuple[list[int], tuple[int, ...]]] = []
        self.val_loss: dict[int, float] = {}

    def on_validation_end(self, trainer, pl_module):
        self.val_loss[trainer.global_step] = float(trainer.callback_metrics["val/loss"])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append((batch["index"].tolist(), tuple(batch["tokens"].shape)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == 0:
            self.grads = {name: p.grad.clone() for name, p in pl_module.named_parameters()}


def _fit(root: Path, store: Path, *, devices: int, batch_size: int, max_steps: int, strategy, ckpt_path=None) -> dict:
    L.seed_everything(0, verbose=False)
    module = _tiny_lm(Objective.CAUSAL_LM, [SlidingWindow(window=32, block_size=16), None])
    data = GenomeDataModule(
        str(store),
        window=FIT_WINDOW,
        batch_size=batch_size,
        num_workers=0,
        samples_per_epoch=16,
        seed=3,
        split=SplitSpec(val_fraction=0.05),
    )
    record = Record()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        num_sanity_val_steps=0,
        val_check_interval=1,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
        callbacks=[ModelCheckpoint(dirpath=root / "checkpoints", every_n_train_steps=1, save_top_k=-1), record],
    )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return {
        "grads": record.grads,
        "batches": record.batches,
        "val_loss": record.val_loss,
        "state": {k: v.clone() for k, v in module.state_dict().items()},
        "global_step": trainer.global_step,
    }


def _fit_worker(rank: int, world: int, port: int, out: Path, store: Path, name: str, max_steps: int, ckpt) -> None:
    # what torchrun sets: Lightning then runs this process as one rank instead of starting others
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world)
    )
    # find_unused_parameters keeps DDP's first bucket layout (it lays the buckets out anew after a
    # run's first step otherwise, which changes the order in which 4 processes' gradients are summed)
    strategy = ContextParallelStrategy(context_parallel=FIT_PARTS, find_unused_parameters=True)
    result = _fit(
        out / name, store, devices=world, batch_size=1, max_steps=max_steps, strategy=strategy, ckpt_path=ckpt
    )
    result["replica"] = strategy.sample_replica()
    torch.save(result, out / f"{name}_rank{rank}.pt")


def main(out: Path, store: Path) -> None:
    _launch(_numerics_worker, 3, out)
    _launch(_fit_worker, FIT_WORLD, out, store, "uninterrupted", 2, None)
    first = sorted((out / "uninterrupted" / "checkpoints").glob("*step=1.ckpt"))
    _launch(_fit_worker, FIT_WORLD, out, store, "resumed", 2, str(first[0]))
    # one process, one step, on the windows of both replicas (samples 0 and 1 of epoch 0)
    single = _fit(out / "single", store, devices=1, batch_size=FIT_WORLD // FIT_PARTS, max_steps=1, strategy="auto")
    torch.save(single, out / "single.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
