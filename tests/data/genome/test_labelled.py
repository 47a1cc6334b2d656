"""LabelledDataModule and its datasets: sequence tasks from tables (leak-free held-out splits, the
--leaks rule, regression statistics, multi-label), per-base tasks from a GFF3 with ##FASTA and a
bedGraph (region holdout, tiling, IGNORE/NaN padding), batch keys and dtypes, deterministic
(epoch, index) samples for exact resume, and the errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from genoformer.data.genome.alphabet import PAD, decode, encode, reverse_complement
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, CDS_MINUS, CDS_PLUS, OTHER, STRAND_SWAP
from genoformer.data.genome.labelled import (
    IGNORE,
    LabelledDataModule,
    RandomTrackWindows,
    SequenceDataset,
    TargetKind,
    TargetSpace,
    TiledTrackWindows,
    Track,
    pad_sequences,
    pad_windows,
)
from genoformer.data.genome.labels import canonical_key, read_labelled

GENES = [(101, 400, "+"), (1501, 1800, "-"), (2301, 2610, "+")]  # GFF3: 1-based, inclusive


def random_dna(rng: np.random.Generator, n: int) -> str:
    return decode(rng.integers(0, 4, n).astype(np.uint8))


def write_table(path: Path, rows: list[tuple[str, str]], header: str = "name\tsequence\tlabel") -> Path:
    path.write_text(header + "\n" + "".join("\t".join(row) + "\n" for row in rows))
    return path


def classify_rows(n: int, seed: int, prefix: str = "s") -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    return [(f"{prefix}{i}", random_dna(rng, int(rng.integers(20, 40))), "ab"[i % 2]) for i in range(n)]


def write_gff3_genome(path: Path, length: int = 3000, seed: int = 0, name: str = "ctg1") -> tuple[Path, str]:
    """A GFF3 with a ##FASTA section: one contig with CDSs on both strands."""
    sequence = random_dna(np.random.default_rng(seed), length)
    lines = ["##gff-version 3", f"##sequence-region {name} 1 {length}"]
    lines += [f"{name}\ttest\tCDS\t{s}\t{e}\t.\t{strand}\t0\tID=g{i}" for i, (s, e, strand) in enumerate(GENES)]
    lines += ["##FASTA", f">{name}"] + [sequence[i : i + 60] for i in range(0, length, 60)]
    path.write_text("\n".join(lines) + "\n")
    return path, sequence


def expected_labels(length: int = 3000) -> np.ndarray:
    labels = np.full(length, OTHER, dtype=np.int64)
    for s, e, strand in GENES:
        labels[s - 1 : e] = CDS_PLUS if strand == "+" else CDS_MINUS
    return labels


# ------------------------------------------------------------------ sequence tasks
def test_classify_without_val_holds_out_a_leak_free_share(tmp_path):
    rows = classify_rows(40, seed=1)
    # duplicates and reverse complements of some rows: they must stay on one side
    rows += [(f"dup{i}", rows[i][1], rows[i][2]) for i in range(0, 10, 2)]
    rows += [(f"rc{i}", decode(reverse_complement(encode(rows[i][1]))), rows[i][2]) for i in range(1, 10, 2)]
    data = LabelledDataModule(
        "classify", [str(write_table(tmp_path / "train.tsv", rows))], val_fraction=0.25, batch_size=4
    )
    data.setup("fit")
    train, val = data.splits["train"], data.splits["val"]
    assert len(train) + len(val) == len(rows) and len(val) == round(0.25 * len(rows))
    assert not {canonical_key(c) for c in train.codes} & {canonical_key(c) for c in val.codes}
    assert set(train.names).isdisjoint(val.names)
    assert data.target_space == TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b"))
    again = LabelledDataModule("classify", [str(tmp_path / "train.tsv")], val_fraction=0.25, batch_size=4)
    again.setup("fit")
    assert again.splits["val"].names == val.names  # the split is a function of the seed


def test_sequence_batches_keys_and_dtypes(tmp_path):
    rows = classify_rows(12, seed=2)
    data = LabelledDataModule(
        "classify",
        [str(write_table(tmp_path / "t.tsv", rows))],
        val=[str(write_table(tmp_path / "v.tsv", classify_rows(5, seed=3, prefix="v")))],
        batch_size=4,
    )
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"tokens", "length", "targets", "index"}
    assert batch["tokens"].dtype == torch.uint8 and batch["length"].dtype == torch.int64
    assert batch["targets"].dtype == torch.int64 and batch["targets"].shape == (4,)
    assert batch["index"].dtype == torch.int64
    assert batch["tokens"].shape == (4, int(batch["length"].max()))
    for row, n, index, target in zip(batch["tokens"], batch["length"], batch["index"], batch["targets"]):
        np.testing.assert_array_equal(row[:n].numpy(), encode(rows[int(index)][1]))
        assert (row[n:] == PAD).all() and int(target) == "ab".index(rows[int(index)][2])
    val_batches = list(data.val_dataloader())
    assert sum(len(b["length"]) for b in val_batches) == 5  # every validation sequence, none dropped
    assert [int(i) for b in val_batches for i in b["index"]] == list(range(5))


