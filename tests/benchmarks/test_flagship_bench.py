"""benchmarks/flagship.py: what can be checked without a GPU or the fetched genomes (the rest ran
as `SMOKE=1 bash benchmarks/gpu_flagship.sh sweep|long` on the CPU), and the report stage on the
committed results."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np

from benchmarks import flagship
from data_helpers import write_fasta

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "flagship"


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


def _report(tmp_path, edit=None) -> str:
    """The report stage on a copy of the committed results (`edit` changes the copy first); the section it writes."""
    results = tmp_path / "flagship"
    shutil.copytree(RESULTS, results)
    if edit:
        edit(results)
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\n<!-- flagship:start -->\nold\n<!-- flagship:end -->\n\n## after\n")
    flagship.main(["report", "--results", str(results), "--benchmarks_md", str(markdown)])
    assert (results / "training_curve.png").stat().st_size > 0 and (results / "context_curve.png").stat().st_size > 0
    text = markdown.read_text()
    assert text.endswith("## after\n") and "old" not in text
    return text


def _targets(text: str) -> list[str]:
    return [line for line in text.split("### Targets")[1].splitlines() if line.startswith("- ")]


def test_report_renders_the_committed_results(tmp_path):
    text = _report(tmp_path)
    assert "## Flagship DNA model: sweep, data, context, mixture with the Markov model" in text
    for bullet in ("Data", "Width", "RoPE base", "32k curriculum", "Mixture"):
        assert f"- **{bullet}.**" in text
    targets = _targets(text)
    assert len(targets) == 4 and all("MET**" in line for line in targets)
    assert all(flagship.FLAGSHIP in line for line in targets)
    # the runs table, the held-out table and the context table hold the final round
    assert "| flagship8k | final: stage 1" in text and f"| {flagship.FLAGSHIP} | bacterial |" in text
    mixed = json.loads((RESULTS / "mixture.json").read_text())["network"]
    assert f"network ({mixed})" in text


def test_report_follows_the_files(tmp_path):
    def edit(results):
        # the mixture redone on the flagship, and a flagship 10% better on the new genus at every context
        mixture = json.loads((results / "mixture.json").read_text())
        (results / "mixture.json").write_text(json.dumps({**mixture, "network": flagship.FLAGSHIP}))
        scores = json.loads((results / "final" / "scores.json").read_text())
        for context in scores["models"][flagship.FLAGSHIP]["contexts"].values():
            for record in context["sets"]["new_genus"]["records"]:
                record["bits"] = [b * 0.9 for b in record["bits"]]
        (results / "final" / "scores.json").write_text(json.dumps(scores))

    text = _report(tmp_path, edit)
    genus = _targets(text)[0]
    assert "**MET**" in genus and "Gap" not in genus
    assert f"network ({flagship.FLAGSHIP})" in text and "first round's network" not in text
