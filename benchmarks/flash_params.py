"""flash-attn's parameters in our kernels: flash-attn's own test suite against our compatible module,
and what each parameter costs, against FlexAttention and flash-attn-4.

    python -m benchmarks.flash_params stage --from /path/to/flash-attention     # CPU, once
    python -m benchmarks.flash_params count --out DIR                           # CPU
    python -m benchmarks.flash_params suite --out DIR                           # GPU
    python -m benchmarks.flash_params bench --out DIR                           # GPU
(`bash benchmarks/gpu_flash_params.sh` runs the GPU steps with our GPU tests, about 8 minutes.)

stage: copies flash-attn's tests/test_flash_attn.py (Dao-AILab/flash-attention; a checkout, or its
    git directory) unmodified into .flash_attn_suite/, which .git/info/exclude keeps out of git:
    the file is read and run, never committed. The GPU machine cannot fetch it: carry the folder.
suite / count: the file runs against `genoformer.kernels.flash_attn_compat` through a package
    `flash_attn` written at run time into a temporary folder (SHIM): it re-exports the compatible
    module's functions (flash_attn_with_kvcache included: genoformer.kernels.kvcache's), flash-attn's
    bert_padding helpers from it, a rotary embedding for the KV-cache tests' set-up, and stand-ins
    that raise `UnsupportedFeature` for what the module lacks (flash-attn's internal and compiled
    entry points). A conftest.py beside the copied file records every case's outcome and reports a case
    that raised `UnsupportedFeature` as skipped, its reason "missing feature: PARAMETER"; nothing
    else is changed: a failing assertion is a failure.
  count collects every case on a CPU (the file asks the GPU's compute capability at import; the
    conftest answers sm_90 there) and counts, per test function, the cases that exercise each
    flash-attn parameter and those that need a feature the module lacks.
  suite runs a deterministic stratified sample on the GPU: the suite has ~508k cases, each new
    kernel variant compiles for seconds, and a GPU call lasts minutes. From every test function a
    sample seeded by its name (--fraction of its cases, at least --minimum), run by
    `pytest -n WORKERS` until the budget ends; cases not finished by then are counted as not run.
    The conftest replaces each function's parametrize marks by one holding its sample (ids as pytest
    writes them), so pytest builds only the sampled cases: collecting all 508,777 takes minutes in
    every process (12 minutes on two busy CPU cores).
bench: bf16 on the GPU, B=1, 16 heads of 128, 16k tokens, our kernels with each parameter against
    the same call without it (ratios: exact window / block-granular window of the same width, ALiBi
    and softcap / plain causal, dropout / none, the compatible module / the native call), and
    against FlexAttention (torch.compile(flex_attention): its Triton backend; score_mod for ALiBi
    and softcap, mask_mod for windows) and flash-attn-4 (window_size, softcap; it has no ALiBi
    slopes or dropout) where installed. Forward and forward + backward medians (triton's do_bench),
    best of ROUNDS interleaved rounds, each situation's outputs checked against Flex's first. Our
    launch configurations are the defaults (GENOFORMER_TRITON_AUTOTUNE=0): the ratios compare a
    parameter with its absence in the same tiles. Kernels compile first in parallel processes
    (Triton's and Inductor's disk caches), so the timed process finds them built.

Shape legend: q (B, H, L, D) for our kernels, (B, L, H, D) for flash-attn's and FA4's.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from benchmarks.common import command_line, describe_environment, environment_markdown, markdown_table, publish

REPO = Path(__file__).resolve().parents[1]
SUITE_DIR = REPO / ".flash_attn_suite"
SUITE_FILE = "test_flash_attn.py"
SUITE_SOURCE = "tests/test_flash_attn.py"

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
    "flash_attn/flash_attn_interface.py": '''
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
''',
    "flash_attn/bert_padding.py": '''
from genoformer.kernels.flash_attn_compat import pad_input, unpad_input  # noqa: F401
''',
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
FRACTION = float(os.environ.get("FA_SAMPLE_FRACTION", "1"))
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
    combinations (FRACTION of them, at least MINIMUM), ids as pytest writes them: pytest then builds
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
    count = min(total, max(MINIMUM, round(FRACTION * total)))
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
    target = folder / "tests" / SUITE_FILE
    shutil.copyfile(suite_file, target)
    return target


def _suite_file() -> Path:
    path = SUITE_DIR / SUITE_FILE
    if not path.is_file():
        sys.exit(f"{path} is missing: stage it first on a machine that has flash-attn's sources:\n"
                 f"  python -m benchmarks.flash_params stage --from /path/to/flash-attention")
    return path


def _pytest(folder: Path, args: list[str], env: dict, timeout: float, log: Path) -> tuple[int | None, float]:
    """pytest on the shim folder's tests in a child process (the shim first on PYTHONPATH); its
    output to `log`; (return code, or None when the budget stopped it with its workers; seconds)."""
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO),
                                                                os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", str(folder / "tests" / SUITE_FILE), "-p", "no:cacheprovider",
               "--rootdir", str(folder / "tests"), *args]
    began = time.monotonic()
    with open(log, "w") as handle:
        child = subprocess.Popen(command, cwd=folder, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # pytest and its xdist workers
            child.wait()
            code = None
    return code, time.monotonic() - began


# ------------------------------------------------------------------------------ stage / count
def stage(args: argparse.Namespace) -> None:
    source = Path(args.source)
    SUITE_DIR.mkdir(exist_ok=True)
    if (source / SUITE_SOURCE).is_file():
        text = (source / SUITE_SOURCE).read_text()
    else:  # a bare git directory (a mirror)
        text = subprocess.run(["git", "-C", str(source), "show", f"HEAD:{SUITE_SOURCE}"], capture_output=True,
                              text=True, check=True).stdout
    (SUITE_DIR / SUITE_FILE).write_text(text)
    exclude = REPO / ".git" / "info" / "exclude"
    if not exclude.is_file():  # a worktree: its git dir holds no info/ of its own
        common = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        exclude = (REPO / common / "info" / "exclude").resolve()
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if "/.flash_attn_suite/" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join([*lines, "/.flash_attn_suite/"]) + "\n")
    print(f"staged {SUITE_DIR / SUITE_FILE} ({len(text.splitlines())} lines), excluded from git in {exclude}")


COUNT_COLUMNS = ("window_size", "alibi_slopes", "dropout_p", "softcap", "causal with seqlen_q != seqlen_k", "varlen",
                 "head dim not a multiple of 8", "flash_attn_with_kvcache", "block_table")


def count(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="flash_attn_shim_") as tmp:
        folder = Path(tmp)
        write_shim(folder, _suite_file())
        table_path = folder / "count.json"
        code, seconds = _pytest(folder, ["--collect-only", "-q"], {"FA_COUNT": str(table_path)}, 3600,
                                args.out / "flash_attn_suite_count.log")
        if not table_path.is_file():
            sys.exit(f"collection failed (code {code}): see {args.out / 'flash_attn_suite_count.log'}")
        table = json.loads(table_path.read_text())
    summary = {"environment": describe_environment("cpu"), "command": command_line(), "seconds": seconds,
               "functions": table}
    publish(args.out, "flash_attn_suite_count", summary, render_count(summary))
    return summary


def _count_rows(table: dict) -> list[dict]:
    rows = []
    for name, row in sorted(table.items()) + [("all", _totals(table))]:
        missing = {key[len("missing: "):]: n for key, n in row.items() if key.startswith("missing: ")}
        rows.append({"test function": name, "cases": row["cases"], **{c: row.get(c, 0) for c in COUNT_COLUMNS},
                     "needs a missing feature": ", ".join(f"{key} {n}" for key, n in missing.items()) or 0})
    return rows


def _totals(table: dict) -> dict:
    total = collections.Counter()
    for row in table.values():
        total.update(row)
    return dict(total)


def render_count(summary: dict) -> str:
    table = summary["functions"]
    total = _totals(table)
    missing = sum(n for key, n in total.items() if key.startswith("missing: "))
    return "\n".join([
        "## flash-attn's test suite, counted: which cases need which parameter",
        "",
        environment_markdown(summary["environment"], summary["command"]),
        "",
        f"flash-attn's tests/test_flash_attn.py (unmodified) collected against genoformer.kernels.flash_attn_compat: "
        f"{total['cases']:,} cases, of which {missing:,} need a feature the module lacks (flash-attn's internal "
        f"and compiled entry points); every other case runs on our kernels (the KV-cache cases on "
        f"genoformer.kernels.kvcache's flash_attn_with_kvcache). Columns count the cases that exercise each "
        f"parameter (a case may count in several).",
        "",
        markdown_table(_count_rows(table)),
    ])


# ------------------------------------------------------------------------------ suite
def suite(args: argparse.Namespace) -> dict:
    results_path = args.out / "flash_attn_suite_cases.jsonl"
    results_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="flash_attn_shim_") as tmp:
        folder = Path(tmp)
        write_shim(folder, _suite_file())
        selected_path = folder / "selected.jsonl"
        env = {"FA_RESULTS": str(results_path), "FA_SELECTED": str(selected_path),
               "FA_SAMPLE_FRACTION": str(args.fraction), "FA_SAMPLE_MIN": str(args.minimum),
               "FA_SAMPLE_SEED": str(args.seed), "GENOFORMER_TRITON_AUTOTUNE": "0"}
        pytest_args = ["-q", "-rfs", "--tb=line", *(["-n", str(args.workers)] if args.workers else [])]
        code, seconds = _pytest(folder, pytest_args, env, args.budget, args.out / "flash_attn_suite.log")
        # each collecting process wrote the same sample: one line per function
        selected = {row["function"]: row for row in map(json.loads, selected_path.read_text().splitlines())} \
            if selected_path.is_file() else {}
    cases = [json.loads(line) for line in results_path.read_text().splitlines()] if results_path.is_file() else []
    results_path.unlink(missing_ok=True)  # its cases go into flash_attn_suite.json
    summary = {"environment": describe_environment(), "command": command_line(), "budget_s": args.budget,
               "seconds": seconds, "returncode": code, "selected": sum(row["selected"] for row in selected.values()),
               "functions": selected, "fraction": args.fraction, "minimum": args.minimum, "seed": args.seed,
               "cases": cases}
    publish(args.out, "flash_attn_suite", summary, render_suite(summary))
    return summary


def _outcomes(summary: dict) -> dict[str, collections.Counter]:
    by_function: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in summary["cases"]:
        name = case["nodeid"].split("::")[-1].split("[")[0]
        if case["outcome"] == "skipped" and case["reason"].startswith("missing feature: "):
            by_function[name]["skipped (" + case["reason"] + ")"] += 1
        elif case["outcome"] == "skipped":
            by_function[name]["skipped by the suite"] += 1
        else:
            by_function[name][case["outcome"]] += 1
    return by_function


def render_suite(summary: dict) -> str:
    by_function = _outcomes(summary)
    total = collections.Counter()
    for counts in by_function.values():
        total.update(counts)
    done = sum(total.values())
    keys = ["passed", "failed", "skipped by the suite"] + sorted(k for k in total if k.startswith("skipped ("))
    rows = [{"test function": name, **{k: by_function[name].get(k, 0) for k in keys}} for name in sorted(by_function)]
    rows.append({"test function": "all", **{k: total.get(k, 0) for k in keys}})
    failures = [case for case in summary["cases"] if case["outcome"] == "failed"][:20]
    ended = "ran to the end" if summary["returncode"] is not None else f"stopped by its {summary['budget_s']:.0f} s budget"
    lines = [
        "## flash-attn's own test suite against genoformer.kernels.flash_attn_compat",
        "",
        environment_markdown(summary["environment"], summary["command"]),
        "",
        f"flash-attn's tests/test_flash_attn.py, unmodified, `import flash_attn` resolved to our module (a package "
        f"written at run time). A deterministic sample: {summary['fraction']:g} of every test function's cases, at "
        f"least {summary['minimum']}, seeded by the function's name (seed {summary['seed']}): {summary['selected']:,} "
        f"cases selected, {done:,} finished in {summary['seconds']:.0f} s (pytest {ended}). Skipped by the suite: its "
        f"own pytest.skip (e.g. softcap with dropout). Skipped with a missing feature: the case called something the "
        f"module raises UnsupportedFeature for.",
        "",
        markdown_table(rows),
    ]
    if failures:
        lines += ["", "Failures (first 20):", ""] + [f"- `{case['nodeid']}`: {case['reason']}" for case in failures]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ bench
@dataclasses.dataclass(frozen=True)
class Situation:
    name: str
    ours: dict  # triton_attention keywords (a layout's factory under "layout")
    baseline: str | None  # the situation whose ours this one is compared with
    target: float | None  # ours / baseline at most
    flex: str | None  # "causal", "window", "window_bidirectional", "alibi", "softcap"; None: not run
    fa4: dict | None  # flash_attn.cute.flash_attn_func keywords; None: not run
    why_not_flex: str = ""
    why_not_fa4: str = ""


L_BENCH, H_BENCH, D_BENCH, WINDOW, SOFTCAP_BENCH, DROPOUT_BENCH = 16384, 16, 128, 1024, 30.0, 0.1


def situations(L: int, window: int) -> list[Situation]:
    from genoformer.kernels.layout import BlockLayout

    causal_layout = functools.partial(lambda L, w: BlockLayout.sliding_window(L, w, 128).with_causal(), L, window)
    layout = functools.partial(BlockLayout.sliding_window, L, window, 128)
    no_alibi = "flash-attn-4 takes ALiBi slopes only as a CuTe-DSL score_mod"
    no_dropout = "no dropout"
    return [
        Situation("causal", {"causal": True}, None, None, "causal", {"causal": True}),
        Situation(f"block-granular window ±{window}, causal", {"causal": True, "layout": causal_layout}, None, None,
                  None, None, "the exact window's row", "the exact window's row"),
        Situation(f"exact window {window}, causal", {"causal": True, "window": (window, 0)},
                  f"block-granular window ±{window}, causal", 1.05, "window", {"causal": True,
                                                                               "window_size": (window, 0)}),
        Situation(f"block-granular window ±{window}", {"layout": layout}, None, None, None, None,
                  "the exact window's row", "the exact window's row"),
        Situation(f"exact window ±{window}", {"window": (window, window)}, f"block-granular window ±{window}", 1.05,
                  "window_bidirectional", {"window_size": (window, window)}),
        Situation("ALiBi, causal", {"causal": True, "alibi": True}, "causal", 1.10, "alibi", None,
                  why_not_fa4=no_alibi),
        Situation(f"softcap {SOFTCAP_BENCH:g}, causal", {"causal": True, "softcap": SOFTCAP_BENCH}, "causal", 1.10,
                  "softcap", {"causal": True, "softcap": SOFTCAP_BENCH}),
        Situation(f"dropout {DROPOUT_BENCH:g}, causal", {"causal": True, "dropout_p": DROPOUT_BENCH}, "causal", 1.25,
                  None, None, f"FlexAttention has {no_dropout}", f"flash-attn-4 has {no_dropout}"),
        Situation("flash_attn_compat.flash_attn_func, causal", {"causal": True, "compat": True}, "causal", 1.03,
                  None, None, "the native call's row", "the native call's row"),
    ]


def _inputs(B: int, H: int, L: int, D: int, device, seed: int = 0):
    """q, k, v, dout (B, H, L, D) bf16 views of (B, L, H, D) tensors (flash-attn's layout)."""
    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn(B, L, H, D, device=device, dtype=torch.bfloat16, generator=g).transpose(1, 2)
            for _ in range(4)]


