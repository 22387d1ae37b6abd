"""The compiled scaling and squaring (simwarp::squaring_fwd / squaring_bwd,
csrc/cpu/squaring.cpp): against the torch path it replaces (grid_sampler, the twin and
fallback in ops/integrate_velocity.py), values and gradients, float32 and float64, 2-D and
3-D, with samples beyond the border; float64 gradcheck; the dispatch (issue 24)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from napari_simwarp.ops._validation import check_field
from napari_simwarp.ops.integrate_velocity import integrate_velocity, torch_squarings
from tests.compiled import require_compiled

SHAPES = [(2, 13, 17), (3, 7, 9, 8)]
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11}


@pytest.fixture(scope="module")
def calls():
    return require_compiled()


def _field(shape, dtype, amplitude=4.0, offset=2.7, batch=2):
    """A smooth field (N, D, *S) in pixels whose samples leave the image: a sinusoid of
    ``amplitude`` pixels plus ``offset`` along the first axis (not an integer, so that no
    sample position lands on a cell boundary, where bilinear's derivative jumps)."""
    d, spatial = shape[0], shape[1:]
    axes = torch.meshgrid(
        *[torch.linspace(0, 1, n, dtype=torch.float64) for n in spatial], indexing="ij"
    )
    comps = []
    for c in range(d):
        phase = sum((c + k + 1) * a for k, a in enumerate(axes))
        comps.append(amplitude * torch.sin(math.pi * phase + 0.3 * c) + (offset if c == 0 else 0))
    u = torch.stack(comps)[None].repeat(batch, *[1] * (d + 1))
    u[1:] *= -0.7  # a second field, not a copy of the first
    return u.to(dtype)


def _run(fn, u, steps, upstream, *scale):
    leaf = u.detach().clone().requires_grad_()
    out = fn(leaf, steps, *scale)
    (grad,) = torch.autograd.grad(out, leaf, upstream)
    return out.detach(), grad


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s) - 1}d")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("steps", [1, 4, 7])
def test_against_the_torch_path(calls, shape, dtype, steps):
    u = _field(shape, dtype) / 2**steps * 2  # |v| up to ~13 px: samples far beyond the border
    gen = torch.Generator().manual_seed(3)
    upstream = torch.randn(u.shape, generator=gen, dtype=torch.float64).to(dtype)
    ours = _run(calls.squarings, u, steps, upstream)
    twin = _run(torch_squarings, u, steps, upstream)
    assert ours[0].dtype == dtype and ours[0].shape == u.shape
    for a, b in zip(ours, twin):
        assert _rel(a, b) <= TOLERANCE[dtype]
    # the border matters here: some final positions are beyond the image
    pos0 = torch.arange(shape[1], dtype=dtype).view(-1, *[1] * (len(shape) - 2))
    beyond = (pos0 + twin[0][:, 0]) > shape[1] - 1
    assert beyond.any()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s) - 1}d")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("steps", [0, 1, 7])
