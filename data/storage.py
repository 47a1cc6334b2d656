"""What genome and time-series stores share: the metadata schema, the one atomic writer, the chunk cache.

A store is a zarr v3 group. Its attributes hold one key, ``"genoformer"``, a dict with
``format`` ("genoformer.genome" or "genoformer.timeseries"), ``format_version``,
``tool_version``, ``created`` (UTC ISO 8601), ``command``, ``arguments`` and ``complete``.
``complete`` is written True only after every array was re-read and checked, and the store is
built under a temporary name in the same directory and renamed into place afterwards; so an
interrupted build never leaves anything at the final path, and :func:`open_store_group`
refuses a group whose ``complete`` is not True.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

import numpy as np
import zarr

from genoformer.hints import hint, option

log = logging.getLogger(__name__)

METADATA_KEY = "genoformer"
_TMP_MARK = ".tmp-"


class CorruptStoreError(ValueError):
    """Bytes of a store that do not match the checksum written with them (or cannot be decoded):
    the store was damaged after it was built. Its message is one line: the store, the command
    that rebuilds it, and what was found."""


def rebuild_command(command: str, inputs_flag: str, inputs: Sequence[str], out: Path, options: dict[str, Any]) -> str:
    """The command line that builds the store ``out`` again, replacing it: ``genoformer COMMAND
    INPUTS_FLAG INPUT... --out OUT`` with ``options`` (a True flag bare, a list as '[a,b]'; None and
    False left out) and ``--overwrite``."""
    words = ["genoformer", command, inputs_flag, *inputs, "--out", str(out)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        words.append(f"--{name}")
        if isinstance(value, (list, tuple)):
            words.append("[" + ",".join(map(str, value)) + "]")
        elif value is not True:
            words.append(str(value))
    return shlex.join([*words, "--overwrite"])


def damaged_store(path: Path, rebuild: str, found: str) -> CorruptStoreError:
    """Our one-line message for a store whose data no longer match their checksums."""
    return CorruptStoreError(
        f"{path} is damaged (its data changed after it was built: a disk or copy error), so "
        f"it cannot be read; rebuild it: {rebuild} (found: {found})"
    )


def tool_version() -> str:
    try:
        return version("genoformer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def base_metadata(fmt: str, format_version: int, arguments: dict, command: str | None) -> dict:
    """The store-level metadata every store carries (``complete`` starts False)."""
    return {
        "format": fmt,
        "format_version": format_version,
        "tool_version": tool_version(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join(sys.argv),
        "arguments": arguments,
        "complete": False,
    }


def read_metadata(path: Path) -> dict | None:
    """The store metadata at ``path``, or None when there is no zarr group with it."""
    try:
        group = zarr.open_group(path, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, ValueError):
        return None
    meta = group.attrs.get(METADATA_KEY)
    return dict(meta) if isinstance(meta, dict) else None


def sha256_files(paths: Sequence[Path]) -> list[str]:
    """The SHA-256 hex digest of each file, read in 4 MiB blocks."""
    digests = []
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        digests.append(h.hexdigest())
    return digests


def reusable_store(out: Path, fmt: str, arguments: dict, paths_key: str) -> dict | None:
    """The metadata of a complete store of format ``fmt`` at ``out`` built with the same
    ``arguments`` except the input paths (``arguments[paths_key]``; a moved file is the same
    input), else None. The caller compares the inputs' checksums with the ones it recorded."""
    if not out.exists():
        return None
    existing = read_metadata(out)
    if existing is None or existing.get("complete") is not True or existing.get("format") != fmt:
        return None
    options = {k: v for k, v in arguments.items() if k != paths_key}
    stored = {k: v for k, v in existing.get("arguments", {}).items() if k != paths_key}
    return existing if stored == options else None


_WARNED: set[Path] = set()


def warn_unchecked_store(path: Path, rebuild: str) -> None:
    """Say once per process that the store at ``path`` (an older format) has no chunk
    checksums, and how to rebuild it with them."""
    if path.resolve() not in _WARNED:
        _WARNED.add(path.resolve())
        log.warning(
            "%s was built by an older genoformer without chunk checksums: damage to it would go unnoticed. "
            "Rebuild it to have every read checked: %s",
            path,
            rebuild,
        )