def _ours(situation: Situation, H: int) -> Callable:
    from genoformer.kernels import alibi_slopes
    from genoformer.kernels import flash_attn_compat as compat
    from genoformer.kernels.dropout import draw_rng
    from genoformer.kernels.triton_flash import triton_attention

    kwargs = dict(situation.ours)
    if kwargs.pop("compat", False):
        return lambda q, k, v: compat.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      causal=kwargs["causal"]).transpose(1, 2)
    if "layout" in kwargs:
        kwargs["layout"] = kwargs["layout"]()
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = alibi_slopes(H).cuda()
    if kwargs.get("dropout_p"):
        rng = draw_rng("cuda")
        kwargs["dropout_rng"] = rng
    return functools.partial(triton_attention, **kwargs)


def _flex(kind: str, H: int, L: int, window: int):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from genoformer.kernels import alibi_slopes

    def causal(b, h, q, kv):
        return kv <= q

    def sliding(b, h, q, kv):
        return (kv <= q) & (q - kv <= window)

    def band(b, h, q, kv):
        return (q - kv <= window) & (kv - q <= window)

    slopes = alibi_slopes(H).cuda()

    def alibi(score, b, h, q, kv):
        return score - slopes[h] * (q - kv).abs()

    def softcap(score, b, h, q, kv):
        return SOFTCAP_BENCH * torch.tanh(score / SOFTCAP_BENCH)

    mask_mod = {"window": sliding, "window_bidirectional": band}.get(kind, causal)
    score_mod = {"alibi": alibi, "softcap": softcap}.get(kind)
    block_mask = create_block_mask(mask_mod, None, None, L, L, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return functools.partial(compiled, score_mod=score_mod, block_mask=block_mask)


def _fa4(kwargs: dict):
    import flash_attn.cute as fa4

    def run(q, k, v):
        out = fa4.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return run


def _impls(situation: Situation, H: int, L: int, window: int, fa4_error: str | None) -> dict[str, Callable | str]:
    """{"ours": fn, "flex": fn or why not, "fa4": fn or why not} of one situation."""
    impls: dict[str, Callable | str] = {"ours": _ours(situation, H)}
    impls["flex"] = _flex(situation.flex, H, L, window) if situation.flex else situation.why_not_flex
    if situation.fa4 is None:
        impls["fa4"] = situation.why_not_fa4
    else:
        impls["fa4"] = fa4_error or _fa4(situation.fa4)
    return impls


def _time(fn: Callable, q, k, v, dout, rep_ms: float) -> dict[str, float]:
    import triton.testing

    def forward():
        with torch.no_grad():
            fn(q, k, v)

    def forward_backward():
        fn(q, k, v).backward(dout)

    grads = [q, k, v]
    return {"fwd_ms": triton.testing.do_bench(forward, warmup=10, rep=rep_ms, return_mode="median"),
            "fwd_bwd_ms": triton.testing.do_bench(forward_backward, warmup=10, rep=rep_ms, grad_to_none=grads,
                                                  return_mode="median")}


def _warm(name: str, L: int, window: int) -> str:
    """Child process: run one situation's implementations once, forward and backward, so that their
    kernels compile into the disk caches; returns what failed, if anything."""
    torch.cuda.set_device(0)
    situation = next(s for s in situations(L, window) if s.name == name)
    q, k, v, dout = (t.requires_grad_() for t in _inputs(1, H_BENCH, L, D_BENCH, "cuda"))
    errors = []
    for key, impl in _impls(situation, H_BENCH, L, window, _fa4_error()).items():
        if callable(impl):
            try:
                impl(q, k, v).backward(dout)
            except Exception as error:  # recorded: the timed run reports it again
                errors.append(f"{key}: {type(error).__name__}: {str(error)[:200]}")
    torch.cuda.synchronize()
    return "; ".join(errors)


@functools.cache
def _fa4_error() -> str | None:
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError as error:
        return f"flash-attn-4 is not installed here ({error}); skipped"
    return None


def bench(args: argparse.Namespace) -> dict:
    os.environ["GENOFORMER_TRITON_AUTOTUNE"] = "0"
    L, window = args.length, args.window
    cases = situations(L, window)
    began = time.monotonic()
    if args.warm_workers:
        context = __import__("multiprocessing").get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.warm_workers, mp_context=context) as pool:
            warm_errors = dict(zip([s.name for s in cases],
                                   pool.map(_warm, [s.name for s in cases], [L] * len(cases), [window] * len(cases))))
    else:
        warm_errors = {}
    warm_s = time.monotonic() - began
    q, k, v, dout = (t.requires_grad_() for t in _inputs(1, H_BENCH, L, D_BENCH, "cuda"))
    impls = {s.name: _impls(s, H_BENCH, L, window, _fa4_error()) for s in cases}
    records = {s.name: {key: ({"skipped": impl} if not callable(impl) else {}) for key, impl in impls[s.name].items()}
               for s in cases}
    # outputs against Flex's (or ours, bf16 both): the same function is timed
    for s in cases:
        fns = impls[s.name]
        with torch.no_grad():
            try:
                ours = fns["ours"](q, k, v).float()
            except Exception as error:
                records[s.name]["ours"] = {"skipped": f"{type(error).__name__}: {error}"}
                continue
            for key in ("flex", "fa4"):
                if callable(fns[key]):
                    try:
                        records[s.name][key]["max_abs_diff_vs_ours"] = (fns[key](q, k, v).float() - ours).abs().max().item()
                    except Exception as error:
                        records[s.name][key] = {"skipped": f"{type(error).__name__}: {str(error)[:300]}"}
    for _ in range(args.rounds):
        for s in cases:
            for key, fn in impls[s.name].items():
                record = records[s.name][key]
                if not callable(fn) or "skipped" in record:
                    continue
                try:
                    times = _time(fn, q, k, v, dout, args.rep_ms)
                except Exception as error:
                    record["skipped"] = f"{type(error).__name__}: {str(error)[:300]}"
                    continue
                for name, ms in times.items():
                    record[name] = min(record.get(name, math.inf), ms)
    summary = {"environment": describe_environment(), "command": command_line(), "shape": [1, H_BENCH, L, D_BENCH],
               "window": window, "rounds": args.rounds, "rep_ms": args.rep_ms, "warm_s": warm_s,
               "warm_errors": warm_errors, "seconds": time.monotonic() - began,
               "situations": [{**dataclasses.asdict(s), "ours": {k: str(v) for k, v in s.ours.items()},
                               "records": records[s.name]} for s in cases]}
    publish(args.out, "flash_params_bench", summary, render_bench(summary))
    return summary


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else ""


