"""The fault-injection suite: each fault an operator met is injected here, and each must end in
the previous good state plus one clear line, never in a lost file or a silently wrong number.

1. A full disk during a checkpoint save, with $TMPDIR on another file system than the run
   directory: the previous last.ckpt survives whole.
2. Bytes flipped in a checkpoint's weights: every reader refuses it, naming the file.
3. Bytes flipped in a genome or time-series store's chunks: every read refuses it, naming the
   store and the command that rebuilds it.
4. Two `genoformer fit` processes on one run directory: the second fails at once naming the
   first; a lock left by a killed process is taken over (tests/core/test_fault_injection.py, with
   real processes).
5. A BGZF file cut at a block boundary (its end-of-file block missing): an error, not a shorter genome.
6. Two records of one name: an error in every command that reads sequences.
7. SIGTERM at the end of a training step: exit status 143 after the save, and after the resume
   metrics.csv holds a row for every step, once.
8. Nothing scorable in a VCF (a wrong reference build): exit status 1, naming the contigs of both;
   a full disk while writing a command's output: one line naming the file and what to do.

The disk is filled by `small_filesystem`, which makes one folder behave as a file system of its
own (writes fail with ENOSPC past its free bytes, renames out of it fail with EXDEV as across two
real file systems), so that no test needs root to mount one.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import gzip
import io
import os
import shutil
import signal
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from data_helpers import EXAMPLES, random_bases, write_fasta
from genoformer.data import prepare_genome_store
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.genome.store import GenomeStore
from model_helpers import WINDOW, split_runtime, tiny_config, token_loader

from genoformer.cli import main
from genoformer.core.callbacks import ResumeCheckpoint
from genoformer.core.checkpoints import read_checkpoint
from genoformer.core.loggers import AppendingCSVLogger
from genoformer.genome.lm import GenoformerLM, Objective

REPO_ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------- a small file system
class _FullDisk:
    """A writable file below a `small_filesystem` root: writes past the free bytes write what
    fits, then fail with ENOSPC, as a full disk does."""

    def __init__(self, file: io.IOBase, space: dict[str, int], name: str) -> None:
        self._file, self._space, self.name = file, space, name

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self._space["free"]:
            fits = self._space["free"]
            self._file.write(memoryview(data).cast("B")[:fits])
            self._file.flush()
            self._space["free"] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        self._space["free"] -= size
        return self._file.write(data)

    def __getattr__(self, name: str):
        return getattr(self._file, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def __iter__(self):
        return iter(self._file)


@contextlib.contextmanager
def small_filesystem(root: Path, free: int, elsewhere: Path) -> Iterator[dict[str, int]]:
    """Make `root` behave as a file system of its own with `free` bytes left, and `elsewhere`
    the temporary folder ($TMPDIR) on another one: files opened for writing below `root` fail
    with ENOSPC once `free` bytes were written into them; renaming between `root` and the rest
    fails with EXDEV (so shutil.move copies, as between two real file systems)."""
    root = root.resolve()
    space = {"free": free}
    real_open, real_rename, real_replace = builtins.open, os.rename, os.replace

    def below(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).is_relative_to(root)

    def opened(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        writing = any(flag in mode for flag in "wax+")
        return _FullDisk(handle, space, str(file)) if writing and below(file) else handle

    def crossing(rename):
        def move(src, dst, *args, **kwargs):
            if below(src) != below(dst):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))
            return rename(src, dst, *args, **kwargs)

        return move

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(builtins, "open", opened)
        patch.setattr(io, "open", opened)
        patch.setattr(os, "rename", crossing(real_rename))
        patch.setattr(os, "replace", crossing(real_replace))
        patch.setattr(shutil, "_USE_CP_SENDFILE", False)  # copies go through write(), as they would hit the disk
        patch.setenv("TMPDIR", str(elsewhere))
        patch.setattr(tempfile, "tempdir", str(elsewhere))
        yield space


def one_line_error(capsys, args: list[str]) -> str:
    """Run `genoformer ARGS`, expect exit status 1 and a short error (no traceback); its text."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return err


# ----------------------------------------------------------------------- shared inputs
@pytest.fixture(scope="module")
def genome(tmp_path_factory) -> Path:
    rng = np.random.default_rng(50)
    root = tmp_path_factory.mktemp("faults_genome")
    return write_fasta(root / "genome.fa", [("chr1", random_bases(rng, 3000)), ("chr2", random_bases(rng, 1500))])


