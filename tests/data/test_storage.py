"""The one atomic writer (`genoformer.data.storage.atomic_build` and `atomic_open`): the new file is
on the disk before it replaces the old one, which a failure never touches; a full disk is one
message naming the file."""

from __future__ import annotations

import errno
import os
import types
from pathlib import Path

import pytest
from genoformer.data import storage
from genoformer.data.storage import DiskFullError, atomic_build, atomic_open, rebuild_command, write_text


def test_the_new_file_is_synced_before_it_replaces_the_old_in_one_rename(tmp_path, monkeypatch):
    out = tmp_path / "result.json"
    out.write_text("old")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", f"{Path(src).name}->{Path(dst).name}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic_open(out, "w") as file:
        file.write("new")
        temporary = Path(file.name)
    assert out.read_text() == "new"
    assert temporary.parent == out.parent, "the temporary must lie beside the file (one file system)"
    assert events == [
        ("fsync", str(temporary)),
        ("replace", f"{temporary.name}->{out.name}"),
        ("fsync", str(tmp_path)),
    ], events


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "tracks.bedgraph"
    out.write_text("old")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_open(out, "w") as file:
            file.write("half of it")
            raise RuntimeError("midway")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["tracks.bedgraph"]


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "embeddings.npz"
    out.write_bytes(b"old")
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=12_345_678))
    with pytest.raises(DiskFullError) as failure:
        with atomic_build(out, overwrite=True) as tmp:
            tmp.write_bytes(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    message = str(failure.value)
    assert failure.value.errno == errno.ENOSPC and "\n" not in message
    assert f"while writing {out}" in message and "12.3 MB free" in message and "left as it was" in message
    assert out.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    out = write_text(tmp_path / "a.txt", "first", overwrite=False)
    with pytest.raises(FileExistsError, match="overwrite"):
        write_text(out, "second", overwrite=False)
    assert write_text(out, "second", overwrite=True).read_text() == "second"
    with pytest.raises(ValueError, match="mode 'a'"):
        with atomic_open(out, "a"):
            pass


def test_a_directory_replaces_the_old_one_whole(tmp_path):
    out = tmp_path / "store.zarr"
    with atomic_build(out, overwrite=False) as tmp:
        tmp.mkdir()
        (tmp / "chunk").write_text("one")
    with atomic_build(out, overwrite=True) as tmp:
        tmp.mkdir()
        (tmp / "other").write_text("two")
    assert [p.name for p in out.iterdir()] == ["other"] and [p.name for p in tmp_path.iterdir()] == ["store.zarr"]


def test_the_rebuild_command_is_typed_as_the_options_are():
    command = rebuild_command(
        "prepare",
        "--fasta",
        ["/data/a b.fa", "/data/c.fa"],
        Path("g.zarr"),
        {"chunk_size": 4096, "keep_softmask": "false", "columns": ["x", "y"], "dayfirst": True, "delimiter": None},
    )
    assert command == (
        "genoformer prepare --fasta '/data/a b.fa' /data/c.fa --out g.zarr --chunk_size 4096 "
        "--keep_softmask false --columns '[x,y]' --dayfirst --overwrite"
    )
