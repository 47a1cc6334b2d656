"""Reading whole records from FASTA/GenBank files and genome stores, for the commands that score them."""

from __future__ import annotations

import numpy as np
import pytest
from data_helpers import write_fasta
from genoformer.data.genome.alphabet import encode
from genoformer.data.genome.inputs import read_sequences


def test_files_and_stores_give_the_same_records(tmp_path, small_store, small_records):
    fasta = write_fasta(tmp_path / "small.fa", small_records)
    from_file = list(read_sequences([fasta]))
    from_store = list(read_sequences([small_store]))
    assert [r.name for r in from_file] == [r.name for r in from_store] == [name for name, _ in small_records]
    for file_record, store_record, (_, sequence) in zip(from_file, from_store, small_records):
        np.testing.assert_array_equal(file_record.codes, encode(sequence))
        np.testing.assert_array_equal(store_record.codes, encode(sequence))
    assert from_file[0].source == str(fasta) and from_store[0].source == str(small_store)


def test_several_inputs_keep_their_order(tmp_path, small_store):
    first = write_fasta(tmp_path / "one.fa", [("x", "ACGT")])
    last = write_fasta(tmp_path / "two.fa", [("y", "ACGT")])
    names = [record.name for record in read_sequences([first, small_store, last])]
    assert names == ["x", "chrA", "chrB", "chrC", "y"]
    with pytest.raises(ValueError, match=r"one.fa: the record name 'x' appears twice in .*one.fa"):
        list(read_sequences([first, small_store, first]))


@pytest.mark.parametrize(
    "records, message",
    [
        ([("fine", "ACGT"), ("empty", "")], "record 'empty' is empty"),
        ([("bad", "ACGTXA")], "record 'bad', base 5 (1-based): invalid character 'X'"),
    ],
)
def test_bad_records_are_clear_errors(tmp_path, records, message):
    path = write_fasta(tmp_path / "bad.fa", records)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        list(read_sequences([path]))
    assert str(path) in str(error.value)


def test_missing_input_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found: .*nope.zarr"):
        list(read_sequences([tmp_path / "nope.zarr"]))
    with pytest.raises(ValueError, match="no input given"):
        list(read_sequences([]))


def test_a_plain_folder_stands_for_its_sequence_files(tmp_path):
    from genoformer.data.genome.inputs import read_sequences

    folder = tmp_path / "genomes"
    folder.mkdir()
    (folder / "b.fa").write_text(">b\nACGT\n")
    (folder / "a.fasta").write_text(">a\nGGCC\n")
    (folder / "notes.txt").write_text("not a genome\n")
    assert [r.name for r in read_sequences([folder])] == ["a", "b"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no FASTA/GenBank files"):
        list(read_sequences([tmp_path / "empty"]))


def test_gff3_with_a_fasta_section_reads_its_sequences(tmp_path):
    from genoformer.data.genome.inputs import read_sequences

    gff = tmp_path / "prokka.gff3"
    gff.write_text(
        "##gff-version 3\n##sequence-region c1 1 12\nc1\tProdigal\tCDS\t1\t9\t.\t+\t0\tID=g1\n"
        "##FASTA\n>c1 contig one\nACGTAC\nGTACGT\n>c2\nTTTT\n"
    )
    records = list(read_sequences([str(gff)]))
    assert [(r.name, len(r.codes)) for r in records] == [("c1", 12), ("c2", 4)]
    bare = tmp_path / "genes.gff3"
    bare.write_text("##gff-version 3\nc1\tProdigal\tCDS\t1\t9\t.\t+\t0\tID=g1\n")
    with pytest.raises(ValueError, match="without a ##FASTA section"):
        list(read_sequences([str(bare)]))