@pytest.fixture(scope="module")
def quickstart_store(tmp_path_factory) -> Path:
    """A genome store of the lambda phage (48.5 kb), for short `genoformer fit` runs."""
    root = tmp_path_factory.mktemp("faults_store")
    return prepare_genome_store([EXAMPLES / "lambda_phage.fasta.gz"], root / "lambda.zarr", progress=False)


def quickstart(run_dir: Path, store: Path, *extra: str) -> list[str]:
    """`genoformer fit` of the quick start, shrunk to run in seconds."""
    return [
        "fit",
        "--config",
        str(REPO_ROOT / "configs" / "quickstart.yaml"),
        "--trainer.default_root_dir",
        str(run_dir),
        "--data.init_args.store",
        str(store),
        "--model.transformer.max_seq_len",
        "256",
        "--model.transformer.d_model",
        "32",
        "--data.init_args.samples_per_epoch",
        "6",
        "--data.init_args.num_workers",
        "0",
        "--trainer.val_check_interval",
        "1000",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        *extra,
    ]


# ----------------------------------------------------------------------- 1. full disk
def test_full_disk_during_a_checkpoint_save_keeps_the_previous_last_ckpt(tmp_path, quickstart_store, capsys):
    """The cluster layout: runs on one file system, $TMPDIR on another. A save that meets a full
    disk must leave the last good checkpoint as it was (on main: truncated in place by the copy
    of a cross-file-system move)."""
    run_dir = tmp_path / "run"
    main(quickstart(run_dir, quickstart_store, "--trainer.max_steps", "2"))
    last = run_dir / "checkpoints" / "last.ckpt"
    good = last.read_bytes()
    elsewhere = tmp_path / "local_tmp"
    elsewhere.mkdir()
    with small_filesystem(run_dir / "checkpoints", free=len(good) // 2, elsewhere=elsewhere):
        with pytest.raises((SystemExit, OSError, RuntimeError)) as failure:
            main(quickstart(run_dir, quickstart_store, "--trainer.max_steps", "4", "--ckpt_path", "last"))
    assert last.read_bytes() == good, "the previous last.ckpt was damaged by the failed save"
    assert read_checkpoint(last)["global_step"] == 2
    assert isinstance(failure.value, SystemExit) and failure.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "last.ckpt" in err and "no space left" in err.lower()
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name != "last.ckpt"], "a temporary was left"


# ----------------------------------------------------------------------- 2. flipped checkpoint
def _largest_tensor_bytes(path: Path) -> tuple[int, int]:
    """(start, end) byte offsets of the largest tensor's data in a checkpoint file."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as file:
        file.seek(info.header_offset)
        name_length, extra_length = struct.unpack("<HH", file.read(30)[26:30])
    start = info.header_offset + 30 + name_length + extra_length
    return start, start + info.file_size


def flip_bytes(path: Path, start: int, end: int, count: int, seed: int = 0) -> None:
    """XOR `count` distinct bytes in [start, end) of `path` with random non-zero values."""
    rng = np.random.default_rng(seed)
    data = bytearray(path.read_bytes())
    for offset in rng.choice(np.arange(start, end), size=count, replace=False):
        data[offset] ^= int(rng.integers(1, 256))
    path.write_bytes(bytes(data))


@pytest.fixture()
def flipped_checkpoint(causal_checkpoint, tmp_path) -> Path:
    bad = tmp_path / "flipped.ckpt"
    shutil.copyfile(causal_checkpoint, bad)
    flip_bytes(bad, *_largest_tensor_bytes(bad), count=64)
    return bad


def test_a_checkpoint_with_flipped_weights_is_refused_by_every_reader(flipped_checkpoint, genome, tmp_path, capsys):
    with pytest.raises(ValueError, match="flipped.ckpt.*(corrupt|damaged)"):
        read_checkpoint(flipped_checkpoint)
    with pytest.raises(ValueError, match="flipped.ckpt.*(corrupt|damaged)"):
        GenoformerLM.load_from_checkpoint(flipped_checkpoint, map_location="cpu")
    err = one_line_error(
        capsys, ["evaluate", "--checkpoint", str(flipped_checkpoint), "--inputs", str(genome), "--device", "cpu"]
    )
    assert "flipped.ckpt" in err and "genoformer verify" in err
    err = one_line_error(
        capsys,
        [
            "embed",
            "--checkpoint",
            str(flipped_checkpoint),
            "--inputs",
            str(genome),
            "--out",
            str(tmp_path / "e.npz"),
            "--device",
            "cpu",
        ],
    )
    assert "flipped.ckpt" in err and not (tmp_path / "e.npz").exists()


def test_a_run_whose_newest_checkpoint_is_flipped_is_refused_by_name(causal_checkpoint, genome, capsys, tmp_path):
    """A run directory names its best checkpoint through the record in its newest one: that record
    is read only once the file is verified, so a damaged last.ckpt is reported, not read past."""
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copyfile(causal_checkpoint, folder / "epoch=0-step=2.ckpt")
    state = torch.load(causal_checkpoint, map_location="cpu", weights_only=True)
    state["callbacks"] = {
        "ModelCheckpoint{'monitor': 'val/loss'}": {
            "monitor": "val/loss",
            "best_model_path": "epoch=0-step=2.ckpt",
            "best_model_score": torch.tensor(1.5),
        }
    }
    torch.save(state, folder / "last.ckpt")
    flip_bytes(folder / "last.ckpt", *_largest_tensor_bytes(folder / "last.ckpt"), count=8)
    err = one_line_error(
        capsys, ["evaluate", "--checkpoint", str(tmp_path / "run"), "--inputs", str(genome), "--device", "cpu"]
    )
    assert "last.ckpt is damaged" in err and "genoformer verify" in err


def test_lightning_resume_verifies_the_checkpoint(flipped_checkpoint):
    """`fit --ckpt_path` restores through the trainer's CheckpointIO: it verifies too."""
    from genoformer.core.checkpoints import AtomicCheckpointIO

    with pytest.raises(ValueError, match="flipped.ckpt.*(corrupt|damaged)"):
        AtomicCheckpointIO().load_checkpoint(flipped_checkpoint)


