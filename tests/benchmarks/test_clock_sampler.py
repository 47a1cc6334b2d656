"""benchmarks.common.ClockSampler: GPU clocks sampled beside the timings, with nvidia-smi faked
by a script (no GPU here)."""

from __future__ import annotations

import time
import types

import torch

from benchmarks.common import ClockSampler

UUID = "58f0c2a1-1b2c-3d4e-5f60-718293a4b5c6"


def _fake_nvidia_smi(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$@" > {tmp_path / "args"}\n'
        "while true; do echo '1980, 650.50, 61'; echo '1500, [N/A], 63'; sleep 0.01; done\n"
    )
    fake.chmod(0o755)
    return fake


def test_windows_summarise_the_samples_taken_inside_them(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid=UUID))
    sampler = ClockSampler(torch.device("cuda", 0), period_ms=10, command=str(_fake_nvidia_smi(tmp_path)))
    start = time.monotonic()
    time.sleep(0.3)
    end = time.monotonic()
    window = sampler.window(start, end)
    info = sampler.close()
    assert window["samples"] >= 4
    assert window["sm_mhz_min"] == 1500 and 1500 < window["sm_mhz"] < 1980
    assert window["power_w"] == 650.5 and window["temp_c"] == 63  # "[N/A]" power is left out, not zero
    assert info == {"period_ms": 10, "samples": len(sampler.samples), "reason": None}
    assert sampler.window(end + 100, end + 200) is None
    args = (tmp_path / "args").read_text()
    assert f"--id=GPU-{UUID}" in args and "--loop-ms=10" in args  # by UUID: CUDA_VISIBLE_DEVICES renumbers


def test_without_a_gpu_or_nvidia_smi_it_says_why(tmp_path, monkeypatch):
    sampler = ClockSampler(torch.device("cpu"))
    assert sampler.window(0.0, 1e12) is None and sampler.close()["reason"] == "not a CUDA run"
    missing = ClockSampler(torch.device("cuda", 0), command=str(tmp_path / "no-such-tool"))
    assert "is not on PATH" in missing.close()["reason"]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid=""))
    nameless = ClockSampler(torch.device("cuda", 0), command=str(_fake_nvidia_smi(tmp_path)))
    assert nameless.close()["reason"] == "no UUID for cuda:0 in its device properties"