def open_store_group(path: str | Path, fmt: str, supported_versions: tuple[int, ...]) -> tuple[zarr.Group, dict]:
    """Open a complete store of format ``fmt`` read-only; clear errors otherwise."""
    path = Path(path)
    kind = fmt.split(".")[-1]
    command = "prepare" if kind == "genome" else f"prepare_{kind}"
    if not path.exists():
        raise FileNotFoundError(
            f"store not found: {path}; create it with "
            + hint(f"prepare_{kind}_store", f"`genoformer {command} --out {shlex.quote(str(path))}`")
        )
    meta = read_metadata(path)
    if meta is None:
        raise ValueError(f"{path} is not a genoformer store (no zarr group with '{METADATA_KEY}' metadata)")
    if meta.get("format") != fmt:
        raise ValueError(f"{path} holds format {meta.get('format')!r}, expected {fmt!r}")
    if meta.get("complete") is not True:
        raise ValueError(
            f"{path} is incomplete (its build was interrupted or failed verification); rebuild it: "
            + hint(
                f"prepare_{kind}_store(INPUTS, {str(path)!r}, overwrite=True)",
                f"genoformer {command} --out {shlex.quote(str(path))} --overwrite and its input files",
            )
        )
    if meta.get("format_version") not in supported_versions:
        raise ValueError(
            f"{path} has format_version {meta.get('format_version')}, this genoformer reads "
            f"{supported_versions}; re-create the store with this version"
        )
    return zarr.open_group(path, mode="r"), meta


def _temporary_name(out: Path, kind: str) -> Path:
    """A unique build path beside ``out``: ``.NAME.tmp-PID@HOST-KIND-RANDOM.SUFFIX``."""
    unique = f"{os.getpid()}@{socket.gethostname()}-{kind}-{uuid.uuid4().hex[:8]}"
    return out.parent / f".{out.name}{_TMP_MARK}{unique}{out.suffix}"


def _remove_stale_temporaries(out: Path) -> None:
    """Delete temporary builds of ``out`` left by processes of this host that no longer run.

    Builds of other hosts (a shared file system under multi-node training) are left alone: their
    process ids mean nothing here.
    """
    for tmp in out.parent.glob(f".{out.name}{_TMP_MARK}*"):
        pid_text, _, rest = tmp.name[len(f".{out.name}{_TMP_MARK}") :].partition("@")
        if not pid_text.isdigit() or not rest.startswith(f"{socket.gethostname()}-"):
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            log.info("removing stale temporary %s", tmp)
            _remove(tmp)
        except PermissionError:  # a live process of another user
            continue


def _remove(path: Path) -> None:
    """Delete a file or a directory tree; a missing path is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def refuse_existing(out: Path, overwrite: bool) -> None:
    """Raise FileExistsError when ``out`` exists and ``overwrite`` is False (checked again by
    :func:`atomic_build`; call it first to refuse before any long computation)."""
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass {option('overwrite')} to replace it")


class DiskFullError(OSError):
    """A write that met a full disk (or quota): says which file, that the old one was kept, and
    what to do; `errno` stays ENOSPC (or EDQUOT)."""

    def __str__(self) -> str:
        return str(self.strerror)


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(out: Path, error: OSError) -> DiskFullError:
    try:
        free = f"{shutil.disk_usage(out.parent).free / 1e6:,.1f} MB free there now"
    except OSError:
        free = "free space unknown"
    kept = f"{out} was left as it was" if out.exists() else f"nothing was written at {out}"
    return DiskFullError(
        error.errno,
        f"no space left on the device while writing {out} ({free}); {kept}. Free some "
        f"space or write elsewhere, then run the command again "
        f"({os.strerror(error.errno)})",
    )


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush `path` (a file, or a directory's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError as error:
        if not directory or error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise  # some file systems cannot sync a directory; the rename is then as durable as they make it
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush a file, or every file and folder of a directory tree, to the disk."""
    if not path.is_dir():
        _fsync(path)
        return
    for folder, _, files in os.walk(path):
        for name in files:
            _fsync(Path(folder, name))
        _fsync(Path(folder), directory=True)


