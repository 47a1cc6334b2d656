"""flash-attn's own test file, unmodified, against genoformer.kernels.flash_attn_compat: a seeded
sample of its cases on a GPU, or (--count) every case counted by the parameters it exercises.

    python -m benchmarks.flash_attn_suite --out OUT                  # GPU: the sample, passed/failed/skipped
    python -m benchmarks.flash_attn_suite --count --out OUT          # CPU: the 508,777 cases by parameter
    python -m benchmarks.flash_attn_suite --smoke --out OUT          # CPU: the sample collected, nothing run

The file is flash-attn's tests/test_flash_attn.py (Dao-AILab/flash-attention), read from
--suite-file (default .flash_attn_suite/test_flash_attn.py, a folder .git/info/exclude keeps out of
git: it is read and run, never committed; benchmarks/gpu_kernels.sh says how to stage it). It
runs against the compatible module through a package `flash_attn` written at run time into a
temporary folder: the module's functions (flash_attn_with_kvcache is genoformer.kernels.kvcache's),
flash-attn's bert_padding helpers from it, a rotary embedding in PyTorch for the KV-cache tests'
set-up, and stand-ins raising `UnsupportedFeature` for what the module lacks (flash-attn's internal
and compiled entry points). A conftest.py beside the copied file records every case's outcome and
reports a case that raised `UnsupportedFeature` as skipped, its reason "missing feature: PARAMETER";
nothing else changes: a failing assertion is a failure.

The sample: the suite has 508,777 cases, each new kernel variant compiles for seconds, and a GPU call
lasts minutes. From every test function of n cases round(--scale * sqrt(n)) of them (at least
--minimum; the large functions sampled more thinly than the small ones, so that every function
counts: the KV-cache test alone has 304,128 cases), drawn with a seed from the function's name: the conftest replaces each function's parametrize marks by one holding
its sample (the ids as pytest writes them), so that pytest builds only those (collecting all 508,777
takes minutes in every process), shuffled with the seed, so that the budget cuts every function
alike. `pytest -n WORKERS` runs them until --budget seconds; what has not finished is counted as not
run. --count collects every case on a CPU (the file asks for the GPU's compute capability at import;
the conftest answers sm_90 there) and counts each function's cases per parameter.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO_ROOT, Benchmark, Summary, at_most, table, verdict

SUITE_FILE = REPO_ROOT / ".flash_attn_suite" / "test_flash_attn.py"
PARAMETERS = (
    "window_size",
    "alibi_slopes",
    "dropout_p",
    "softcap",
    "causal with seqlen_q != seqlen_k",
    "varlen",
    "head dim not a multiple of 8",
    "flash_attn_with_kvcache",
    "block_table",
)
"""The count's columns: the cases exercising each (a case may count in several)."""