def render_bench(summary: dict) -> str:
    by_name = {s["name"]: s["records"] for s in summary["situations"]}
    rows = []
    for s in summary["situations"]:
        ours, flex, fa4 = (s["records"].get(key, {}) for key in ("ours", "flex", "fa4"))
        base = by_name.get(s["baseline"], {}).get("ours", {}) if s["baseline"] else {}
        row = {"situation": s["name"],
               "ours fwd / fwd+bwd ms": f"{ours.get('fwd_ms', 0):.3f} / {ours.get('fwd_bwd_ms', 0):.3f}"
               if "fwd_ms" in ours else ours.get("skipped", "")}
        if s["baseline"]:
            fwd, total = _ratio(ours.get("fwd_ms"), base.get("fwd_ms")), _ratio(ours.get("fwd_bwd_ms"),
                                                                              base.get("fwd_bwd_ms"))
            met = "met" if total and float(total) <= s["target"] and float(fwd) <= s["target"] else "NOT met"
            row["vs " + "its baseline"] = f"{fwd} / {total} (vs {s['baseline']}; target <= {s['target']:g}: {met})"
        for key, label in (("flex", "vs Flex"), ("fa4", "vs FA4")):
            other = s["records"].get(key, {})
            row[label] = (f"{_ratio(ours.get('fwd_ms'), other.get('fwd_ms'))} / "
                          f"{_ratio(ours.get('fwd_bwd_ms'), other.get('fwd_bwd_ms'))}"
                          if "fwd_ms" in other else other.get("skipped", ""))
        rows.append(row)
    B, H, L, D = summary["shape"]
    return "\n".join([
        "## flash-attn's parameters: what each costs in our kernels, and against FlexAttention and flash-attn-4",
        "",
        environment_markdown(summary["environment"], summary["command"]),
        "",
        f"bf16, B={B}, {H} heads of {D}, {L:,} tokens; medians of triton's do_bench, best of {summary['rounds']} "
        f"interleaved rounds; ratios are forward / forward+backward times (below 1: ours faster). Our launches use "
        f"the default configurations (no tuning), the same tiles with and without each parameter. Flex: "
        f"torch.compile(flex_attention), its Triton backend, score_mod for ALiBi and softcap, mask_mod for the "
        f"windows. Warm-up (compiling in parallel processes) {summary['warm_s']:.0f} s.",
        "",
        markdown_table(rows),
    ])


