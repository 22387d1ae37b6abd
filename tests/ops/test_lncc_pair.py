"""The registration loop's local NCC loss (ops/_lncc_pair.py) against the general operator.

The reference is :class:`~napari_simwarp.ops.losses.LocalNCCLoss` (``ops.local_ncc``,
itself checked against SciPy in test_local_ncc.py) and, for the GPU's float32 sums, the
same loss computed from float64 data.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops._lncc_pair import PairLocalNCCLoss, reflect_index
from napari_simwarp.ops.losses import LocalNCCLoss
from tests.images import random_smooth

pytestmark = pytest.mark.usefixtures("backend")


def _pairs(shape, n=3, seed=0):
    """``n`` fixed images and moving images related to them (normalized to about [0, 1], as
    the registration gives them), and a 0..1 weight, float32 ``(n, 1, *S)``."""
    rng = np.random.default_rng(seed)
    fixed = np.stack([random_smooth(rng, shape, 2.0) for _ in range(n)])
    other = np.stack([random_smooth(rng, shape, 3.0) for _ in range(n)])
    moving = 0.7 * fixed + 0.3 * other + 0.2
    weight = np.clip(rng.uniform(-0.3, 1.3, fixed.shape), 0, 1)
    return (torch.from_numpy(x).float()[:, None] for x in (fixed, moving, weight))


def test_reflect_index_is_scipys_reflect_padding():
    x = np.arange(5 * 7).reshape(5, 7)
    padded = x.ravel()[reflect_index((5, 7), (5, 3))].reshape(5 + 4, 7 + 2)
    np.testing.assert_array_equal(padded, np.pad(x, ((2, 2), (1, 1)), mode="symmetric"))


@pytest.mark.parametrize(
    "shape,window,fixed_pairs",
    [((40, 36), 9, 3), ((40, 36), (7, 5), 1), ((12, 14, 10), 5, 3)],
)
@pytest.mark.parametrize("weighted", [True, False])
def test_loss_and_gradient_match_the_general_operator(shape, window, fixed_pairs, weighted):
    """On the CPU both sum in float64; the general operator averages its float32 map in
    float32 (a few 1e-7 of rounding), this one in float64."""
    fixed, moving, weight = _pairs(shape)
    fixed = fixed[:fixed_pairs]
    weight = weight if weighted else None
    expected_loss, expected_grad = _loss_and_gradient(
        LocalNCCLoss(window=window, reduction="none"), fixed, moving, weight
    )
    loss, grad = _loss_and_gradient(PairLocalNCCLoss(window=window), fixed, moving, weight)
    np.testing.assert_allclose(loss, expected_loss, rtol=0, atol=1e-6)
    scale = np.abs(expected_grad).max()
    np.testing.assert_allclose(grad, expected_grad, rtol=0, atol=1e-5 * scale)


def _loss_and_gradient(loss_fn, fixed, moving, weight):
    moving = moving.clone().requires_grad_(True)
    loss = loss_fn(fixed, moving, weight)
    (grad,) = torch.autograd.grad(loss.sum(), moving)
    return loss.detach().double().numpy(), grad.double().numpy()


@pytest.mark.usefixtures("float32_moments")
def test_float32_sums_stay_close_to_float64():
    """The GPU's float32 sums (centered on each image's mean, no per-tile centering) against
    the loss of float64 data: within 1e-5 of the loss and 2e-3 of the gradient's scale on
    registration-like images (smooth, normalized); the general operator's tiles do no
    better than 1e-5 on the loss."""
    fixed, moving, weight = _pairs((64, 64), seed=4)
    expected_loss, expected_grad = _loss_and_gradient(
        LocalNCCLoss(window=9, reduction="none"), fixed.double(), moving.double(), weight.double()
    )
    loss, grad = _loss_and_gradient(PairLocalNCCLoss(window=9), fixed, moving, weight)
    np.testing.assert_allclose(loss, expected_loss, rtol=0, atol=1e-5)
    scale = np.abs(expected_grad).max()
    np.testing.assert_allclose(grad, expected_grad, rtol=0, atol=2e-3 * scale)
    tiled, _ = _loss_and_gradient(LocalNCCLoss(window=9, reduction="none"), fixed, moving, weight)
    assert np.abs(loss - expected_loss).max() <= max(1e-5, 4 * np.abs(tiled - expected_loss).max())


def test_gradcheck_in_float64():
    fixed, moving, weight = (x.double() for x in _pairs((11, 9), n=2, seed=1))
    loss_fn = PairLocalNCCLoss(window=5)
    moving.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed, m, weight), (moving,))
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed[:1], m, None), (moving,))


def test_a_flat_window_gives_zero_and_no_nan():
    """Flat windows: NCC 0 and zero gradient, as the general operator gives them."""
    fixed, moving, weight = _pairs((30, 30), n=1)
    moving[..., :12, :] = 0.5  # a flat band, wider than the window
    fixed[..., 20:, :] = 0.25
    expected_loss, expected_grad = _loss_and_gradient(
        LocalNCCLoss(window=7, reduction="none"), fixed, moving, weight
    )
    loss, grad = _loss_and_gradient(PairLocalNCCLoss(window=7), fixed, moving, weight)
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(loss, expected_loss, atol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, atol=1e-5 * np.abs(expected_grad).max())


def test_a_non_finite_pixel_makes_its_pair_nan_only():
    fixed, moving, weight = _pairs((24, 24))
    moving[1, 0, 5, 7] = float("nan")
    expected = LocalNCCLoss(window=5, reduction="none")(fixed, moving, weight)
    loss = PairLocalNCCLoss(window=5)(fixed, moving, weight)
    assert torch.isnan(expected[1]) and torch.isnan(loss[1])
    np.testing.assert_allclose(loss[[0, 2]], expected[[0, 2]], atol=1e-6)


def test_the_fixed_side_is_made_once_and_again_when_the_fixed_image_changes():
    from tests._dispatch_count import DispatchCounter

    fixed, moving, weight = _pairs((32, 32))
    loss_fn = PairLocalNCCLoss(window=7)
    first = loss_fn(fixed, moving, weight)
    with DispatchCounter() as again:
        second = loss_fn(fixed, moving, weight)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    assert again.syncs == 0
    with DispatchCounter() as fresh:
        PairLocalNCCLoss(window=7)(fixed, moving, weight)
    # the side's making: its window sums, and reads of the two scales
    assert fresh.syncs == 2 and again.launches < fresh.launches
    # the fixed tensor changed in place: its side is made again
    fixed.mul_(0.5).add_(ndi.gaussian_filter(np.ones((32, 32)), 1.0)[0, 0])
    expected = LocalNCCLoss(window=7, reduction="none")(fixed, moving, weight)
    np.testing.assert_allclose(loss_fn(fixed, moving, weight), expected, atol=1e-6)


def test_what_it_does_not_cover_goes_to_the_general_operator():
    rng = np.random.default_rng(2)
    fixed = torch.from_numpy(np.stack([random_smooth(rng, (20, 20)) for _ in range(2)])).float()
    moving = fixed.flip(-1)
    fixed, moving = fixed[None], moving[None]  # (1, 2 channels, H, W)
    expected = LocalNCCLoss(window=5, reduction="none")(fixed, moving)
    torch.testing.assert_close(PairLocalNCCLoss(window=5)(fixed, moving), expected)


def test_a_prepared_moving_image_gives_the_same_loss_and_gradient():
    """prepare_moving centers and scales the moving image before the warp: the local NCC
    and its gradient with respect to the warped image (times the scale) do not change."""
    fixed, moving, weight = _pairs((40, 36), seed=5)
    expected_loss, expected_grad = _loss_and_gradient(
        LocalNCCLoss(window=9, reduction="none"), fixed, moving, weight
    )
    loss_fn = PairLocalNCCLoss(window=9)
    raw = moving.clone().requires_grad_(True)
    prepared = loss_fn.prepare_moving(raw)  # differentiable: the chain rule holds the scale
    assert prepared.dtype == moving.dtype and not prepared.requires_grad
    assert abs(float(prepared.mean())) < 1e-6 and 0.5 <= float(prepared.abs().max()) <= 1.0
    scale = float((prepared[0] - prepared[0].mean()).abs().max()) / float(
        (moving[0] - moving[0].mean()).abs().max()
    )
    loss, grad = _loss_and_gradient(loss_fn, fixed, prepared, weight)
    np.testing.assert_allclose(loss, expected_loss, rtol=0, atol=1e-6)
    # ∂L/∂moving = scale · ∂L/∂prepared
    np.testing.assert_allclose(
        scale * grad, expected_grad, rtol=0, atol=1e-5 * np.abs(expected_grad).max()
    )


def test_base_replaces_the_one_and_takes_its_gradient():
    fixed, moving, weight = (x.double() for x in _pairs((24, 20), seed=6))
    loss_fn = PairLocalNCCLoss(window=5)
    base = torch.tensor([1.5, 0.25, 3.0], dtype=torch.float64, requires_grad=True)
    plain = loss_fn(fixed, moving, weight)
    with_base = loss_fn(fixed, moving, weight, base=base)
    torch.testing.assert_close(with_base, plain + base - 1.0)
    v = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    (grad,) = torch.autograd.grad((with_base * v).sum(), base)
    torch.testing.assert_close(grad, v)
    with pytest.raises(ValueError, match="base needs reduction='none'"):
        PairLocalNCCLoss(window=5, reduction="mean")(fixed, moving, weight, base=base)
    # the general path (two channels) adds it too
    two = fixed.expand(-1, 2, -1, -1)
    general = loss_fn(two, moving.expand(-1, 2, -1, -1), None, base=base)
    expected = LocalNCCLoss(window=5, reduction="none")(two, moving.expand(-1, 2, -1, -1))
    torch.testing.assert_close(general, expected + base - 1.0)


def test_a_second_call_before_the_first_backward_keeps_the_first_gradient():
    """The loop writes each call into the same tensors; a call made while an earlier one's
    backward is pending takes tensors of its own."""
    fixed, moving, weight = _pairs((32, 28), seed=7)
    loss_fn = PairLocalNCCLoss(window=7)
    a = moving.clone().requires_grad_(True)
    b = (moving.flip(-1) * 0.5).requires_grad_(True)
    first = loss_fn(fixed, a, weight)
    second = loss_fn(fixed, b, weight)
    (grad_a,) = torch.autograd.grad(first.sum(), a)
    (grad_b,) = torch.autograd.grad(second.sum(), b)
    for x, grad in ((moving, grad_a), (moving.flip(-1) * 0.5, grad_b)):
        _, expected = _loss_and_gradient(LocalNCCLoss(window=7, reduction="none"), fixed, x, weight)
        np.testing.assert_allclose(
            grad.double().numpy(), expected, rtol=0, atol=1e-5 * np.abs(expected).max()
        )