def test_a_leaking_val_file_is_an_error_unless_leaks_drop(tmp_path):
    rows = classify_rows(20, seed=4)
    val_rows = classify_rows(6, seed=5, prefix="v")
    val_rows[0] = ("v0", rows[3][1], rows[3][2])  # the same sequence
    val_rows[1] = ("v1", decode(reverse_complement(encode(rows[7][1]))), rows[7][2])  # its reverse complement
    train = str(write_table(tmp_path / "train.tsv", rows))
    val = str(write_table(tmp_path / "val.tsv", val_rows))
    data = LabelledDataModule("classify", [train], val=[val], batch_size=4)
    with pytest.raises(ValueError, match="--leaks drop") as error:
        data.setup("fit")
    assert "2 of the 6 validation sequences" in str(error.value)
    dropping = LabelledDataModule("classify", [train], val=[val], batch_size=4, leaks="drop")
    dropping.setup("fit")
    assert len(dropping.splits["train"]) == 18 and "s3" not in dropping.splits["train"].names
    assert "s7" not in dropping.splits["train"].names
    assert len(dropping.splits["val"]) == 6  # held-out sets never change
    # a test file leaking is refused too
    test = str(
        write_table(
            tmp_path / "test.tsv", [("t0", rows[0][1], "a"), ("t1", random_dna(np.random.default_rng(9), 30), "b")]
        )
    )
    with pytest.raises(ValueError, match="test sequences also occur"):
        LabelledDataModule("classify", [train], test=[test], batch_size=4).setup("fit")
    with_test = LabelledDataModule("classify", [train], test=[test], batch_size=4, leaks="drop")
    with_test.setup("test")
    assert "s0" not in with_test.splits["train"].names and len(with_test.splits["test"]) == 2


def test_regress_with_two_label_columns(tmp_path):
    rng = np.random.default_rng(6)
    rows = [(f"r{i}", random_dna(rng, 30), f"{rng.normal():.5f}", f"{rng.normal(10, 3):.5f}") for i in range(16)]
    path = write_table(tmp_path / "r.tsv", rows, header="name\tsequence\tlabel_first\tlabel_second")
    data = LabelledDataModule("regress", [str(path)], val_fraction=0.25, batch_size=4)
    data.setup("fit")
    space = data.target_space
    assert space.kind is TargetKind.SEQUENCE_VALUES and space.names == ("first", "second")
    values = data.splits["train"].targets.astype(np.float64)
    np.testing.assert_allclose(space.mean, values.mean(0), rtol=1e-9)
    np.testing.assert_allclose(space.std, values.std(0), rtol=1e-9)
    batch = next(iter(data.train_dataloader()))
    assert batch["targets"].dtype == torch.float32 and batch["targets"].shape == (4, 2)
    assert TargetSpace.from_dict(space.to_dict()) == space


