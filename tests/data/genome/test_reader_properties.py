"""Property tests (hypothesis) of the readers: the FASTA reader and the time-series CSV reader give
back exactly what was written in every layout hypothesis tries (line widths, line endings,
compressions, case, several records), and any other bytes end in a ValueError that names the
file, never in another exception or in a store that looks complete."""

from __future__ import annotations

import bz2
import gzip
import lzma
import tempfile
from pathlib import Path

import numpy as np
from genoformer.data import GenomeStore, TimeSeriesStore, prepare_genome_store, prepare_timeseries_store
from genoformer.data.genome.alphabet import encode_bytes
from genoformer.data.genome.seqfiles import read_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress}

names = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=">"), min_size=1, max_size=12
)


@st.composite
def sequences(draw) -> str:
    """DNA in any case with N, and IUPAC ambiguity codes sprinkled in at most a fifth of the letters
    (more reads as not DNA: data.genome.alphabet.AMBIGUOUS_SHARE_LIMIT)."""
    dna = list(draw(st.text(alphabet="ACGTNacgtn", min_size=1, max_size=300)))
    codes = draw(st.text(alphabet="RYKMSWBDHVrykmswbdhv", max_size=len(dna) // 4))
    for code in codes:
        dna.insert(draw(st.integers(0, len(dna))), code)
    return "".join(dna)


records = st.lists(st.tuples(names, sequences()), min_size=1, max_size=4, unique_by=lambda record: record[0])


def _fasta_bytes(recs: list[tuple[str, str]], width: int, newline: str, description: str) -> bytes:
    lines = []
    for name, seq in recs:
        lines.append(f">{name}{description}")
        lines += [seq[i : i + width] for i in range(0, len(seq), width)]
    return (newline.join(lines) + newline).encode("ascii")


@SETTINGS
@given(
    recs=records,
    width=st.integers(1, 80),
    newline=st.sampled_from(["\n", "\r\n"]),
    suffix=st.sampled_from(sorted(COMPRESS)),
    description=st.sampled_from(["", " some description", "\t x"]),
)
def test_fasta_round_trips_in_any_layout(recs, width, newline, suffix, description):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"g.fa{suffix}"
        path.write_bytes(COMPRESS[suffix](_fasta_bytes(recs, width, newline, description)))
        read = [(r.name, r.sequence.decode("ascii")) for r in read_records(path)]
        assert read == recs
        store = GenomeStore(prepare_genome_store([path], Path(tmp) / "s.zarr", progress=False))
        for contig, (_, seq) in zip(store.contigs, recs):
            assert np.array_equal(store.read(contig.index, 0, contig.length), encode_bytes(seq.encode("ascii")))


@SETTINGS
@given(
    data=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(lambda t: t.encode("utf-8"))),
    suffix=st.sampled_from(sorted(COMPRESS)),
)
def test_any_bytes_give_records_or_a_value_error_naming_the_file(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"any.fa{suffix}"
        path.write_bytes(COMPRESS[suffix](data))
        out = Path(tmp) / "s.zarr"
        try:
            prepare_genome_store([path], out, progress=False)
        except ValueError as error:
            assert str(path) in str(error)
            assert not out.exists(), "a failed build left a store behind"
        else:
            assert GenomeStore(out).total_length > 0


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@SETTINGS
@given(
    values=st.integers(1, 4).flatmap(
        lambda c: st.lists(st.lists(finite, min_size=c, max_size=c), min_size=1, max_size=40)
    ),
    newline=st.sampled_from(["\n", "\r\n"]),
)
def test_csv_round_trips(values, newline):
    matrix_TC = np.array(values, dtype=np.float32)
    header = ",".join(f"ch{c}" for c in range(matrix_TC.shape[1]))
    body = newline.join(",".join(repr(float(x)) for x in row) for row in matrix_TC)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "series.csv"
        path.write_text(header + newline + body + newline, newline="")
        store = TimeSeriesStore(
            prepare_timeseries_store([path], Path(tmp) / "t.zarr", sampling_rate=10.0, progress=False)
        )
        assert store.channel_names == [f"ch{c}" for c in range(matrix_TC.shape[1])]
        assert np.array_equal(store.read(0, 0, matrix_TC.shape[0]), matrix_TC.T)


@SETTINGS
@given(
    data=st.one_of(
        st.text(alphabet=st.sampled_from(list('0123456789.,-eE naNInf\n\r"abc')), max_size=300).map(
            lambda t: t.encode("ascii")
        ),
        st.binary(max_size=300),
    )
)
def test_any_csv_bytes_give_a_store_or_a_value_error_naming_the_file(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "any.csv"
        path.write_bytes(data)
        out = Path(tmp) / "t.zarr"
        try:
            prepare_timeseries_store([path], out, sampling_rate=1.0, progress=False)
        except ValueError as error:
            assert str(path) in str(error), str(error)
            assert not out.exists(), "a failed build left a store behind"
        else:
            assert TimeSeriesStore(out).series[0].length > 0