@contextlib.contextmanager
def atomic_build(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary path beside ``out`` to build into (a store directory or a single file);
    on success flush it to the disk and rename it to ``out``. The one atomic writer: every file
    genoformer writes goes through it (or through :func:`atomic_open` on it).

    The temporary lies in ``out``'s own directory, so the rename never crosses file systems (a
    move across them copies into ``out``, and a full disk then truncates it). On any exception
    the temporary is deleted and ``out`` is left as it was; a full disk raises
    :class:`DiskFullError` naming ``out``. A file replaces an existing ``out`` in one rename,
    so a reader sees the old file or the new one, never neither; a directory (a store) is
    renamed aside first, then replaced. With ``overwrite`` an existing ``out`` is replaced only
    after the new one is complete and on the disk. The temporary path keeps ``out``'s suffix,
    so writers that go by the suffix (``numpy.savez``) write it as named.
    """
    out = Path(out)
    refuse_existing(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out)
    tmp = _temporary_name(out, "new")
    try:
        try:
            yield tmp
            _fsync_tree(tmp)
        except OSError as error:
            if error.errno in _FULL and not isinstance(error, DiskFullError):
                raise _disk_full(out, error) from error
            raise
        if out.exists() and (tmp.is_dir() or out.is_dir()):  # a directory cannot be renamed over
            old = _temporary_name(out, "old")
            os.replace(out, old)
            os.replace(tmp, out)
            _fsync(out.parent, directory=True)
            _remove(old)
        else:
            os.replace(tmp, out)
            _fsync(out.parent, directory=True)
    finally:
        if tmp.exists():
            _remove(tmp)


@contextlib.contextmanager
def atomic_open(out: Path, mode: str = "wb", *, overwrite: bool = True, **kwargs: Any) -> Iterator[IO]:
    """`open(out, mode)` through :func:`atomic_build`: the file object writes a temporary
    beside ``out``, which replaces ``out`` (flushed to the disk) only when the block ends without
    an exception. ``mode`` is a writing mode ("w", "wb", "wt")."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a new file; mode {mode!r} does not (use 'w', 'wb' or 'wt')")
    with atomic_build(Path(out), overwrite) as tmp, open(tmp, mode, **kwargs) as file:
        yield file


def write_text(path: Path, text: str, *, overwrite: bool) -> Path:
    """Write a text file through `atomic_build`: readers never see a partial file, and an
    existing file is replaced only with `overwrite` (callers refuse it first, with
    `refuse_existing`, before any long computation)."""
    path = Path(path)
    with atomic_build(path, overwrite) as tmp:
        tmp.write_text(text)
    return path


def write_json(path: Path, payload: Any, *, overwrite: bool) -> Path:
    """`write_text` of `payload` as indented JSON."""
    return write_text(path, json.dumps(payload, indent=2) + "\n", overwrite=overwrite)


class ChunkCache:
    """Per-process LRU cache of decoded chunks, bounded in bytes.

    ``get(key, load)`` returns the cached array for ``key`` or calls ``load()`` and keeps the
    result; ``lookup(key)`` / ``put(key, chunk)`` are the same in two steps, for hot paths that
    should not build a closure per call. Chunks beyond ``max_bytes`` are evicted least recently
    used first. Cached arrays are marked read-only so that callers cannot corrupt them.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[object, np.ndarray] = OrderedDict()

    def lookup(self, key: object) -> np.ndarray | None:
        """The cached chunk for ``key`` (now the most recently used), or None (a miss)."""
        chunk = self._items.get(key)
        if chunk is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return chunk

    def put(self, key: object, chunk: np.ndarray) -> np.ndarray:
        """Keep ``chunk`` (marked read-only) under ``key``, a key not in the cache, evicting as
        needed; a chunk larger than the whole cache is not kept. Returns ``chunk``."""
        chunk.flags.writeable = False
        if chunk.nbytes <= self.max_bytes:
            items = self._items
            items[key] = chunk
            self.nbytes += chunk.nbytes
            while self.nbytes > self.max_bytes:
                _, evicted = items.popitem(last=False)
                self.nbytes -= evicted.nbytes
        return chunk

    def get(self, key: object, load: Callable[[], np.ndarray]) -> np.ndarray:
        chunk = self.lookup(key)
        return self.put(key, load()) if chunk is None else chunk

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0
