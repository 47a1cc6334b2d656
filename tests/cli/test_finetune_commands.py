"""`genoformer finetune`, `classify` and `annotate` end to end on the CPU, in-process through
genoformer.cli.main, from the tiny causal language model of the test fixtures: the run directory,
refusal and resume, prediction tables, GFF3 and bedGraph outputs, and the errors for a model of the
wrong kind."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import fails
from genoformer.data.genome.alphabet import decode
from genoformer.data.genome.annotations import read_genes

from genoformer.cli import main
from genoformer.core.checkpoints import REGROUPED, ModelKind

GENES = [(101, 400, "+"), (1501, 1800, "-"), (2301, 2610, "+")]  # GFF3: 1-based, inclusive
QUIET = ["--device", "cpu"]


def random_dna(rng: np.random.Generator, n: int) -> str:
    return decode(rng.integers(0, 4, n).astype(np.uint8))


def write_table(path: Path, n: int, seed: int, *, regress: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    header = "name\tsequence\tlabel_alpha\tlabel_beta\textra" if regress else "name\tsequence\tlabel\textra"
    lines = [header]
    for i in range(n):
        sequence = random_dna(rng, int(rng.integers(24, 48)))
        labels = f"{rng.normal():.4f}\t{rng.normal(5, 2):.4f}" if regress else "ab"[i % 2]
        lines.append(f"{path.stem}{i}\t{sequence}\t{labels}\tx{i}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file, delimiter="\t"))


def step_of(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def finetune_args(pretrained: Path, tables: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "finetune",
        "--pretrained",
        str(pretrained),
        "--task",
        "classify",
        "--train",
        str(tables["train"]),
        "--val",
        str(tables["val"]),
        "--out",
        str(out),
        "--batch_size",
        "4",
        *QUIET,
        *extra,
    ]


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tables")
    return {
        name: write_table(folder / f"{name}.tsv", n, seed)
        for name, n, seed in [("train", 24, 1), ("val", 8, 2), ("test", 7, 3)]
    }


@pytest.fixture(scope="module")
def classifier_run(causal_checkpoint, tables, tmp_path_factory) -> tuple[Path, str]:
    """A classifier run and what it printed: validation every 2 steps, test metrics at the end,
    and a learning rate far too high, so that the validation loss rises after step 4 and early
    stopping (--patience 2) ends the run at step 8 of 40."""
    run = tmp_path_factory.mktemp("classify_run") / "RUN"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(
            finetune_args(
                causal_checkpoint,
                tables,
                run,
                "--test",
                str(tables["test"]),
                "--max_steps",
                "40",
                "--val_every",
                "2",
                "--patience",
                "2",
                "--learning_rate",
                "0.05",
            )
        )
    return run, printed.getvalue()


@pytest.fixture(scope="module")
def classifier(classifier_run) -> Path:
    return classifier_run[0]


def test_finetune_writes_a_run_directory(classifier):
    files = {str(p.relative_to(classifier)) for p in classifier.rglob("*") if p.is_file()}
    assert {
        "checkpoints/last.ckpt",
        "checkpoints/best.ckpt",
        "metrics.csv",
        "loss.png",
        "config.yaml",
        "test/metrics.csv",
    } <= files
    assert step_of(classifier / "checkpoints" / "last.ckpt") == 8  # stopped early
    rows = read_tsv_csv(classifier / "metrics.csv")
    assert {"val/accuracy", "val/auroc", "val/loss"} <= set(rows[0])
    assert len([r for r in rows if r.get("val/loss")]) == 4  # validated at steps 2, 4, 6 and 8
    [test_row] = [r for r in read_tsv_csv(classifier / "test" / "metrics.csv") if r.get("test/accuracy")]
    assert 0.0 <= float(test_row["test/auroc"]) <= 1.0
    config = (classifier / "config.yaml").read_text()
    assert "genoformer.genome.finetune.FineTuner" in config and "max_steps: 4" in config


def read_tsv_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_finetune_again_is_refused_and_ckpt_path_last_resumes(causal_checkpoint, tables, tmp_path, capsys):
    run = tmp_path / "RUN"
    main(finetune_args(causal_checkpoint, tables, run, "--max_steps", "2", "--val_every", "2"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    err = fails(capsys, finetune_args(causal_checkpoint, tables, run, "--max_steps", "2", "--val_every", "2"))
    assert "already holds a training run" in err and "--ckpt_path last" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # refused before touching it
    main(finetune_args(causal_checkpoint, tables, run, "--max_steps", "4", "--val_every", "2", "--ckpt_path", "last"))
    assert step_of(run / "checkpoints" / "last.ckpt") == 4
    rows = read_tsv_csv(run / "metrics.csv")
    val_steps = [int(r["step"]) for r in rows if r.get("val/loss")]
    assert len(val_steps) == 2 and val_steps[0] == 1 and val_steps[1] > 2  # one run, appended to


def test_classify_a_table_keeps_its_columns_and_order(classifier, tables, tmp_path):
    out = tmp_path / "pred.tsv"
    main(
        [
            "classify",
            "--checkpoint",
            str(classifier / "checkpoints" / "last.ckpt"),
            "--inputs",
            str(tables["test"]),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--batch_size",
            "3",
        ]
    )
    rows = read_tsv(out)
    assert list(rows[0]) == ["name", "sequence", "label", "extra", "prediction", "p_a", "p_b"]  # the input's columns
    assert [r["label"] for r in rows] == ["ab"[i % 2] for i in range(7)]
    assert [r["name"] for r in rows] == [f"test{i}" for i in range(7)]
    assert [r["extra"] for r in rows] == [f"x{i}" for i in range(7)]
    for row in rows:
        pa, pb = float(row["p_a"]), float(row["p_b"])
        assert pa + pb == pytest.approx(1.0, abs=2e-6)
        assert row["prediction"] == ("a" if pa >= pb else "b")


def test_classify_with_the_run_directory_reads_its_best_checkpoint(classifier, tables, tmp_path, capsys):
    """A run directory (or RUN/best) is the checkpoint the run recorded as best by validation loss,
    found by its name inside the run, so that a run moved elsewhere still finds its own."""
    states = torch.load(classifier / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["callbacks"]
    (recorded,) = [
        state["best_model_path"]
        for key, state in states.items()
        if key.startswith("ModelCheckpoint") and state["monitor"] == "val/loss"
    ]
    moved = tmp_path / "moved"
    shutil.copytree(classifier, moved)
    best = moved / "checkpoints" / Path(recorded).name
    assert best.is_file() and best.name != "last.ckpt"
    for checkpoint in (moved, moved / "best"):
        main(
            [
                "classify",
                "--checkpoint",
                str(checkpoint),
                "--inputs",
                str(tables["test"]),
                "--out",
                str(tmp_path / f"{checkpoint.name}.tsv"),
                "--device",
                "cpu",
            ]
        )
        assert f"checkpoint {checkpoint} is {best} (the run's best checkpoint, val/loss " in capsys.readouterr().err
    main(
        [
            "classify",
            "--checkpoint",
            str(best),
            "--inputs",
            str(tables["test"]),
            "--out",
            str(tmp_path / "file.tsv"),
            "--device",
            "cpu",
        ]
    )
    assert read_tsv(tmp_path / "moved.tsv") == read_tsv(tmp_path / "file.tsv") == read_tsv(tmp_path / "best.tsv")


def test_classify_a_fasta_names_the_records(classifier, tmp_path):
    rng = np.random.default_rng(5)
    fasta = tmp_path / "seqs.fa"
    fasta.write_text("".join(f">rec{i} description\n{random_dna(rng, 30 + i)}\n" for i in range(3)))
    out = tmp_path / "pred.tsv"
    main(
        [
            "classify",
            "--checkpoint",
            str(classifier / "checkpoints" / "last.ckpt"),
            "--inputs",
            str(fasta),
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    rows = read_tsv(out)
    assert [r["name"] for r in rows] == ["rec0", "rec1", "rec2"]
    assert list(rows[0])[-3:] == ["prediction", "p_a", "p_b"]


def test_existing_outputs_and_wrong_models_are_refused(classifier, causal_checkpoint, tables, tmp_path, capsys):
    out = tmp_path / "pred.tsv"
    out.write_text("keep me\n")
    checkpoint = str(classifier / "checkpoints" / "last.ckpt")
    err = fails(capsys, ["classify", "--checkpoint", checkpoint, "--inputs", str(tables["test"]), "--out", str(out)])
    assert "exists" in err and "--overwrite" in err and out.read_text() == "keep me\n"
    main(
        [
            "classify",
            "--checkpoint",
            checkpoint,
            "--inputs",
            str(tables["test"]),
            "--out",
            str(out),
            "--overwrite",
            "--device",
            "cpu",
        ]
    )
    assert len(read_tsv(out)) == 7
    err = fails(
        capsys,
        [
            "classify",
            "--checkpoint",
            str(causal_checkpoint),
            "--inputs",
            str(tables["test"]),
            "--out",
            str(tmp_path / "lm.tsv"),
        ],
    )
    assert "a DNA language model" in err and "fine-tuned" in err and "genoformer embed" in err
    fasta = tmp_path / "g.fa"
    fasta.write_text(">c\n" + "ACGT" * 50 + "\n")
    err = fails(
        capsys, ["annotate", "--checkpoint", checkpoint, "--inputs", str(fasta), "--out", str(tmp_path / "g.gff3")]
    )
    assert "sequence_classes" in err and "genoformer classify" in err
    assert not (tmp_path / "g.gff3").exists() and not (tmp_path / "lm.tsv").exists()


def test_regression_predicts_y_columns(causal_checkpoint, tmp_path):
    train, val = (
        write_table(tmp_path / "rtrain.tsv", 16, 7, regress=True),
        write_table(tmp_path / "rval.tsv", 6, 8, regress=True),
    )
    run = tmp_path / "REG"
    main(
        [
            "finetune",
            "--pretrained",
            str(causal_checkpoint),
            "--task",
            "regress",
            "--train",
            str(train),
            "--val",
            str(val),
            "--out",
            str(run),
            "--max_steps",
            "2",
            "--val_every",
            "2",
            "--batch_size",
            "4",
            *QUIET,
        ]
    )
    rows = read_tsv_csv(run / "metrics.csv")
    assert {"val/pearson", "val/mse"} <= set(rows[0])
    out = tmp_path / "y.tsv"
    main(
        [
            "classify",
            "--checkpoint",
            str(run / "checkpoints" / "last.ckpt"),
            "--inputs",
            str(val),
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    rows = read_tsv(out)
    assert list(rows[0]) == [
        "name",
        "sequence",
        "label_alpha",
        "label_beta",
        "extra",
        "prediction",
        "y_alpha",
        "y_beta",
    ]
    for row in rows:
        assert row["prediction"].split(",") == [row["y_alpha"], row["y_beta"]]
        assert np.isfinite([float(row["y_alpha"]), float(row["y_beta"])]).all()


def write_genome(folder: Path, length: int = 3000, seed: int = 11) -> tuple[Path, Path]:
    """(GFF3 with ##FASTA, the same contig as FASTA): CDSs on both strands."""
    sequence = random_dna(np.random.default_rng(seed), length)
    lines = ["##gff-version 3", f"##sequence-region ctg1 1 {length}"]
    lines += [f"ctg1\ttest\tCDS\t{s}\t{e}\t.\t{strand}\t0\tID=g{i}" for i, (s, e, strand) in enumerate(GENES)]
    body = [sequence[i : i + 60] for i in range(0, length, 60)]
    gff3 = folder / "genome.gff3"
    gff3.write_text("\n".join(lines + ["##FASTA", ">ctg1"] + body) + "\n")
    fasta = folder / "genome.fasta"
    fasta.write_text("\n".join([">ctg1"] + body) + "\n")
    return gff3, fasta


@pytest.mark.slow
def test_annotate_end_to_end(causal_checkpoint, tmp_path, capsys):
    gff3, fasta = write_genome(tmp_path)
    run = tmp_path / "ANN"
    main(
        [
            "finetune",
            "--pretrained",
            str(causal_checkpoint),
            "--task",
            "annotate",
            "--train",
            str(gff3),
            "--out",
            str(run),
            "--window",
            "256",
            "--max_steps",
            "2",
            "--val_every",
            "2",
            "--batch_size",
            "2",
            *QUIET,
        ]
    )
    rows = read_tsv_csv(run / "metrics.csv")
    assert {"val/accuracy", "val/mcc", "val/coding_mcc"} <= set(rows[0])
    checkpoint = str(run / "checkpoints" / "last.ckpt")
    genes, tracks = tmp_path / "genes.gff3", tmp_path / "t.bedgraph"
    main(
        [
            "annotate",
            "--checkpoint",
            checkpoint,
            "--inputs",
            str(fasta),
            "--out",
            str(genes),
            "--tracks",
            str(tracks),
            "--window",
            "256",
            "--device",
            "cpu",
        ]
    )
    called = read_genes(genes)
    assert all(g.contig == "ctg1" and g.kind == "CDS" and 0 <= g.start < g.end <= 3000 for g in called)
    text = tracks.read_text().splitlines()
    assert [line for line in text if line.startswith("track")] == [line for line in text if "name=" in line]
    assert len([line for line in text if line.startswith("track")]) == 2
    data = [line.split("\t") for line in text if not line.startswith("track")]
    assert data and all(fields[0] == "ctg1" and 0.0 <= float(fields[3]) <= 1.0 for fields in data)
    starts = [int(fields[1]) for fields in data]
    assert starts.count(0) == 2  # one run of lines per class (CDS+, CDS-), each covering the contig
    ends = [int(fields[2]) for fields in data]
    assert ends.count(3000) == 2 and all(b == a for a, b in zip(ends, starts[1:]) if b != 0)
    # existing outputs are refused, and then replaced with --overwrite
    before = genes.read_bytes()
    err = fails(capsys, ["annotate", "--checkpoint", checkpoint, "--inputs", str(fasta), "--out", str(genes)])
    assert "exists" in err and genes.read_bytes() == before
    err = fails(
        capsys,
        [
            "annotate",
            "--checkpoint",
            checkpoint,
            "--inputs",
            str(fasta),
            "--out",
            str(tmp_path / "new.gff3"),
            "--tracks",
            str(tracks),
        ],
    )
    assert "t.bedgraph exists" in err and not (tmp_path / "new.gff3").exists()
    main(
        [
            "annotate",
            "--checkpoint",
            checkpoint,
            "--inputs",
            str(fasta),
            "--out",
            str(genes),
            "--tracks",
            str(tracks),
            "--overwrite",
            "--device",
            "cpu",
        ]
    )
    assert read_genes(genes) is not None
    # an annotator given to classify is refused
    err = fails(
        capsys, ["classify", "--checkpoint", checkpoint, "--inputs", str(fasta), "--out", str(tmp_path / "p.tsv")]
    )
    assert "base_classes" in err and "genoformer annotate" in err


def test_finetune_without_test_names_no_test_metrics(classifier, causal_checkpoint, tables, tmp_path, capsys):
    run = tmp_path / "NOTEST"
    capsys.readouterr()
    main(finetune_args(causal_checkpoint, tables, run, "--max_steps", "1", "--val_every", "1"))
    out = capsys.readouterr().out
    assert not (run / "test").exists()
    assert "test metrics:" not in out


def test_finetune_stops_early_keeps_the_best_and_says_last_is_worse(classifier_run, tables, tmp_path):
    """best.ckpt holds the step with the lowest validation loss, the summary says that the last
    checkpoint is worse and that the run stopped early, and the command it prints predicts with
    the best checkpoint (run as printed)."""
    run, out = classifier_run
    best = run / "checkpoints" / "best.ckpt"
    found = re.search(
        r"best: step (\d+) +val/loss ([\d.]+).*?(\S+best\.ckpt)\n +last: step (\d+) +val/loss ([\d.]+)", out
    )
    assert found, out
    best_step, best_loss, best_path, last_step, last_loss = found.groups()
    assert Path(best_path) == best and step_of(best) == int(best_step) < int(last_step) == step_of(
        run / "checkpoints" / "last.ckpt"
    )
    assert float(best_loss) < float(last_loss)
    assert f"stopped early at step {last_step} of 40" in out and "--patience" in out
    assert "the last checkpoint is WORSE than the best" in out
    command = out.split("predict with the best checkpoint:\n")[1].splitlines()[0].strip()
    assert command.startswith("genoformer classify --checkpoint ") and str(best) in command
    predictions = tmp_path / "predictions.tsv"
    args = [
        str(tables["test"]) if word == "SEQUENCES.tsv" else str(predictions) if word == "predictions.tsv" else word
        for word in shlex.split(command)[1:]
    ]
    main([*args, "--device", "cpu"])
    assert [r["label"] for r in read_tsv(predictions)] == ["ab"[i % 2] for i in range(7)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA GPU runs --device gpu")
def test_finetune_device_gpu_on_a_cpu_suggests_device_cpu(causal_checkpoint, tables, tmp_path, capsys):
    run = tmp_path / "RUN"
    err = fails(
        capsys,
        [
            "finetune",
            "--pretrained",
            str(causal_checkpoint),
            "--task",
            "classify",
            "--train",
            str(tables["train"]),
            "--val",
            str(tables["val"]),
            "--out",
            str(run),
            "--max_steps",
            "1",
            "--batch_size",
            "4",
            "--device",
            "gpu",
        ],
    )
    assert "sees no CUDA GPU" in err and not run.exists()
    [command] = [line.strip() for line in err.splitlines() if line.strip().startswith("genoformer finetune --")]
    assert len(command) < 400 and "--device cpu" in command and "genoformer fit" not in err
    main(shlex.split(command)[1:])  # the hint as printed
    assert (run / "checkpoints" / "best.ckpt").is_file()


def test_a_checkpoint_of_the_flat_layout_tests_as_saved(classifier, tables, tmp_path):
    """A checkpoint saved before FineTuner grouped its head and strand arguments (the
    hyperparameters flat, as the shipped gene annotator's are) rebuilds its model through
    `genoformer test --ckpt_path` (the command line parsed again with its hyperparameters) and
    scores what today's layout of the same weights scored. (Inference reads the flat layout in
    tests/genome/test_shipped_gene_model.py.)"""
    best = classifier / "checkpoints" / "best.ckpt"
    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    for old, (group, field) in REGROUPED[ModelKind.GENOME_FINETUNED].items():
        hparams[old] = hparams[group].pop(field)
    for group in ("head", "strands"):
        assert not hparams.pop(group)
    flat = tmp_path / "flat.ckpt"
    torch.save(checkpoint, flat)
    data = [f"--data.init_args.{split}={json.dumps([str(tables[split])])}" for split in ("train", "val", "test")]
    data.append("--data.init_args.batch_size=4")
    main(["test", "--config", "finetune_cpu", f"--trainer.default_root_dir={tmp_path}", *data, f"--ckpt_path={flat}"])
    [scores] = [r for r in read_tsv_csv(tmp_path / "test" / "metrics.csv") if r.get("test/loss")]
    [expected] = [r for r in read_tsv_csv(classifier / "test" / "metrics.csv") if r.get("test/loss")]
    # what `finetune --test` measured with best.ckpt (up to the order of float sums)
    assert {key: float(value) for key, value in scores.items()} == pytest.approx(
        {key: float(value) for key, value in expected.items()}, rel=1e-5
    )