# ------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flash_params", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("stage", help="copy flash-attn's test file into .flash_attn_suite/ (excluded from git)")
    p.add_argument("--from", dest="source", required=True,
                   help="a flash-attention checkout or its git directory (e.g. a mirror)")
    for name, text in (("count", "count the suite's cases by parameter and missing feature (CPU)"),
                       ("suite", "run a sample of the suite against the compatible module (GPU)"),
                       ("bench", "time each parameter against its absence, Flex and FA4 (GPU)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--out", type=Path, required=True, help="folder for the result files")
    suite_parser = sub.choices["suite"]
    suite_parser.add_argument("--fraction", type=float, default=0.001, help="share of each function's cases (0.001)")
    suite_parser.add_argument("--minimum", type=int, default=3, help="cases per function at least (3)")
    suite_parser.add_argument("--seed", type=int, default=0, help="the sample's seed (0)")
    suite_parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers (8; 0: none)")
    suite_parser.add_argument("--budget", type=float, default=270.0, help="seconds before pytest is stopped (270)")
    bench_parser = sub.choices["bench"]
    bench_parser.add_argument("--length", type=int, default=L_BENCH, help=f"tokens (default {L_BENCH})")
    bench_parser.add_argument("--window", type=int, default=WINDOW, help=f"window width (default {WINDOW})")
    bench_parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    bench_parser.add_argument("--rep-ms", type=float, default=60.0, help="do_bench measuring time in ms (60)")
    bench_parser.add_argument("--warm-workers", type=int, default=6,
                              help="processes compiling the situations first (6; 0: none)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.step == "stage":
        stage(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "count":
        count(args)
        return
    if not torch.cuda.is_available():
        sys.exit(f"`{args.step}` needs a CUDA GPU; on a CPU: python -m benchmarks.flash_params count --out DIR")
    random.seed(0)
    suite(args) if args.step == "suite" else bench(args)


if __name__ == "__main__":
    main()
