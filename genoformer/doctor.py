"""`genoformer doctor`: what this machine runs, on one screen.

    genoformer doctor

Prints the versions that decide what runs (Python, torch and its CUDA build, Lightning, Triton,
flash-attn 2 and 4, xformers), the GPU and its compute capability; then every attention backend of
the dispatch table (`genoformer.kernels.dispatch.BACKENDS`) with whether it runs here and, where it
does not, the table's own reason (which names what to install); the one install command that adds
a faster backend than auto runs here now; and for every shipped recipe the backend each kind of its
layers would use on this machine, with auto's own reason (`dispatch.explain_auto`). Nothing here
lists backends or rules of its own: what runs and why are the dispatch table's answers.

It exits with status 1 when something a shipped recipe needs is broken: a dependency of genoformer
missing or of a version it does not accept, an attention package that is installed but does not
import, a recipe that does not load, a recipe's named backend that cannot run on the device it
asks for, a bfloat16 recipe on a GPU without bfloat16, or a GPU driver that torch does not see (a
CPU build of torch). What is only slower (a faster backend not installed) or absent (a GPU recipe
on a CPU-only machine, a pretrained model not downloaded yet) is said, with what to do, and is not
an error.

Importing this module imports no torch (`genoformer doctor --help` stays fast); running it does.

Shape legend: B batch, H heads, L length, D head dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import io
import platform
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

from genoformer.shipped import PACKAGE, checkout_root, compose_config, configs_dir, shipped_recipes

PACKAGES = {
    "triton": ("triton", "pytorch-triton"),
    "flash-attn 2": ("flash-attn",),
    "flash-attn-4": ("flash-attn-4",),
    "xformers": ("xformers",),
}
"""The optional packages whose versions decide the attention backends, by their distribution names."""

PROBE_HEADS, PROBE_LENGTH, PROBE_HEAD_DIM = 8, 4096, 64
"""The input the backend table is asked about: causal, dense and one layout, as the recipes run."""

_INSTALL = re.compile(r"pip install [^;()]+?(?=\s*(?:\(|;|$|\.(?:\s|$)))")
"""The first install command in a backend's reason (`pip install flash-attn-4`)."""


@dataclasses.dataclass
class Report:
    """What `examine` found: the screen's lines, and the problems (exit 1) and notes among them."""

    lines: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        lines = list(self.lines)
        if self.notes:
            lines += ["", "Notes:", *(f"  - {note}" for note in dict.fromkeys(self.notes))]
        if self.problems:
            lines += [
                "",
                f"Problems ({len(dict.fromkeys(self.problems))}; genoformer doctor exits with status 1):",
                *(f"  - {problem}" for problem in dict.fromkeys(self.problems)),
            ]
        else:
            lines += ["", "No problems: every shipped recipe for this machine's devices can run."]
        return "\n".join(lines)


def doctor() -> None:
    """Check this machine: versions, GPU, which attention backends run, and what each recipe would use.

    Prints one screen: Python, torch (and its CUDA build), Lightning, Triton, flash-attn 2 and 4 and
    xformers versions; the GPU and its compute capability; every attention backend with whether it
    runs here, why not, and the one install command that adds a faster one; and for every shipped
    recipe (`genoformer recipes`) the backend each kind of its layers would use here, and why. Exits
    with status 1 when something a shipped recipe needs is broken (the list at the end says what
    and what to do); a faster backend that is not installed, or a GPU recipe on a CPU-only
    machine, is said but is not an error.
    """
    report = examine()
    print(report.text())
    if report.problems:
        raise SystemExit(1)


def examine() -> Report:
    """Everything `doctor` prints, as a Report."""
    report = Report()
    torch = _versions(report)
    if torch is None:
        return report
    device, dtype = _machine(report, torch)
    _dependencies(report)
    _backends(report, torch, device, dtype)
    _recipes(report, torch, device)
    return report


