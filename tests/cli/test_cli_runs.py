"""The run-directory rule and evaluation on trained weights only, through the `genoformer` command.

Every hint the command prints here is followed as typed: the test cuts the suggested command out
of the message, splits it as a shell would and runs it.
"""

from __future__ import annotations

import csv
import shlex
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import fails

from genoformer.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
MODEL_OPTIONS = [
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
]
DATA_OPTIONS = [
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.log_every_n_steps",
    "1",
    "--data.init_args.num_workers",
    "0",
    "--data.init_args.split",
    "{by: region, val_fraction: 0.1, test_fraction: 0.1}",
    "--data.init_args.fasta",
    f"[{LAMBDA}]",  # what the store is built from
]
TINY = MODEL_OPTIONS + DATA_OPTIONS


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "lambda.zarr"
    main(["prepare", "--fasta", str(LAMBDA), "--out", str(path)])
    return path


def command(subcommand: str, run_dir: Path, store: Path, *extra: str) -> list[str]:
    return [
        subcommand,
        "--config",
        str(QUICKSTART),
        "--trainer.default_root_dir",
        str(run_dir),
        "--data.init_args.store",
        str(store),
        *TINY,
        *extra,
    ]


def fit(run_dir: Path, store: Path, steps: int, *extra: str) -> None:
    main(
        command(
            "fit", run_dir, store, "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps), *extra
        )
    )


def suggested(message: str, containing: str) -> list[str]:
    """The command line the message suggests (a line starting with `genoformer` that holds
    `containing`), split as a shell would, without the leading `genoformer`."""
    lines = [
        line.strip() for line in message.splitlines() if line.strip().startswith("genoformer ") and containing in line
    ]
    assert len(lines) == 1, message
    words = shlex.split(lines[0])
    assert words[0] == "genoformer"
    return words[1:]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def checkpoint_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


