"""benchmarks/flagship.py: what can be checked without a GPU or the fetched genomes (the rest ran
as `SMOKE=1 bash benchmarks/gpu_flagship.sh sweep|long` on the CPU)."""

from __future__ import annotations

import tarfile

import numpy as np

from benchmarks import flagship
from data_helpers import write_fasta


def test_parts_rejoin_into_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(flagship, "PART_BYTES", 1000)
    folder = tmp_path / "out" / "flagship"
    folder.mkdir(parents=True)
    payload = np.random.default_rng(0).bytes(3500)
    (folder / "scores.bin").write_bytes(payload)
    flagship.pack(folder, tmp_path / "out")
    parts = sorted((tmp_path / "out").glob("flagship.tar.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))
    assert not folder.exists() and len(parts) > 3 and all(p.stat().st_size <= 1000 for p in parts)
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        tar.extractall(tmp_path / "back", filter="data")
    assert (tmp_path / "back" / "flagship" / "scores.bin").read_bytes() == payload


def test_long_models_get_every_context_and_the_others_their_own():
    contexts = [1024, 8192, 32768]
    assert flagship._contexts_of(32768, contexts) == contexts
    assert flagship._contexts_of(8192, contexts) == [8192]


def test_held_out_contigs_follow_the_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(flagship, "MIN_CONTIG", 100)
    rng = np.random.default_rng(1)
    fasta = write_fasta(tmp_path / "g.fa", [(f"c{i}", "".join(rng.choice(list("ACGT"), size=n)))
                                            for i, n in enumerate([50, 300, 120, 400, 200])])
    chosen = flagship._whole_contigs(fasta, budget=500)
    # contigs of at least MIN_CONTIG bases, in file order, until the budget is reached
    assert [name for name, _ in chosen] == ["c1", "c2", "c3"]
