"""`genoformer doctor` on this CPU, and on GPUs and packages faked on it: torch.cuda's answers
monkeypatched, the attention inputs made as fake CUDA tensors (FakeTensorMode: what a tensor is,
without memory), flash-attn-4 put into sys.modules and importlib.metadata. The backends' answers
are the dispatch table's own; only the machine is faked."""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
import types

import pytest
import torch
from genoformer.kernels import dispatch, flash_attn_backend, triton_flash
from torch._subclasses.fake_tensor import FakeTensorMode

from genoformer import doctor, shipped
from genoformer.cli import main


def _doctor(capsys) -> tuple[int, str]:
    """(exit status, what it printed) of `genoformer doctor` as typed."""
    capsys.readouterr()
    try:
        main(["doctor"])
    except SystemExit as exit_info:
        return int(exit_info.code), capsys.readouterr().out
    return 0, capsys.readouterr().out


def _line(out: str, start: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(start)]
    return line


def test_on_this_cpu_it_names_every_backend_of_the_table_and_what_each_recipe_uses(capsys):
    status, out = _doctor(capsys)
    assert status == 0, out
    for label in ("Python", "torch", "lightning", "triton", "flash-attn 2", "flash-attn-4", "xformers", "GPU"):
        assert any(line.startswith(label) for line in out.splitlines()), label
    for backend in dispatch.BACKENDS:
        assert f"  {backend.value} " in out, backend
    assert _line(out, "  sdpa ").split()[1] == "runs"
    assert "on cpu: torch runs block-sparse layouts" in out and "Faster here:  a CUDA GPU" in out
    for recipe in shipped.shipped_recipes():
        assert f"  {recipe.name} " in out, recipe.name
    assert _line(out, "  quickstart ").split(":")[1].strip().startswith("block-sparse -> torch")
    assert "not here: needs a CUDA GPU (its CPU version: genome_8k_cpu)" in _line(out, "  genome_8k_gpu ")


@pytest.fixture
def h100(monkeypatch):
    """torch on this CPU answering as on an H100 with CUDA 12.8; attention inputs as fake CUDA tensors."""
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(
        cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(total_memory=80 * 2**30)
    )
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(triton_flash, "INTERPRETED", False)  # as imported on a GPU machine
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    real_probe = doctor._probe

    def fake_probe(shape, dtype, device):
        with mode:
            return real_probe(shape, dtype, device)

    monkeypatch.setattr(doctor, "_probe", fake_probe)
    monkeypatch.setattr(dispatch, "_logged_choices", set())
    flash_attn_backend.import_error.cache_clear()
    yield monkeypatch
    flash_attn_backend.import_error.cache_clear()


def _install_flash_attn_4(monkeypatch, *, working: bool = True) -> None:
    """flash-attn-4 as installed: the distribution's version, and `flash_attn.cute` in sys.modules
    (without its entry points when not `working`, as a partial install leaves it)."""
    package, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
    package.__path__, cute.__path__ = [], []
    if working:
        cute.flash_attn_func = cute.flash_attn_varlen_func = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "4.0.0b36" if name == "flash-attn-4" else real_version(name)
    )


def _only_recipes(monkeypatch, *names: str) -> None:
    chosen = [recipe for recipe in shipped.shipped_recipes() if recipe.name in names]
    monkeypatch.setattr(doctor, "shipped_recipes", lambda: chosen)


def test_on_an_h100_with_flash_attn_4_every_recipe_gets_the_measured_order(h100, capsys):
    _install_flash_attn_4(h100)
    status, out = _doctor(capsys)
    assert status == 0, out
    assert "NVIDIA H100 80GB HBM3, compute capability 9.0 (sm_90)" in out
    assert doctor._cudnn(90100) == "9.1.0" and doctor._cudnn(8907) == "8.9.7"
    assert _line(out, "flash-attn-4").split()[1] == "4.0.0b36"
    assert _line(out, "  flash_attn_4 ").split()[1:3] == ["runs", "dense"]  # runs dense inputs; not layouts: ...
    assert "Faster here:  nothing to install" in out
    recipe_lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and " -> " in line}
    assert "does not load" not in out and "not here" not in out
    assert {recipe.name for recipe in shipped.shipped_recipes()} <= set(recipe_lines)
    assert "cuda bfloat16, causal D64: block-sparse -> triton [" in recipe_lines["genome_8k_gpu"]
    assert "; dense -> flash_attn_4 [" in recipe_lines["genome_8k_gpu"]
    assert "first of the order measured on sm_90 that runs these inputs: flash_attn_4, gluon, triton" in out
    # the CPU recipes run on the CPU whatever the machine has
    assert "cpu float32, causal D32: block-sparse -> torch" in recipe_lines["quickstart"]
    # context parallelism: the ring needs the lse with its gradient, which flash-attn-4 does not give
    assert "flash_attn_4" not in recipe_lines["genome_1m_cp_gpu"] and ", ring:" in recipe_lines["genome_1m_cp_gpu"]


def test_on_an_h100_without_flash_attn_4_it_says_the_one_install_that_is_faster(h100, capsys):
    h100.setitem(sys.modules, "flash_attn", None)
    h100.setitem(sys.modules, "flash_attn.cute", None)
    _only_recipes(h100, "genome_8k_gpu")
    status, out = _doctor(capsys)
    assert status == 0, out  # slower is not broken
    assert "Faster here:  pip install flash-attn-4\n" in out
    assert "passed over flash_attn_4: flash-attn-4 does not import" in out


def test_an_installed_flash_attn_4_that_does_not_import_is_a_problem(h100, capsys):
    _install_flash_attn_4(h100, working=False)
    _only_recipes(h100, "genome_8k_gpu")
    status, out = _doctor(capsys)
    assert status == 1
    problems = out.split("Problems (")[1]
    assert "flash-attn-4 4.0.0b36 is installed but does not import" in problems
    assert "pip uninstall -y flash-attn-4 && pip install flash-attn-4" in problems


def test_a_bf16_recipe_on_a_gpu_without_bf16_is_a_problem(h100, capsys):
    h100.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    h100.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    h100.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    _only_recipes(h100, "genome_8k_gpu", "quickstart")
    status, out = _doctor(capsys)
    assert status == 1
    assert (
        "recipe genome_8k_gpu: trainer.precision bf16-mixed on a GPU without bfloat16: add --trainer.precision "
        "16-mixed" in out
    )
    assert "Attention backends on cuda (float16" in out  # the table asks in the GPU's own half precision
    assert "quickstart" not in out.split("Problems (")[1]


def test_a_driver_that_torch_does_not_see_is_a_problem(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else real_which(name)
    )
    _only_recipes(monkeypatch, "quickstart")
    status, out = _doctor(capsys)
    assert status == 1
    assert "torch is a CPU build: install a CUDA build (pip install torch --index-url" in out.split("Problems (")[1]
