"""Every hint the `genoformer` command prints works as typed; inputs, flags, help and clear errors.

A hint is followed by cutting the options it names out of the message and appending them, as
typed, to the command that failed; Python callers get the same messages with Python names.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from cli_helpers import fails
from genoformer.data import GenomeStore, TimeSeriesStore, prepare_genome_store, prepare_timeseries_store
from genoformer.data.storage import METADATA_KEY

from genoformer.cli import _tool_arguments, main
from genoformer.genome.commands import prepare
from genoformer.hints import command_line_hints
from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


def hinted(message: str, pattern: str) -> list[str]:
    """The options a message suggests: the text matching `pattern` (a regex), split as a shell
    would, e.g. hinted(err, r"--missing \\w+") -> ["--missing", "ffill"]."""
    found = re.search(pattern, message)
    assert found, f"no {pattern!r} in: {message}"
    return shlex.split(found.group(0))


def write_fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in records.items()))
    return path


# --------------------------------------------------------------------------- flags and inputs
def test_boolean_options_are_bare_flags():
    assert _tool_arguments(prepare, ["--fasta", "a.fa", "--overwrite"]) == ["--fasta", "a.fa", "--overwrite", "true"]
    assert _tool_arguments(prepare, ["--overwrite", "--out", "x"]) == ["--overwrite", "true", "--out", "x"]
    assert _tool_arguments(prepare, ["--overwrite", "false"]) == ["--overwrite", "false"]
    assert _tool_arguments(prepare, ["--fasta", "a.fa", "b.fa", "--out", "x"]) == [
        "--fasta",
        '["a.fa", "b.fa"]',
        "--out",
        "x",
    ]
    assert _tool_arguments(prepare, ["--fasta", "[a.fa,b.fa]"]) == ["--fasta", "[a.fa,b.fa]"]


def test_existing_store_hint_works_as_typed(tmp_path, capsys):
    first = write_fasta(tmp_path / "one.fa", {"a": "ACGT" * 300})
    other = write_fasta(tmp_path / "other.fa", {"b": "GGCC" * 300})
    out = tmp_path / "store.zarr"
    main(["prepare", "--fasta", str(first), "--out", str(out)])
    err = fails(capsys, ["prepare", "--fasta", str(other), "--out", str(out)])
    assert "pass --overwrite to replace it" in err
    main(["prepare", "--fasta", str(other), "--out", str(out), *hinted(err, r"--overwrite")])
    assert [contig.name for contig in GenomeStore(out).contigs] == ["b"]
    with pytest.raises(FileExistsError, match=r"pass overwrite=True"):  # the Python API speaks Python
        prepare_genome_store([first], out, progress=False)


def test_fasta_accepts_several_paths_a_folder_and_a_list(tmp_path, capsys):
    folder = tmp_path / "genomes"
    folder.mkdir()
    write_fasta(folder / "a.fa", {"a": "ACGT" * 300})
    write_fasta(folder / "b.fasta", {"b": "GGCC" * 300})
    (folder / "README.txt").write_text("not a genome")
    paths = sorted(str(path) for path in folder.glob("*.fa*"))  # what the shell makes of genomes/*.fa*
    for name, fasta_args in {
        "several": paths,
        "folder": [str(folder)],
        "list": [f"[{paths[0]},{paths[1]}]"],
    }.items():
        out = tmp_path / f"{name}.zarr"
        main(["prepare", "--fasta", *fasta_args, "--out", str(out)])
        assert [contig.name for contig in GenomeStore(out).contigs] == ["a", "b"], name

    main(["prepare", "--fasta", ",".join(paths), "--out", str(tmp_path / "comma.zarr")])  # existing files a,b
    assert [contig.name for contig in GenomeStore(tmp_path / "comma.zarr").contigs] == ["a", "b"]
    (tmp_path / "empty").mkdir()
    assert "holds no FASTA/GenBank files" in fails(
        capsys, ["prepare", "--fasta", str(tmp_path / "empty"), "--out", str(tmp_path / "e.zarr")]
    )


# --------------------------------------------------------------------------- time series
def test_prepare_timeseries_rerun_is_a_no_op(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(200, dtype=np.float32))
    np.save(tmp_path / "b.npy", np.arange(200, dtype=np.float32) * 2)
    out = tmp_path / "ts.zarr"
    args = [
        "prepare_timeseries",
        "--inputs",
        str(tmp_path / "a.npy"),
        str(tmp_path / "b.npy"),
        "--sampling_rate",
        "100",
        "--out",
        str(out),
    ]
    main(args)
    written = (out / "zarr.json").read_bytes()
    main(args)  # same inputs and options: kept as it is
    assert (out / "zarr.json").read_bytes() == written
    main(["prepare_timeseries", "--inputs", str(tmp_path), "--sampling_rate", "100", "--out", str(out)])  # a folder
    assert (out / "zarr.json").read_bytes() == written
    np.save(tmp_path / "b.npy", np.arange(200, dtype=np.float32) * 3)  # an input changed
    err = fails(capsys, args)
    assert "pass --overwrite" in err
    main(args + hinted(err, r"--overwrite"))
    assert TimeSeriesStore(out).read(1, 0, 3)[0].tolist() == [0.0, 3.0, 6.0]


def test_timeseries_hints_work_as_typed(tmp_path, capsys):
    csv = tmp_path / "gaps.csv"
    csv.write_text("a,b\n1,2\n3,\n5,6\n")
    err = fails(
        capsys,
        [
            "prepare_timeseries",
            "--inputs",
            str(csv),
            "--sampling_rate",
            "10",
            "--out",
            str(tmp_path / "x.zarr"),
            "--missing",
            "error",
        ],
    )
    for policy in ("ffill", "zero", "linear"):
        assert f"--missing {policy}" in err
        out = tmp_path / f"{policy}.zarr"
        main(
            [
                "prepare_timeseries",
                "--inputs",
                str(csv),
                "--sampling_rate",
                "10",
                "--out",
                str(out),
                *hinted(err, rf"--missing {policy}"),
            ]
        )
        assert TimeSeriesStore(out).read(0, 0, 3).shape == (2, 3)
    with pytest.raises(ValueError, match="missing='ffill'"):
        prepare_timeseries_store([csv], tmp_path / "y.zarr", sampling_rate=10, missing="error", progress=False)

    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float32))
    err = fails(capsys, ["prepare_timeseries", "--inputs", str(tmp_path / "x.npy"), "--out", str(tmp_path / "r.zarr")])
    typed = [word.replace("HZ", "250") for word in hinted(err, r"--sampling_rate HZ")]
    main(["prepare_timeseries", "--inputs", str(tmp_path / "x.npy"), "--out", str(tmp_path / "r.zarr"), *typed])
    assert TimeSeriesStore(tmp_path / "r.zarr").sampling_rate == 250
    with pytest.raises(ValueError, match="sampling_rate=HZ"):
        prepare_timeseries_store([tmp_path / "x.npy"], tmp_path / "p.zarr", progress=False)


def test_incomplete_store_hint_works_as_typed(tmp_path, capsys):
    fasta = write_fasta(tmp_path / "g.fa", {"a": "ACGT" * 300})
    store = tmp_path / "g.zarr"
    main(["prepare", "--fasta", str(fasta), "--out", str(store)])
    group = zarr.open_group(store, mode="r+")
    group.attrs[METADATA_KEY] = {**group.attrs[METADATA_KEY], "complete": False}
    with pytest.raises(ValueError, match=r"prepare_genome_store\(INPUTS, .*overwrite=True\)"):
        GenomeStore(store)
    err = fails(
        capsys,
        [
            "validate",
            "--config",
            str(REPO_ROOT / "configs" / "quickstart.yaml"),
            "--untrained",
            "--data.init_args.store",
            str(store),
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
        ],
    )
    typed = hinted(err, r"genoformer prepare --out \S+ --overwrite")
    main(typed[1:] + ["--fasta", str(fasta)])
    assert GenomeStore(store).contigs[0].length == 1200


# --------------------------------------------------------------------------- training commands
@pytest.mark.slow
def test_empty_split_hint_works_as_typed(tmp_path, capsys):
    store = tmp_path / "lambda.zarr"
    main(["prepare", "--fasta", str(LAMBDA), "--out", str(store)])
    args = [
        "validate",
        "--config",
        str(REPO_ROOT / "configs" / "quickstart.yaml"),
        "--untrained",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--data.init_args.store",
        str(store),
        "--data.init_args.fasta",
        f"[{LAMBDA}]",
        "--data.init_args.num_workers",
        "0",
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
        "--data.init_args.split",
        "{by: region, val_fraction: 0.0, test_fraction: 0.1}",
    ]
    err = fails(capsys, args)
    main(args + hinted(err, r"--data\.init_args\.split\.val_fraction [\d.]+"))
    assert "val/bpb" in (tmp_path / "run" / "validate" / "metrics.csv").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_gpu_config_without_a_gpu_names_its_cpu_version_and_the_cpu_overrides(tmp_path, capsys):
    gpu = REPO_ROOT / "configs" / "genome_8k_gpu.yaml"
    args = [
        "--config",
        str(gpu),
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--data.init_args.store",
        str(tmp_path / "s.zarr"),
    ]
    err = fails(capsys, ["fit", *args])
    assert "sees no CUDA GPU" in err and "slow" in err
    commands = [shlex.split(line.strip()) for line in err.splitlines() if line.strip().startswith("genoformer fit ")]
    assert len(commands) == 2
    twin, overrides = commands
    assert twin == ["genoformer", "fit", "--config", str(gpu.with_name("genome_8k_cpu.yaml")), *args[2:]]
    for option, value in [
        ("--trainer.accelerator", "cpu"),
        ("--trainer.precision", "32-true"),
        ("--model.init_args.runtime.compile", "false"),
        ("--data.init_args.batch_size", "1"),
    ]:
        assert overrides[overrides.index(option) + 1] == value
    assert "--trainer.accumulate_grad_batches 8" in err  # how to keep the recipe's batch, in words
    for typed in commands:  # both build on the CPU as typed (minus the subcommand)
        cli = training_cli(typed[2:], run=False)
        assert cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    assert not cli.model.runtime.compile and cli.datamodule.num_workers <= max(1, (os.cpu_count() or 1) // 4)


# --------------------------------------------------------------------------- embed
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
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
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_embed_refuses_an_existing_output_and_the_hint_works(tmp_path, checkpoint, capsys):
    out = tmp_path / "emb.npz"
    main(["embed", "--checkpoint", str(checkpoint), "--inputs", "ACGTACGT", "--out", str(out)])
    before = out.read_bytes()
    args = ["embed", "--checkpoint", str(checkpoint), "--inputs", "ACGT", "GGCC", "--out", str(out)]
    err = fails(capsys, args)
    assert "pass --overwrite" in err and out.read_bytes() == before
    main(args + hinted(err, r"--overwrite"))
    assert list(np.load(out)["names"]) == ["seq0", "seq1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_embed_on_cuda_without_cuda_hint_works(tmp_path, checkpoint, capsys):
    args = ["embed", "--checkpoint", str(checkpoint), "--inputs", "ACGT", "--out", str(tmp_path / "e.npz")]
    err = fails(capsys, args + ["--device", "cuda"])
    assert "sees none" in err
    main(args + ["--device", "cuda"] + hinted(err, r"--device cpu"))
    assert (tmp_path / "e.npz").is_file()


def test_embed_takes_a_folder_and_several_inputs(tmp_path, checkpoint):
    folder = tmp_path / "seqs"
    folder.mkdir()
    write_fasta(folder / "a.fa", {"r1": "ACGTACGT"})
    write_fasta(folder / "b.fa", {"r2": "GGGCCCAA"})
    out = tmp_path / "emb.npz"
    main(["embed", "--checkpoint", str(checkpoint), "--inputs", "TTTT", str(folder), "--out", str(out)])
    assert list(np.load(out)["names"]) == ["seq0", "r1", "r2"]


# --------------------------------------------------------------------------- help and version
def test_version(capsys):
    main(["--version"])
    assert re.fullmatch(r"genoformer \S+\n", capsys.readouterr().out)


def test_fit_help_documents_the_data_modules(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "genoformer fit --data.help GenomeDataModule" in out
    assert "The main advantage is" not in out and "\nthe architecture." not in out  # no cut-off titles
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data.help", "GenomeDataModule"])  # the short name, as the help says
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--data.store STORE" in out and "--data.split SPLIT" in out
    for subcommand in ("validate", "predict"):
        with pytest.raises(SystemExit):
            main([subcommand, "--help"])
        out = capsys.readouterr().out
        assert "--untrained" in out and "--overwrite" in out and "Required, unless --untrained" in out


# --------------------------------------------------------------------------- progress bars
def test_progress_bar_ends_its_line_before_an_error(tmp_path):
    bad = write_fasta(tmp_path / "bad.fa", {"a": "ACGT!ACGT"})
    result = subprocess.run(
        [sys.executable, "cli.py", "prepare", "--fasta", str(bad), "--out", str(tmp_path / "x.zarr")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    lines = result.stderr.split("\n")
    error_line = next(index for index, line in enumerate(lines) if "error:" in line)
    assert lines[error_line].startswith("genoformer prepare: error:")  # not on the bar's line
    assert "prepare:" not in "\n".join(lines[error_line + 1 :])  # and the bar is not drawn again


def test_data_hints_under_a_training_command_name_the_data_module_options(tmp_path):
    """Inside `genoformer fit` the data code runs in the data module: its hints carry the prefix
    that reaches the data module's own options, and work as typed there."""
    csv = tmp_path / "gaps.csv"
    csv.write_text("a,b\n1,2\n3,\n5,6\n")
    args = [
        "--model.transformer",
        "{d_model: 16, n_layers: 1, n_heads: 2, max_seq_len: 64}",
        "--data",
        "TimeSeriesDataModule",
        "--data.init_args.store",
        str(tmp_path / "s.zarr"),
        "--data.init_args.sources",
        f"[{csv}]",
        "--data.init_args.sampling_rate",
        "10",
        "--data.init_args.missing",
        "error",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
    ]
    cli = training_cli(args, run=False)
    with command_line_hints(prefix="data.init_args."), pytest.raises(ValueError) as error:
        cli.datamodule.prepare_data()
    typed = hinted(str(error.value), r"--data\.init_args\.missing ffill")
    training_cli(args + typed, run=False).datamodule.prepare_data()
    assert TimeSeriesStore(tmp_path / "s.zarr").read(0, 0, 3).tolist() == [[1.0, 3.0, 5.0], [2.0, 2.0, 6.0]]


def test_one_plain_value_of_a_list_option_is_a_list_of_one():
    """`genoformer evaluate --inputs genome.fa` (as the guides write it) reads one file, as
    `--inputs a.fa b.fa` reads two and `--inputs "[a.fa,b.fa]"` a list."""
    from genoformer.cli import _tool_arguments
    from genoformer.genome.evaluate import evaluate

    assert _tool_arguments(evaluate, ["--inputs", "a.fa"]) == ["--inputs", '["a.fa"]']
    assert _tool_arguments(evaluate, ["--inputs", "a.fa", "b.fa", "--both_strands"]) == [
        "--inputs",
        '["a.fa", "b.fa"]',
        "--both_strands",
        "true",
    ]
    assert _tool_arguments(evaluate, ["--inputs", "[a.fa,b.fa]"]) == ["--inputs", "[a.fa,b.fa]"]