# ----------------------------------------------------------------------- 3. flipped stores
@pytest.fixture(scope="module")
def fault_store(tmp_path_factory) -> Path:
    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("fault_store")
    fasta = write_fasta(root / "g.fa", [("chrA", random_bases(rng, 20_000)), ("chrB", random_bases(rng, 7_000))])
    return prepare_genome_store([fasta], root / "g.zarr", chunk_size=1024, shard_chunks=8, progress=False)


def _chunk_spans(shard: Path, chunks_per_shard: int) -> list[tuple[int, int]]:
    data = shard.read_bytes()
    index = np.frombuffer(data[len(data) - 4 - 16 * chunks_per_shard : len(data) - 4], dtype="<u8").reshape(-1, 2)
    return [(int(o), int(o + n)) for o, n in index.tolist() if o != 2**64 - 1]


def test_every_flipped_byte_in_a_genome_store_is_detected(fault_store, tmp_path):
    """40 single-byte flips anywhere in the chunks of a shard: each read of the contig fails
    naming the store and the command that rebuilds it (on main most decode to other bases)."""
    copy = tmp_path / "copy.zarr"
    shutil.copytree(fault_store, copy)
    shard = copy / "contigs" / "0" / "c" / "1"
    spans = _chunk_spans(shard, 8)
    original = shard.read_bytes()
    expected = GenomeStore(fault_store, cache_bytes=0).read("chrA", 0, 20_000)
    rng = np.random.default_rng(1)
    silent = 0
    for trial in range(40):
        lo, hi = spans[trial % len(spans)]
        offset = int(rng.integers(lo, hi))
        data = bytearray(original)
        data[offset] ^= int(rng.integers(1, 256))
        shard.write_bytes(bytes(data))
        try:
            codes = GenomeStore(copy, cache_bytes=0).read("chrA", 0, 20_000)
        except ValueError as error:
            message = str(error)
            assert str(copy) in message and "genoformer prepare" in message and "--overwrite" in message, message
            assert "\n" not in message
        else:
            silent += not np.array_equal(codes, expected)
            raise AssertionError(f"flip at byte {offset} was not detected ({silent} silently wrong so far)")
    shard.write_bytes(original)


def test_a_flipped_genome_store_is_one_line_from_evaluate_and_verify(fault_store, causal_checkpoint, tmp_path, capsys):
    copy = tmp_path / "copy.zarr"
    shutil.copytree(fault_store, copy)
    shard = copy / "contigs" / "1" / "c" / "0"
    flip_bytes(shard, *_chunk_spans(shard, 8)[2], count=1)
    err = one_line_error(
        capsys, ["evaluate", "--checkpoint", str(causal_checkpoint), "--inputs", str(copy), "--device", "cpu"]
    )
    assert str(copy) in err and "genoformer prepare" in err and "--overwrite" in err
    err = one_line_error(capsys, ["verify", str(copy)])
    assert "chrB" in err and str(copy) in err
    main(["verify", str(fault_store)])
    assert "ok" in capsys.readouterr().out


