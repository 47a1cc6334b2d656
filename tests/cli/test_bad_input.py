"""Bad input to `genoformer fit` names what is wrong: the config key, or the file path.

Parsing errors exit with status 2 (jsonargparse); errors found while setting up the run exit
with status 1 and a one-line message (the kernels' and readers' own messages are tested beside
them: tests/kernels/test_attention_errors.py, tests/data/).
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from genoformer.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"


def _fail(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(QUICKSTART), *args])
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, named",
    [
        (["--model.learnin_rate", "3"], "learnin_rate"),
        (["--trainer.max_steps", "ten"], "--trainer.max_steps takes a whole number"),
        (["--model.transformer.d_model", "wide"], "d_model"),
        (["--model.objective", "NEXT_TOKEN"], "objective"),
        (["--config", "no/such/config.yaml"], "no/such/config.yaml"),
    ],
    ids=["unknown_key", "wrong_type", "wrong_type_nested", "bad_enum", "missing_config"],
)
def test_config_errors_name_the_key_or_path(capsys, args, named):
    code, err = _fail(capsys, *args)
    assert code == 2 and named in err, err[-2000:]


def test_unknown_key_inside_a_yaml_file_is_named(tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text(QUICKSTART.read_text().replace("warmup_steps:", "warmup_step:"))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config)])
    assert exit_info.value.code == 2 and "warmup_step" in capsys.readouterr().err


def test_missing_fasta_names_the_option_and_path(tmp_path, capsys):
    missing = tmp_path / "genome.fa.gz"
    code, err = _fail(
        capsys,
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--data.init_args.store",
        str(tmp_path / "g.zarr"),
        "--data.init_args.fasta",
        f"[{missing}]",
    )
    assert code == 1 and f"data.init_args.fasta: input file not found: {missing}" in err
    assert "Traceback" not in err


def test_missing_checkpoint_names_the_path(tmp_path, capsys, repo_root):
    missing = tmp_path / "last.ckpt"
    store = tmp_path / "lambda.zarr"
    code, err = _fail(
        capsys,
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--ckpt_path",
        str(missing),
        "--data.init_args.store",
        str(store),
        "--data.init_args.fasta",
        f"[{repo_root / 'examples' / 'lambda_phage.fasta.gz'}]",
    )
    assert code == 1 and str(missing) in err


def test_an_error_inside_a_training_step_keeps_its_traceback(tmp_path, monkeypatch, repo_root):
    """Bad input stays a one-line message; a ValueError from deep inside a step propagates whole."""
    from genoformer.genome.lm import GenoformerLM

    def broken_loss(self, tokens_BL, lengths_B=None, cu_seqlens=None):
        raise ValueError("deep inside the model")

    monkeypatch.setattr(GenoformerLM, "loss", broken_loss)
    with pytest.raises(ValueError, match="deep inside the model") as caught:
        main(
            [
                "fit",
                "--config",
                str(QUICKSTART),
                "--trainer.default_root_dir",
                str(tmp_path / "run"),
                "--data.init_args.store",
                str(tmp_path / "lambda.zarr"),
                "--data.init_args.fasta",
                f"[{repo_root / 'examples' / 'lambda_phage.fasta.gz'}]",
                "--model.transformer.max_seq_len",
                "256",
                "--data.init_args.num_workers",
                "0",
                "--trainer.enable_progress_bar",
                "false",
            ]
        )
    assert any(frame.name == "broken_loss" for frame in traceback.extract_tb(caught.value.__traceback__))
