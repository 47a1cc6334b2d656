"""`--backend fp8`, as a user types it: score, mutagenesis and embed run their attention in FP8
(emulated on the CPU, the Triton FP8 kernel on a Hopper GPU) and stay close to the default run; a
model with block-sparse layers is refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from genoformer.data.genome.alphabet import decode
from model_helpers import random_tokens

from genoformer.cli import main


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8") / "genome.fa"
    path.write_text(f">chr1\n{decode(random_tokens(1, 150, seed=12)[0].numpy())}\n")
    return path


def _bedgraph(path) -> np.ndarray:
    values = []
    for line in path.read_text().splitlines()[1:]:
        _, start, end, value = line.split("\t")
        values += [float(value)] * (int(end) - int(start))
    return np.array(values)


def test_score_and_mutagenesis_in_fp8_stay_close_to_the_default(causal_checkpoint, genome, tmp_path):
    """Per-base log2 p and every SNV's llr: FP8 within 0.05 bits of the default run (the tiny model
    in float32 on the CPU), and not equal to it (the FP8 path did run)."""
    runs = {}
    for backend in ("auto", "fp8"):
        common = ["--checkpoint", str(causal_checkpoint), "--device", "cpu", "--backend", backend]
        main(
            [
                "score",
                *common,
                "--inputs",
                str(genome),
                "--out",
                str(tmp_path / f"{backend}.bedgraph"),
                "--context",
                "128",
            ]
        )
        main(
            [
                "mutagenesis",
                *common,
                "--inputs",
                str(genome),
                "--regions",
                "chr1:70-75",
                "--window",
                "64",
                "--out",
                str(tmp_path / f"{backend}.tsv"),
            ]
        )
        llr = [float(line.split("\t")[4]) for line in (tmp_path / f"{backend}.tsv").read_text().splitlines()[1:]]
        runs[backend] = (_bedgraph(tmp_path / f"{backend}.bedgraph"), np.array(llr))
    for default, fp8 in zip(runs["auto"], runs["fp8"]):
        assert len(default) == len(fp8) > 10
        assert np.abs(default - fp8).max() < 0.05
        assert np.abs(default - fp8).max() > 0


def test_embed_in_fp8_and_a_layout_refused_with_the_reason(causal_checkpoint, mlm_checkpoint, genome, tmp_path, capsys):
    for backend in ("auto", "fp8"):
        main(
            [
                "embed",
                "--checkpoint",
                str(causal_checkpoint),
                "--inputs",
                str(genome),
                "--device",
                "cpu",
                "--backend",
                backend,
                "--out",
                str(tmp_path / f"{backend}.npz"),
            ]
        )
    default, fp8 = (np.load(tmp_path / f"{b}.npz")["embeddings"] for b in ("auto", "fp8"))
    assert np.abs(default - fp8).max() < 0.05 * np.abs(default).max()
    with pytest.raises(SystemExit):  # its layers alternate sliding-window layouts and dense ones
        main(
            [
                "embed",
                "--checkpoint",
                str(mlm_checkpoint),
                "--inputs",
                str(genome),
                "--device",
                "cpu",
                "--backend",
                "fp8",
                "--out",
                str(tmp_path / "mlm.npz"),
            ]
        )
    assert "FP8 attention runs dense attention only" in capsys.readouterr().err
