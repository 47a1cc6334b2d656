"""The `genoformer` command: help texts, bad input, and prepare -> fit -> embed end to end."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from genoformer.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


def name_in_fasta(path: Path) -> str:
    with gzip.open(path, "rt") as handle:
        return handle.readline()[1:].split()[0]


def test_top_level_help_lists_every_command(capsys):
    main([])
    out = capsys.readouterr().out
    for command in ("fit", "validate", "test", "predict", "prepare", "prepare_timeseries", "embed"):
        assert f"  {command} " in out


@pytest.mark.parametrize(
    "command, expected",
    [
        ("prepare", "Bases per chunk"),
        ("prepare_timeseries", "samples per second"),
        ("embed", "Hidden state to read"),
        ("verify", "A checkpoint, a store, or a folder holding them"),
        ("fit", "--model.help"),
    ],
)
def test_command_help_comes_from_docstrings(capsys, command, expected):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out


def test_python_cli_py_is_the_same_command():
    result = subprocess.run(
        [sys.executable, "cli.py", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert "prepare" in result.stdout and "fit" in result.stdout


def test_unknown_command_fails_with_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train"])
    assert exit_info.value.code == 2
    assert "unknown command 'train'" in capsys.readouterr().err


def test_prepare_missing_file_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--fasta", str(tmp_path / "nope.fa"), "--out", str(tmp_path / "x.zarr")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "nope.fa" in err and "not found" in err
    assert not (tmp_path / "x.zarr").exists()


def test_prepare_non_fasta_file_is_a_clear_error(tmp_path, capsys):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("these are my notes, not a genome\n")
    with pytest.raises(SystemExit):
        main(["prepare", "--fasta", str(bogus), "--out", str(tmp_path / "x.zarr")])
    assert "notes.txt" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


def test_unknown_config_key_is_rejected(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text((REPO_ROOT / "configs" / "quickstart.yaml").read_text().replace("d_model:", "d_modle:"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code != 0
    assert "d_modle" in capsys.readouterr().err


@pytest.mark.slow
def test_prepare_fit_embed_end_to_end(tmp_path, capsys):
    """The quick start in miniature: the shipped config with a tiny model and context."""
    store = tmp_path / "lambda.zarr"
    main(["prepare", "--fasta", str(LAMBDA), "--out", str(store)])
    assert store.is_dir()
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(REPO_ROOT / "configs" / "quickstart.yaml"),
            "--trainer.default_root_dir",
            str(run_dir),
            "--trainer.max_steps",
            "3",
            "--trainer.val_check_interval",
            "3",
            "--trainer.log_every_n_steps",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--model.transformer.d_model",
            "32",
            "--model.transformer.n_layers",
            "1",
            "--model.transformer.n_heads",
            "2",
            # the data window follows the context through the config's interpolation
            "--model.transformer.max_seq_len",
            "512",
            "--model.transformer.attention",
            "[{class_path: genoformer.kernels.layout.SlidingWindow, init_args: {window: 128, block_size: 64}}]",
            "--data.init_args.store",
            str(store),
            "--data.init_args.fasta",
            f"[{LAMBDA}]",
            "--data.init_args.num_workers",
            "0",
            "--data.init_args.split",
            "{by: region, val_fraction: 0.1, test_fraction: 0.1}",
        ]
    )
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    assert (run_dir / "loss.png").is_file()
    assert (run_dir / "metrics.csv").is_file()

    training_metrics = (run_dir / "metrics.csv").read_text()
    # test and predict with the same config log beside the training run, never over it
    for command in ("test", "predict"):
        main(
            [
                command,
                "--config",
                str(REPO_ROOT / "configs" / "quickstart.yaml"),
                "--ckpt_path",
                str(checkpoint),
                "--trainer.default_root_dir",
                str(run_dir),
                "--trainer.enable_progress_bar",
                "false",
                "--model.transformer.d_model",
                "32",
                "--model.transformer.n_layers",
                "1",
                "--model.transformer.n_heads",
                "2",
                "--model.transformer.max_seq_len",
                "512",
                "--model.transformer.attention",
                "[{class_path: genoformer.kernels.layout.SlidingWindow, init_args: {window: 128, block_size: 64}}]",
                "--data.init_args.store",
                str(store),
                "--data.init_args.fasta",
                f"[{LAMBDA}]",
                "--data.init_args.num_workers",
                "0",
                "--data.init_args.split",
                "{by: region, val_fraction: 0.1, test_fraction: 0.1}",
            ]
        )
    assert (run_dir / "metrics.csv").read_text() == training_metrics
    assert "test/bpb" in (run_dir / "test" / "metrics.csv").read_text()
    predictions = np.load(run_dir / "predict" / "predictions.npz")
    genome_length = 48_502
    assert predictions["embeddings"].shape == (-(-genome_length // 512), 32)
    assert list(predictions["start"][:3]) == [0, 512, 1024]
    assert predictions["length"].sum() == genome_length
    assert set(predictions["contig_name"]) == {name_in_fasta(LAMBDA)}

    out = tmp_path / "emb.npz"
    main(["embed", "--checkpoint", str(checkpoint), "--inputs", str(LAMBDA), "--out", str(out), "--batch_size", "4"])
    saved = np.load(out)
    assert list(saved["names"]) == [name_in_fasta(LAMBDA)]
    assert saved["embeddings"].shape == (1, 32)
    assert np.isfinite(saved["embeddings"]).all()

    with pytest.raises(SystemExit):
        main(["embed", "--checkpoint", str(checkpoint), "--inputs", "ACGTXACGT", "--out", str(tmp_path / "bad.npz")])
    assert "'X'" in capsys.readouterr().err


def test_embed_keeps_input_order_and_rejects_repeated_names(tmp_path, capsys):
    """Strings and files mixed in one call come out in input order; names must be unique."""
    from genoformer.kernels.layout import SlidingWindow
    from lightning import Trainer

    from genoformer.core.transformer import TransformerConfig
    from genoformer.genome.lm import GenoformerLM

    module = GenoformerLM(
        TransformerConfig(
            d_model=16, n_layers=1, n_heads=2, max_seq_len=256, attention=[SlidingWindow(window=64, block_size=32)]
        )
    )
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    checkpoint = tmp_path / "tiny.ckpt"
    trainer.save_checkpoint(checkpoint)
    fasta = tmp_path / "two.fa"
    fasta.write_text(">r1\nACGTACGTAC\n>r2\nGGGCCCAATT\n")
    out = tmp_path / "mixed.npz"
    main(
        [
            "embed",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            f"[ACGTAC,{fasta},TTGACA]",
            "--out",
            str(out),
            "--pooling",
            "max",
        ]
    )
    saved = np.load(out)
    assert list(saved["names"]) == ["seq0", "r1", "r2", "seq2"]
    assert saved["embeddings"].shape == (4, 16)

    with pytest.raises(SystemExit):
        main(
            [
                "embed",
                "--checkpoint",
                str(checkpoint),
                "--inputs",
                f"[{fasta},{fasta}]",
                "--out",
                str(tmp_path / "dup.npz"),
            ]
        )
    assert "'r1' appears twice" in capsys.readouterr().err

    # a genome store reads as its FASTA does, in embed as in evaluate (one reader for both)
    from genoformer.data.genome.store import prepare_genome_store

    store = prepare_genome_store([fasta], tmp_path / "two.zarr", progress=False)
    main(
        [
            "embed",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            str(store),
            "--out",
            str(tmp_path / "store.npz"),
            "--pooling",
            "max",
        ]
    )
    main(
        [
            "embed",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            str(fasta),
            "--out",
            str(tmp_path / "fasta.npz"),
            "--pooling",
            "max",
        ]
    )
    from_store, from_fasta = np.load(tmp_path / "store.npz"), np.load(tmp_path / "fasta.npz")
    assert list(from_store["names"]) == list(from_fasta["names"]) == ["r1", "r2"]
    np.testing.assert_array_equal(from_store["embeddings"], from_fasta["embeddings"])
    # and a quoted glob as the shell would have expanded it
    main(
        [
            "embed",
            "--checkpoint",
            str(checkpoint),
            "--inputs",
            str(tmp_path / "tw*.fa"),
            "--out",
            str(tmp_path / "glob.npz"),
            "--pooling",
            "max",
        ]
    )
    assert list(np.load(tmp_path / "glob.npz")["names"]) == ["r1", "r2"]