@pytest.mark.slow
def test_fit_into_an_existing_run_refuses_then_resumes_the_same_run(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    fit(run_dir, store, 2)
    first = snapshot(run_dir)
    assert {"checkpoints/last.ckpt", "metrics.csv", "config.yaml", "loss.png"} <= set(first)
    first_rows = metric_rows(run_dir)

    err = fails(capsys, command("fit", run_dir, store, "--trainer.max_steps", "2", "--trainer.val_check_interval", "2"))
    assert "already holds a training run" in err
    assert snapshot(run_dir) == first  # refused before touching anything

    # follow the hint as typed, continuing to step 4: one run, last.ckpt its newest state
    resume = suggested(err, "--ckpt_path last")
    main(resume + ["--trainer.max_steps", "4", "--trainer.val_check_interval", "2"])
    files = snapshot(run_dir)
    assert sorted(name for name in files if name.startswith("checkpoints/")) == ["checkpoints/last.ckpt"]
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 4
    rows = metric_rows(run_dir)
    assert rows[: len(first_rows)] == first_rows  # appended to, never truncated
    old_steps = [int(row["step"]) for row in first_rows if row.get("train/loss")]
    new_steps = [int(row["step"]) for row in rows[len(first_rows) :] if row.get("train/loss")]
    assert len(new_steps) == 2 and min(new_steps) > max(old_steps)  # the resumed steps, after the old ones
    assert "max_steps: 4" in (run_dir / "config.yaml").read_text()

    # the other hint: a new run in a new directory
    err = fails(capsys, command("fit", run_dir, store, "--trainer.max_steps", "1", "--trainer.val_check_interval", "1"))
    fresh = suggested(err, "--trainer.default_root_dir NEW_DIR")
    assert fresh.count("--trainer.default_root_dir") == 1  # the option replaced, not given twice
    new_dir = tmp_path / "new run"
    main([str(new_dir) if word == "NEW_DIR" else word for word in fresh])
    assert checkpoint_step(new_dir / "checkpoints" / "last.ckpt") == 1
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 4


@pytest.mark.slow
def test_fit_that_fails_before_its_first_step_changes_nothing(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    fit(run_dir, store, 2)
    before = snapshot(run_dir)
    fails(
        capsys,
        command(
            "fit",
            run_dir,
            store,
            "--ckpt_path",
            "last",
            "--trainer.max_steps",
            "4",
            "--data.init_args.batch_size",
            "-3",
        ),
    )
    assert snapshot(run_dir) == before

    # in a new directory, a failed start leaves no run behind: the next fit there is not refused
    new_dir = tmp_path / "new"
    fails(capsys, command("fit", new_dir, store, "--trainer.max_steps", "1", "--data.init_args.batch_size", "-3"))
    assert not new_dir.exists()  # not even the empty folders it made
    fit(new_dir, store, 1)
    assert (new_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_evaluation_needs_weights_and_never_replaces_a_result(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    fit(run_dir, store, 2)
    last = run_dir / "checkpoints" / "last.ckpt"

    # without a checkpoint: refused, nothing written, and both hints work as typed
    for subcommand in ("validate", "predict"):
        err = fails(capsys, command(subcommand, run_dir, store))
        assert "--ckpt_path last" in err and "--untrained" in err
        assert not (run_dir / subcommand).exists()
    err = fails(capsys, command("validate", run_dir, store))
    main(suggested(err, "--ckpt_path last"))
    trained = metric_rows(run_dir / "validate")
    assert trained and float(trained[-1]["val/bpb"]) > 0

    # a second run would replace that result: refused until --overwrite, as the hint says
    err = fails(capsys, command("validate", run_dir, store, "--untrained"))
    assert "already holds the result" in err
    assert metric_rows(run_dir / "validate") == trained
    main(suggested(err, "--overwrite"))
    untrained = metric_rows(run_dir / "validate")
    assert len(untrained) == len(trained) and untrained != trained  # replaced, not appended

    capsys.readouterr()
    main(command("predict", run_dir, store, "--ckpt_path", "last"))
    predictions_path = run_dir / "predict" / "predictions.npz"
    assert f"to {predictions_path}" in capsys.readouterr().out  # says where it wrote
    with np.load(predictions_path) as saved:
        assert str(saved["pooling"]) == "mean" and int(saved["layer"]) == -1
        assert int(saved["window"]) == 512 and int(saved["stride"]) == 512
        assert Path(str(saved["checkpoint"])) == last
        assert saved["embeddings"].shape == (-(-48_502 // 512), 32)
    before = predictions_path.read_bytes()
    err = fails(capsys, command("predict", run_dir, store, "--ckpt_path", str(last)))
    assert "predictions.npz" in err and predictions_path.read_bytes() == before
    assert not [path.name for path in (run_dir / "predict").iterdir() if ".tmp-" in path.name]

    # best needs a monitored checkpoint; the quick start keeps only last
    err = fails(capsys, command("test", run_dir, store, "--ckpt_path", "best"))
    assert "no best checkpoint" in err and "--ckpt_path last" in err


@pytest.mark.slow
def test_ckpt_path_best_resolves_to_the_monitored_checkpoint(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    checkpoint = (
        "[{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
        f"{{dirpath: {run_dir}/checkpoints, save_last: true, monitor: val/loss, save_top_k: 1}}}}]"
    )
    fit(run_dir, store, 2, "--trainer.callbacks", checkpoint)
    best = [path for path in (run_dir / "checkpoints").iterdir() if not path.name.startswith("last")]
    assert len(best) == 1
    capsys.readouterr()
    main(command("test", run_dir, store, "--trainer.callbacks", checkpoint, "--ckpt_path", "best"))
    assert f"--ckpt_path best is {best[0]}" in capsys.readouterr().out


def test_unreadable_or_missing_checkpoints_get_our_message(tmp_path, store, capsys):
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"PK\x03\x04 not really a checkpoint")
    err = fails(capsys, command("validate", tmp_path / "run", store, "--ckpt_path", str(broken)))
    assert "not a readable genoformer checkpoint" in err and "weights_only" not in err
    a_zip = tmp_path / "a_zip.ckpt"  # a complete zip container, but not what torch.save writes
    with zipfile.ZipFile(a_zip, "w") as archive:
        archive.writestr("notes.txt", "hello")
    err = fails(capsys, command("validate", tmp_path / "run", store, "--ckpt_path", str(a_zip)))
    assert "not a readable genoformer checkpoint" in err and "weights_only" not in err
    err = fails(capsys, command("validate", tmp_path / "run", store, "--ckpt_path", "last"))
    assert "has no checkpoint" in err
    err = fails(capsys, ["embed", "--checkpoint", str(broken), "--inputs", "ACGT", "--out", str(tmp_path / "e.npz")])
    assert "not a readable genoformer checkpoint" in err and "weights_only" not in err


@pytest.mark.slow
def test_evaluation_takes_the_model_from_the_checkpoint(tmp_path, store):
    """`--ckpt_path last` builds the trained model, whatever the config's model options say, and
    what the config derives from the model (the data window) follows it."""
    run_dir = tmp_path / "run"
    fit(run_dir, store, 1)
    main(
        [
            "validate",
            "--config",
            str(QUICKSTART),
            "--trainer.default_root_dir",
            str(run_dir),
            "--data.init_args.store",
            str(store),
            *DATA_OPTIONS,
            "--ckpt_path",
            "last",
        ]
    )
    assert metric_rows(run_dir / "validate")[-1]["val/bpb"]


@pytest.mark.slow
def test_ckpt_path_last_starts_a_new_run_where_there_is_none(tmp_path, store, capsys):
    """What `make quickstart` relies on: `--ckpt_path last` in an empty directory starts the run,
    and the same command again resumes it."""
    run_dir = tmp_path / "run"
    capsys.readouterr()
    fit(run_dir, store, 1, "--ckpt_path", "last")
    assert "no run to resume" in capsys.readouterr().out
    fit(run_dir, store, 2, "--ckpt_path", "last")
    assert f"--ckpt_path last is {run_dir / 'checkpoints' / 'last.ckpt'}" in capsys.readouterr().out
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 2

    # metrics but no checkpoint (killed before its first save): nothing to resume, say so
    for path in (run_dir / "checkpoints").iterdir():
        path.unlink()
    err = fails(capsys, command("fit", run_dir, store, "--ckpt_path", "last"))
    assert "no checkpoint of it to resume from" in err
    new_dir = tmp_path / "new"
    main(
        [str(new_dir) if word == "NEW_DIR" else word for word in suggested(err, "NEW_DIR")]
        + ["--trainer.max_steps", "1"]
    )
    assert checkpoint_step(new_dir / "checkpoints" / "last.ckpt") == 1
