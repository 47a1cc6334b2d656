"""The compile tests' child process (gluon_harness.compile_report): past its time limit the child is
killed with every process it started, as a compile child's pool of workers is."""

from __future__ import annotations

import os
import textwrap
import time

import pytest
from gluon_harness import compile_report


def test_a_child_past_its_time_limit_is_killed_with_its_workers(tmp_path):
    worker_pid = tmp_path / "worker.pid"
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(worker_pid)!r}, "w").write(str(worker.pid))
            time.sleep(60)
            """
        )
    )
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s: killed with its workers"):
        compile_report(str(script), timeout=3)
    pid = int(worker_pid.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the child's worker {pid} outlived the child")