# ----------------------------------------------------------------------- versions and the GPU
def _version(*distributions: str) -> Optional[str]:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _versions(report: Report) -> Any:
    """The versions' lines; torch, imported (None, with the problem said, when it does not import)."""
    root = checkout_root()
    where = f"a clone at {root}" if root is not None else f"installed at {PACKAGE}"
    report.lines += [
        f"genoformer    {_version('genoformer') or 'not installed (run from a clone)'} ({where})",
        f"Python        {platform.python_version()} ({sys.executable})",
    ]
    try:
        import torch
    except ImportError as error:
        report.problems.append(f"torch does not import ({error}): every recipe needs it; pip install torch")
        return None
    cuda = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if cuda else None
    build = f"built for CUDA {cuda}" + (f", cuDNN {_cudnn(cudnn)}" if cudnn else "") if cuda else "a CPU build, no CUDA"
    report.lines += [
        f"torch         {torch.__version__}, {build}",
        f"lightning     {_version('lightning') or 'not installed'}",
    ]
    for label, distributions in PACKAGES.items():
        report.lines.append(f"{label:<14}{_version(*distributions) or 'not installed'}")
    return torch


def _cudnn(number: int) -> str:
    """cuDNN's version number as a release: 8907 is 8.9.7 (major * 1000 before cuDNN 9), 90100 is 9.1.0."""
    major, rest = (number // 10000, number % 10000) if number >= 10000 else (number // 1000, number % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _machine(report: Report, torch: Any) -> tuple[Any, Any]:
    """The GPU's line; the device and dtype the backend table is asked about."""
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        memory = torch.cuda.get_device_properties(index).total_memory / 2**30
        bf16 = torch.cuda.is_bf16_supported()
        report.lines.append(
            f"GPU           {torch.cuda.get_device_name(index)}, compute capability {major}.{minor} "
            f"(sm_{major}{minor}), {memory:.1f} GiB, bfloat16 {'yes' if bf16 else 'no'}; "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
        return torch.device("cuda", index), torch.bfloat16 if bf16 else torch.float16
    report.lines.append("GPU           none that torch sees")
    if shutil.which("nvidia-smi") is not None:
        cause = (
            "torch is a CPU build: install a CUDA build (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128, or the CUDA version your driver supports)"
            if torch.version.cuda is None
            else f"torch's CUDA {torch.version.cuda} build finds no usable GPU: the driver may be older than that "
            "CUDA needs (nvidia-smi shows its CUDA version), or CUDA_VISIBLE_DEVICES hides the GPUs"
        )
        report.problems.append(
            f"this machine has an NVIDIA driver (nvidia-smi) but torch {torch.__version__} sees no "
            f"GPU, so the GPU recipes cannot run: {cause}"
        )
    return torch.device("cpu"), torch.float32


def _dependencies(report: Report) -> None:
    """A problem for each requirement of the installed genoformer that is missing or of a version
    it does not accept."""
    try:
        required = importlib.metadata.requires("genoformer") or []
    except importlib.metadata.PackageNotFoundError:
        report.notes.append(
            "genoformer is not installed (run from a clone): its dependencies were not checked; "
            "pip install -e . installs them"
        )
        return
    from packaging.requirements import Requirement

    checked = 0
    for text in required:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an optional extra's requirement
        checked += 1
        installed = _version(requirement.name)
        if installed is None:
            report.problems.append(f"{requirement.name} is not installed: pip install '{requirement}'")
        elif requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            report.problems.append(
                f"{requirement.name} {installed} is installed; genoformer needs {requirement}: "
                f"pip install '{requirement}'"
            )
    report.lines.append(f"dependencies  {checked} required packages checked")


# ----------------------------------------------------------------------- the backend table
def _probe(shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """An input of this description for the backends' checks, which read what a tensor is (device,
    dtype, shape), never its values: one element, expanded, as `dispatch.plan_attention` does."""
    import torch

    return torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(*shape)


def _backends(report: Report, torch: Any, device: Any, dtype: Any) -> None:
    from genoformer.kernels import dispatch
    from genoformer.kernels.layout import BlockLayout

    q = _probe((1, PROBE_HEADS, PROBE_LENGTH, PROBE_HEAD_DIM), dtype, device)
    layout = BlockLayout.sliding_window(PROBE_LENGTH, 1024, block_size=128).with_causal()
    report.lines += [
        "",
        f"Attention backends on {device.type} ({str(dtype).removeprefix('torch.')}, causal, head dim "
        f"{PROBE_HEAD_DIM}; dense, and a sliding-window layout):",
    ]
    for backend in dispatch.BACKENDS:
        dense = _reason(report, dispatch, backend, q, causal=True)
        sparse = _reason(report, dispatch, backend, q, causal=True, layout=layout)
        if dense is None and sparse is None:
            verdict = "runs"
        elif dense is None:
            verdict = f"runs dense inputs; not layouts: {sparse}"
        else:
            verdict = f"no: {dense}"
        report.lines.append(f"  {backend.value:<14}{verdict}")
    faster = []
    for kind, kind_layout in (("dense", None), ("block-sparse", layout)):
        choice = dispatch.explain_auto(q, q, q, causal=True, layout=kind_layout)
        report.lines.append(f"  auto          {kind}: {choice.backend.value} ({choice.why})")
        faster += [_install_command(why) for _, why in choice.passed_over]
    faster = [command for command in faster if command is not None]
    if faster:
        report.lines.append(f"Faster here:  {faster[0]}")
    elif device.type == "cuda":
        report.lines.append("Faster here:  nothing to install: auto runs the first backend of its order here")
    else:
        report.lines.append(
            "Faster here:  a CUDA GPU (the fused kernels run on CUDA; on a CPU, sdpa and torch are the backends)"
        )


def _install_command(reason: str) -> Optional[str]:
    found = _INSTALL.search(reason)
    return found.group(0).rstrip(".") if found else None


def _reason(report: Report, dispatch: Any, backend: Any, q: Any, **conditions: Any) -> Optional[str]:
    """The table's reason why `backend` cannot run inputs like q here (None: it runs). A package that
    is installed but does not import is a problem (it was installed to run); one that is not
    installed is not. A check that raises is a problem, with what it raised."""
    try:
        reason = dispatch.unsupported_reason(backend, q, q, q, **conditions)
    except Exception as error:  # reported as a problem, with the error: the check of an installed package broke
        reason = f"checking it raised {type(error).__name__}: {error}"
        report.problems.append(f"backend {backend.value}: {reason}")
        return reason
    for label, distributions in PACKAGES.items():
        if reason is not None and f"{label} does not import" in reason and _version(*distributions) is not None:
            report.problems.append(
                f"{label} {_version(*distributions)} is installed but does not import, so backend "
                f"{backend.value} cannot run: {reason}"
            )
    return reason


# ----------------------------------------------------------------------- the recipes
@dataclasses.dataclass(frozen=True)
class _Plan:
    """What one kind of a recipe's layers runs here."""

    kind: str
    backend: str
    why: str


def _recipes(report: Report, torch: Any, device: Any) -> None:
    from genoformer.core.context_parallel import ContextParallelStrategy
    from genoformer.kernels import dispatch

    notes: dict[str, int] = {}
    report.lines += ["", f"Recipes ({configs_dir()}): the backend each kind of layer would use here, and why"]
    for recipe in shipped_recipes():
        try:
            described, plans = _recipe_plans(recipe.path, torch, device, dispatch, ContextParallelStrategy)
        except _NotHere as absent:
            report.lines.append(f"  {recipe.name:<28}not here: {absent}")
            continue
        except (FileNotFoundError, ValueError, TypeError, KeyError, ImportError) as error:
            missing = _missing_file(error)
            if missing is not None:
                report.lines.append(f"  {recipe.name:<28}needs a file that is not here (see the notes)")
                report.notes.append(f"{recipe.name}: {missing}")
            else:
                report.lines.append(f"  {recipe.name:<28}does not load (see the problems)")
                report.problems.append(f"recipe {recipe.name} does not load: {type(error).__name__}: {error}")
            continue
        shown = []
        for plan in plans:
            mark = notes.setdefault(plan.why, len(notes) + 1)
            shown.append(f"{plan.kind} -> {plan.backend} [{mark}]")
            if plan.backend == "cannot run":
                report.problems.append(f"recipe {recipe.name}: {plan.why}")
        report.lines.append(f"  {recipe.name:<28}{described}: {'; '.join(shown)}")
    for why, mark in notes.items():
        report.lines.append(f"  [{mark}] {why}")


def _missing_file(error: BaseException) -> Optional[BaseException]:
    """The FileNotFoundError behind `error` (the parser wraps what the model's constructor raised),
    or None: a file not here yet (a pretrained model to download) is a note, not a broken recipe."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, FileNotFoundError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class _NotHere(Exception):
    """A recipe for a device this machine does not have."""


def _recipe_plans(
    path: Path, torch: Any, device: Any, dispatch: Any, context_parallel: type
) -> tuple[str, list[_Plan]]:
    """(what the recipe runs, its plans here), or _NotHere."""
    config = compose_config(path)
    trainer = config.get("trainer") or {}
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda") and device.type != "cuda":
        twin = path.name.replace("_gpu", "_cpu")
        cpu = f" (its CPU version: {Path(twin).stem})" if twin != path.name and (path.parent / twin).is_file() else ""
        raise _NotHere(f"needs a CUDA GPU{cpu}")
    on = device if accelerator in ("gpu", "cuda", "auto") else torch.device("cpu")
    precision = str(trainer.get("precision", "32-true"))
    dtype = (
        torch.bfloat16
        if precision.startswith("bf16")
        else torch.float16
        if precision.startswith("16")
        else torch.float32
    )
    if dtype is torch.bfloat16 and on.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"cuda {precision}", [
            _Plan(
                "every layer",
                "cannot run",
                f"trainer.precision {precision} on a GPU without bfloat16: add --trainer.precision 16-mixed",
            )
        ]
    trunk = _trunk(config)
    settings = trunk.config
    strategy = _class(trainer.get("strategy"))
    ring = isinstance(strategy, type) and issubclass(strategy, context_parallel)
    length = settings.max_seq_len
    if ring:  # the ring runs each layer's attention on pairs of chunks, with their log-sum-exp
        pieces = 2 * int(((trainer.get("strategy") or {}).get("init_args") or {}).get("context_parallel", 1))
        length //= pieces
    data = (config.get("data") or {}).get("init_args") or {}
    packed = bool(data.get("pack"))
    q = _probe((1, settings.n_heads, length, settings.head_dim), dtype, on)
    k = _probe((1, settings.kv_heads, length, settings.head_dim), dtype, on)
    cu_seqlens = _probe((2,), torch.int32, on) if packed else None
    backend = dispatch.Backend(trunk.runtime.attention_backend)
    kinds: dict[str, Any] = {}
    for layer in range(settings.n_layers):
        layout = trunk.layout(layer, length)
        kinds.setdefault("dense" if layout is None else "block-sparse", layout)
    plans = []
    for kind, layout in kinds.items():
        conditions = dict(causal=settings.causal, layout=layout, cu_seqlens=cu_seqlens, return_lse=ring)
        if backend is dispatch.Backend.AUTO:
            choice = dispatch.explain_auto(q, k, k, **conditions)
            why = choice.why + "".join(f"; passed over {name.value}: {reason}" for name, reason in choice.passed_over)
            plans.append(_Plan(kind, choice.backend.value, why))
        else:
            reason = dispatch.unsupported_reason(backend, q, k, k, **conditions)
            plans.append(
                _Plan(kind, backend.value, "the recipe names it")
                if reason is None
                else _Plan(kind, "cannot run", f"its attention_backend {backend.value} cannot run here: {reason}")
            )
    described = (
        f"{on.type} {str(dtype).removeprefix('torch.')}, {'causal' if settings.causal else 'bidirectional'} "
        f"D{settings.head_dim}{', packed' if packed else ''}{', ring' if ring else ''}"
    )
    return described, plans


def _trunk(config: dict) -> Any:
    """The recipe's model built on the meta device (no memory, no weights), and its transformer
    trunk: what the model really is, the way the training command builds it."""
    import torch
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningModule
    from omegaconf import OmegaConf

    from genoformer.core.transformer import TransformerTrunk
    from genoformer.genome.lm import GenoformerLM  # the model of a config without model.class_path

    model = config.get("model") or {}
    if "class_path" not in model:
        model = {"class_path": f"{GenoformerLM.__module__}.{GenoformerLM.__qualname__}", "init_args": model}
    resolved = OmegaConf.to_container(OmegaConf.create({**config, "model": model}), resolve=True)["model"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningModule, "model", required=True)
    with warnings.catch_warnings(), torch.device("meta"), contextlib.redirect_stderr(io.StringIO()):
        # weights loaded into meta tensors (a no-op, said once per tensor), and which file a model's
        # name resolved to, are not this report's business
        warnings.simplefilter("ignore")
        module = parser.instantiate_classes(parser.parse_object({"model": resolved})).model
    return next(part for part in module.modules() if isinstance(part, TransformerTrunk))


def _class(config: Any) -> Any:
    """The class a `class_path` mapping names (None for anything else)."""
    if not isinstance(config, dict) or "class_path" not in config:
        return None
    module, _, name = str(config["class_path"]).rpartition(".")
    return getattr(importlib.import_module(module), name)
