"""Packing: records shorter than the window fill windows end to end, and batches carry
cu_seqlens that put every document boundary (and every row boundary) in place."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from data_helpers import random_bases, write_fasta
from genoformer.data import (
    PAD,
    GenomeDataModule,
    PackedRandomWindowDataset,
    PackedTiledWindowDataset,
    SplitSpec,
    TiledWindowDataset,
    encode,
    prepare_genome_store,
    reverse_complement,
)
from genoformer.data.packing import collate_packed, pack_lengths

WINDOW = 1024
LENGTHS = {"plasmid1": 97, "plasmid2": 300, "contig3": 700, "contig4": 1025, "chrom": 5000}
"""Records shorter and longer than the window, one just over it."""


@pytest.fixture(scope="module")
def short_records() -> dict[str, str]:
    rng = np.random.default_rng(11)
    return {name: random_bases(rng, n) for name, n in LENGTHS.items()}


@pytest.fixture(scope="module")
def short_store(tmp_path_factory, short_records):
    root = tmp_path_factory.mktemp("short_store")
    fasta = write_fasta(root / "short.fa", list(short_records.items()))
    return prepare_genome_store([fasta], root / "short.zarr", chunk_size=1024, progress=False)


def _documents(sample: dict, names: list[str], records: dict[str, str]):
    """(name, start, length, reverse, tokens) of each document of a packed sample."""
    offsets = np.concatenate([[0], np.cumsum(sample["doc_lens"].numpy())])
    for doc in range(len(sample["doc_lens"])):
        contig = int(sample["doc_contig"][doc])
        tokens = sample["tokens"][offsets[doc] : offsets[doc + 1]].numpy()
        yield (
            names[contig] if contig >= 0 else None,
            int(sample["doc_start"][doc]),
            int(sample["doc_lens"][doc]),
            bool(sample["doc_reverse"][doc]),
            tokens,
        )


def _check_cu_seqlens(batch: dict, rows: int, window: int) -> None:
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.ndim == 1
    assert cu[0] == 0 and cu[-1] == rows * window and bool((cu[1:] > cu[:-1]).all())
    assert set(range(0, rows * window + 1, window)) <= set(cu.tolist())  # no document crosses a row
    assert len(cu) == len(batch["doc_lens"]) + 1 and torch.equal(cu.diff(), batch["doc_lens"].int())


def test_pack_lengths_puts_every_item_in_one_bin_within_capacity():
    lengths = [5, 10, 3, 10, 7, 1, 9, 2, 2, 6]
    bins = pack_lengths(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert bins[:2] == [[1], [3]]  # full items alone, first, in order
    assert all(b == sorted(b) for b in bins)
    assert len(bins) == 2 + -(-sum(n for n in lengths if n < 10) // 10)  # best fit: no bin wasted here
    assert pack_lengths(lengths, 10) == bins
    with pytest.raises(ValueError, match=r"lengths in \[1, 10\]"):
        pack_lengths([3, 11], 10)


def test_collate_builds_cu_seqlens_over_the_flattened_batch():
    samples = [
        {"tokens": torch.zeros(8, dtype=torch.uint8), "doc_lens": torch.tensor(lens), "index": i}
        for i, lens in enumerate([[3, 5], [8], [1, 1, 6]])
    ]
    batch = collate_packed(samples)
    assert batch["tokens"].shape == (3, 8) and batch["index"].tolist() == [0, 1, 2]
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 16, 17, 18, 24]
    _check_cu_seqlens(batch, 3, 8)
    with pytest.raises(ValueError, match="must sum to its window length 8"):
        collate_packed([{"tokens": torch.zeros(8), "doc_lens": torch.tensor([3, 4])}])


def test_packed_training_windows_are_store_pieces_and_short_records_appear_whole(short_store, short_records):
    ds = PackedRandomWindowDataset(short_store, WINDOW, 200, seed=5, reverse_complement=True)
    names = [c.name for c in ds.store.contigs]
    whole = collections.Counter()
    for i in range(200):
        sample = ds[(1, i)]
        assert sample["tokens"].dtype == torch.uint8 and sample["tokens"].shape == (WINDOW,)
        assert int(sample["doc_lens"].sum()) == WINDOW and bool((sample["doc_lens"] > 0).all())
        for name, start, length, reverse, tokens in _documents(sample, names, short_records):
            expected = encode(short_records[name][start : start + length])
            assert np.array_equal(tokens, reverse_complement(expected) if reverse else expected)
            whole[name] += length == LENGTHS[name]
        again = PackedRandomWindowDataset(short_store, WINDOW, 200, seed=5, reverse_complement=True)[(1, i)]
        assert all(torch.equal(again[key], sample[key]) for key in ("tokens", "doc_lens", "doc_start"))
    for name in ("plasmid1", "plasmid2", "contig3"):  # shorter than the window: always whole
        assert whole[name] > 0
    assert whole["chrom"] == 0


def test_packed_tiles_hold_every_tile_once_and_pad_the_rest(short_store, short_records):
    for stride in (WINDOW, 600):
        tiles = TiledWindowDataset(short_store, WINDOW, stride)
        packed = PackedTiledWindowDataset(short_store, WINDOW, stride)
        names = [c.name for c in packed.store.contigs]
        assert len(packed) < len(tiles)
        seen = []
        for i in range(len(packed)):
            sample = packed[i]
            assert sample["tokens"].shape == (WINDOW,) and int(sample["doc_lens"].sum()) == WINDOW
            for name, start, length, _, tokens in _documents(sample, names, short_records):
                if name is None:
                    assert (tokens == PAD).all()
                    continue
                assert np.array_equal(tokens, encode(short_records[name][start : start + length]))
                seen.append((names.index(name), start, start + length))
        assert sorted(seen) == sorted(tiles.locate(i) for i in range(len(tiles)))


def test_every_base_of_every_record_is_in_exactly_one_packed_tile(short_store):
    packed = PackedTiledWindowDataset(short_store, WINDOW)
    covered = collections.Counter()
    for i in range(len(packed)):
        sample = packed[i]
        for contig, start, length in zip(*(sample[key].tolist() for key in ("doc_contig", "doc_start", "doc_lens"))):
            if contig >= 0:
                covered.update((contig, p) for p in range(start, start + length))
    expected = {(contig, p) for contig, n in enumerate(LENGTHS.values()) for p in range(n)}
    assert set(covered) == expected and set(covered.values()) == {1}


def test_data_module_packs_train_val_and_test_batches(short_store):
    split = SplitSpec(by="contigs", val=["contig3"], test=["plasmid1", "plasmid2"])
    dm = GenomeDataModule(
        str(short_store), window=WINDOW, batch_size=3, num_workers=0, samples_per_epoch=6, split=split, pack=True
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["tokens"].shape == (3, WINDOW) and "length" not in batch
    _check_cu_seqlens(batch, 3, WINDOW)
    assert set(batch["doc_contig"].tolist()) <= {1, 3, 4}  # train contigs only
    described = dm.describe_batch(batch)
    assert described.startswith(f"store {short_store}: ") and described.count(" | ") == 2
    val = list(dm.val_dataloader())
    assert len(val) == 1 and val[0]["doc_contig"].tolist() == [2, -1]  # contig3, then its PAD
    _check_cu_seqlens(val[0], 1, WINDOW)
    assert "PAD x 324" in dm.describe_batch(val[0])
    dm.setup("test")
    test = list(dm.test_dataloader())
    assert len(test) == 1 and test[0]["doc_contig"].tolist() == [0, 1, -1]
    dm.setup("predict")
    predict = next(iter(dm.predict_dataloader()))  # embeddings: one tile per row, as unpacked
    assert "cu_seqlens" not in predict and predict["length"].tolist() == [97, 300, 700]


def test_default_stays_unpacked_and_max_shift_with_pack_is_refused(short_store):
    dm = GenomeDataModule(str(short_store), window=WINDOW, batch_size=2, num_workers=0, samples_per_epoch=4)
    dm.setup("fit")
    assert "cu_seqlens" not in next(iter(dm.train_dataloader()))
    with pytest.raises(ValueError, match="set max_shift to 0 or pack to false"):
        GenomeDataModule(str(short_store), window=WINDOW, pack=True, max_shift=10)