# ------------------------------------------------------------------------------ the shim
_SHIM = {
    "flash_attn/__init__.py": '''
"""Run-time stand-in for flash-attn: genoformer.kernels.flash_attn_compat under flash-attn's name."""
from genoformer.kernels import flash_attn_compat as _compat
from genoformer.kernels.flash_attn_compat import (
    flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
)

if hasattr(_compat, "flash_attn_with_kvcache"):
    flash_attn_with_kvcache = _compat.flash_attn_with_kvcache
else:
    def flash_attn_with_kvcache(*args, **kwargs):
        raise _compat.UnsupportedFeature("flash_attn_with_kvcache", "the KV-cache decoding API")
''',
    "flash_attn/flash_attn_interface.py": """
from genoformer.kernels import flash_attn_compat as _compat
from flash_attn import *  # noqa: F401,F403
from flash_attn import flash_attn_with_kvcache  # noqa: F401

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    return _compat.ATTN_PROBS_BLOCK_N


def _flash_attn_varlen_forward(*args, **kwargs):
    raise _compat.UnsupportedFeature("_flash_attn_varlen_forward", "flash-attn's internal entry points")


class _Extension:
    def __getattr__(self, name):
        raise _compat.UnsupportedFeature("flash_attn_gpu", "flash-attn's compiled CUDA extension")


flash_attn_gpu = _Extension()
""",
    "flash_attn/bert_padding.py": """
from genoformer.kernels.flash_attn_compat import pad_input, unpad_input  # noqa: F401
""",
    "flash_attn/layers/__init__.py": "",
    "flash_attn/layers/rotary.py": '''
"""flash-attn's apply_rotary_emb in plain PyTorch (the KV-cache tests prepare their inputs with it)."""
import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    B, S, H, D = x.shape
    half = cos.shape[-1]
    positions = torch.arange(S, device=x.device).view(1, S)
    offsets = seqlen_offsets.view(-1, 1) if torch.is_tensor(seqlen_offsets) else seqlen_offsets
    positions = (positions + offsets).expand(B, S)
    cos_BS1R, sin_BS1R = (t[positions].unsqueeze(2).float() for t in (cos, sin))
    rotated, rest = x[..., : 2 * half].float(), x[..., 2 * half:]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
        out = torch.stack((x1 * cos_BS1R - x2 * sin_BS1R, x1 * sin_BS1R + x2 * cos_BS1R), dim=-1).flatten(-2)
    else:
        x1, x2 = rotated[..., :half], rotated[..., half:]
        out = torch.cat((x1 * cos_BS1R - x2 * sin_BS1R, x1 * sin_BS1R + x2 * cos_BS1R), dim=-1)
    return torch.cat((out.to(x.dtype), rest), dim=-1)
''',
    "tests/conftest.py": '''
"""Beside flash-attn's unmodified test file: sampling, outcomes, missing features (benchmarks/flash_params.py)."""
import inspect
import json
import math
import os
import random

import pytest
import torch
from _pytest.mark.structures import ParameterSet

COUNT = os.environ.get("FA_COUNT")
RESULTS = os.environ.get("FA_RESULTS")
SELECTED = os.environ.get("FA_SELECTED")
SCALE = float(os.environ.get("FA_SAMPLE_SCALE", "0"))  # 0: every case
MINIMUM = int(os.environ.get("FA_SAMPLE_MIN", "0"))
SEED = os.environ.get("FA_SAMPLE_SEED", "0")

if not torch.cuda.is_available():  # counting on a CPU: the file reads the GPU's compute capability at import
    torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)

from genoformer.kernels import flash_attn_compat  # noqa: E402
from genoformer.kernels.flash_attn_compat import UnsupportedFeature  # noqa: E402

KVCACHE = {"test_flash_attn_kvcache", "test_flash_attn_kvcache_paged_block_table_bounds"}
INTERNAL = {"test_flash_attn_varlen_paged_kv_num_splits": "_flash_attn_varlen_forward",
            "test_flash_attn_generator_arg_must_be_none": "flash_attn_gpu"}


def missing(item):
    """The missing feature a collected case needs, or None."""
    name = item.originalname
    if name in KVCACHE and not hasattr(flash_attn_compat, "flash_attn_with_kvcache"):
        return "flash_attn_with_kvcache"
    return INTERNAL.get(name)


def uses(item):
    """The flash-attn parameters a collected case exercises."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    name = item.originalname
    found = []
    if params.get("local"):
        found.append("window_size")
    if params.get("alibi"):
        found.append("alibi_slopes")
    if params.get("dropout_p"):
        found.append("dropout_p")
    if params.get("softcap"):
        found.append("softcap")
    q, k = params.get("seqlen_q"), params.get("seqlen_k")
    causal = params.get("causal", name in ("test_flash_attn_causal", "test_flash_attn_varlen_causal"))
    if causal and q is not None and k is not None and q != k:
        found.append("causal with seqlen_q != seqlen_k")
    if "varlen" in name:
        found.append("varlen")
    if name in KVCACHE:
        found.append("flash_attn_with_kvcache")
    if params.get("paged_kv_block_size") is not None:
        found.append("block_table")
    if "d" in params and params["d"] % 8:
        found.append("head dim not a multiple of 8")
    return found


def _case_id(name, value, index):
    """pytest's default id of one parametrize value (numbers, bools, strings, None as themselves)."""
    return str(value) if isinstance(value, (bool, int, float, str, type(None))) else f"{name}{index}"


def _sample(function, name):
    """Replace a test function's stacked parametrize marks by one holding a seeded sample of their
    combinations (SCALE * sqrt of their number, at least MINIMUM), ids as pytest writes them: pytest then builds
    the sampled cases only, not the 508k of the file (minutes of collecting on every worker)."""
    marks = getattr(function, "pytestmark", [])
    axes = []
    for mark in marks:  # the decorator nearest the function first, as pytest orders the ids
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        values = [value for value in mark.args[1]]
        if any(isinstance(value, ParameterSet) for value in values):  # pytest.param(...): its values
            values = [value.values[0] if len(names) == 1 else value.values for value in values]
        axes.append((names, values))
    if not axes:
        return
    total = math.prod(len(values) for _, values in axes)
    count = min(total, max(MINIMUM, round(SCALE * math.sqrt(total)))) if SCALE else total
    argnames, argvalues, ids = [n for names, _ in axes for n in names], [], []
    for index in sorted(random.Random(f"{SEED}:{name}").sample(range(total), count)):
        combo, parts = [], []
        for names, values in axes:
            index, r = divmod(index, len(values))
            value = values[r]
            if len(names) == 1:
                combo.append(value)
                parts.append(_case_id(names[0], value, r))
            else:
                combo.extend(value)
                parts.extend(_case_id(n, v, r) for n, v in zip(names, value))
        argvalues.append(tuple(combo))
        ids.append("-".join(parts))
    function.pytestmark = [mark for mark in marks if mark.name != "parametrize"] + [
        pytest.mark.parametrize(argnames, argvalues, ids=ids).mark]
    if SELECTED:
        with open(SELECTED, "a") as handle:
            handle.write(json.dumps({"function": name, "selected": count, "cases": total}) + "\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    if not COUNT and inspect.isfunction(obj) and name.startswith("test_"):
        _sample(obj, name)
    yield


def pytest_collection_modifyitems(config, items):
    if not COUNT:  # the functions' samples mixed (seeded, the same in every worker): a budget cuts them alike
        random.Random(SEED).shuffle(items)
        return
    table = {}
    for item in items:
        row = table.setdefault(item.originalname, {"cases": 0})
        row["cases"] += 1
        lacking = missing(item)
        for key in [*uses(item), *(["missing: " + lacking] if lacking else [])]:
            row[key] = row.get(key, 0) + 1
    with open(COUNT, "w") as handle:
        json.dump(table, handle, indent=1)
    config.hook.pytest_deselected(items=list(items))
    items[:] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(UnsupportedFeature):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"missing feature: {call.excinfo.value.parameter}")


def pytest_runtest_logreport(report):
    if RESULTS is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when == "call" or report.outcome != "passed":
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        elif report.failed:
            reason = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
        with open(RESULTS, "a") as handle:
            handle.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                     "reason": reason, "seconds": round(report.duration, 3)}) + "\\n")
''',
}