def test_a_flipped_timeseries_store_is_refused(tmp_path):
    from genoformer.data.timeseries.store import TimeSeriesStore, prepare_timeseries_store

    values = np.random.default_rng(0).normal(size=(5000, 2)).astype(np.float32)
    np.save(tmp_path / "s.npy", values)
    store = prepare_timeseries_store(
        [tmp_path / "s.npy"], tmp_path / "s.zarr", sampling_rate=1.0, chunk_size=1000, progress=False
    )
    chunk = next(p for p in sorted((store / "series" / "0").rglob("*")) if p.is_file() and p.name != "zarr.json")
    flip_bytes(chunk, 40, chunk.stat().st_size - 8, count=1)
    with pytest.raises(ValueError, match="(corrupt|damaged).*prepare_timeseries.*--overwrite"):
        TimeSeriesStore(store).read(0, 0, 5000)


# ----------------------------------------------------------------------- 5. cut BGZF
def _bgzf_blocks(data: bytes) -> list[int]:
    """Offsets where each BGZF block starts (BSIZE from the BC extra field)."""
    starts, offset = [], 0
    while offset < len(data):
        starts.append(offset)
        offset += struct.unpack("<H", data[offset + 16 : offset + 18])[0] + 1
    return starts


def test_a_bgzf_file_cut_at_a_block_boundary_is_an_error(tmp_path):
    from Bio import bgzf

    rng = np.random.default_rng(5)
    plain = write_fasta(tmp_path / "g.fa", [("chr1", random_bases(rng, 200_000))])
    packed = tmp_path / "g.fa.gz"
    with bgzf.BgzfWriter(str(packed), "wb") as writer:
        writer.write(plain.read_bytes())
    data = packed.read_bytes()
    blocks = _bgzf_blocks(data)
    assert len(blocks) >= 4  # three blocks of data, then the empty end-of-file block
    (tmp_path / "cut.fa.gz").write_bytes(data[: blocks[2]])
    with pytest.raises(ValueError, match="cut.fa.gz.*(truncated|end-of-file)"):
        list(read_sequences(tmp_path / "cut.fa.gz"))
    with pytest.raises(ValueError, match="cut.fa.gz.*(truncated|end-of-file)"):
        prepare_genome_store([tmp_path / "cut.fa.gz"], tmp_path / "cut.zarr", progress=False)
    assert not (tmp_path / "cut.zarr").exists()
    assert sum(r.codes.size for r in read_sequences(packed)) == 200_000  # the whole file reads


def test_a_gzip_stream_that_stops_short_is_an_error(tmp_path):
    rng = np.random.default_rng(6)
    data = gzip.compress(f">chr1\n{random_bases(rng, 50_000)}\n".encode())
    (tmp_path / "short.fa.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="short.fa.gz.*truncated"):
        list(read_sequences(tmp_path / "short.fa.gz"))


# ----------------------------------------------------------------------- 6. duplicate names
def test_duplicate_record_names_are_an_error_in_every_reading_command(causal_checkpoint, tmp_path, capsys):
    rng = np.random.default_rng(8)
    fasta = write_fasta(tmp_path / "dup.fa", [("chr1", random_bases(rng, 300)), ("chr1", random_bases(rng, 300))])
    with pytest.raises(ValueError, match="dup.fa.*chr1.*(twice|repeat|duplicate)"):
        list(read_sequences(fasta))
    variants = tmp_path / "v.tsv"
    variants.write_text("chr1\t10\tA\tC\n")
    for args in (
        ["evaluate", "--inputs", str(fasta)],
        ["score", "--inputs", str(fasta), "--out", str(tmp_path / "s.bedgraph")],
        ["embed", "--inputs", str(fasta), "--out", str(tmp_path / "e.npz")],
        [
            "variant_effect",
            "--reference",
            str(fasta),
            "--variants",
            str(variants),
            "--out",
            str(tmp_path / "v_out.tsv"),
        ],
    ):
        err = one_line_error(capsys, [args[0], "--checkpoint", str(causal_checkpoint), *args[1:], "--device", "cpu"])
        assert "chr1" in err and "dup.fa" in err, (args[0], err)


# ----------------------------------------------------------------------- 7. SIGTERM
class _SignalAt(L.Callback):
    """Sends SIGTERM to this process at step `step`: at the start of the step, or at its end after
    ResumeCheckpoint has looked for a signal (the callbacks run in list order)."""

    def __init__(self, step: int, where: str) -> None:
        self.step, self.where = step, where

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.where == "start" and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.where == "end" and trainer.global_step == self.step + 1:
            os.kill(os.getpid(), signal.SIGTERM)


def _fit(root: Path, max_steps: int, *callbacks: L.Callback, ckpt_path: str | None = None) -> None:
    L.seed_everything(0, verbose=False)
    architecture, runtime = split_runtime({})
    module = GenoformerLM(
        tiny_config(**architecture), objective=Objective.CAUSAL_LM, warmup_steps=2, learning_rate=1e-3, runtime=runtime
    )
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        default_root_dir=root,
        log_every_n_steps=1,
        logger=AppendingCSVLogger(save_dir=root, name="", version=""),
        callbacks=[
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=3),
            ResumeCheckpoint(),
            *callbacks,
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, token_loader(40, WINDOW, 2, seed=1), ckpt_path=ckpt_path)


