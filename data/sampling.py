"""Reproducible, shardable sampling: per-sample random generators and the rank-aware sampler.

Every random choice for sample ``index`` of epoch ``epoch`` comes from
``numpy.random.default_rng((seed, epoch, index))``, so a sample is a pure function of
(seed, epoch, index): the same on any worker, rank, or resumed run. :class:`ShardSampler`
hands each rank the indices ``rank, rank + world_size, ...`` as ``(epoch, index)`` keys, so no
index is served twice across ranks within an epoch, and DataLoader workers then split a rank's
keys between them (map-style datasets: each key goes to exactly one worker).

Exact resume: :meth:`ShardSampler.resume_from` makes the next pass start in a given epoch and
leave out the indices below a count of samples already consumed (over all ranks), so a run
restarted from a mid-epoch checkpoint sees the rest of that epoch, not its beginning again, even
with another number of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size): the explicit values if given, else torch.distributed's when it is
    initialised, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (to use torch.distributed)")
    if rank is None:
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample: a pure function of (seed, epoch, index)."""
    return np.random.default_rng((seed, epoch, index))


def split_key(key: int | tuple[int, int], default_epoch: int) -> tuple[int, int]:
    """A dataset key is an index or an (epoch, index) pair (as ShardSampler yields)."""
    if isinstance(key, tuple):
        epoch, index = key
        return int(epoch), int(index)
    if isinstance(key, torch.Tensor):
        key = key.item()
    return default_epoch, int(key)


class ShardSampler(DistributedSampler):
    """Yields this rank's ``(epoch, index)`` keys of a dataset with ``num_samples`` indices.

    Rank r of W gets indices r, r + W, r + 2W, ... With ``equal_shares`` (training: random
    windows) the index range is padded up to a multiple of W with *new* indices, so every rank
    runs the same number of steps and still no index repeats; without it (evaluation: tiles)
    the last ranks may get one index fewer. A DistributedSampler subclass so that Lightning
    calls ``set_epoch`` on it and does not replace it under DDP.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        equal_shares: bool = True,
        start_epoch: int = 0,
    ) -> None:
        rank, world_size = resolve_rank(rank, world_size)
        super().__init__(range(num_samples), num_replicas=world_size, rank=rank, shuffle=False)
        self.total = num_samples
        self.equal_shares = equal_shares
        self.epoch = start_epoch
        self.skip = 0  # indices below this are left out of the next pass only (see resume_from)

    def resume_from(self, epoch: int, consumed: int) -> None:
        """Make the next pass (only) run epoch ``epoch`` without its first ``consumed`` indices:
        the samples that all ranks together had already trained on before a checkpoint."""
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self.epoch = epoch
        self.skip = consumed

    def _stop(self) -> int:
        if self.equal_shares:
            return math.ceil(self.total / self.num_replicas) * self.num_replicas
        return self.total

    def _indices(self, skip: int) -> range:
        first = self.rank + self.num_replicas * max(0, -(-(skip - self.rank) // self.num_replicas))
        return range(first, self._stop(), self.num_replicas)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, skip = self.epoch, self.skip
        self.skip = 0
        for index in self._indices(skip):
            yield (epoch, index)

    def __len__(self) -> int:
        """Keys of a whole epoch (Lightning counts a resumed epoch's batches from its start)."""
        return len(self._indices(0))
