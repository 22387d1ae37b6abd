"""simwarp::parzen_fwd / parzen_bwd (the mutual information's Parzen histogram): the CUDA
kernels (cuda/parzen.cu) against the CPU kernel (cpu/parzen.cpp), as the host shim runs
them on every run and the GPU where there is one (tests/csrc/test_host_shim.py's sides).
The CUDA side sums the histogram in the data's type with atomics where the CPU sums in
double, hence float32's tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.csrc.test_host_shim import CPU, DTYPES, side  # noqa: F401 (side: a fixture)

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def _close(ours, cpu, dtype):
    assert ours.shape == cpu.shape and ours.dtype == cpu.dtype
    finite = ~cpu.isnan()
    assert torch.equal(ours.isnan(), ~finite)
    scale = max(cpu[finite].abs().max().item(), 1e-300) if finite.any() else 1.0
    assert (ours[finite].double() - cpu[finite].double()).abs().max().item() <= TOLERANCE[
        dtype
    ] * scale


def _inputs(dtype, m=3, p=700, seed=4):
    rng = np.random.default_rng(seed)
    a = rng.random((m, p))
    b = np.cos(4 * a) + 0.3 * rng.random((m, p))
    w = rng.random((m, p)) * (rng.random((m, p)) > 0.2)
    a[2, 5] = np.nan  # row 2 scores NaN and passes no gradient
    return (torch.tensor(x, dtype=dtype) for x in (a, b, w))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("value_range", [[], [-0.5, 1.2]])
def test_parzen(side, dtype, normalize, weighted, value_range):  # noqa: F811
    a, b, w = _inputs(dtype)
    w = w if weighted else None
    ours = side.parzen_fwd(a, b, w, 16, normalize, value_range)
    cpu = CPU.parzen_fwd(a, b, w, 16, normalize, value_range)
    for x, y in zip(ours, cpu):
        _close(x, y, dtype)
    gs = torch.tensor([0.7, -1.3, 2.0], dtype=dtype)
    for x, y in zip(
        side.parzen_bwd(gs, *ours[:2], a, b, w, ours[2], 16),
        CPU.parzen_bwd(gs, *cpu[:2], a, b, w, cpu[2], 16),
    ):
        _close(x, y, dtype)
        assert x[2].abs().max().item() == 0.0


def test_parzen_empty_and_refused(side):  # noqa: F811
    a = torch.zeros(2, 0)
    for ours, cpu in zip(
        side.parzen_fwd(a, a, None, 8, True, []), CPU.parzen_fwd(a, a, None, 8, True, [])
    ):
        assert torch.equal(ours, cpu)
    with pytest.raises(RuntimeError, match="bins must be between 4 and 1024"):
        side.parzen_fwd(torch.zeros(2, 3), torch.zeros(2, 3), None, 3, True, [])
