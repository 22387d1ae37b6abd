"""Shared fixtures: device and dtype parametrization (CPU always, CUDA/MPS when present)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _devices() -> list[str]:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


@pytest.fixture(params=_devices())
def device(request) -> torch.device:
    """Every available torch device; CPU on machines without an accelerator."""
    return torch.device(request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded NumPy generator so each test sees the same data on every run."""
    return np.random.default_rng(20261122)


@pytest.fixture(params=["torch", "compiled"])
def backend(request, monkeypatch) -> str:
    """Run a test once per backend of the ops that have compiled kernels.

    "torch" forces the pure torch path; "compiled" needs the kernels (skipped where they
    cannot be built, failed instead under SIMWARP_REQUIRE_COMPILED=1).
    """
    if request.param == "compiled":
        from tests.compiled import require_compiled

        require_compiled()
    monkeypatch.setenv("SIMWARP_BACKEND", request.param)
    return request.param


@pytest.fixture
def float32_moments(monkeypatch) -> None:
    """SSIM and local NCC on float32 data take the GPU's path on the CPU too: float32 sums
    with per-tile centring (ops/_tiles.py) instead of float64 sums."""
    from napari_simwarp.ops import _numerics

    types = _numerics.FLOAT32_MOMENT_DEVICE_TYPES | {"cpu"}
    monkeypatch.setattr(_numerics, "FLOAT32_MOMENT_DEVICE_TYPES", types)
