"""benchmarks/genome_science.py's report stage renders the committed results: the per-genome
table, the curve, the targets and the BENCHMARKS.md section, without measuring anything."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.genome_science import main

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "benchmarks" / "results" / "genome_science"


def test_report_renders_the_committed_results(tmp_path, monkeypatch):
    results = tmp_path / "genome_science"
    shutil.copytree(RESULTS, results)
    monkeypatch.chdir(REPO_ROOT)  # the results name their configs relative to the repository
    markdown = tmp_path / "BENCHMARKS.md"
    main(["report", "--results", str(results), "--benchmarks_md", str(markdown)])
    text = markdown.read_text()
    assert "<!-- genome-science:start -->" in text and "<!-- genome-science:end -->" in text
    for genome in ("ecoli_k12_mg1655", "saureus_col", "hpylori_els37", "vcholerae_o395"):
        assert genome in text
    assert text.count("model below the best Markov model: MET") == 2
    assert (results / "context_curve.png").stat().st_size > 10_000
    assert (results / "summary.json").is_file() and (results / "table.md").is_file()
