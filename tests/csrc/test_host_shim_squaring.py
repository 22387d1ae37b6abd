"""simwarp::squaring_fwd / squaring_bwd (scaling and squaring): the CUDA kernels
(cuda/squaring.cu) against the CPU kernel (cpu/squaring.cpp), as the host shim runs them
on every run and the GPU where there is one (tests/csrc/test_host_shim.py's sides), with
and without the scale folded into the first squaring (against the squarings of the field
scaled beforehand). The CUDA backward adds with atomics in any order, hence a tolerance."""

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


def _factors(d, scaled):
    """The op's scale argument: none, or one factor per component (not powers of two)."""
    return [0.3, 1.7, 0.55][:d] if scaled else []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 2, 9, 11), (1, 3, 5, 6, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("steps", [0, 1, 5])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
def test_squaring(side, dtype, shape, steps, scaled):  # noqa: F811
    gen = torch.Generator().manual_seed(7)
    u = (torch.randn(shape, generator=gen, dtype=torch.float64) * 1.5 + 0.3).to(dtype)
    grad = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    scale = _factors(shape[1], scaled)
    out, saved = side.squaring_fwd(u, scale, steps, True)
    cpu_out, cpu_saved = CPU.squaring_fwd(u, scale, steps, True)
    assert saved.shape == (steps, *shape)
    _close(out, cpu_out, dtype)
    _close(saved, cpu_saved, dtype)
    plain_out, nothing = side.squaring_fwd(u, scale, steps, False)
    _close(plain_out, cpu_out, dtype)
    assert nothing.shape == (0, *shape)
    _close(
        side.squaring_bwd(grad, cpu_saved, scale, None),
        CPU.squaring_bwd(grad, cpu_saved, scale, None),
        dtype,
    )
    base = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    _close(
        side.squaring_bwd(grad, cpu_saved, scale, base),
        CPU.squaring_bwd(grad, cpu_saved, scale, base),
        dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 2, 9, 11), (1, 3, 5, 6, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("steps", [0, 1, 4])
def test_the_scale_is_the_squarings_of_the_scaled_field(side, dtype, shape, steps):  # noqa: F811
    """squaring_fwd(v, s) is the squarings of s · v scaled beforehand (s · v saved first),
    and squaring_bwd(·, s, base) is s times the gradient with respect to s · v plus base."""
    gen = torch.Generator().manual_seed(11)
    v = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2.5 + 0.4).to(dtype)
    grad = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    scale = _factors(shape[1], True)
    factors = torch.tensor(scale, dtype=dtype).view(1, -1, *[1] * (len(shape) - 2))
    out, saved = side.squaring_fwd(v, scale, steps, True)
    ref_out, ref_saved = CPU.squaring_fwd((v * factors).contiguous(), [], steps, True)
    _close(out, ref_out, dtype)
    _close(saved, ref_saved, dtype)
    ref_grad = CPU.squaring_bwd(grad, ref_saved, [], None) * factors
    _close(side.squaring_bwd(grad, ref_saved, scale, None), ref_grad, dtype)
    base = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    ref_grad = (CPU.squaring_bwd(grad, ref_saved, [], None) + base) * factors
    _close(side.squaring_bwd(grad, ref_saved, scale, base), ref_grad, dtype)


def test_squaring_empty_and_refused(side):  # noqa: F811
    u = torch.zeros(0, 2, 4, 5)
    out, saved = side.squaring_fwd(u, [], 3, True)
    assert out.shape == u.shape and saved.shape == (3, 0, 2, 4, 5)
    assert side.squaring_bwd(u, torch.zeros(3, 0, 2, 4, 5), [0.5, 2.0], u).shape == u.shape
    with pytest.raises(RuntimeError, match="steps must be between 0 and 30"):
        side.squaring_fwd(torch.zeros(1, 2, 4, 4), [], 31, False)
    with pytest.raises(RuntimeError, match=r"saved must have shape"):
        side.squaring_bwd(torch.zeros(1, 2, 4, 4), torch.zeros(3, 1, 2, 4, 5), [], None)
    with pytest.raises(RuntimeError, match=r"base must have shape"):
        side.squaring_bwd(
            torch.zeros(1, 2, 4, 4), torch.zeros(2, 1, 2, 4, 4), [], torch.zeros(1, 2, 4, 5)
        )
    with pytest.raises(RuntimeError, match=r"scale must be empty or hold one factor per component"):
        side.squaring_fwd(torch.zeros(1, 2, 4, 4), [1.0, 2.0, 3.0], 2, False)
    with pytest.raises(RuntimeError, match=r"scale must be empty or hold one factor per component"):
        side.squaring_bwd(torch.zeros(1, 2, 4, 4), torch.zeros(2, 1, 2, 4, 4), [1.0], None)
