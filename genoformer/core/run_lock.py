"""One run per directory: the lock `genoformer fit` (and `finetune`) holds on its run directory.

A second process that trains into the same directory would mix two runs (config.yaml of one,
last.ckpt of the other, metrics.csv interleaving both under the same steps). So `fit` takes an
exclusive lock on ``<run dir>/.genoformer-run.lock`` before it touches the directory and keeps it
until the run ends; a second `fit` on the directory fails at once, naming the holder: its process
id, host, start time and command, which the holder writes into the lock file.

The lock is the kernel's (``flock``): it dies with its process, so the lock of a process that was
killed (SIGKILL, a crashed node) is taken over by the next `fit`, which says whose it was. A lock
file is removed when its run ends. On a file system without locks (some network mounts refuse
``flock``) the run goes on unlocked, with a warning.

Why not the `filelock` package: its Unix lock opens the lock file with truncation in some
versions and removes it in others, so the holder's identity cannot live in the file it locks,
and a file beside it would be read without the lock that makes it true.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

LOCK_NAME = ".genoformer-run.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run directory's lock."""

    pid: int
    host: str
    started: str
    command: str

    def running(self) -> Optional[bool]:
        """Whether the process still runs (None when it runs on another host)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return True

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started}: {self.command}"


class RunDirectoryInUse(FileExistsError):
    """Another process holds the run directory's lock."""


class RunLock:
    """The exclusive lock of one run directory (see the module docstring); a context manager.

    `acquire` raises RunDirectoryInUse naming the holder when another process has the lock;
    `taken_over` is then set when the lock file named a holder that had died without releasing it.
    """

    def __init__(self, run_dir: os.PathLike | str) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.taken_over: Optional[Holder] = None
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirectoryInUse(_in_use_message(self.run_dir, holder)) from None
            except OSError as error:
                os.close(fd)
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                log.warning(
                    "%s: the file system refuses locks (%s); training without the one-run-per-directory lock",
                    self.run_dir,
                    error.strerror,
                )
                return
            # the holder may have released (and removed) the file between our open and our lock
            try:
                current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        self.taken_over = _read_holder(fd)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["genoformer", *sys.argv[1:]])[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        if self.taken_over is not None:
            log.warning("%s: took over the lock of %s, which ended without releasing it", self.run_dir, self.taken_over)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a waiting process then sees a new file (see acquire)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_holder(fd: int) -> Optional[Holder]:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "null")
        return (
            None
            if record is None
            else Holder(int(record["pid"]), str(record["host"]), str(record["started"]), str(record["command"]))
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _in_use_message(run_dir: Path, holder: Optional[Holder]) -> str:
    if holder is None:
        who = "another process (it has not yet written who it is)"
    elif holder.running() is False:
        who = (
            f"{holder}; that process has ended, but processes it started (data loader workers) still hold the lock: "
            "wait a few seconds, or end them"
        )
    else:
        who = str(holder)
    return (
        f"{run_dir} is in use by another training run, and one directory holds one run: wait for it to end (or "
        f"stop it), or train into another directory (--trainer.default_root_dir NEW_DIR); it is held by {who}"
    )