def test_the_scale_against_the_torch_path(calls, shape, dtype, steps):
    """The scale folded into the compiled op's first squaring (each way) against the torch
    path's product with it (the DenseModel's use: control pixels per full pixel, by
    2**-steps, per component)."""
    v = _field(shape, dtype) * 2  # |v| up to ~13 px before the scale
    scale = [f / 2**steps for f in (0.75, 1.25, 0.5)[: shape[0]]]
    gen = torch.Generator().manual_seed(5)
    upstream = torch.randn(v.shape, generator=gen, dtype=torch.float64).to(dtype)
    ours = _run(calls.squarings, v, steps, upstream, scale)
    twin = _run(torch_squarings, v, steps, upstream, scale)
    for a, b in zip(ours, twin):
        assert _rel(a, b) <= TOLERANCE[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s) - 1}d")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_scaled_input_against_the_torch_path(calls, shape, dtype):
    """with_input: (squarings, u = scale · v), a loss on both; u's gradient joins the
    squarings' inside squaring_bwd (its base) where the torch path sums the two."""
    v = _field(shape, dtype) * 2
    scale = [f / 2**5 for f in (0.75, 1.25, 0.5)[: shape[0]]]
    gen = torch.Generator().manual_seed(9)
    up_out, up_u = (
        torch.randn(v.shape, generator=gen, dtype=torch.float64).to(dtype) for _ in "ab"
    )
    results = []
    for fn in (calls.squarings, torch_squarings):
        leaf = v.detach().clone().requires_grad_()
        out, u = fn(leaf, 5, scale, with_input=True)
        (grad,) = torch.autograd.grad((out * up_out).sum() + (u * up_u).sum(), leaf)
        results.append((out.detach(), u.detach(), grad))
    for a, b in zip(*results):
        assert _rel(a, b) <= TOLERANCE[dtype]
    # u alone (no gradient through the squarings) and the squarings alone
    for which in (0, 1):
        grads = []
        for fn in (calls.squarings, torch_squarings):
            leaf = v.detach().clone().requires_grad_()
            outputs = fn(leaf, 5, scale, with_input=True)
            (grad,) = torch.autograd.grad((outputs[which] * up_u).sum(), leaf)
            grads.append(grad)
        assert _rel(*grads) <= TOLERANCE[dtype]


@pytest.mark.parametrize("shape", [(2, 5, 6), (3, 4, 3, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
def test_gradcheck(calls, shape, scaled):
    u = (_field(shape, torch.float64, amplitude=1.3, offset=1.1) / 4).requires_grad_()
    scale = [0.6, 1.4, 0.9][: shape[0]] if scaled else None
    assert torch.autograd.gradcheck(
        lambda x: calls.squarings(x, 3, scale), (u,), eps=1e-7, atol=1e-6
    )
    assert torch.autograd.gradcheck(  # both outputs: the base of squaring_bwd
        lambda x: calls.squarings(x, 3, scale, with_input=True), (u,), eps=1e-7, atol=1e-6
    )


def test_no_grad_and_zero_steps(calls):
    u = _field((2, 9, 10), torch.float64) / 8
    with torch.no_grad():
        ours = calls.squarings(u.requires_grad_(), 5)
    assert not ours.requires_grad
    assert _rel(ours, torch_squarings(u.detach(), 5)) <= 1e-12
    assert torch.equal(calls.squarings(u.detach(), 0), u.detach())


def test_bad_arguments_are_refused_with_their_name(calls):
    with pytest.raises(ValueError, match="steps must be between 0 and 30"):
        calls.squarings(torch.zeros(1, 2, 4, 4), 31)
    with pytest.raises(ValueError, match=r"u must be \(N, 2, H, W\)"):
        calls.squarings(torch.zeros(1, 3, 4, 4), 2)
    with pytest.raises(TypeError, match="u must be float32 or float64"):
        calls.squarings(torch.zeros(1, 2, 4, 4, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match=r"scale must hold one factor per component \(2\)"):
        calls.squarings(torch.zeros(1, 2, 4, 4), 2, [1.0])


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_integrate_velocity_runs_one_op_each_way(calls, monkeypatch):
    monkeypatch.delenv("SIMWARP_BACKEND", raising=False)
    v = _field((2, 11, 12), torch.float32).requires_grad_()
    with _Ops() as ops:
        out = integrate_velocity(v, 7)
    assert "simwarp.squaring_fwd" in ops.names and "aten.grid_sampler" not in ops.names
    with _Ops() as checks:  # the input check's own ops (its finite test)
        check_field(v, "v")
    for name in ("aten.div", "aten.mul"):  # the scale by 2**-7: folded into the op
        assert ops.names.count(name) == checks.names.count(name), name
    with _Ops() as ops:
        out.backward(torch.ones_like(out))
    assert ops.names.count("simwarp.squaring_bwd") == 1
    assert not any("grid_sampler" in n or n == "aten.mul" for n in ops.names)
    with torch.no_grad():
        twin = torch_squarings(v.detach() / 2**7, 7)
    assert _rel(out.detach(), twin) <= 2e-5
