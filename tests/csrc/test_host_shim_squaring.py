"""simwarp::squaring_fwd / squaring_bwd (scaling and squaring): the CUDA kernels
(cuda/squaring.cu) against the CPU kernel (cpu/squaring.cpp), as the host shim runs them
on every run and the GPU where there is one (tests/csrc/test_host_shim.py's sides). The
CUDA backward adds with atomics in any order, hence a tolerance."""

from __future__ import annotations

import pytest
import torch

from tests.csrc.test_host_shim import CPU, DTYPES, side  # noqa: F401 (side: a fixture)

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def _close(ours, cpu, dtype):
    assert ours.shape == cpu.shape and ours.dtype == cpu.dtype
    if cpu.numel() == 0:
        return
    scale = max(cpu.abs().max().item(), 1e-300)
    assert (ours.double() - cpu.double()).abs().max().item() <= TOLERANCE[dtype] * scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 2, 9, 11), (1, 3, 5, 6, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("steps", [0, 1, 5])
def test_squaring(side, dtype, shape, steps):  # noqa: F811
    gen = torch.Generator().manual_seed(7)
    u = (torch.randn(shape, generator=gen, dtype=torch.float64) * 1.5 + 0.3).to(dtype)
    grad = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    out, saved = side.squaring_fwd(u, steps, True)
    cpu_out, cpu_saved = CPU.squaring_fwd(u, steps, True)
    assert saved.shape == (steps, *shape)
    _close(out, cpu_out, dtype)
    _close(saved, cpu_saved, dtype)
    plain_out, nothing = side.squaring_fwd(u, steps, False)
    _close(plain_out, cpu_out, dtype)
    assert nothing.shape == (0, *shape)
    _close(side.squaring_bwd(grad, cpu_saved), CPU.squaring_bwd(grad, cpu_saved), dtype)


def test_squaring_empty_and_refused(side):  # noqa: F811
    u = torch.zeros(0, 2, 4, 5)
    out, saved = side.squaring_fwd(u, 3, True)
    assert out.shape == u.shape and saved.shape == (3, 0, 2, 4, 5)
    assert side.squaring_bwd(u, torch.zeros(3, 0, 2, 4, 5)).shape == u.shape
    with pytest.raises(RuntimeError, match="steps must be between 0 and 30"):
        side.squaring_fwd(torch.zeros(1, 2, 4, 4), 31, False)
    with pytest.raises(RuntimeError, match=r"saved must have shape"):
        side.squaring_bwd(torch.zeros(1, 2, 4, 4), torch.zeros(3, 1, 2, 4, 5))
