"""benchmarks/integrity.py: its report renders from a summary, and its check that damage is caught
before timing catches it."""

from __future__ import annotations

from pathlib import Path

from benchmarks import integrity


def test_the_report_renders_every_measurement():
    seconds = {"evaluate_with": 10.2, "evaluate_without": 10.0, "step_with": 1.01, "step_without": 1.0,
               "read_with": 12e-6, "read_without": 10e-6, "save_atomic": 0.02, "save_lightning": 0.01,
               "load_crc_check": 0.004, "load_torch": 0.01, "load_sha256_of_weights": 0.012}
    summary = {"environment": {"device": "CPU", "date_utc": "today", "torch": "2", "triton": "3", "python": "3"},
               "command": "python -m benchmarks.integrity --out x", "rounds": 3, "save_every": 10,
               "checkpoint_mib": 12.3, "seconds": seconds, "setting": "a setting", "batch": 1,
               "detection": {"flipped_checkpoint_refused": True, "flipped_store_chunk_refused": True}}
    summary["overhead_percent_from_parts"] = integrity.from_parts(seconds, 1, 10)
    text = integrity.render(summary)
    assert "| evaluate | 10.00 s | 10.20 s | +2.00% |" in text
    assert "| training step + a checkpoint save every 10 steps | 1001.0 ms | 1012.0 ms | +1.10% |" in text
    assert "flipped checkpoint refused: True" in text and "SHA-256 of the weights" in text
    assert "| evaluate | 4.0 ms (the checkpoint's CRCs) | 0.040% |" in text
    assert "| training step | 2.0 us (the chunk CRCs of 1 window(s)) | 0.0002% |" in text


def test_damage_is_caught_before_anything_is_timed(tmp_path):
    fasta = integrity.first_bases(integrity.EXAMPLES / "lambda_phage.fasta.gz", 5000, tmp_path)
    stores = integrity.build_stores(fasta, tmp_path)
    assert integrity.detection(stores, tmp_path) == {"flipped_checkpoint_refused": True,
                                                     "flipped_store_chunk_refused": True}
    assert Path(stores["without"]).exists()