def test_multilabel_classify(tmp_path):
    rng = np.random.default_rng(7)
    rows = [(random_dna(rng, 25), str(i % 2), str((i // 2) % 2)) for i in range(12)]
    path = write_table(tmp_path / "m.tsv", rows, header="sequence\tlabel_x\tlabel_y")
    data = LabelledDataModule("classify", [str(path)], val_fraction=0.25, batch_size=4)
    data.setup("fit")
    assert data.target_space == TargetSpace(TargetKind.SEQUENCE_LABELS, ("x", "y"))
    batch = next(iter(data.train_dataloader()))
    assert batch["targets"].dtype == torch.float32 and batch["targets"].shape == (4, 2)


def test_pad_sequences_and_pad_windows():
    samples = [
        {"tokens": torch.tensor([0, 1, 2], dtype=torch.uint8), "targets": torch.tensor([1, 2, 3]), "start": 5},
        {"tokens": torch.tensor([3], dtype=torch.uint8), "targets": torch.tensor([4]), "start": 9},
    ]
    batch = pad_windows(samples)
    assert batch["tokens"].tolist() == [[0, 1, 2], [3, PAD, PAD]]
    assert batch["targets"].tolist() == [[1, 2, 3], [4, IGNORE, IGNORE]] and batch["targets"].dtype == torch.int64
    assert batch["length"].tolist() == [3, 1] and batch["start"].tolist() == [5, 9]
    for sample, values in zip(samples, ([0.5, 1.5, 2.5], [3.5])):
        sample["targets"] = torch.tensor(values)
    values = pad_windows(samples)["targets"]
    assert values.dtype == torch.float32 and torch.isnan(values[1, 1:]).all() and values[1, 0] == 3.5
    sequences = pad_sequences(
        [
            {"tokens": torch.tensor([1, 1], dtype=torch.uint8), "targets": torch.tensor(2), "index": 0},
            {"tokens": torch.tensor([2], dtype=torch.uint8), "targets": torch.tensor(0), "index": 1},
        ]
    )
    assert sequences["tokens"].tolist() == [[1, 1], [2, PAD]] and sequences["targets"].tolist() == [2, 0]


# ------------------------------------------------------------------ per-base tasks
def test_annotate_from_gff3_with_fasta_holds_out_a_region(tmp_path):
    path, sequence = write_gff3_genome(tmp_path / "genome.gff3")
    data = LabelledDataModule("annotate", [str(path)], window=256, samples_per_epoch=16, batch_size=4, val_fraction=0.2)
    assert data.per_base
    data.setup("fit")
    assert data.target_space == TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)
    train, val = data.splits["train"], data.splits["val"]
    labels = expected_labels()
    spans = []
    for track in train + val:  # pieces named ctg1:start-end hold the bases and labels of the contig
        start, end = (int(x) for x in track.name.split(":")[1].split("-"))
        assert decode(track.codes) == sequence[start:end]
        np.testing.assert_array_equal(track.targets, labels[start:end])
        spans.append((start, end, track in val))
    [(held_start, held_end, _)] = [s for s in spans if s[2]]
    assert held_end - held_start == 600
    for start, end, held in spans:  # a window-sized gap on each side of the held-out region
        if not held:
            assert end <= held_start - 256 or start >= held_end + 256
    batch = next(iter(data.train_dataloader()))
    assert set(batch) >= {"tokens", "length", "targets", "contig", "start"}
    assert batch["tokens"].shape == (4, 256) and batch["tokens"].dtype == torch.uint8
    assert batch["targets"].shape == (4, 256) and batch["targets"].dtype == torch.int64
    assert (batch["length"] == 256).all()
    val_batches = list(data.val_dataloader())
    covered = np.zeros(600, dtype=int)
    for b in val_batches:
        for start, n in zip(b["start"].tolist(), b["length"].tolist()):
            covered[start : start + n] += 1
    assert (covered >= 1).all()  # the tiles reach every held-out base


def test_tiled_track_windows_serve_every_base_once():
    rng = np.random.default_rng(0)
    track = Track("a", rng.integers(0, 4, 600).astype(np.uint8), rng.integers(0, 5, 600).astype(np.uint8))
    tiles = TiledTrackWindows([track], 256)
    counted = np.zeros(600, dtype=int)
    for i in range(len(tiles)):
        sample = tiles[i]
        known = sample["targets"].numpy() != IGNORE
        counted[sample["start"] + np.flatnonzero(known)] += 1
    np.testing.assert_array_equal(counted, np.ones(600, dtype=int))


def test_annotate_with_a_val_genome_and_contig_leaks(tmp_path):
    train, _ = write_gff3_genome(tmp_path / "a.gff3", seed=1, name="ctgA")
    val, _ = write_gff3_genome(tmp_path / "b.gff3", length=2800, seed=2, name="ctgB")
    data = LabelledDataModule("annotate", [str(train)], val=[str(val)], window=300, samples_per_epoch=8, batch_size=2)
    data.setup("fit")
    assert [t.name for t in data.splits["val"]] == ["ctgB"]
    tiles = TiledTrackWindows(data.splits["val"], 300)
    assert len(tiles) == 10 and tiles[9]["start"] + len(tiles[9]["tokens"]) == 2800
    with pytest.raises(ValueError, match="also in the training data"):
        LabelledDataModule("annotate", [str(train)], val=[str(train)], window=300).setup("fit")


def test_regress_per_base_from_a_bedgraph(tmp_path):
    rng = np.random.default_rng(3)
    genome = tmp_path / "g.fa"
    genome.write_text(">chr1\n" + random_dna(rng, 2000) + "\n")
    track = tmp_path / "signal.bedgraph"
    track.write_text("".join(f"chr1\t{s}\t{s + 50}\t{rng.normal(2, 1):.3f}\n" for s in range(0, 2000, 100)))
    data = LabelledDataModule(
        "regress", [str(track)], genome=str(genome), window=200, samples_per_epoch=8, batch_size=4, val_fraction=0.2
    )
    assert data.per_base
    data.setup("fit")
    space = data.target_space
    assert space.kind is TargetKind.BASE_VALUES and space.names == ("signal",)
    known = np.concatenate([t.targets[np.isfinite(t.targets)] for t in data.splits["train"]])
    assert space.mean[0] == pytest.approx(known.mean(), rel=1e-6)
    batch = next(iter(data.train_dataloader()))
    assert batch["targets"].dtype == torch.float32 and batch["targets"].shape == (4, 200)
    with pytest.raises(ValueError, match="--genome"):
        LabelledDataModule("regress", [str(track)], window=200).setup("fit")


# ------------------------------------------------------------------ exact resume
def test_random_track_windows_are_a_pure_function_of_epoch_and_index():
    rng = np.random.default_rng(0)
    tracks = [
        Track("a", rng.integers(0, 4, 500).astype(np.uint8), rng.integers(0, 5, 500).astype(np.uint8)),
        Track("b", rng.integers(0, 4, 90).astype(np.uint8), rng.integers(0, 5, 90).astype(np.uint8)),
    ]
    one = RandomTrackWindows(tracks, 100, samples_per_epoch=50, seed=3)
    two = RandomTrackWindows(tracks, 100, samples_per_epoch=50, seed=3)
    for key in [(0, 0), (0, 7), (2, 7), (5, 49)]:
        a, b = one[key], two[key]
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["targets"], b["targets"])
        assert (a["contig"], a["start"]) == (b["contig"], b["start"])
        track = tracks[a["contig"]]
        np.testing.assert_array_equal(a["tokens"].numpy(), track.codes[a["start"] : a["start"] + 100])
    two.set_epoch(2)  # a plain index reads the current epoch
    assert two[7]["start"] == one[(2, 7)]["start"]
    starts = {(e, i): (one[(e, i)]["contig"], one[(e, i)]["start"]) for e in range(3) for i in range(50)}
    assert len(set(starts.values())) > 50  # epochs differ
    short = RandomTrackWindows(tracks[1:], 100, samples_per_epoch=5)
    assert all(short[(0, i)]["start"] == 0 and len(short[(0, i)]["tokens"]) == 90 for i in range(5))  # served whole
    other_seed = RandomTrackWindows(tracks, 100, samples_per_epoch=50, seed=4)
    assert [other_seed[(0, i)]["start"] for i in range(10)] != [one[(0, i)]["start"] for i in range(10)]


def test_sequence_dataset_order_is_a_pure_function_of_seed_and_epoch(tmp_path):
    seqs = read_labelled(write_table(tmp_path / "t.tsv", classify_rows(30, seed=8)), task="classify")
    one, two = SequenceDataset(seqs, shuffle=True, seed=1), SequenceDataset(seqs, shuffle=True, seed=1)
    order = {e: [one[(e, i)]["index"] for i in range(30)] for e in (0, 1, 2)}
    assert all(sorted(o) == list(range(30)) for o in order.values())  # a permutation per epoch
    assert order[0] != order[1] != order[2]
    assert [two[(1, i)]["index"] for i in range(30)] == order[1]
    assert [two[(0, i)]["index"] for i in range(30)] == order[0]  # going back an epoch is the same too
    plain = SequenceDataset(seqs, shuffle=False)
    assert [plain[(4, i)]["index"] for i in range(30)] == list(range(30))


# ------------------------------------------------------------------ errors
def test_errors(tmp_path):
    rows = classify_rows(6, seed=10)
    train = str(write_table(tmp_path / "t.tsv", rows))
    with pytest.raises(ValueError, match="task must be one of classify, regress, annotate"):
        LabelledDataModule("segment", [train])
    with pytest.raises(ValueError, match="no training files"):
        LabelledDataModule("classify", [])
    with pytest.raises(ValueError, match="val_fraction"):
        LabelledDataModule("classify", [train], val_fraction=1.0)
    with pytest.raises(ValueError, match="leaks must be"):
        LabelledDataModule("classify", [train], leaks="keep")
    with pytest.raises(ValueError, match="longer than max_length=30"):
        LabelledDataModule("classify", [train], val_fraction=0.3, max_length=30).setup("fit")
    data = LabelledDataModule("classify", [train], val_fraction=0.3, batch_size=8)
    data.setup("fit")
    with pytest.raises(ValueError, match="fewer than batch_size=8"):
        data.train_dataloader()
    with pytest.raises(ValueError, match="no test files"):
        LabelledDataModule("classify", [train], val_fraction=0.3).setup("test")
