"""The self-check (ops/_kernels/self_check.py): each compiled primitive against its pure
torch twin, values and gradients, and what a wrong or failing kernel gives.

It runs on CUDA in production; here the CPU kernels stand in for the device's (the check
itself is device-generic), and monkeypatched kernels stand in for broken ones.
"""

from __future__ import annotations

import math

import pytest
import torch

from napari_simwarp.ops._kernels import calls, self_check
from tests.compiled import require_compiled

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernels():
    return require_compiled()


def test_every_op_passes_with_sound_kernels(kernels):
    results = self_check.check_device(CPU)
    assert set(results) == set(self_check.PRIMITIVES)
    for op, check in results.items():
        assert check.passed, (op, check.reason)
        # The compiled and torch paths agree far inside the tolerance: the figures are real
        # differences (not 0), and small ones.
        assert 0 < check.error < check.tolerance / 10, (op, check.error)
        assert check.reason == "" and check.seconds > 0


def test_runs_whatever_the_callers_context(kernels):
    # It runs at the first use of an op, maybe inside no_grad, inference_mode or
    # deterministic mode, which must neither break it nor leak out of it.
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with torch.inference_mode(), torch.no_grad():
            results = self_check.check_device(CPU)
            assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before)
    assert all(check.passed for check in results.values()), results


def test_a_wrong_primitive_fails_the_ops_that_use_it(kernels, monkeypatch):
    real = calls.box_sum
    monkeypatch.setattr(calls, "box_sum", lambda x, w, full=False: real(x, w, full) * (1 + 1e-3))
    results = self_check.check_device(CPU)
    for op in ("ssim", "local_ncc"):
        assert not results[op].passed
        assert "box_sum differs from the pure torch path by 0.001 in float32" in results[op].reason
        assert results[op].error == pytest.approx(1e-3, rel=1e-2)
    assert results["local_std"].passed and results["splat"].passed


def test_a_primitive_that_raises_fails_with_the_error(kernels, monkeypatch):
    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")

    monkeypatch.setattr(calls, "splat_fwd", broken)
    check = self_check.check_device(CPU)["splat"]
    assert not check.passed and math.isnan(check.error)
    assert check.reason == (
        "splat failed to run: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_nan_and_wrong_shapes_fail(kernels, monkeypatch):
    monkeypatch.setattr(
        calls,
        "moments5",
        lambda c, taps: [m * math.nan for m in self_check._reference.moments5(c, taps)],
    )
    assert not self_check.check_primitive("moments5", CPU).passed
    assert self_check.relative_difference(torch.zeros(3), torch.zeros(4)) == math.inf
    assert self_check.relative_difference(torch.ones(3), torch.zeros(3)) == 1.0


def test_combine_keeps_the_worst_figures():
    good = self_check.Check(True, 1e-7, 1e-4, seconds=0.5)
    close = self_check.Check(True, 1e-12, 1e-10, seconds=0.25)
    bad = self_check.Check(False, 2.0, 1e-4, "x differs", seconds=1.0)
    assert self_check.combine([good, close]) == self_check.Check(True, 1e-12, 1e-10, "", 0.75)
    assert self_check.combine([good, bad]) == self_check.Check(False, 2.0, 1e-4, "x differs", 1.5)
