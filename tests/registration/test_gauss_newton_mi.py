"""metric "mi" on the device (issue 24): :class:`~napari_simwarp.registration.gauss_newton.
DeviceMutualInformationProblem`'s losses, gradient and matrix against float64 autograd of
the Parzen mutual information through the warp, in float64 and under the GPU's float32
policy; the histogram's frames are the level's (the fixed level's range over its weight,
the moving level's whole range)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._sampling import affine_grid, grid_sample
from napari_simwarp.ops.losses import loss_for
from napari_simwarp.ops.mutual_information import _JointHistogram, _Parzen, score_of_joint
from napari_simwarp.registration import gauss_newton as gn
from tests.registration.test_gauss_newton import _inside_model, _ramp
from tests.registration.test_loop_budget import gpu_policy  # noqa: F401 (a fixture)

BINS = 12


def _case(kind, fixed_shape, pairs, normalize, dtype=torch.float64):
    rng = np.random.default_rng(3)
    moving_shape = tuple(2 * n for n in fixed_shape)
    model = _inside_model(rng, kind, fixed_shape, pairs, dtype, 0.3)
    moving = torch.from_numpy(_ramp(moving_shape))[None, None].to(dtype)
    fixed = torch.sin(4.0 * torch.from_numpy(_ramp(fixed_shape)))[None, None]
    fixed = (fixed + 0.05 * torch.from_numpy(rng.standard_normal(fixed.shape))).to(dtype)
    loss_fn = loss_for("mi", reduction="none", bins=BINS, normalize=normalize)
    problem = gn.level_problem(model, fixed, moving, None, loss_fn, "mi")
    return model, fixed, moving, problem


def _reference(model, fixed, moving, weight, normalize):
    """The loss ``(N,)`` in float64 through autograd's histogram (ops/mutual_information's
    differentiable one, tested against NumPy) in the level's frames, and ``θ`` (its
    ``.grad`` after ``backward``)."""
    d = model.ndim
    theta = model.flat_parameters().double().requires_grad_(True)
    matrix = model.matrix(theta[:, :d], theta[:, d:]).double()
    grid = affine_grid(matrix, tuple(moving.shape[2:]), model.fixed_shape)
    n = theta.shape[0]
    warped = grid_sample(moving.double(), grid, "linear", "nearest").reshape(n, -1)
    w = weight.double().reshape(weight.shape[0], -1).expand(n, -1)
    f = fixed.double().reshape(1, -1).expand(n, -1)
    valid = w > 0
    lo = torch.where(valid, f, np.inf).amin(1, keepdim=True)
    hi = torch.where(valid, f, -np.inf).amax(1, keepdim=True)
    m = moving.double()
    xa = (f - lo) / (hi - lo) * (BINS - 3) + 1
    xb = (warped - m.min()) / (m.max() - m.min()) * (BINS - 3) + 1
    joint = _JointHistogram.apply(xa, xb, w, _Parzen("bspline", BINS, 1.0))
    score = score_of_joint(joint, normalize)
    return (2.0 - score if normalize else -score), theta


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    "kind,fixed_shape,pairs",
    [
        ("affine", (14, 18), 1),  # at most COUPLING_PIXELS: the histogram's curvature too
        ("affine", (40, 36), 2),
        ("rigid", (8, 9, 10), 1),
        ("similarity", (40, 36), 1),
    ],
)
def test_the_device_system_is_autograds_gradient(kind, fixed_shape, pairs, normalize):
    model, fixed, moving, problem = _case(kind, fixed_shape, pairs, normalize)
    assert isinstance(problem, gn.DeviceMutualInformationProblem)
    theta = problem.start()
    samples = problem.sample(theta)
    loss = problem.loss(samples)
    hessian, gradient = problem.normal_equations(samples, theta)
    ref, ref_theta = _reference(model, fixed, moving, samples[1], normalize)
    ref.sum().backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-13)
    g = ref_theta.grad
    np.testing.assert_allclose(gradient.numpy(), g.numpy(), rtol=1e-6, atol=1e-9 * g.abs().max())
    torch.testing.assert_close(hessian, hessian.transpose(1, 2), rtol=0, atol=1e-12)
    top = torch.linalg.eigvalsh(hessian)
    assert (top[:, 0] >= -1e-10 * top[:, -1]).all()  # positive semi-definite


def test_losses_over_another_weight_are_the_reference():
    model, fixed, moving, problem = _case("affine", (30, 34), 2, True)
    theta = problem.start()
    samples = problem.sample(theta)
    other = samples[1] * torch.linspace(0.2, 1.0, samples[1].shape[-1], dtype=torch.float64)
    both = problem.losses(samples, other)
    for row, weight in zip(both, (samples[1], other)):
        torch.testing.assert_close(row, _reference(model, fixed, moving, weight, True)[0].detach())
    assert (both[0] - both[1]).abs().min() > 1e-6  # the weights matter


@pytest.mark.usefixtures("gpu_policy")
@pytest.mark.parametrize("normalize", [True, False])
def test_in_float32_the_system_is_float64s(normalize):
    """The GPU's policy: pixels, histograms, entropies and the system in float32 (no
    float64), within 1e-4 of the float64 gradient's scale."""
    model, fixed, moving, problem = _case("affine", (40, 36), 1, normalize, torch.float32)
    theta = problem.start()
    assert theta.dtype == torch.float32
    samples = problem.sample(theta)
    loss = problem.loss(samples)
    hessian, gradient = problem.normal_equations(samples, theta)
    assert loss.dtype == gradient.dtype == hessian.dtype == torch.float32
    ref, ref_theta = _reference(model, fixed, moving, samples[1], normalize)
    ref.sum().backward()
    g = ref_theta.grad
    assert abs(float(loss) - float(ref.detach())) < 1e-5
    np.testing.assert_allclose(gradient.double().numpy(), g.numpy(), atol=1e-4 * g.abs().max())
