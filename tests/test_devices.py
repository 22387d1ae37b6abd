"""Device resolution (_devices.py): "auto", explicit devices and the errors that name them."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp import _devices
from napari_simwarp._devices import available_devices, available_memory, resolve_device


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_devices, "_mps_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(_devices, "_mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_explicit_cpu_is_returned_as_a_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "tpu-please", 3.5])
def test_unknown_device_names_are_a_value_error_naming_them(name):
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda'") as info:
        resolve_device(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_value_error(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=f"device '{name}' was asked for but CUDA is not"):
        resolve_device(name)


def test_mps_without_mps_is_a_value_error(monkeypatch):
    monkeypatch.setattr(_devices, "_mps_available", lambda: False)
    with pytest.raises(ValueError, match="device 'mps' was asked for but Apple MPS is not"):
        resolve_device("mps")


def test_available_devices_follow_what_torch_reports(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_devices, "_mps_available", lambda: False)
    assert available_devices() == ["auto", "cpu"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert available_devices() == ["auto", "cpu", "cuda"]


def test_available_memory_on_cpu_reads_meminfo():
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    expected = int(fields["MemAvailable"].split()[0]) * 1024
    got = available_memory(torch.device("cpu"))
    # Free memory moves between the two reads; the units (kB -> bytes) must not.
    assert abs(got - expected) < 0.25 * expected
    assert available_memory(torch.device("meta")) is None