def write_shim(folder: Path, suite_file: Path) -> Path:
    """The `flash_attn` stand-in package and the conftest in `folder`, flash-attn's test file copied
    unmodified beside the conftest; returns the copied test file."""
    for name, text in _SHIM.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    target = folder / "tests" / suite_file.name
    target.write_bytes(suite_file.read_bytes())
    return target


def run_pytest(folder: Path, args: list[str], env: dict, timeout: float, log: Path) -> tuple[int | None, float]:
    """pytest on the shim folder's test file in a child process (the shim first on PYTHONPATH), its
    output to `log`: (return code, or None when the budget stopped it with its workers; seconds). A
    calling pytest-xdist worker's variables stay behind: the child would take itself for a worker."""
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST")},
        **env,
        "PYTHONPATH": os.pathsep.join([str(folder), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(folder / "tests"),
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(folder / "tests"),
        *args,
    ]
    began = time.monotonic()
    with open(log, "w") as handle:
        child = subprocess.Popen(
            command, cwd=folder, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # pytest and its xdist workers
            child.wait()
            code = None
    return code, time.monotonic() - began


# ------------------------------------------------------------------------------ measure
def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", action="store_true", help="count every case by parameter (CPU), run nothing")
    parser.add_argument(
        "--suite-file",
        type=Path,
        default=SUITE_FILE,
        help=f"flash-attn's tests/test_flash_attn.py (default {SUITE_FILE.relative_to(REPO_ROOT)})",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=0.3,
        help="a function of n cases runs round(scale * sqrt(n)) of them (default 0.3: 488 cases in all)",
    )
    parser.add_argument("--minimum", type=int, default=3, help="cases per function at least (3)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (0)")
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers (8; 0: none)")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds before pytest is stopped (270)")
    parser.add_argument(
        "--functions",
        type=lambda text: [name for name in text.split(",") if name],
        default=[],
        help="only these test functions, comma-separated (e.g. test_flash_attn_kvcache); their "
        "result is named flash_attn_suite_subset",
    )


def name_of(args: argparse.Namespace) -> str:
    if args.count:
        return "flash_attn_suite_count"
    return "flash_attn_suite_subset" if args.functions else "flash_attn_suite"


def measure(args: argparse.Namespace) -> dict:
    if not args.suite_file.is_file():
        sys.exit(
            f"{args.suite_file} is missing: stage flash-attn's tests/test_flash_attn.py there first (see "
            f"benchmarks/gpu_kernels.sh, flash_params), or pass --suite-file"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flash_attn_shim_") as tmp:
        folder = Path(tmp)
        write_shim(folder, args.suite_file)
        if args.count:
            table_path = folder / "count.json"
            code, seconds = run_pytest(
                folder, ["--collect-only", "-q"], {"FA_COUNT": str(table_path)}, 7200, folder / "collect.log"
            )
            if not table_path.is_file():
                sys.exit(
                    f"collecting flash-attn's suite failed (status {code}):\n"
                    + (folder / "collect.log").read_text()[-3000:]
                )
            return {"kind": "count", "seconds": seconds, "functions": json.loads(table_path.read_text())}
        selected_path, results_path = folder / "selected.jsonl", folder / "cases.jsonl"
        env = {
            "FA_RESULTS": str(results_path),
            "FA_SELECTED": str(selected_path),
            "FA_SAMPLE_SCALE": str(args.scale),
            "FA_SAMPLE_MIN": str(args.minimum),
            "FA_SAMPLE_SEED": str(args.seed),
            "GENOFORMER_TRITON_AUTOTUNE": "0",
        }
        if args.smoke:  # the sample collected on this CPU, nothing run
            code, seconds = run_pytest(folder, ["--collect-only", "-q"], env, 600, folder / "collect.log")
            cases = []
        else:
            workers = ["-n", str(args.workers)] if args.workers else []
            only = ["-k", " or ".join(args.functions)] if args.functions else []
            code, seconds = run_pytest(
                folder,
                ["-q", "-rfs", "--tb=line", *workers, *only],
                env,
                args.budget,
                args.out / "flash_attn_suite.log",
            )
            cases = (
                [json.loads(line) for line in results_path.read_text().splitlines()] if results_path.is_file() else []
            )
        # every collecting process wrote the same sample: one line per function is kept
        selected = (
            {row["function"]: row for row in map(json.loads, selected_path.read_text().splitlines())}
            if selected_path.is_file()
            else {}
        )
        if args.functions:  # -k's substring match
            selected = {name: row for name, row in selected.items() if any(part in name for part in args.functions)}
    return {
        "kind": "suite",
        "collected_only": args.smoke,
        "seconds": seconds,
        "returncode": code,
        "budget_s": args.budget,
        "scale": args.scale,
        "minimum": args.minimum,
        "seed": args.seed,
        "functions": selected,
        "cases": cases,
    }


# ------------------------------------------------------------------------------ summarize
def _count_summary(data: dict) -> Summary:
    functions = data["functions"]
    total = collections.Counter()
    for row in functions.values():
        total.update(row)
    rows = []
    for name, row in [*sorted(functions.items()), ("all", dict(total))]:
        missing = {key.removeprefix("missing: "): n for key, n in row.items() if key.startswith("missing: ")}
        rows.append(
            {
                "test function": name,
                "cases": row["cases"],
                **{p: row.get(p, 0) for p in PARAMETERS},
                "need a missing feature": sum(missing.values()),
                "which": ", ".join(f"{key} {n}" for key, n in missing.items()),
            }
        )
    lacking = sum(n for key, n in total.items() if key.startswith("missing: "))
    return Summary(
        title="flash-attn's test suite, counted: the cases each flash-attn parameter takes",
        tables=[
            table(
                rows,
                caption="flash-attn's tests/test_flash_attn.py, unmodified, collected against "
                "genoformer.kernels.flash_attn_compat; a column counts the cases exercising that parameter.",
            )
        ],
        targets=[
            at_most(
                "cases that need a feature the module lacks: at most the KV-cache decoding tests",
                lacking,
                total["flash_attn_with_kvcache"],
                measured=f"{lacking:,} (flash-attn's internal and compiled entry points)",
            )
        ],
        notes=[f"{total['cases']:,} cases collected in {data['seconds']:.0f} s."],
    )


def _outcome(case: dict) -> str:
    if case["outcome"] == "skipped":
        reason = case["reason"]
        return f"skipped ({reason})" if reason.startswith("missing feature: ") else "skipped by the suite"
    return case["outcome"]


def summarize(data: dict) -> Summary:
    if data["kind"] == "count":
        return _count_summary(data)
    by_function: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in data["cases"]:
        by_function[case["nodeid"].split("::")[-1].split("[")[0]][_outcome(case)] += 1
    total = collections.Counter()
    for counts in by_function.values():
        total.update(counts)
    outcomes = ["passed", "failed", "skipped by the suite", *sorted(k for k in total if k.startswith("skipped ("))]
    rows = []
    for name, row in sorted(data["functions"].items()):
        counts = by_function.get(name, collections.Counter())
        rows.append(
            {
                "test function": name,
                "cases": row["cases"],
                "selected": row["selected"],
                **{k: counts.get(k, 0) for k in outcomes},
                "not run (budget)": row["selected"] - sum(counts.values()),
            }
        )
    selected = sum(row["selected"] for row in data["functions"].values())
    rows.append(
        {
            "test function": "all",
            "cases": sum(row["cases"] for row in data["functions"].values()),
            "selected": selected,
            **{k: total.get(k, 0) for k in outcomes},
            "not run (budget)": selected - sum(total.values()),
        }
    )
    failures = [case for case in data["cases"] if case["outcome"] == "failed"]
    ended = (
        "collected only (--smoke)"
        if data["collected_only"]
        else ("ran to the end" if data["returncode"] is not None else f"stopped by its {data['budget_s']:.0f} s budget")
    )
    missing = sum(n for k, n in total.items() if k.startswith("skipped ("))
    targets = (
        []
        if data["collected_only"]
        else [
            at_most("failures among the cases run", total.get("failed", 0), 0),
            verdict(
                "skipped for a missing feature: at most the KV-cache decoding tests",
                f"{missing} (flash-attn's internal entry points)",
                missing == 0
                or all(
                    "_flash_attn_varlen_forward" in k or "flash_attn_gpu" in k
                    for k in total
                    if k.startswith("skipped (")
                ),
            ),
        ]
    )
    return Summary(
        title="flash-attn's own test suite against genoformer.kernels.flash_attn_compat",
        tables=[
            table(
                rows,
                caption=f"flash-attn's tests/test_flash_attn.py, unmodified (`import flash_attn` resolved "
                f"to our module by a package written at run time): round({data['scale']:g} sqrt(n)) of a "
                f"function's n cases, at least {data['minimum']}, seeded by its name (seed {data['seed']}); pytest "
                f"{ended} after {data['seconds']:.0f} s. Skipped by the suite: its own pytest.skip; skipped "
                "with a missing feature: the case called what the module raises UnsupportedFeature for.",
            )
        ],
        targets=targets,
        notes=[f"failed: `{case['nodeid']}`: {case['reason']}" for case in failures[:20]],
        failed=bool(failures),
    )


BENCHMARK = Benchmark(
    "flash_attn_suite",
    "flash-attn's own test suite against genoformer.kernels.flash_attn_compat",
    __doc__,
    measure,
    summarize,
    baseline="",
    arguments=arguments,
    name_of=name_of,
)

if __name__ == "__main__":
    BENCHMARK.main()