def _logged_steps(root: Path) -> list[int]:
    import csv

    with open(root / "metrics.csv", newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss")]


@pytest.mark.parametrize("where", ["start", "end"])
def test_sigterm_exits_143_after_the_save_and_no_metrics_row_is_lost(tmp_path, where):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        _fit(run, 8, _SignalAt(4, where))
    assert stopped.value.code == 128 + signal.SIGTERM
    saved = read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]
    assert saved == 5, "the checkpoint holds the step the signal interrupted, whole"
    _fit(run, 8, ckpt_path=str(run / "checkpoints" / "last.ckpt"))
    assert _logged_steps(run) == list(range(8)), "an uninterrupted run logs every step once"


# ----------------------------------------------------------------------- 8. nothing scorable; full disk
def test_variant_effect_with_no_scorable_variant_fails_naming_both_sets_of_contigs(
    causal_checkpoint, genome, tmp_path, capsys
):
    vcf = tmp_path / "wrong_build.vcf"
    vcf.write_text(
        "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
        + "".join(f"NC_000913.3\t{10 * i}\t.\tA\tC\t.\t.\t.\n" for i in range(1, 30))
    )
    err = one_line_error(
        capsys,
        [
            "variant_effect",
            "--checkpoint",
            str(causal_checkpoint),
            "--reference",
            str(genome),
            "--variants",
            str(vcf),
            "--out",
            str(tmp_path / "out.vcf"),
            "--device",
            "cpu",
        ],
    )
    assert "0 of 29" in err and "NC_000913.3" in err and "chr1" in err and "chr2" in err


def test_variant_effect_with_some_variants_on_unknown_contigs_names_both_sets_once(
    causal_checkpoint, genome, tmp_path, capsys
):
    from genoformer.data.genome.alphabet import decode

    ref = decode(next(r for r in read_sequences(genome) if r.name == "chr1").codes[99:100])
    vcf = tmp_path / "mixed.vcf"
    vcf.write_text(
        "##fileformat=VCFv4.2\n#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
        f"chr1\t100\t.\t{ref}\t{'C' if ref != 'C' else 'G'}\t.\t.\t.\n"
        + "".join(f"chrUn_{i}\t10\t.\tA\tC\t.\t.\t.\n" for i in range(3))
    )
    capsys.readouterr()
    main(
        [
            "variant_effect",
            "--checkpoint",
            str(causal_checkpoint),
            "--reference",
            str(genome),
            "--variants",
            str(vcf),
            "--out",
            str(tmp_path / "out.tsv"),
            "--device",
            "cpu",
            "--window",
            "256",
        ]
    )
    said = capsys.readouterr().out
    assert (
        "3 of 4 variants lie on contigs that are not in the reference: chrUn_0, chrUn_1, chrUn_2; the reference "
        "has chr1, chr2"
    ) in said
    assert (tmp_path / "out.tsv").is_file()


def test_a_full_disk_while_writing_an_output_is_one_line(causal_checkpoint, genome, tmp_path, capsys):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "e.npz").write_bytes(b"the previous result")
    with small_filesystem(outputs, free=200, elsewhere=tmp_path):
        err = one_line_error(
            capsys,
            [
                "embed",
                "--checkpoint",
                str(causal_checkpoint),
                "--inputs",
                str(genome),
                "--out",
                str(outputs / "e.npz"),
                "--device",
                "cpu",
                "--overwrite",
            ],
        )
    assert "e.npz" in err and "no space left" in err.lower()
    assert (outputs / "e.npz").read_bytes() == b"the previous result"
    assert [p.name for p in outputs.iterdir()] == ["e.npz"]
