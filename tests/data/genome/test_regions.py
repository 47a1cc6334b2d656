"""Regions as users write them: BED files and 1-based chrom:start-end strings, checked against a genome."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
from data_helpers import write_fasta
from genoformer.data.genome.inputs import NamedSequence, read_sequences
from genoformer.data.genome.regions import Region, read_regions, record_regions
from genoformer.data.genome.store import prepare_genome_store
from genoformer.data.splits import SplitSpec

LENGTHS = {"chr1": 5_000, "chr2": 300, "plasmid:p1": 1_000}


def test_strings_are_one_based_inclusive_and_become_half_open():
    regions = read_regions(["chr1:1-1,000", "chr2:101-200", "chr2:300-300"], LENGTHS)
    assert regions == [
        Region("chr1", 0, 1000, "chr1:1-1000"),
        Region("chr2", 100, 200, "chr2:101-200"),
        Region("chr2", 299, 300, "chr2:300-300"),
    ]
    assert [region.length for region in regions] == [1000, 100, 1]
    assert [region.label for region in regions] == ["chr1:1-1000", "chr2:101-200", "chr2:300-300"]


def test_a_record_alone_is_the_whole_record_and_a_start_alone_runs_to_its_end():
    assert read_regions("chr2", LENGTHS) == [Region("chr2", 0, 300, "chr2")]
    assert read_regions("chr1:4,001", LENGTHS) == [Region("chr1", 4000, 5000, "chr1:4001-5000")]
    # a record name holding ':' is read whole first, and its regions still parse
    assert read_regions("plasmid:p1", LENGTHS) == [Region("plasmid:p1", 0, 1000, "plasmid:p1")]
    assert read_regions("plasmid:p1:11-20", LENGTHS) == [Region("plasmid:p1", 10, 20, "plasmid:p1:11-20")]


def test_bed_files_are_zero_based_with_optional_names(tmp_path):
    bed = tmp_path / "regions.bed.gz"
    with gzip.open(bed, "wt") as handle:
        handle.write(
            "# a comment\ntrack name=x\nbrowser position chr1\n\n"
            "chr1\t0\t100\tpromoter\textra\nchr2\t10\t20\nchr1\t4990\t5000\t.\n"
        )
    assert read_regions(str(bed), LENGTHS) == [
        Region("chr1", 0, 100, "promoter"),
        Region("chr2", 10, 20, "chr2:11-20"),
        Region("chr1", 4990, 5000, "chr1:4991-5000"),
    ]
    # a BED file and strings mix, in the order given
    assert [r.name for r in read_regions([bed, "chr2:1-5"], LENGTHS)] == [
        "promoter",
        "chr2:11-20",
        "chr1:4991-5000",
        "chr2:1-5",
    ]


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "chrX:1-10",
            "region 'chrX:1-10': record 'chrX' is not in the genome, which holds 3 record(s): 'chr1', 'chr2', "
            "'plasmid:p1'; name one of these records",
        ),
        ("chrX", "region 'chrX': record 'chrX' is not in the genome"),
        (
            "chr2:1-301",
            "region 'chr2:1-301': the end (301) lies beyond the end of record 'chr2' (300 bases); "
            "give an end of at most 300",
        ),
        ("chr2:20-10", "region 'chr2:20-10': the start (20) lies after the end (10); give start <= end"),
        ("chr2:0-10", "positions are 1-based (the first base is 1)"),
        ("chr2:a-b", "cannot read it as chrom:start-end (1-based, inclusive)"),
    ],
)
def test_bad_strings_name_the_region_and_the_fix(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read_regions(spec, LENGTHS)


@pytest.mark.parametrize(
    "line, message",
    [
        ("chrZ\t0\t10", "line 2 (chrZ 0 10): record 'chrZ' is not in the genome"),
        ("chr2\t0\t301", "line 2 (chr2 0 301): the end (301) lies beyond the end of record 'chr2' (300 bases)"),
        ("chr2\t20\t10", "line 2: the start (20) lies after the end (10)"),
        ("chr2\t10\t10", "line 2 (chr2 10 10): the region is empty (0 bases)"),
        ("chr2\t-1\t10", "line 2: the start (-1) is negative"),
        ("chr2\tten\t20", "line 2: start 'ten' and end '20' must be whole numbers"),
        ("chr2 0 10", "line 2: 1 tab-separated field(s)"),
    ],
)
def test_bad_bed_lines_name_the_file_and_line(tmp_path, line, message):
    bed = tmp_path / "bad.bed"
    bed.write_text(f"chr1\t0\t10\n{line}\n")
    with pytest.raises(ValueError, match=re.escape(f"{bed} {message}")):
        read_regions(str(bed), LENGTHS)


def test_missing_and_empty_bed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="BED file of regions not found: .*missing.bed"):
        read_regions(str(tmp_path / "missing.bed"), LENGTHS)
    empty = tmp_path / "empty.bed"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no regions"):
        read_regions(str(empty), LENGTHS)
    with pytest.raises(ValueError, match="no regions given"):
        read_regions([], LENGTHS)


def named(name: str, length: int, source: str = "genome.fa") -> NamedSequence:
    return NamedSequence(name, source, np.zeros(length, dtype=np.uint8))


def test_record_regions_are_whole_records_given_regions_or_a_split():
    records = [named("chr1", 1000), named("chr2", 200)]
    assert record_regions(records) == [(0, Region("chr1", 0, 1000, "chr1")), (1, Region("chr2", 0, 200, "chr2"))]
    assert record_regions(records, ["chr2:11-20", "chr1"]) == [
        (1, Region("chr2", 10, 20, "chr2:11-20")),
        (0, Region("chr1", 0, 1000, "chr1")),
    ]
    spec = SplitSpec(val_fraction=0.1, test_fraction=0.05)
    assert record_regions(records, split="test", split_spec=spec) == [
        (0, Region("chr1", 950, 1000, "chr1:951-1000")),
        (1, Region("chr2", 190, 200, "chr2:191-200")),
    ]
    assert [region for _, region in record_regions(records, split="train")] == [  # SplitSpec(): the last 5% is val
        Region("chr1", 0, 950, "chr1:1-950"),
        Region("chr2", 0, 190, "chr2:1-190"),
    ]
    with pytest.raises(ValueError, match=r"give regions=REGIONS or split=SPLIT, not both"):
        record_regions(records, "chr1", split="test")
    with pytest.raises(ValueError, match=r"the test split of these inputs is empty under SplitSpec\(by='region'"):
        record_regions(records, split="test")
    with pytest.raises(ValueError, match="record 'chr1' occurs twice in the inputs"):
        record_regions([*records, named("chr1", 10, "other.fa")], "chr1:1-5")


def test_a_store_split_by_files_follows_the_files_its_contigs_came_from(tmp_path):
    first = write_fasta(tmp_path / "first.fa", [("a", "ACGT" * 50), ("b", "ACGT" * 20)])
    second = write_fasta(tmp_path / "second.fa", [("c", "ACGT" * 30)])
    store = prepare_genome_store([first, second], tmp_path / "g.zarr", progress=False)
    records = list(read_sequences([store]))
    spec = SplitSpec(by="files", test=["second.fa"])
    assert record_regions(records, split="test", split_spec=spec) == [(2, Region("c", 0, 120, "c"))]
    assert [region.name for _, region in record_regions(records, split="train", split_spec=spec)] == ["a", "b"]
