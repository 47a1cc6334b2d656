"""Genome datasets: reproducible sampling, N filtering, augmentation, tiling, splits, workers
(fork and spawn) and DDP shares."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from data_helpers import write_fasta
from genoformer.data import (
    PAD,
    GenomeStore,
    RandomWindowDataset,
    ShardSampler,
    SplitSpec,
    TiledWindowDataset,
    encode,
    prepare_genome_store,
    reverse_complement,
    split_intervals,
)
from genoformer.data.splits import SequenceSource
from torch.utils.data import DataLoader


def test_windows_equal_store_slices_and_are_pure(small_store, small_records):
    ds = RandomWindowDataset(small_store, 1000, 50, seed=3)
    seqs = dict(small_records)
    names = [c.name for c in ds.store.contigs]
    for i in range(50):
        s = ds[(2, i)]
        assert s["tokens"].dtype == torch.uint8 and s["tokens"].shape == (1000,)
        expected = encode(seqs[names[s["contig"]]][s["start"] : s["start"] + 1000])
        assert np.array_equal(s["tokens"].numpy(), expected)
        again = RandomWindowDataset(small_store, 1000, 50, seed=3)[(2, i)]
        assert torch.equal(again["tokens"], s["tokens"]) and again["start"] == s["start"]
    assert ds[(0, 1)]["start"] != ds[(1, 1)]["start"] or ds[(0, 1)]["contig"] != ds[(1, 1)]["contig"]


def test_positions_weighted_by_contig_length(small_store):
    ds = RandomWindowDataset(small_store, 100, 1, max_n_fraction=1.0)
    counts = collections.Counter(ds.locate(0, i)[0] for i in range(6000))
    starts = np.array([c.length - 99 for c in ds.store.contigs], dtype=float)
    for contig, p in enumerate(starts / starts.sum()):
        assert abs(counts[contig] / 6000 - p) < 0.03


def test_n_rich_windows_are_redrawn(small_store):
    ds = RandomWindowDataset(small_store, 2000, 1, max_n_fraction=0.05, seed=1)
    for i in range(300):
        assert (ds[i]["tokens"] == 4).float().mean() <= 0.05


def test_all_n_and_short_contigs_are_left_out(tmp_path):
    fasta = write_fasta(tmp_path / "x.fa", [("gap", "N" * 3000), ("short", "ACGT" * 100), ("ok", "ACGT" * 1000)])
    store = prepare_genome_store([fasta], tmp_path / "s.zarr", progress=False)
    ds = RandomWindowDataset(store, 1000, 10)
    assert [iv.index for iv in ds.intervals] == [2]
    with pytest.raises(ValueError, match="shorter window"):
        RandomWindowDataset(store, 5000, 10)


def test_reverse_complement_and_shift_augmentation(small_store):
    plain = RandomWindowDataset(small_store, 500, 1, seed=5)
    aug = RandomWindowDataset(small_store, 500, 1, seed=5, reverse_complement=True, max_shift=7)
    flags = []
    for i in range(100):
        s = aug[i]
        flags.append(s["reverse"])
        forward = plain.store.read(s["contig"], s["start"], s["start"] + 500)
        expected = reverse_complement(forward) if s["reverse"] else forward
        assert np.array_equal(s["tokens"].numpy(), expected)
    assert 20 < sum(flags) < 80


def test_tiles_cover_every_base_once(small_store):
    ds = TiledWindowDataset(small_store, 4096)
    store = GenomeStore(small_store)
    covered = {c.index: np.zeros(c.length, dtype=int) for c in store.contigs}
    for i in range(len(ds)):
        s = ds[i]
        covered[s["contig"]][s["start"] : s["start"] + s["length"]] += 1
        assert (s["tokens"][s["length"] :] == PAD).all()
        assert np.array_equal(
            s["tokens"][: s["length"]].numpy(), store.read(s["contig"], s["start"], s["start"] + s["length"])
        )
    assert all((c == 1).all() for c in covered.values())


@pytest.mark.parametrize(
    "spec",
    [
        SplitSpec(by="region", val_fraction=0.1, test_fraction=0.1),
        SplitSpec(by="contigs", val=["chrB"], test=["chrC"]),
    ],
)
def test_split_windows_never_cross_boundaries(small_store, spec):
    store = GenomeStore(small_store)
    sources = [SequenceSource(c.name, c.length, c.source_name) for c in store.contigs]
    splits = split_intervals(sources, spec)
    owner = {c.index: np.full(c.length, "", dtype=object) for c in store.contigs}
    for name, ivs in splits.items():
        for iv in ivs:
            assert (owner[iv.index][iv.start : iv.end] == "").all()
            owner[iv.index][iv.start : iv.end] = name
    assert all((o != "").all() for o in owner.values())  # every base in exactly one split
    train = RandomWindowDataset(store, 500, 1, intervals=splits["train"], max_n_fraction=1.0)
    for i in range(500):
        contig, start, _ = train.locate(0, i)
        assert set(owner[contig][start : start + 500]) == {"train"}
    val = TiledWindowDataset(store, 500, intervals=splits["val"])
    for i in range(len(val)):
        contig, start, end = val.locate(i)
        assert set(owner[contig][start:end]) == {"val"}


def test_split_by_files_and_unknown_names(tmp_path):
    f1 = write_fasta(tmp_path / "a.fa", [("a1", "ACGT" * 10), ("a2", "ACGT" * 10)])
    f2 = write_fasta(tmp_path / "b.fa", [("b1", "ACGT" * 10)])
    store = GenomeStore(prepare_genome_store([f1, f2], tmp_path / "s.zarr", progress=False))
    sources = [SequenceSource(c.name, c.length, c.source_name) for c in store.contigs]
    splits = split_intervals(sources, SplitSpec(by="files", val=[str(f2)]))
    assert [iv.index for iv in splits["train"]] == [0, 1] and [iv.index for iv in splits["val"]] == [2]
    with pytest.raises(ValueError, match="not found"):
        split_intervals(sources, SplitSpec(by="contigs", val=["zz"]))


def collect(loader) -> dict[int, tuple[int, int, bytes]]:
    seen = {}
    for batch in loader:
        for i, idx in enumerate(batch["index"].tolist()):
            assert idx not in seen, f"index {idx} served twice"
            seen[idx] = (int(batch["contig"][i]), int(batch["start"][i]), batch["tokens"][i].numpy().tobytes())
    return seen


def expected_share(ds, epoch: int, indices) -> dict[int, tuple[int, int, bytes]]:
    out = {}
    for i in indices:
        s = ds[(epoch, i)]
        out[i] = (s["contig"], s["start"], s["tokens"].numpy().tobytes())
    return out


@pytest.mark.parametrize("workers,context", [(0, None), (1, "fork"), (2, "fork")])
def test_workers_serve_each_window_once(small_store, workers, context):
    ds = RandomWindowDataset(small_store, 256, 40, seed=9, reverse_complement=True)
    sampler = ShardSampler(len(ds), rank=0, world_size=1)
    sampler.set_epoch(3)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers, multiprocessing_context=context)
    assert collect(loader) == expected_share(ds, 3, range(40))


def test_spawn_workers(small_store):
    ds = TiledWindowDataset(small_store, 8192)
    sampler = ShardSampler(len(ds), rank=0, world_size=1, equal_shares=False)
    loader = DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2, multiprocessing_context="spawn")
    assert collect(loader) == expected_share(ds, 0, range(len(ds)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_ranks_get_disjoint_equal_shares(small_store, world_size):
    ds = RandomWindowDataset(small_store, 128, 31, seed=2)
    shares = []
    for rank in range(world_size):
        sampler = ShardSampler(len(ds), rank=rank, world_size=world_size)
        sampler.set_epoch(1)
        loader = DataLoader(
            ds,
            batch_size=2,
            sampler=sampler,
            num_workers=2 if rank == 0 else 0,
            multiprocessing_context="fork" if rank == 0 else None,
        )
        served = collect(loader)
        assert served == expected_share(ds, 1, range(rank, -(-31 // world_size) * world_size, world_size))
        shares.append(set(served))
    assert len({len(s) for s in shares}) == 1  # equal steps per rank
    assert not set.intersection(*shares) and set.union(*shares) >= set(range(31))


def test_ddp_eval_tiles_split_without_duplicates(small_store):
    ds = TiledWindowDataset(small_store, 1000)
    shares = [
        set(
            collect(
                DataLoader(ds, batch_size=5, sampler=ShardSampler(len(ds), rank=r, world_size=3, equal_shares=False))
            )
        )
        for r in range(3)
    ]
    assert sum(map(len, shares)) == len(ds) and set.union(*shares) == set(range(len(ds)))


def test_sampler_rank_arguments():
    with pytest.raises(ValueError, match="both rank and world_size"):
        ShardSampler(10, rank=1)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        ShardSampler(10, rank=2, world_size=2)
    assert ShardSampler(10).num_replicas == 1  # no process group: a single rank


def test_sampler_reads_rank_from_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    sampler = ShardSampler(10)
    sampler.set_epoch(5)
    assert list(sampler) == [(5, 1), (5, 5), (5, 9)] and len(sampler) == 3


def test_source_weights_share_windows_by_file_whatever_their_lengths(tmp_path):
    rng = np.random.default_rng(0)
    bases = lambda n: "".join(rng.choice(list("ACGT"), size=n))  # noqa: E731
    long = write_fasta(tmp_path / "long.fa", [("l1", bases(30_000)), ("l2", bases(10_000))])
    short = write_fasta(tmp_path / "short.fa", [("s1", bases(2_000))])
    store = prepare_genome_store([long, short], tmp_path / "s.zarr", progress=False)
    ds = RandomWindowDataset(store, 500, 1, source_weights={"long.fa": 1, "short.fa": 3})
    draws = [ds.locate(0, i) for i in range(8000)]
    by_contig = collections.Counter(contig for contig, _, _ in draws)
    assert abs(by_contig[2] / 8000 - 0.75) < 0.02  # the short file's share, not its 4% of the bases
    # inside a file, windows stay uniform over valid starts: l1 has 29,501 of the file's 39,002
    assert abs(by_contig[0] / (by_contig[0] + by_contig[1]) - 29_501 / 39_002) < 0.03
    lengths = [c.length for c in GenomeStore(store).contigs]
    assert all(0 <= start <= lengths[contig] - 500 for contig, start, _ in draws)
    assert ds.locate(0, 7) == RandomWindowDataset(store, 500, 1, source_weights={"long.fa": 1, "short.fa": 3}).locate(
        0, 7
    )
    with pytest.raises(ValueError, match=r"no weight for \['short.fa'\]"):
        RandomWindowDataset(store, 500, 1, source_weights={"long.fa": 1})
    with pytest.raises(ValueError, match="finite, >= 0"):
        RandomWindowDataset(store, 500, 1, source_weights={"long.fa": -1, "short.fa": 1})


# ------------------------------------------------------------------------- whole records
def test_whole_record_windows_are_whole_intervals_weighted_by_length(small_store, small_records):
    from genoformer.data import WholeRecordDataset

    seqs = dict(small_records)
    ds = WholeRecordDataset(small_store, 10**7, 200, seed=2, max_n_fraction=1.0, reverse_complement=True)
    names = [c.name for c in ds.store.contigs]
    counts = collections.Counter()
    for i in range(200):
        s = ds[i]
        name = names[s["contig"]]
        counts[name] += 1
        assert s["start"] == 0 and s["tokens"].shape == (len(seqs[name]),)  # the whole record, unpadded
        expected = encode(seqs[name])
        assert np.array_equal(s["tokens"].numpy(), reverse_complement(expected) if s["reverse"] else expected)
        assert torch.equal(
            WholeRecordDataset(small_store, 10**7, 200, seed=2, max_n_fraction=1.0, reverse_complement=True)[i][
                "tokens"
            ],
            s["tokens"],
        )
    assert counts["chrA"] > counts["chrB"] > counts["chrC"] > 0  # 50k, 33k and 21k bases


def test_whole_record_windows_cut_long_records_and_follow_the_split(small_store, small_records):
    from genoformer.data import WholeRecordDataset

    names = [c.name for c in GenomeStore(small_store).contigs]
    intervals = split_intervals(
        [SequenceSource(c.name, c.length, "small.fa.gz") for c in GenomeStore(small_store).contigs],
        SplitSpec(by="contigs", val=["chrB"]),
    )
    ds = WholeRecordDataset(small_store, 30_000, 50, intervals=intervals["train"], max_n_fraction=1.0)
    seqs = dict(small_records)
    for i in range(50):
        s = ds[i]
        name = names[s["contig"]]
        assert name != "chrB"
        length = min(len(seqs[name]), 30_000)  # chrA (50k) gives 30k windows, chrC (21k) whole
        assert s["tokens"].shape == (length,)
        assert np.array_equal(s["tokens"].numpy(), encode(seqs[name][s["start"] : s["start"] + length]))


def test_unpadded_tiles_are_as_long_as_their_bases(small_store, small_records):
    tiles = TiledWindowDataset(small_store, 40_000, pad=False)
    lengths = [tiles[i]["tokens"].shape[0] for i in range(len(tiles))]
    assert lengths == [40_000, 10_000, 33_000, 21_000] and "length" not in tiles[0]
    with pytest.raises(ValueError, match="cannot be cut into parts"):
        TiledWindowDataset(small_store, 40_000, pad=False, part=[(0, 10)])
