"""BENCHMARKS.md is what `python -m benchmarks.report` makes of the committed result files, one page
of at most 20 KB, every section a result file's, every section that README, docs and configs name
found there; and nothing in the package imports benchmarks/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import report
from benchmarks.common import RESULTS, read_result, render

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "BENCHMARKS.md"


def test_the_committed_page_is_what_the_committed_results_give():
    assert PAGE.read_text() == report.page(RESULTS), "run: python -m benchmarks.report"
    assert len(PAGE.read_bytes()) <= 20_000


def test_the_check_runs_as_typed_and_fails_on_a_stale_page(tmp_path):
    command = [sys.executable, "-m", "benchmarks.report", "--check"]
    assert subprocess.run(command, cwd=REPO, capture_output=True).returncode == 0
    (tmp_path / "B.md").write_text(PAGE.read_text().replace("MET", "MT", 1))
    stale = subprocess.run([*command, "--out", str(tmp_path / "B.md")], cwd=REPO, capture_output=True, text=True)
    assert stale.returncode == 1 and "python -m benchmarks.report" in stale.stderr


def test_every_section_comes_from_a_result_file_and_every_named_section_exists():
    titles = {read_result(path)["title"] for path in RESULTS.glob("*.json")}
    page = PAGE.read_text()
    headings = re.findall(r"^## (.+)$", page, flags=re.M)
    assert set(headings) - {"Also measured"} <= titles and len(headings) >= 8
    sources = [
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("docs/design/*.md"),
        *REPO.glob("configs/*.yaml"),
    ]
    scripts = "".join(path.read_text() for path in (REPO / "benchmarks").glob("*.py"))  # a section to come: its title
    for source in sources:
        for name in re.findall(r'BENCHMARKS\.md[^"\n]{0,3}"([^"]+)"', source.read_text()):
            name = " ".join(name.replace("#", "").split())
            assert any(title.startswith(name) for title in headings) or f'"{name}' in scripts, (
                f"{source.name} names {name!r}"
            )


def test_a_section_past_the_size_limit_is_named_instead(tmp_path):
    for path in RESULTS.glob("*.json"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    last = [
        name
        for name in report.PAGE
        if (RESULTS / f"{name}.json").is_file() and read_result(RESULTS / f"{name}.json")["title"] in headings
    ][-1]  # the last section on the page
    large = read_result(RESULTS / f"{last}.json")
    large["summary"]["notes"] = ["a long note " * 500]
    (tmp_path / f"{last}.json").write_text(json.dumps(large))
    text = report.page(tmp_path)
    assert len(text.encode()) <= report.LIMIT_BYTES and f"`{last}`" in text and f"## {large['title']}" not in text
    assert all(f"## {title}\n" in text for title in headings[: headings.index(large["title"])])


def test_nothing_in_the_package_imports_benchmarks():
    for folder in ("genoformer", "kernels", "data"):
        for path in (REPO / folder).rglob("*.py"):
            assert not re.search(r"^\s*(from|import) benchmarks\b", path.read_text(), flags=re.M), path


def test_every_cause_in_gaps_yaml_explains_a_target_that_is_not_met():
    """benchmarks/gaps.yaml names a result file and one of its targets that is missed: a cause
    never outlives its gap, and a renamed target does not leave its cause behind unseen."""
    results = {read_result(path)["name"]: read_result(path) for path in RESULTS.glob("*.json")}
    for name, causes in report.causes().items():
        assert name in results, f"gaps.yaml: no result file named {name}"
        verdicts = {t["target"]: t["status"] for t in results[name]["summary"]["targets"]}
        for target, cause in causes.items():
            assert target in verdicts, f"gaps.yaml [{name}]: no target {target!r}"
            assert verdicts[target] != "MET", f"gaps.yaml [{name}]: {target!r} is met; remove its cause"
            assert cause.strip()
    section = render(results["plugin"], causes=report.causes()["plugin"])
    assert "| gap and cause |" in section and "separate float32 PyTorch passes" in section
