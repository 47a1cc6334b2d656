"""A biologist's first day with the `genoformer` command: each stumble ends in a message whose
hint works as typed (the test cuts the hinted command or options out of the message and runs it),
and a failed command leaves nothing behind.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import fails

from genoformer.cli import TOOL_COMMANDS, main

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"
SHIPPED = REPO_ROOT / "examples" / "genoformer_dna.ckpt"
QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
QUIET = [
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--data.init_args.num_workers",
    "0",
]
TINY_MODEL = [
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


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "lambda.zarr"
    main(["prepare", "--fasta", str(LAMBDA), "--out", str(path)])
    return path


def quickstart(run_dir: Path, store: Path, *extra: str) -> list[str]:
    """`genoformer fit` of the quick start on the lambda store, quietly, one step unless `extra` says."""
    return [
        "fit",
        "--config",
        str(QUICKSTART),
        "--trainer.default_root_dir",
        str(run_dir),
        "--data.init_args.store",
        str(store),
        "--trainer.max_steps",
        "1",
        *QUIET,
        *extra,
    ]


def suggested(message: str, containing: str) -> list[str]:
    """The one command line of the message that starts with `genoformer` and holds `containing`,
    split as a shell would, without the leading `genoformer`."""
    lines = [
        line.strip() for line in message.splitlines() if line.strip().startswith("genoformer ") and containing in line
    ]
    assert len(lines) == 1, message
    return shlex.split(lines[0])[1:]


def saved(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in records.items()))
    return path


def random_dna(length: int, seed: int) -> str:
    return "".join(np.random.default_rng(seed).choice(list("ACGT"), size=length))


# --------------------------------------------------------------------------- 1: weights as --ckpt_path
@pytest.mark.slow
def test_weights_only_checkpoint_to_fit_points_to_init_weights_which_keeps_your_options(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    args = quickstart(run_dir, store, "--model.transformer.max_seq_len", "2048")
    err = fails(capsys, args + ["--ckpt_path", str(SHIPPED)])
    assert "holds a model's weights only" in err and "KeyError" not in err
    assert not run_dir.exists()  # refused before anything was made

    typed = suggested(err, "--init_weights")
    assert "--ckpt_path" not in typed and typed[typed.index("--init_weights") + 1] == str(SHIPPED)
    main(typed)
    out = capsys.readouterr().out
    assert "--model.transformer.max_seq_len 2048 (your option) replaces the 32768" in out  # said, never silent
    assert f"a new run, starting from the weights in {SHIPPED}" in out
    trained, shipped = saved(run_dir / "checkpoints" / "last.ckpt"), saved(SHIPPED)
    assert trained["global_step"] == 1  # a new run: its own optimizer and step count
    architecture = trained["hyper_parameters"]["transformer"]
    assert (
        architecture["max_seq_len"] == 2048
        and architecture["d_model"] == shipped["hyper_parameters"]["transformer"]["d_model"]
    )
    # how to train is the config's (quickstart.yaml: 2e-3, 20 warm-up steps), not the checkpoint's 5e-4 and 50
    assert (trained["hyper_parameters"]["learning_rate"], trained["hyper_parameters"]["warmup_steps"]) == (2e-3, 20)
    assert (shipped["hyper_parameters"]["learning_rate"], shipped["hyper_parameters"]["warmup_steps"]) == (5e-4, 50)
    before, after = (saved_["state_dict"]["model.embed.weight"].float() for saved_ in (shipped, trained))
    assert torch.allclose(before, after, atol=0.05) and not torch.equal(before, after)  # one step from the weights

    # an option the weights cannot take is refused, naming both values; nothing is left behind
    other = tmp_path / "other"
    err = fails(
        capsys, quickstart(other, store, "--init_weights", "genoformer-dna", "--model.transformer.d_model", "128")
    )
    assert "--model.transformer.d_model 128 (the checkpoint's: 256)" in err and "do not fit" in err
    assert not other.exists()


@pytest.mark.slow
def test_a_resumed_run_keeps_its_model_and_evaluation_takes_a_safe_option(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    main(quickstart(run_dir, store, *TINY_MODEL))
    last = run_dir / "checkpoints" / "last.ckpt"
    err = fails(
        capsys,
        quickstart(
            run_dir,
            store,
            *TINY_MODEL,
            "--trainer.max_steps",
            "2",
            "--ckpt_path",
            "last",
            "--model.transformer.max_seq_len",
            "256",
        ),
    )
    assert "--model.transformer.max_seq_len is 512 there, 256 in your options" in err
    assert saved(last)["global_step"] == 1  # untouched
    # how to run it is no part of the model: a resumed run takes runtime settings
    main(
        quickstart(
            run_dir,
            store,
            *TINY_MODEL,
            "--trainer.max_steps",
            "2",
            "--ckpt_path",
            "last",
            "--model.init_args.runtime.activation_checkpointing",
            "true",
        )
    )
    assert saved(last)["global_step"] == 2 and "replaces" not in capsys.readouterr().out

    new_dir = tmp_path / "new"
    typed = [str(new_dir) if word == "NEW_DIR" else word for word in suggested(err, "NEW_DIR")]
    assert typed.count("--trainer.default_root_dir") == 1 and "--ckpt_path" not in typed
    main(typed)
    assert saved(new_dir / "checkpoints" / "last.ckpt")["hyper_parameters"]["transformer"]["max_seq_len"] == 256

    # evaluating the trained weights at a shorter context: honoured, and said; the weights named by
    # their run directory (a run without a validation monitor: its last checkpoint)
    capsys.readouterr()
    main(
        [
            "validate",
            "--config",
            str(QUICKSTART),
            "--trainer.default_root_dir",
            str(run_dir),
            "--data.init_args.store",
            str(store),
            *QUIET,
            "--ckpt_path",
            str(run_dir),
            "--model.transformer.max_seq_len",
            "256",
        ]
    )
    said = capsys.readouterr()
    assert "--model.transformer.max_seq_len 256 (your option) replaces the 512" in said.out
    assert f"checkpoint {run_dir} is {last} (the run's last checkpoint" in said.err
    assert (run_dir / "validate" / "metrics.csv").is_file()


# --------------------------------------------------------------------------- 2: a GPU config on a CPU
def _tiny_config(folder: Path, name: str, store: Path, gpu: bool = True) -> Path:
    """A small recipe in the shape of the shipped ones; for a GPU: compiled, 4 workers, 4 windows a batch."""
    config = {
        "include": "base/trainer_gpu.yaml" if gpu else "base/trainer_cpu.yaml",
        "trainer": {
            "max_steps": 1,
            "val_check_interval": 1,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "default_root_dir": str(folder / name.removesuffix(".yaml")),
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "model": {
            "transformer": {
                "d_model": 32,
                "n_layers": 1,
                "n_heads": 2,
                "max_seq_len": 512,
                "attention": [
                    {
                        "class_path": "genoformer.kernels.layout.SlidingWindow",
                        "init_args": {"window": 128, "block_size": 64},
                    }
                ],
            },
            **({"runtime": {"compile": True}} if gpu else {}),
        },
        "data": {
            "class_path": "genoformer.data.genome.datamodule.GenomeDataModule",
            "init_args": {
                "store": str(store),
                "fasta": [str(LAMBDA)],
                "window": 512,
                "batch_size": 4 if gpu else 1,
                "num_workers": 4 if gpu else 0,
                "split": {"by": "region", "val_fraction": 0.1, "test_fraction": 0.1},
            },
        },
    }
    path = folder / name
    path.write_text(json.dumps(config))  # YAML reads JSON
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_a_gpu_config_on_a_cpu_hints_a_command_that_finishes_a_step(tmp_path, store, capsys):
    gpu = _tiny_config(tmp_path, "tiny_gpu.yaml", store)
    err = fails(capsys, ["fit", "--config", str(gpu)])
    assert "CPU version" not in err  # there is none beside it
    typed = suggested(err, "--trainer.accelerator cpu")
    assert typed[typed.index("--model.init_args.runtime.compile") + 1] == "false"
    started = time.perf_counter()
    main(typed)
    assert time.perf_counter() - started < 60
    run_dir = tmp_path / "tiny_gpu"
    assert saved(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 1
    assert "compile: false" in (run_dir / "config.yaml").read_text()

    # with a CPU version beside it (name_gpu.yaml -> name_cpu.yaml), that comes first, and runs as typed
    _tiny_config(tmp_path, "tiny_cpu.yaml", store, gpu=False)
    err = fails(capsys, ["fit", "--config", str(gpu)])
    typed = suggested(err, "tiny_cpu.yaml")
    assert err.index("tiny_cpu.yaml") < err.index("--trainer.accelerator cpu")
    main(typed)
    assert saved(tmp_path / "tiny_cpu" / "checkpoints" / "last.ckpt")["global_step"] == 1


# --------------------------------------------------------------------------- 4, 7: stores and short records
@pytest.mark.slow
def test_a_store_named_alone_is_used_as_it_is(tmp_path, store, capsys):
    genome = write_fasta(tmp_path / "klebsiella.fa", {"chromosome": random_dna(6000, 1)})
    mine = tmp_path / "mine.zarr"
    main(["prepare", "--fasta", str(genome), "--out", str(mine)])
    capsys.readouterr()
    main(quickstart(tmp_path / "run", mine, *TINY_MODEL))  # the config's E. coli FASTA is not read
    assert f"training on the store {mine} as it is" in capsys.readouterr().out
    assert saved(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 1

    # naming other files for it is refused; what works comes first, and works as typed
    args = quickstart(tmp_path / "run2", mine, *TINY_MODEL, "--data.init_args.fasta", f"[{LAMBDA}]")
    err = fails(capsys, args)
    assert "delete" not in err and err.index("--data.init_args.fasta '[]'") < err.index(
        "--data.init_args.store NEW.zarr"
    )
    main(args + shlex.split(re.search(r"--data\.init_args\.fasta '\[\]'", err).group(0)))
    assert saved(tmp_path / "run2" / "checkpoints" / "last.ckpt")["global_step"] == 1


@pytest.mark.slow
def test_records_shorter_than_the_window_point_to_pack_which_trains(tmp_path, capsys):
    plasmids = write_fasta(tmp_path / "plasmids.fa", {f"p{i}": random_dna(400, i) for i in range(6)})
    args = quickstart(
        tmp_path / "run", tmp_path / "plasmids.zarr", *TINY_MODEL, "--data.init_args.fasta", f"[{plasmids}]"
    )
    err = fails(capsys, args)
    assert "is at least 512 bases long" in err
    main(args + shlex.split(re.search(r"--data\.init_args\.pack true", err).group(0)))
    assert saved(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 1


# --------------------------------------------------------------------------- 8: resuming a finished run
@pytest.mark.slow
def test_resuming_a_run_that_reached_max_steps_says_how_to_train_longer(tmp_path, store, capsys):
    run_dir = tmp_path / "run"
    main(quickstart(run_dir, store, *TINY_MODEL, "--trainer.max_steps", "2"))
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    capsys.readouterr()
    main(quickstart(run_dir, store, *TINY_MODEL, "--trainer.max_steps", "2", "--ckpt_path", "last"))  # not an error
    out = capsys.readouterr().out
    assert "already reached trainer.max_steps 2" in out and last.read_bytes() == before
    typed = suggested(out, "--trainer.max_steps 4")
    assert typed.count("--trainer.max_steps") == 1
    main(typed)
    assert saved(last)["global_step"] == 4


# --------------------------------------------------------------------------- 9: typos
def test_a_mistyped_key_is_named_in_one_line_with_the_nearest_one(tmp_path, capsys):
    def only_line(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "usage:" not in err and len(err.splitlines()) == 1
        return err.splitlines()[0]

    yaml_typo = tmp_path / "typo.yaml"
    yaml_typo.write_text(QUICKSTART.read_text().replace("warmup_steps:", "warmup_step:"))
    assert only_line(["fit", "--config", str(yaml_typo)]) == (
        "genoformer fit: error: did you mean model.warmup_steps? (the options of GenoformerLM: genoformer fit "
        "--model.help GenoformerLM); unknown option model.warmup_step (GenoformerLM has no warmup_step)"
    )
    section_typo = tmp_path / "section.yaml"
    section_typo.write_text(QUICKSTART.read_text().replace("\ntrainer:", "\ntrainr:"))
    assert only_line(["fit", "--config", str(section_typo)]).startswith("genoformer fit: error: did you mean trainer? ")
    # an abbreviation is no longer taken for the option it starts
    assert only_line(["fit", "--config", str(QUICKSTART), "--trainer.max_step", "10"]) == (
        "genoformer fit: error: did you mean --trainer.max_steps? (all options: genoformer fit --help); "
        "unknown option --trainer.max_step"
    )
    assert "did you mean --model.transformer.d_model?" in only_line(
        ["fit", "--config", str(QUICKSTART), "--model.transformer.d_modle", "64"]
    )
    assert "did you mean --data.batch_size?" in only_line(
        ["fit", "--config", str(QUICKSTART), "--data.init_args.batch_sise", "4"]
    )
    assert only_line(["prepare", "--fastaa", "x.fa", "--out", str(tmp_path / "x.zarr")]) == (
        "genoformer prepare: error: did you mean --fasta? (all options: genoformer prepare --help); "
        "unknown option --fastaa"
    )
    assert only_line(["prepare", "--fas", "x.fa", "--out", str(tmp_path / "x.zarr")]).endswith("unknown option --fas")


# --------------------------------------------------------------------------- 10: forecast horizons
def _sine_store(tmp_path: Path, length: int) -> Path:
    from genoformer.data import prepare_timeseries_store

    values = np.sin(2 * np.pi * np.arange(length) / 50).astype(np.float32)
    np.save(tmp_path / "sine.npy", values)
    return prepare_timeseries_store([tmp_path / "sine.npy"], tmp_path / "sine.zarr", sampling_rate=1.0, progress=False)


def test_evaluate_forecast_horizon_hints_work_as_typed(tmp_path, capsys):
    import lightning as L

    from genoformer.core.transformer import TransformerConfig
    from genoformer.timeseries.model import ForecastConfig
    from genoformer.timeseries.module import TimeSeriesForecaster

    store = _sine_store(tmp_path, 1000)  # hourly for six weeks: a test part of 200 steps
    args = [
        "evaluate_forecast",
        "--store",
        str(store),
        "--baseline",
        "seasonal_naive",
        "--out",
        str(tmp_path / "sn.json"),
    ]
    err = fails(capsys, args)  # the protocol's 336 and 720 do not fit
    typed = shlex.split(re.search(r"--horizons \S+", err).group(0))
    assert typed == ["--horizons", "96,192"]
    main(args + typed)
    assert [row["horizon"] for row in json.loads((tmp_path / "sn.json").read_text())["results"]] == [96, 192]

    module = TimeSeriesForecaster(
        TransformerConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=64),
        ForecastConfig(patch_len=8, context=64, horizon=16),
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    checkpoint = tmp_path / "h16.ckpt"
    trainer.save_checkpoint(checkpoint)
    args = [
        "evaluate_forecast",
        "--store",
        str(store),
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(tmp_path / "model.json"),
        "--device",
        "cpu",
    ]
    err = fails(capsys, args)  # the model forecasts 16 steps, shorter than every horizon of the protocol
    main(args + shlex.split(re.search(r"--horizons \S+", err).group(0)))
    rows = json.loads((tmp_path / "model.json").read_text())["results"]
    assert [(row["method"], row["horizon"]) for row in rows] == [
        ("forecaster", 16),
        ("seasonal_naive", 16),
        ("ar", 16),
        ("dlinear", 16),
    ]  # the model beside the baselines


# --------------------------------------------------------------------------- 11: nothing left behind
def test_a_failed_fit_removes_only_the_folders_it_created(tmp_path, store, capsys):
    parent = tmp_path / "projects"
    parent.mkdir()
    (parent / "notes.txt").write_text("mine")
    run_dir = parent / "klebsiella" / "run1"
    fails(capsys, quickstart(run_dir, store, *TINY_MODEL, "--data.init_args.batch_size", "-3"))
    assert sorted(path.name for path in parent.iterdir()) == ["notes.txt"]


# --------------------------------------------------------------------------- 12: quiet and fast
@pytest.mark.slow
def test_fit_prints_no_third_party_noise(tmp_path, store):
    result = subprocess.run(
        [sys.executable, "cli.py", *quickstart(tmp_path / "run", store, *TINY_MODEL)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for noise in ("💡 Tip", "LeafSpec", "weights_only"):
        assert noise not in result.stderr + result.stdout


def test_usage_and_tool_summaries_import_no_model_code():
    script = (
        "import sys; from genoformer.cli import main; main(['--help']); "
        "print(sorted(name for name in ('torch', 'lightning', 'zarr') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip().endswith("[]")
    for name, command in TOOL_COMMANDS.items():  # the usage's summaries are the functions' own first lines
        assert command.summary == command.load().__doc__.strip().splitlines()[0], name
