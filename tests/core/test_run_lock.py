"""One run per directory (`genoformer.core.run_lock`): a second holder is refused naming the first;
the lock of a killed process is taken over; a released lock leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from genoformer.core.run_lock import LOCK_NAME, RunDirectoryInUse, RunLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunDirectoryInUse) as refused:
            RunLock(tmp_path / "run").acquire()
    message = str(refused.value)
    assert f"process {os.getpid()} on {socket.gethostname()}, started 20" in message
    assert "--trainer.default_root_dir NEW_DIR" in message and "\n" not in message
    assert not (tmp_path / "run" / LOCK_NAME).exists(), "a released lock leaves no file"
    with RunLock(tmp_path / "run") as again:
        assert again.taken_over is None


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom genoformer.core.run_lock import RunLock\n"
            f"RunLock({str(tmp_path)!r}).acquire()\nprint('locked', flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryInUse, match=f"process {holder.pid} on"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    lock = RunLock(tmp_path)
    with caplog.at_level("WARNING"):
        lock.acquire()
    try:
        assert lock.taken_over is not None and lock.taken_over.pid == holder.pid
        assert f"took over the lock of process {holder.pid}" in caplog.text
    finally:
        lock.release()
