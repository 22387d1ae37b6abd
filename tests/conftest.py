"""Shared fixtures: device and dtype parametrisation (CPU always, CUDA/MPS when present)."""

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
