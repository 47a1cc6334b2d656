"""benchmarks/integrity.py: its summary judges the targets on the parts the checks touch, and its
check that damage is caught before timing catches it (its --smoke run: tests/benchmarks/test_smoke.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import integrity

SECONDS = {
    "evaluate_with": 10.2,
    "evaluate_without": 10.0,
    "genome_read_with": 0.011,
    "genome_read_without": 0.010,
    "step_with": 1.01,
    "step_without": 1.0,
    "read_with": 12e-6,
    "read_without": 10e-6,
    "save_atomic": 0.02,
    "save_lightning": 0.01,
    "load_crc_check": 0.004,
    "load_torch": 0.01,
    "load_sha256_of_weights": 0.012,
}
DATA = {
    "detection": {"flipped_checkpoint_refused": True, "flipped_store_chunk_refused": True},
    "seconds": SECONDS,
    "device": "cpu",
    "rounds": 3,
    "batch": 1,
    "save_every": 10,
    "checkpoint_mib": 12.3,
    "setting": "a setting",
    "rounds_seconds": {"step_with": [1.01, 1.2], "step_without": [1.1, 1.0]},
}


def test_the_targets_are_judged_on_the_parts_and_the_whole_runs_shown_beside():
    summary = integrity.summarize(DATA)
    # evaluate: 4 ms of CRCs + 1 ms of chunk CRCs of 10 s; a step: 2 us of reads + 1 ms of saves per step of 1 s
    assert [t["status"] for t in summary.targets] == ["MET", "MET"]
    assert summary.targets[0]["measured"] == "0.0500%" and summary.targets[1]["measured"] == "0.100%"
    wholes = {row["measured"]: row for row in summary.tables[1]["rows"]}
    assert abs(wholes["evaluate"]["with / without"] - 1.02) < 1e-9
    step = wholes["training step (window reads + step)"]
    assert abs(step["spread over the rounds %"] - 100 * 0.19 / 1.01) < 1e-9  # the wider of the two
    slow = integrity.summarize({**DATA, "seconds": {**SECONDS, "load_crc_check": 0.4}})
    assert slow.targets[0]["status"] == "NOT MET"


def test_a_check_that_misses_its_damage_fails_the_run():
    summary = integrity.summarize(
        {"detection": {"flipped_checkpoint_refused": False, "flipped_store_chunk_refused": True}}
    )
    assert summary.failed and summary.notes and not summary.targets  # nothing timed


def test_damage_is_caught_before_anything_is_timed(tmp_path):
    fasta = integrity.first_bases(integrity.EXAMPLES / "lambda_phage.fasta.gz", 5000, tmp_path)
    stores = integrity.build_stores(fasta, tmp_path)
    assert integrity.detection(stores, tmp_path) == {
        "flipped_checkpoint_refused": True,
        "flipped_store_chunk_refused": True,
    }
    assert Path(stores["without"]).exists()
