"""What the Gluon kernels' two test files share (test_gluon.py: the forward, test_gluon_bwd.py: the
backward); no tests of its own.

The compile check: each test file, run as a script, cross-compiles its kernels for sm_90 in worker
processes (``compile_all``, given the file's own ``_compile_one`` and cases) and prints the JSON
report; its module-scoped ``compiled`` fixture runs it so in a child process without
TRITON_INTERPRET (``compile_report``).  That child needs triton alone: nothing here imports torch
at module level.  Also here: ptxas's register and spill report, the type a launcher's tensor
descriptor mangles to, the markers ``needs_gluon`` and ``on_hopper``, and for the GPU tests the
error bound and the printout of the worst errors.

A uniquely named module beside the two files: they import it as ``gluon_harness``, their folder
being on sys.path both as a script (sys.path[0]) and under pytest (prepend import mode, no
__init__.py).

Shape legend: value, naive, truth (any shape, all the same; truth float64).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
MIN_TRITON = (3, 6)  # as gluon_flash.MIN_TRITON (that module needs torch; the child does not)
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one sm_90 block may opt in to (227 KiB)


def _triton_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("triton") is None:
        return None
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2])


needs_gluon = pytest.mark.skipif(
    _triton_version() is None or _triton_version() < MIN_TRITON,
    reason=f"the Gluon kernels need triton >= {'.'.join(map(str, MIN_TRITON))} (found "
    f"{'none' if _triton_version() is None else '.'.join(map(str, _triton_version()))}): pip install -U triton",
)


def _on_hopper() -> bool:
    if importlib.util.find_spec("torch") is None:  # the compile child may run without torch
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


on_hopper = pytest.mark.skipif(
    not _on_hopper(), reason="needs an sm_90 (Hopper) GPU: the Gluon kernels use wgmma and TMA"
)


# --------------------------------------------------------------------------------------------
# The compile check: the child process (triton only) and the parent's fixture
# --------------------------------------------------------------------------------------------


def descriptor_signature(kernels, rows: int, head_dim: int, dtype: str) -> str:
    """The signature type of a kernel's tensor-descriptor argument (what the launcher's
    ``TensorDescriptor`` mangles to; each file's test_launcher_descriptors_match_the_compiled_signature
    checks it), ``kernels`` being gluon_fwd (gluon_bwd's descriptors take its layout too)."""
    return f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}],{kernels.descriptor_layout(rows, head_dim)!r}>"


def ptxas_report(ptx: str, capability: int) -> dict:
    """ptxas -v of the PTX with the ptxas Triton uses: registers, spill bytes, wgmma warnings."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        ptx_file = Path(tmp, "k.ptx")
        ptx_file.write_text(ptx)
        report = subprocess.run(
            [
                get_ptxas(capability).path,
                "-v",
                f"--gpu-name={sm_arch_from_capability(capability)}",
                str(ptx_file),
                "-o",
                str(Path(tmp, "k.cubin")),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {
        "regs": int(re.search(r"Used (\d+) registers", report).group(1)),
        "spill_stores_B": int(spills.group(1)),
        "spill_loads_B": int(spills.group(2)),
        "wgmma_serialized": "wgmma" in report and "serializ" in report,
    }


def compile_all(compile_one: Callable[[tuple], dict], cases: Iterable[tuple]) -> list[dict]:
    """compile_one of every case in worker processes (at most 8): a test file's report, in its
    cases' order.  compile_one must be a module-level function (the workers get it by name)."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return list(pool.map(compile_one, cases))


def compile_report(script: str, timeout: float = 600) -> dict[str, dict]:
    """The report the test file ``script`` prints when run as a script (its compile_all), run in a
    child process without TRITON_INTERPRET, by case id; the calling test fails if the child does.
    The child runs in a session of its own: at `timeout` seconds the whole session is killed, the
    child's pool of compile workers with it (killing the child alone left them compiling)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: pip install triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with subprocess.Popen(
        [sys.executable, script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            pytest.fail(f"the compile child process ran past {timeout:.0f} s: killed with its workers")
    if child.returncode != 0:
        pytest.fail(f"the compile child process failed:\n{stderr[-4000:]}")
    return {r["id"]: r for r in json.loads(stdout.strip().splitlines()[-1])}


# --------------------------------------------------------------------------------------------
# The GPU tests' errors
# --------------------------------------------------------------------------------------------


def error_bound(value, naive, truth, floor: float = 0.0) -> tuple[float, float, float]:
    """(error, same-precision error, bound): the bound is 2 * naive error + one rounding of truth to
    value's dtype (the rounding of a bf16 output's exact answer; 1e-4 for an fp32 value, the
    forward's lse) + floor (the backward's FP32_FLOOR)."""
    import torch

    err = (value.double() - truth).abs().max().item()
    naive_err = (naive.double() - truth).abs().max().item()
    rounding = (truth.to(value.dtype).double() - truth).abs().max().item() if value.dtype != torch.float32 else 1e-4
    return err, naive_err, 2 * naive_err + rounding + floor


def write_errors(request, title: str, errors: list[dict], case_width: int) -> None:
    """The worst errors of a file's GPU tests (each {"case": id, name: error_bound(...)}) under title, through
    the terminal reporter: pytest -q hides passing tests' output.  Nothing when no GPU test ran."""
    if errors:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("")
        reporter.write_line(title)
        for e in errors:
            reporter.write_line(
                f"  {e['case']:<{case_width}} "
                + "  ".join(f"{k} {v[0]:.3g} / {v[1]:.3g} / {v[2]:.3g}" for k, v in e.items() if k != "case")
            )
