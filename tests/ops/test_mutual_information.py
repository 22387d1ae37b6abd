"""mutual_information against an independent NumPy/SciPy Parzen-window reference and
scikit-image's normalized mutual information; gradients, weights, NaN rule, checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage.metrics import normalized_mutual_information

from napari_simwarp.ops import mutual_information
from napari_simwarp.ops.mutual_information import (
    bspline_histograms,
    cell_taps,
    joint_histogram,
    joint_jacobian,
    parzen_frames,
    pixel_derivatives,
    score_curvature,
    score_of_joint,
)
from tests import images
from tests.images import random_smooth
from tests.ops.mutual_information_reference import _weights, mutual_information_reference


def _pair(rng, shape, n=1, c=1):
    a = np.stack([[random_smooth(rng, shape, 1.5) for _ in range(c)] for _ in range(n)])
    b = np.sin(3 * np.pi * a) + 0.1 * rng.standard_normal(a.shape)  # not monotonic
    return torch.from_numpy(a), torch.from_numpy(b)


@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("shape", [(24, 29), (9, 10, 11)])
def test_matches_the_numpy_reference(rng, kernel, normalize, shape):
    a, b = _pair(rng, shape, n=2, c=2)
    out = mutual_information(a, b, bins=16, kernel=kernel, sigma=0.8, normalize=normalize)
    assert out.shape == (2, 2) and out.dtype == torch.float64
    expected = [
        [
            mutual_information_reference(
                a[i, j], b[i, j], bins=16, kernel=kernel, sigma=0.8, normalize=normalize
            )
            for j in range(2)
        ]
        for i in range(2)
    ]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_weights_and_value_range_match_the_reference(rng):
    a, b = _pair(rng, (30, 26))
    weight = torch.from_numpy(rng.random((1, 1, 30, 26)) * (rng.random((30, 26)) < 0.6))
    out = mutual_information(a, b, weight=weight, value_range=(-0.5, 1.2), bins=20)
    expected = mutual_information_reference(a, b, weight, bins=20, value_range=(-0.5, 1.2))
    np.testing.assert_allclose(float(out), expected, rtol=1e-10)
    unweighted = mutual_information(a, b, value_range=(-0.5, 1.2), bins=20)
    assert abs(float(unweighted) - expected) > 1e-3  # the weight matters here


def test_narrow_gaussian_is_scikit_images_histogram(rng):
    """With intensities on the bin centers and a very narrow Gaussian, the Parzen histogram
    is the plain joint histogram scikit-image counts."""
    a = rng.integers(0, 12, (40, 36)).astype(np.float64)
    b = np.where(rng.random(a.shape) < 0.8, (a * 7) % 12, rng.integers(0, 12, a.shape))
    out = mutual_information(
        torch.from_numpy(a)[None, None],
        torch.from_numpy(b.astype(np.float64))[None, None],
        bins=12,
        kernel="gaussian",
        sigma=0.05,
        normalize=True,
    )
    np.testing.assert_allclose(float(out), normalized_mutual_information(a, b, bins=12), rtol=1e-9)


@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck(rng, kernel, normalize):
    a, b = _pair(rng, (6, 7), n=2)
    weight = torch.from_numpy(rng.random((2, 1, 6, 7)))
    a.requires_grad_()
    b.requires_grad_()
    # A fixed frame (value_range): the default frame follows the min and max, which the
    # operator holds fixed (not differentiated), while finite differences move it.
    assert torch.autograd.gradcheck(
        lambda x, y: mutual_information(
            x, y, weight=weight, bins=7, kernel=kernel, value_range=(-1.5, 1.5), normalize=normalize
        ),
        (a, b),
    )


def test_default_frame_gradient_holds_the_range_fixed(rng):
    """The default frame (each image's min and max) is not differentiated: with both
    images spanning the same range it gives the gradient of that range given explicitly."""
    a, b = _pair(rng, (12, 12))
    lo, hi = float(a.min()), float(a.max())
    b = lo + (b - b.min()) / (b.max() - b.min()) * (hi - lo)
    grads = []
    for value_range in (None, (lo, hi)):
        x = b.clone().requires_grad_()
        mutual_information(a, x, value_range=value_range).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-12)
    assert grads[0].abs().max() > 0


def test_float32_agrees_with_float64(rng):
    a, b = _pair(rng, (64, 64))
    out32 = mutual_information(a.float(), b.float())
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(float(out32), float(mutual_information(a, b)), rtol=1e-5)


def test_independent_images_share_little_information(rng):
    a, _ = _pair(rng, (64, 64))
    b = torch.from_numpy(rng.random((1, 1, 64, 64)))
    assert float(mutual_information(a, b)) < 0.1 * float(mutual_information(a, a))


def test_constant_images():
    flat = torch.full((1, 1, 8, 8), 3.0, dtype=torch.float64)
    ramp = torch.linspace(0, 1, 64, dtype=torch.float64).reshape(1, 1, 8, 8)
    assert float(mutual_information(flat, ramp)) == pytest.approx(0.0, abs=1e-12)
    # the Parzen window spreads a constant image over 3 bins: independent of anything
    assert float(mutual_information(flat, flat, normalize=True)) == pytest.approx(1.0)
    ramp.requires_grad_()
    mutual_information(flat, ramp).sum().backward()
    assert torch.isfinite(ramp.grad).all()


def test_nonfinite_pixels_give_nan_for_their_image_only(rng):
    a, b = _pair(rng, (10, 10), n=2)
    a[1, 0, 3, 3] = float("nan")
    a.requires_grad_()
    out = mutual_information(a, b)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    out[0].sum().backward()
    assert torch.isfinite(a.grad).all()


def test_inputs_are_not_modified(rng):
    a, b = _pair(rng, (10, 10))
    a0, b0 = a.clone(), b.clone()
    weight = torch.ones(1, 1, 10, 10, dtype=torch.float64)
    mutual_information(a, b, weight=weight)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    assert torch.equal(weight, torch.ones_like(weight))


def test_double_backward_is_refused(rng):
    a, b = _pair(rng, (6, 6))
    b.requires_grad_()
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.grad(mutual_information(a, b).sum(), b, create_graph=True)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(bins=3), ValueError, "bins must be at least 4"),
        (dict(bins=8.0), TypeError, "bins must be an int"),
        (dict(kernel="box"), ValueError, "kernel must be one of"),
        (dict(sigma=0), ValueError, "sigma must be positive"),
        (dict(value_range=(1, 1)), ValueError, "high > low"),
        (dict(value_range="ab"), TypeError, "value_range must be None or a pair"),
        (dict(weight=torch.ones(1, 2, 8, 8)), ValueError, r"weight must have shape \(N or 1, 1"),
        (dict(normalize=1), TypeError, "normalize must be True or False"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    a = torch.rand(1, 1, 8, 8)
    with pytest.raises(error, match=message):
        mutual_information(a, a, **kwargs)
    with pytest.raises(ValueError, match="same shape"):
        mutual_information(a, a[..., :7])


# -- the derivatives the Newton-type optimizer of registration/gauss_newton.py uses ------


def _rows(rng, m=2, p=60):
    a = rng.uniform(0, 1, (m, p))
    b = np.sin(3 * np.pi * a) + 0.1 * rng.standard_normal((m, p))
    return a, b, rng.uniform(0.2, 1.0, (m, p))


def _reference_joint(a, b, w, bins, kernel, sigma, frame_b):
    """The joint histogram of one row from the NumPy reference's Parzen weights, in the
    frame of ``a``'s range and the given frame of ``b``."""
    wa = _weights(a, bins, kernel, sigma, a.min(), a.max())
    wb = _weights(b, bins, kernel, sigma, *frame_b)
    return (w[:, None] * wa).T @ wb


@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
@pytest.mark.parametrize("normalize", [False, True])
def test_histogram_and_its_jacobian_match_the_reference(rng, kernel, normalize):
    a, b, w = _rows(rng)
    moves = rng.standard_normal((2, 3, a.shape[1]))
    # The pixels at the ends of b's range would leave it (clamped: one-sided derivatives).
    for i in range(2):
        moves[i, :, [b[i].argmin(), b[i].argmax()]] = 0.0
    bins, sigma = 9, 0.8
    as_t = torch.from_numpy
    frames = parzen_frames(as_t(a), as_t(b), as_t(w), bins, kernel, sigma)
    joint = joint_histogram(frames[0], frames[1], as_t(w), frames[3])
    derivative = joint_jacobian(*frames[:3], as_t(w), frames[3], as_t(moves))
    # The score of the histogram is the operator's.
    expected = mutual_information(
        as_t(a)[:, None, None],
        as_t(b)[:, None, None],
        weight=as_t(w)[:, None, None],
        bins=bins,
        kernel=kernel,
        sigma=sigma,
        normalize=normalize,
    )[:, 0]
    torch.testing.assert_close(score_of_joint(joint, normalize), expected, rtol=1e-12, atol=0)
    eps = 1e-6
    for i in range(2):
        frame = (b[i].min(), b[i].max())  # held fixed, as the operator holds it
        ref = _reference_joint(a[i], b[i], w[i], bins, kernel, sigma, frame)
        np.testing.assert_allclose(joint[i].numpy(), ref, atol=1e-12)
        for q in range(3):
            up, down = (
                _reference_joint(
                    a[i], b[i] + s * eps * moves[i, q], w[i], bins, kernel, sigma, frame
                )
                for s in (1, -1)
            )
            fd = (up - down) / (2 * eps)
            np.testing.assert_allclose(derivative[i, ..., q].numpy(), fd, atol=1e-6 * abs(fd).max())


@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
def test_pixel_derivatives_match_finite_differences(rng, kernel):
    """First and second derivatives of ``Σ G·J`` in each pixel of ``b`` (``G`` fixed)
    against central differences of the reference histogram, pixel by pixel."""
    a, b, w = _rows(rng, m=1, p=25)
    bins, sigma = 8, 0.8
    grad_joint = rng.standard_normal((1, bins, bins))
    as_t = torch.from_numpy
    frames = parzen_frames(as_t(a), as_t(b), as_t(w), bins, kernel, sigma)
    first, second = pixel_derivatives(*frames[:3], as_t(w), frames[3], as_t(grad_joint))
    frame = (b[0].min(), b[0].max())
    inside = np.flatnonzero((b[0] > frame[0]) & (b[0] < frame[1]))

    def total(x, k):
        y = b[0].copy()
        y[k] = x
        return (grad_joint[0] * _reference_joint(a[0], y, w[0], bins, kernel, sigma, frame)).sum()

    eps = 1e-4 * (frame[1] - frame[0])
    for k in inside:
        values = [total(b[0, k] + s * eps, k) for s in (-1, 0, 1)]
        d1 = (values[2] - values[0]) / (2 * eps)
        d2 = (values[2] - 2 * values[1] + values[0]) / eps**2
        scale = np.abs(grad_joint).max() * w[0, k] / (frame[1] - frame[0]) ** 2 * bins**2
        assert abs(first[0, k].item() - d1) < 1e-6 * scale
        assert abs(second[0, k].item() - d2) < 1e-3 * scale
    assert np.abs(second.numpy()).max() > 0


def test_histograms_over_several_weights_in_one_pass(rng):
    """bspline_histograms (the fixed taps kept, one pass for several pixel weights, as the
    Newton-type mi steps use it): each histogram is the reference histogram of its weight,
    in the frames given (a batch of 2 rows, so the rows' offsets are exercised too)."""
    a, b, w = _rows(rng)
    w2 = rng.random(w.shape) * (rng.random(w.shape) < 0.7)
    bins = 11
    as_t = torch.from_numpy
    frames = parzen_frames(as_t(a), as_t(b), as_t(w), bins, "bspline", 1.0)
    joints = bspline_histograms(
        cell_taps(frames[0], bins), frames[1], [as_t(w), None, as_t(w2)], bins
    )
    assert len(joints) == 3
    for i in range(2):
        frame = (b[i].min(), b[i].max())
        for joint, weight in zip(joints, (w[i], np.ones_like(w[i]), w2[i])):
            ref = _reference_joint(a[i], b[i], weight, bins, "bspline", 1.0, frame)
            np.testing.assert_allclose(joint[i].numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
@pytest.mark.parametrize("normalize", [False, True])
def test_score_curvature_is_autograds_second_derivative(rng, kernel, normalize):
    """The closed-form ``(∂J/∂θ)ᵀ ∂²S/∂J² (∂J/∂θ)`` against float64 autograd
    (double backward, one Hessian-vector product per direction), on histograms with
    empty bins (B-spline, 9 bins, a thin relation) and without (Gaussian)."""
    a, b, w = _rows(rng, m=2, p=200)
    bins = 9
    as_t = torch.from_numpy
    frames = parzen_frames(as_t(a), as_t(b), as_t(w), bins, kernel, 0.8)
    joint = joint_histogram(frames[0], frames[1], as_t(w), frames[3])
    moves = joint_jacobian(*frames[:3], as_t(w), frames[3], as_t(rng.standard_normal((2, 4, 200))))
    if kernel == "bspline":
        assert (joint == 0).any()  # empty bins are exercised
    got = score_curvature(joint, moves, normalize)
    leaf = joint.clone().requires_grad_()
    (grad,) = torch.autograd.grad(score_of_joint(leaf, normalize).sum(), leaf, create_graph=True)
    products = [
        torch.autograd.grad((grad * moves[..., q]).sum(), leaf, retain_graph=True)[0]
        for q in range(4)
    ]
    expected = torch.einsum("nijq,nijr->nqr", moves, torch.stack(products, -1))
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12 * expected.abs().max())
    assert expected.abs().max() > 0


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("kernel", ["bspline", "gaussian"])
@pytest.mark.parametrize("normalize", [False, True])
def test_gpu_policy_float32_agrees_with_float64_on_offset_data(rng, kernel, normalize):
    # The GPU's rule (entropies in float32, no float64) forced on the CPU, on camera-like
    # data with a large offset and a non-linear relation: the score against the
    # independent float64 reference, the gradients against float64 autograd.
    a = images.microscopy(rng, (96, 90))
    b = 30.0 * np.sqrt(a - 900.0) + rng.normal(0.0, 3.0, a.shape) + 500.0
    a32 = torch.from_numpy(a).float()[None, None].requires_grad_()
    b32 = torch.from_numpy(b).float()[None, None].requires_grad_()
    out = mutual_information(a32, b32, kernel=kernel, normalize=normalize)
    assert out.dtype == torch.float32
    ref = mutual_information_reference(a, b, kernel=kernel, normalize=normalize)
    assert abs(float(out.detach()) - ref) < 1e-5
    grads = torch.autograd.grad(out.sum(), (a32, b32))
    a64 = torch.from_numpy(a)[None, None].requires_grad_()
    b64 = torch.from_numpy(b)[None, None].requires_grad_()
    out64 = mutual_information(a64, b64, kernel=kernel, normalize=normalize)
    refs = torch.autograd.grad(out64.sum(), (a64, b64))
    for grad, grad64 in zip(grads, refs):
        assert (grad.double() - grad64).abs().max() < 1e-4 * grad64.abs().max()


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("normalize", [False, True])
def test_gpu_policy_score_curvature_in_float32_is_within_1e4_of_float64(rng, normalize):
    a, b, w = _rows(rng, m=2, p=400)
    as_t = torch.from_numpy
    frames = parzen_frames(as_t(a), as_t(b), as_t(w), 16, "bspline", 1.0)
    joint = joint_histogram(frames[0], frames[1], as_t(w), frames[3])
    moves = joint_jacobian(*frames[:3], as_t(w), frames[3], as_t(rng.standard_normal((2, 3, 400))))
    got = score_curvature(joint.float(), moves.float(), normalize)
    assert got.dtype == torch.float32
    expected = score_curvature(joint, moves, normalize)  # float64 data stays float64
    assert (got.double() - expected).abs().max() < 1e-4 * expected.abs().max()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("negate", [False, True])
def test_score_and_gradient_is_autograds_in_float64_and_float32(rng, normalize, negate):
    """The closed-form score and gradient (the device's Gauss–Newton "mi") against float64
    autograd of score_of_joint, on the filled bins (an empty bin's gradient is seen by no
    pixel), in float64 and in float32."""
    from napari_simwarp.ops.mutual_information import score_and_gradient

    joint = torch.from_numpy(rng.random((3, 12, 12)) ** 4 * 50)
    joint[0, :2] = 0.0  # empty rows: an empty marginal bin
    wide = joint.clone().requires_grad_(True)
    expected = score_of_joint(wide, normalize)
    (grad,) = torch.autograd.grad(expected.sum(), wide)
    sign = -1.0 if negate else 1.0
    filled = joint > 0
    for dtype, atol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        score, got = score_and_gradient(joint.to(dtype), normalize, negate=negate)
        assert score.dtype == got.dtype == dtype
        np.testing.assert_allclose(score.double(), expected.detach(), atol=atol, rtol=0)
        scale = grad.abs().max()
        np.testing.assert_allclose(
            got.double()[filled], sign * grad[filled], atol=atol * scale, rtol=0
        )


def test_score_and_gradient_of_an_empty_histogram():
    """Nothing counted: the normalized score 2 with a zero gradient (the op's rule), or,
    with ``empty=False`` (the Gauss–Newton loop's, three launches less), NaN."""
    from napari_simwarp.ops.mutual_information import score_and_gradient

    joint = torch.zeros(2, 8, 8, dtype=torch.float32)
    joint[1, 2:5, 3:6] = 1.0
    score, grad = score_and_gradient(joint, True)
    assert float(score[0]) == 2.0 and not grad[0].any() and torch.isfinite(score[1])
    loose, _ = score_and_gradient(joint, True, empty=False)
    assert torch.isnan(loose[0]) and float(loose[1]) == float(score[1])


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.parametrize("normalize", [True, False])
def test_a_pair_with_no_weight_scores_without_moving_a_pixel(backend, normalize, monkeypatch):
    """A pair whose weight is zero everywhere (with a value range, so its pixels fall inside
    the frame) scores a constant (2 normalized, 0 not) with a zero gradient, and leaves the
    other pair of the batch as it scores alone: a NaN there would poison that pair's
    parameters in a batched registration (review of issue 24's closed-form gradient)."""
    from napari_simwarp.ops import mutual_information

    if backend == "compiled":
        from tests.compiled import require_compiled

        require_compiled()
    else:
        monkeypatch.setenv("SIMWARP_BACKEND", "torch")
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(2, 1, 16, 16, dtype=torch.float64, generator=gen)
    b = (0.5 * a + 0.3 * torch.rand(a.shape, dtype=torch.float64, generator=gen)).requires_grad_()
    w = torch.ones_like(a)
    w[1] = 0
    kw = dict(value_range=(0.0, 1.0), bins=16, normalize=normalize)
    score = mutual_information(a, b, weight=w, **kw)
    (grad,) = torch.autograd.grad(score.sum(), b)
    assert score[1].item() == (2.0 if normalize else 0.0)
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))
    b0 = b[:1].detach().requires_grad_()
    alone = mutual_information(a[:1], b0, weight=w[:1], **kw)
    (grad0,) = torch.autograd.grad(alone.sum(), b0)
    torch.testing.assert_close(score[:1], alone)
    torch.testing.assert_close(grad[:1], grad0)
