"""Labelled sequences: every input format, every bad input, class balance, leak checks and leak-free splits."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from data_helpers import SHARED_DATA, random_bases, require_shared, write_fasta
from genoformer.data.genome.alphabet import decode, encode, reverse_complement
from genoformer.data.genome.labels import (
    LabelledSequences,
    canonical_key,
    class_balance,
    kfold_leak_free,
    leak_check,
    read_labelled,
    read_unlabelled,
    split_leak_free,
)
from genoformer.data.genome.targets import TargetKind

SHARED_EXTRA = Path(__file__).resolve().parents[3] / ".." / "shared-extra"
SPLICE = SHARED_DATA / "labeled" / "splice_junctions_statlog.tsv"
TF_BINDING = SHARED_EXTRA / "labeled" / "tf_binding"


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def seqs_of(strings: list[str], labels: list[int] | None = None) -> LabelledSequences:
    labels = labels if labels is not None else [0] * len(strings)
    return LabelledSequences(
        [f"s{i}" for i in range(len(strings))],
        [encode(s) for s in strings],
        np.asarray(labels, dtype=np.int64),
        TargetKind.SEQUENCE_CLASSES,
        ["a", "b"],
        {},
    )


# --- tables -----------------------------------------------------------------------------------


def test_tsv_classes_in_natural_order_with_names_and_extra_columns(tmp_path):
    path = write(
        tmp_path / "train.tsv.gz",
        "name\tsequence\tlabel\tsource\na\tACGT\t10\tx\nb\tacgn\t2\ty\nc\tGGCC\t1\tz\nd\tTTTT\t2\tw\n",
    )
    seqs = read_labelled(path, task="classify")
    assert seqs.kind == TargetKind.SEQUENCE_CLASSES and seqs.label_names == ["1", "2", "10"]
    assert seqs.targets.dtype == np.int64 and seqs.targets.tolist() == [2, 1, 0, 1]
    assert seqs.names == ["a", "b", "c", "d"] and decode(seqs.codes[1]) == "ACGN"
    assert seqs.columns == {"name": ["a", "b", "c", "d"], "source": ["x", "y", "z", "w"]}
    assert len(seqs) == 4 and seqs.subset([3, 0]).names == ["d", "a"]


def test_string_classes_sort_and_unnamed_rows_are_seq_i(tmp_path):
    first = write(tmp_path / "a.csv", "sequence,label\nACGT,neither\nGGGG,donor\n")
    second = write(tmp_path / "b.csv", "sequence,label\nTTTT,acceptor\n")
    seqs = read_labelled([first, second], task="classify")
    assert seqs.label_names == ["acceptor", "donor", "neither"] and seqs.targets.tolist() == [2, 1, 0]
    assert seqs.names == ["seq0", "seq1", "seq2"]


def test_multilabel_columns_accept_words(tmp_path):
    path = write(
        tmp_path / "m.tsv", "sequence\tlabel_open\tlabel_bound\nACGT\t1\ttrue\nGGCC\tno\t0\nTTAA\tyes\tFalse\n"
    )
    seqs = read_labelled(path, task="classify")
    assert seqs.kind == TargetKind.SEQUENCE_LABELS and seqs.label_names == ["open", "bound"]
    assert seqs.targets.dtype == np.float32
    np.testing.assert_array_equal(seqs.targets, [[1, 1], [0, 0], [1, 0]])
    reordered = read_labelled(path, task="classify", classes=["bound", "open"])
    np.testing.assert_array_equal(reordered.targets, [[1, 1], [0, 0], [0, 1]])


def test_regression_targets(tmp_path):
    path = write(tmp_path / "r.csv", "sequence,label_expr,label_stab\nACGT,1.5,-2\nGGCC,3,0.25\n")
    seqs = read_labelled(path, task="regress")
    assert seqs.kind == TargetKind.SEQUENCE_VALUES and seqs.label_names == ["expr", "stab"]
    np.testing.assert_allclose(seqs.targets, [[1.5, -2], [3, 0.25]])
    single = read_labelled(write(tmp_path / "s.tsv", "sequence\tlabel\nACGT\t0.5\nGGCC\t1\n"), task="regress")
    assert single.label_names == ["label"] and single.targets.shape == (2, 1)
    assert class_balance(single) == "1 target(s) over 2 sequences: label mean 0.75 sd 0.25"


@pytest.mark.parametrize(
    "text, task, message",
    [
        ("sequence\tlabel\nACGT\ta\n\tb\n", "classify", r"s.tsv row 3: the sequence is empty"),
        (
            "sequence\tlabel\nACGT\ta\nACXT\tb\n",
            "classify",
            r"s.tsv row 3: the sequence, base 3 \(1-based\): invalid character 'X'",
        ),
        ("seq\tlabel\nACGT\ta\n", "classify", r"no `sequence` column; found the columns \['seq', 'label'\]"),
        ("sequence\tclass\nACGT\ta\n", "classify", r"no label column; found the columns \['sequence', 'class'\]"),
        (
            "sequence\tlabel\nACGT\ta\nGGCC\ta\n",
            "classify",
            r"every label is 'a'; classification needs at least 2 classes",
        ),
        ("sequence\tlabel\nACGT\t1.5\nGGCC\thigh\n", "regress", r"s.tsv row 3, column 'label': 'high' is not a number"),
        ("sequence\tlabel_x\nACGT\t1\nGGCC\t2\n", "classify", r"s.tsv row 3, column 'label_x': '2' is not 0/1"),
        ("sequence\tlabel\nACGT\ta\nGGCC\tb\textra\n", "classify", r"s.tsv row 3: 3 fields but the header has 2"),
    ],
)
def test_bad_tables_are_clear_errors(tmp_path, text, task, message):
    with pytest.raises(ValueError, match=message):
        read_labelled(write(tmp_path / "s.tsv", text), task=task)


def test_unknown_class_names_the_row_and_the_training_classes(tmp_path):
    path = write(tmp_path / "val.tsv", "sequence\tlabel\nACGT\tdonor\nGGCC\tacceptor\nTTAA\tx\n")
    with pytest.raises(
        ValueError,
        match=r"label 'x' in .*val.tsv row 4 is not one of the training classes "
        r"\['donor', 'acceptor'\]",
    ):
        read_labelled(path, task="classify", classes=["donor", "acceptor"])
    # a validation set may lack a class; the training order fixes the indices
    ok = write(tmp_path / "ok.tsv", "sequence\tlabel\nACGT\tacceptor\n")
    assert read_labelled(ok, task="classify", classes=["donor", "acceptor"]).targets.tolist() == [1]


def test_missing_file_and_unknown_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found: .*nope.tsv"):
        read_labelled(tmp_path / "nope.tsv", task="classify")
    with pytest.raises(ValueError, match="unknown input type"):
        read_labelled(write(tmp_path / "x.json", "{}"), task="classify")


# --- FASTA + table --------------------------------------------------------------------------------


def test_fasta_with_a_name_table(tmp_path):
    fasta = write_fasta(tmp_path / "seqs.fa", [("r1", "ACGT"), ("r2", "GGCC"), ("r3", "TTAA")])
    table = write(tmp_path / "labels.tsv", "name\tlabel\tnote\nr3\tpos\tc\nr1\tneg\ta\nr2\tpos\tb\n")
    seqs = read_labelled([fasta, table], task="classify")
    assert seqs.names == ["r3", "r1", "r2"] and [decode(c) for c in seqs.codes] == ["TTAA", "ACGT", "GGCC"]
    assert seqs.label_names == ["neg", "pos"] and seqs.targets.tolist() == [1, 0, 1]
    assert seqs.columns == {"name": ["r3", "r1", "r2"], "note": ["c", "a", "b"]}
    assert read_labelled([table, fasta], task="classify").names == seqs.names


@pytest.mark.parametrize(
    "records, table, message",
    [
        (
            [("r1", "ACGT"), ("r2", "GGCC")],
            "name\tlabel\nr1\ta\n",
            r"1 FASTA record\(s\) of .* have no row in .*: 'r2'",
        ),
        ([("r1", "ACGT")], "name\tlabel\nr1\ta\nr9\tb\n", r"1 name\(s\) in .* are not records of .*: 'r9'"),
        ([("r1", "ACGT")], "name\tlabel\nr1\ta\nr1\tb\n", r"the `name` column of .* repeats 1 name\(s\): 'r1'"),
        ([("r1", "ACGT"), ("r1", "GGCC")], "name\tlabel\nr1\ta\n", r"the record name 'r1' appears twice"),
    ],
)
def test_bad_pairings_are_clear_errors(tmp_path, records, table, message):
    fasta = write_fasta(tmp_path / "seqs.fa", records)
    with pytest.raises(ValueError, match=message):
        read_labelled([fasta, write(tmp_path / "labels.tsv", table)], task="classify")


def test_fasta_alone_has_no_labels_but_reads_unlabelled(tmp_path):
    fasta = write_fasta(tmp_path / "seqs.fa", [("r1", "ACGT"), ("r2", "GGCC")])
    with pytest.raises(ValueError, match="a FASTA file holds no labels"):
        read_labelled(fasta, task="classify")
    seqs = read_unlabelled(fasta)
    assert seqs.names == ["r1", "r2"] and seqs.targets.tolist() == [-1, -1] and seqs.label_names == []
    assert class_balance(seqs) == "2 unlabelled sequences"
    table = write(tmp_path / "t.tsv", "sequence\tlabel\tid\nACGT\ta\tx\n")
    assert read_unlabelled(table).columns == {"sequence": ["ACGT"], "label": ["a"], "id": ["x"]}  # all carried
    with pytest.raises(ValueError, match="no FASTA file is given with it"):
        read_labelled(write(tmp_path / "n.tsv", "name\tlabel\nr1\ta\n"), task="classify")


# --- BED --------------------------------------------------------------------------------------------


@pytest.fixture
def genome(tmp_path) -> tuple[Path, str]:
    sequence = random_bases(np.random.default_rng(3), 500)
    return write_fasta(tmp_path / "genome.fa", [("chr1", sequence), ("chr2", "ACGT" * 10)]), sequence


def test_bed_intervals_with_strand(tmp_path, genome):
    path, sequence = genome
    bed = write(
        tmp_path / "sites.bed",
        "track name=x\n# comment\nchr1\t10\t20\tbound\t5\t+\nchr1\t30\t45\tfree\t0\t-\nchr2\t0\t8\tbound\t1\t.\n",
    )
    seqs = read_labelled(bed, task="classify", genome=path)
    assert seqs.names == ["chr1:10-20(+)", "chr1:30-45(-)", "chr2:0-8"]
    assert decode(seqs.codes[0]) == sequence[10:20]
    assert decode(seqs.codes[1]) == decode(reverse_complement(encode(sequence[30:45])))
    assert seqs.label_names == ["bound", "free"] and seqs.targets.tolist() == [0, 1, 0]
    assert seqs.columns == {
        "chrom": ["chr1", "chr1", "chr2"],
        "start": ["10", "30", "0"],
        "end": ["20", "45", "8"],
        "score": ["5", "0", "1"],
        "strand": ["+", "-", "."],
    }
    plain = read_unlabelled(write(tmp_path / "plain.bed", "chr1\t0\t5\n"), genome=path)
    assert plain.names == ["chr1:0-5"] and decode(plain.codes[0]) == sequence[:5]


@pytest.mark.parametrize(
    "line, message",
    [
        ("chrZ\t0\t10\ta", r"sites.bed line 2: chromosome 'chrZ' is not in the genome, which holds 'chr1', 'chr2'"),
        ("chr2\t30\t50\ta", r"sites.bed line 2: interval chr2:30-50 runs past the end of 'chr2' \(40 bases\)"),
        ("chr1\t10\t10\ta", r"sites.bed line 2: interval chr1:10-10 is empty"),
        ("chr1\t10\t20", r"sites.bed line 2: no label"),
    ],
)
def test_bad_bed_lines_are_clear_errors(tmp_path, genome, line, message):
    bed = write(tmp_path / "sites.bed", f"chr1\t0\t5\tb\n{line}\n")
    with pytest.raises(ValueError, match=message):
        read_labelled(bed, task="classify", genome=genome[0])


def test_bed_needs_a_genome(tmp_path):
    with pytest.raises(ValueError, match="needs the genome its coordinates refer to; pass genome="):
        read_labelled(write(tmp_path / "s.bed", "chr1\t0\t5\ta\n"), task="classify")


# --- balance, leaks, splits -----------------------------------------------------------------------


def test_class_balance_lines_and_the_imbalance_warning():
    seqs = LabelledSequences(
        [f"s{i}" for i in range(20)],
        [encode("ACGT")] * 20,
        np.asarray([0] * 19 + [1], dtype=np.int64),
        TargetKind.SEQUENCE_CLASSES,
        ["neg", "pos"],
        {},
    )
    line = class_balance(seqs)
    assert line.startswith("2 classes: neg 19 (95.0%), pos 1 (5.0%); imbalanced: pos has 5.3% as many sequences as neg")
    assert "imbalanced" not in class_balance(seqs.subset(np.arange(10, 20)))
    multi = LabelledSequences(
        ["a", "b"],
        [encode("A"), encode("C")],
        np.asarray([[1, 0], [1, 1]], np.float32),
        TargetKind.SEQUENCE_LABELS,
        ["x", "y"],
        {},
    )
    assert class_balance(multi).startswith(
        "2 labels over 2 sequences, positive: x 2 (100.0%), y 1 (50.0%); imbalanced: x"
    )


def test_leak_check_fires_on_a_reverse_complement():
    train = seqs_of(["ACGTTGCA", "GGGAAACC", "TTTTCCCA"])
    other = seqs_of(["CCCCCCCA", decode(reverse_complement(encode("GGGAAACC")))])
    with pytest.raises(
        ValueError,
        match=r"1 of the 2 val sequences also occur in the training set .* e.g. val 's1' = "
        r"train 's1'; deduplicate the files or split one set with split_leak_free",
    ):
        leak_check(train, other, "val")
    leak_check(train, seqs_of(["CCCCCCCA"]), "val")


def test_split_leak_free_keeps_reverse_complements_together():
    rng = np.random.default_rng(0)
    strings = [random_bases(rng, 30) for _ in range(100)]
    strings += [decode(reverse_complement(encode(s))) for s in strings[:40]] + strings[:10]
    seqs = seqs_of(strings)
    kept, held = split_leak_free(seqs, 0.2, seed=1)
    assert len(kept) + len(held) == len(seqs) and abs(len(held) - 30) <= 3
    assert not {canonical_key(c) for c in kept.codes} & {canonical_key(c) for c in held.codes}
    leak_check(kept, held, "held-out")
    again_kept, _ = split_leak_free(seqs, 0.2, seed=1)
    assert again_kept.names == kept.names and split_leak_free(seqs, 0.2, seed=2)[0].names != kept.names
    with pytest.raises(ValueError, match="none fits"):
        split_leak_free(seqs_of(["ACGT", "ACGT", "ACGT"]), 0.3, seed=0)


def test_kfold_leak_free_partitions_with_groups_in_one_fold():
    rng = np.random.default_rng(1)
    strings = [random_bases(rng, 20) for _ in range(30)]
    strings += [decode(reverse_complement(encode(s))) for s in strings[:10]]
    seqs = seqs_of(strings)
    folds = kfold_leak_free(seqs, 4, seed=0)
    tests = np.concatenate([test for _, test in folds])
    assert sorted(tests.tolist()) == list(range(len(seqs)))
    for train, test in folds:
        assert train.dtype == np.int64 and not set(train.tolist()) & set(test.tolist())
        leak_check(seqs.subset(train), seqs.subset(test), "fold")
        assert 9 <= test.size <= 11


# --- real files ------------------------------------------------------------------------------------


def test_splice_junctions_table():
    seqs = read_labelled(require_shared(SPLICE), task="classify")
    assert seqs.label_names == ["acceptor", "donor", "neither"]
    assert np.bincount(seqs.targets).tolist() == [765, 767, 1654]
    assert {c.size for c in seqs.codes} == {60}
    assert class_balance(seqs) == "3 classes: acceptor 765 (24.0%), donor 767 (24.1%), neither 1,654 (51.9%)"
    kept, held = split_leak_free(seqs, 0.1, seed=0)
    leak_check(kept, held, "val")


@pytest.mark.parametrize("factor", ["oct4", "mafk"])
def test_tf_binding_fasta_reads_unlabelled(factor):
    test = read_unlabelled(require_shared(TF_BINDING / f"{factor}_test.fasta"))
    assert len(test) == 100 and {c.size for c in test.codes} == {200}
    assert test.names[0].startswith("chr") and ":" in test.names[0]
