"""Context parallelism (genoformer.core.context_parallel): several processes share every sequence.

The processes' results are the one-process results: loss, target count and every gradient of a
tiny language model on 2 and 3 gloo processes equal one process's (causal dense, causal with a
block-sparse layer, and a bidirectional block-sparse trunk's outputs); a fit through
ContextParallelStrategy on 2 replicas x 2 parts takes the step one process takes on the same two
windows and resumes from a checkpoint bit-identically. The multi-process runs happen once, in
context_parallel_script.py; the data tests run here: each process reads only its part of a window,
the positions the ring's sharding gives it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from data_helpers import random_bases, write_fasta
from genoformer.data.genome.alphabet import PAD, VOCAB_SIZE
from genoformer.data.genome.datamodule import GenomeDataModule
from genoformer.data.genome.datasets import RandomWindowDataset, TiledWindowDataset
from genoformer.data.genome.store import GenomeStore, prepare_genome_store
from genoformer.data.splits import Interval, SplitSpec
from genoformer.kernels.layout import SlidingWindow
from genoformer.kernels.ring import Sharding

from genoformer.core.context_parallel import ContextParallelStrategy, SequenceShard, sequence_sharding
from genoformer.core.transformer import Transformer, TransformerConfig

SCRIPT = Path(__file__).with_name("context_parallel_script.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = ("causal_dense", "causal_block_sparse", "bidirectional_block_sparse")  # the script's CASES
LOSS_RTOL = 1e-6  # float64 models whose norms, RoPE and cross-entropy run in float32
GRAD_RTOL = 1e-5  # of the largest gradient of each parameter; a wrong part or sum is off by far more


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max())


# ------------------------------------------------------------------------------ the runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("context_parallel")
    store = prepare_genome_store(
        [REPO_ROOT / "examples" / "lambda_phage.fasta.gz"], out / "lambda.zarr", progress=False
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(store)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _numerics(runs: Path) -> dict:
    results = {}
    for rank in range(3):
        results.update(torch.load(runs / f"numerics_rank{rank}.pt", weights_only=False))
    return results


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("case", CASES[:2])
def test_language_model_loss_and_gradients_equal_one_process(runs, case, parts):
    results = _numerics(runs)
    for rank in range(parts):
        result = results[case, parts, rank]
        loss, n_targets, grads = result["whole"]
        assert result["n_targets"] == n_targets  # every target of the whole sequence, once
        assert result["loss"] == pytest.approx(loss, rel=LOSS_RTOL), f"rank {rank}"
        for name, grad in grads.items():
            assert _relative(result["grads"][name], grad) <= GRAD_RTOL, f"rank {rank}: {name}"


@pytest.mark.parametrize("parts", [2, 3])
def test_bidirectional_block_sparse_outputs_and_gradients_equal_one_process(runs, parts):
    results = _numerics(runs)
    for rank in range(parts):
        result = results["bidirectional_block_sparse", parts, rank]
        whole = result["whole"]
        assert _relative(result["logits"], whole["logits"]) <= LOSS_RTOL, f"rank {rank}"
        for name, grad in whole["grads"].items():
            assert _relative(result["grads"][name], grad) <= GRAD_RTOL, f"rank {rank}: {name}"


def _fit_results(runs: Path, name: str) -> list[dict]:
    return [torch.load(runs / f"{name}_rank{rank}.pt", weights_only=False) for rank in range(4)]


def test_fit_processes_read_their_part_of_their_replica_s_windows(runs):
    ranks = _fit_results(runs, "uninterrupted")
    assert [rank["replica"] for rank in ranks] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    batches = [rank["batches"] for rank in ranks]
    assert batches[0] == batches[1] and batches[2] == batches[3]  # the parts of one replica: the same windows
    assert [b[0] for b in batches[0]] == [[0], [2]] and [b[0] for b in batches[2]] == [[1], [3]]
    assert {shape for rank in batches for _, shape in rank} == {(1, 64)}  # half of each 128-token window


def test_fit_step_equals_one_process_on_the_same_windows(runs):
    ranks = _fit_results(runs, "uninterrupted")
    single = torch.load(runs / "single.pt", weights_only=False)
    for rank in ranks:
        for name, grad in single["grads"].items():
            assert _relative(rank["grads"][name], grad) <= GRAD_RTOL, name
        # validation: each replica scores its tile, the processes average them
        assert rank["val_loss"][1] == pytest.approx(single["val_loss"][1], rel=1e-4)


def test_fit_resumes_bit_identically(runs):
    uninterrupted, resumed = _fit_results(runs, "uninterrupted"), _fit_results(runs, "resumed")
    for before, after in zip(uninterrupted, resumed):
        assert before["global_step"] == after["global_step"] == 2
        assert before["batches"][1:] == after["batches"]  # the resumed run trains the second step only
        for name, weight in before["state"].items():
            assert torch.equal(after["state"][name], weight), name
            assert torch.equal(uninterrupted[0]["state"][name], weight), f"ranks differ: {name}"


# ------------------------------------------------------------------------------ data
@pytest.fixture(scope="module")
def store(tmp_path_factory) -> GenomeStore:
    folder = tmp_path_factory.mktemp("cp_store")
    bases = random_bases(np.random.default_rng(0), 3000)
    fasta = write_fasta(folder / "genome.fa", [("chr1", bases), ("chr2", bases[:700])])
    return GenomeStore(prepare_genome_store([fasta], folder / "genome.zarr", chunk_size=1024, progress=False))


@pytest.mark.parametrize("max_n_fraction", [1.0, 0.1], ids=["part_read_alone", "whole_read_for_the_n_check"])
@pytest.mark.parametrize("zigzag", [True, False])
def test_random_window_parts_are_the_sharding_s_positions(store, zigzag, max_n_fraction):
    sharding = Sharding(256, 2, zigzag=zigzag, granule=16)
    whole = RandomWindowDataset(store, 256, 20, reverse_complement=True, max_n_fraction=max_n_fraction)
    parts = [
        RandomWindowDataset(
            store, 256, 20, reverse_complement=True, max_n_fraction=max_n_fraction, part=sharding.chunks(rank)
        )
        for rank in range(2)
    ]
    reversed_windows = 0
    for index in range(20):
        sample = whole[index]
        reversed_windows += sample["reverse"]
        for rank, dataset in enumerate(parts):
            part = dataset[index]
            assert (part["contig"], part["start"], part["reverse"]) == (
                sample["contig"],
                sample["start"],
                sample["reverse"],
            )
            assert torch.equal(part["tokens"], sharding.shard(sample["tokens"], rank, dim=0))
    assert 0 < reversed_windows < 20  # both strands were read


def test_without_an_n_check_a_process_reads_only_its_part(store, monkeypatch):
    sharding = Sharding(256, 4, zigzag=True)
    dataset = RandomWindowDataset(store, 256, 8, reverse_complement=True, max_n_fraction=1.0, part=sharding.chunks(1))
    read = []
    original = GenomeStore.read

    def counting_read(self, contig, start, end):
        read.append(end - start)
        return original(self, contig, start, end)

    monkeypatch.setattr(GenomeStore, "read", counting_read)
    for index in range(8):
        dataset[index]
    assert sum(read) == 8 * sharding.length(1) == 8 * 64


def test_tile_parts_are_the_sharding_s_positions_with_the_padding(store):
    sharding = Sharding(256, 2, zigzag=True, granule=16)
    intervals = [Interval(1, 0, 700)]  # the last tile holds 700 - 512 = 188 bases, then PAD
    whole = TiledWindowDataset(store, 256, intervals=intervals)
    for rank in range(2):
        parts = TiledWindowDataset(store, 256, intervals=intervals, part=sharding.chunks(rank))
        for index in range(len(whole)):
            tile, part = whole[index], parts[index]
            assert part["length"] == tile["length"]
            assert torch.equal(part["tokens"], sharding.shard(tile["tokens"], rank, dim=0))
    assert (whole[2]["tokens"][188:] == PAD).all()


class _TwoPartSplit:
    """A stand-in for ContextParallelStrategy as the data module sees it (WindowSplit)."""

    def window_part(self, window: int) -> tuple[tuple[int, int], ...]:
        return Sharding(window, 2, zigzag=True).chunks(1)

    def sample_replica(self) -> tuple[int, int]:
        return 1, 3


def test_data_module_reads_the_part_and_shards_by_replica_the_strategy_gives(store):
    data = GenomeDataModule(
        str(store.path),
        window=128,
        batch_size=2,
        num_workers=0,
        samples_per_epoch=12,
        split=SplitSpec(val_fraction=0.2),
    )
    data.trainer = SimpleNamespace(strategy=_TwoPartSplit())
    data.setup("fit")
    part = Sharding(128, 2, zigzag=True).chunks(1)
    assert data.datasets["train"].part == data.datasets["val"].part == part
    for loader in (data.train_dataloader(), data.val_dataloader()):
        assert (loader.sampler.rank, loader.sampler.num_replicas) == (1, 3)
        assert next(iter(loader))["tokens"].shape == (2, 64)
    data.trainer = None  # on its own: whole windows, sharded as torch.distributed says
    data.setup("fit")
    assert data.datasets["train"].part is None and data.train_dataloader().sampler.num_replicas == 1


def test_packed_windows_are_refused_with_what_to_do(store):
    data = GenomeDataModule(str(store.path), window=128, num_workers=0, pack=True)
    data.trainer = SimpleNamespace(strategy=_TwoPartSplit())
    with pytest.raises(ValueError, match="pack=False"):
        data.setup("fit")


# ------------------------------------------------------------------------------ sharding rules
def _trunk(**overrides) -> Transformer:
    values = dict(vocab_size=VOCAB_SIZE, d_model=32, n_layers=2, n_heads=2, max_seq_len=4096)
    return Transformer(TransformerConfig(**{**values, **overrides}))


def test_causal_models_zigzag_and_layouts_set_the_chunk_granule():
    assert sequence_sharding(_trunk(), 1024, 4) == Sharding(1024, 4, zigzag=True, granule=1)
    layouts = [SlidingWindow(window=64, block_size=32), SlidingWindow(window=64, block_size=64), None]
    bidirectional = _trunk(causal=False, attention=layouts)
    assert sequence_sharding(bidirectional, 1024, 4) == Sharding(1024, 4, zigzag=False, granule=64)
    with pytest.raises(ValueError, match="multiple of 512"):
        sequence_sharding(_trunk(attention=layouts), 1000, 4)  # 2 x 4 chunks of 64-token blocks


def test_a_part_refuses_what_the_ring_cannot_run():
    shard = SequenceShard(Sharding(256, 2, zigzag=True), rank=0, group=None)
    shard.check_inputs(128, causal=True, lengths_B=torch.tensor([100]), cu_seqlens=None)  # causal: no mask needed
    with pytest.raises(ValueError, match="holds a part of 100 positions"):
        shard.check_inputs(100, causal=True, lengths_B=None, cu_seqlens=None)
    with pytest.raises(ValueError, match="packed documents"):
        shard.check_inputs(128, causal=True, lengths_B=None, cu_seqlens=torch.tensor([0, 256], dtype=torch.int32))
    with pytest.raises(ValueError, match="bidirectional"):
        shard.check_inputs(128, causal=False, lengths_B=torch.tensor([100]), cu_seqlens=None)


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="positive int"):
        ContextParallelStrategy(context_parallel=0)
    with pytest.raises(ValueError, match="leave ddp_comm_hook out"):
        ContextParallelStrategy(context_parallel=2, ddp_comm_hook=lambda state, bucket: None)
