"""The registration loop's global NCC loss (ops/_ncc_pair.py) against NCCLoss.

The reference is :class:`~napari_simwarp.ops.losses.NCCLoss` (weighted; its unweighted
form is ``ops.ncc``, checked against NumPy in test_ncc.py), in float64, and float64
itself for the GPU's float32 sums.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._ncc_pair import PairNCCLoss
from napari_simwarp.ops.losses import NCCLoss
from tests.images import random_smooth


def _pairs(shape, n=3, seed=0):
    """``n`` fixed and moving images (normalized to about [0, 1]), a 0..1 weight with some
    zeros, float32 ``(n, 1, *S)``."""
    rng = np.random.default_rng(seed)
    fixed = np.stack([random_smooth(rng, shape, 2.0) for _ in range(n)])
    other = np.stack([random_smooth(rng, shape, 3.0) for _ in range(n)])
    moving = 0.7 * fixed + 0.3 * other + 0.2
    weight = np.clip(rng.uniform(-0.3, 1.3, fixed.shape), 0, 1)
    return (torch.from_numpy(x).float()[:, None] for x in (fixed, moving, weight))


def _loss_and_gradient(loss_fn, fixed, moving, weight, v):
    moving = moving.clone().requires_grad_(True)
    loss = loss_fn(fixed, moving, weight)
    (grad,) = torch.autograd.grad((loss * v).sum(), moving)
    return loss.detach().double().numpy(), grad.double().numpy()


@pytest.mark.parametrize("shape,fixed_pairs", [((40, 36), 3), ((40, 36), 1), ((12, 14, 10), 3)])
def test_loss_and_gradient_match_nccloss_in_float64(shape, fixed_pairs):
    fixed, moving, weight = (x.double() for x in _pairs(shape))
    fixed = fixed[:fixed_pairs]
    v = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    expected = _loss_and_gradient(NCCLoss(reduction="none"), fixed, moving, weight, v)
    loss, grad = _loss_and_gradient(PairNCCLoss(), fixed, moving, weight, v)
    np.testing.assert_allclose(loss, expected[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(grad, expected[1], rtol=0, atol=1e-10 * np.abs(expected[1]).max())


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("seed", [0, 3])
def test_float32_sums_stay_close_to_float64(seed):
    """The GPU's float32 sums (images centered once, summed line by line) against float64
    data: within 3e-7 of the loss and 1e-6 of the gradient's scale, about what NCCLoss's
    own float32 sums give (measured: 1e-7 and 5e-7 on these images)."""
    fixed, moving, weight = _pairs((128, 128), n=2, seed=seed)
    v = torch.ones(2)
    expected = _loss_and_gradient(
        NCCLoss(reduction="none"), fixed.double(), moving.double(), weight.double(), v.double()
    )
    loss, grad = _loss_and_gradient(PairNCCLoss(), fixed, moving, weight, v)
    general = _loss_and_gradient(NCCLoss(reduction="none"), fixed, moving, weight, v)
    np.testing.assert_allclose(loss, expected[0], rtol=0, atol=3e-7)
    scale = np.abs(expected[1]).max()
    np.testing.assert_allclose(grad, expected[1], rtol=0, atol=1e-6 * scale)
    assert np.abs(loss - expected[0]).max() <= max(1e-7, 4 * np.abs(general[0] - expected[0]).max())


def test_gradcheck_in_float64():
    fixed, moving, weight = (x.double() for x in _pairs((11, 9), n=2, seed=1))
    loss_fn = PairNCCLoss()
    moving.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed, m, weight), (moving,))
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed[:1], m, weight[:1]), (moving,))


def test_a_flat_image_scores_zero_with_no_gradient():
    fixed, moving, weight = _pairs((30, 30), n=2)
    moving[0] = 0.5  # flat moving image
    fixed[1] = 0.25  # flat fixed image
    v = torch.ones(2)
    expected = _loss_and_gradient(NCCLoss(reduction="none"), fixed, moving, weight, v)
    loss, grad = _loss_and_gradient(PairNCCLoss(), fixed, moving, weight, v)
    np.testing.assert_allclose(loss, [1.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(loss, expected[0], atol=1e-7)
    assert np.isfinite(grad).all() and np.abs(grad).max() == 0.0


def test_a_zero_weight_is_nccloss_floor():
    fixed, moving, weight = _pairs((16, 16), n=2)
    weight[1] = 0.0
    expected = NCCLoss(reduction="none")(fixed, moving, weight)
    loss = PairNCCLoss()(fixed, moving, weight)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    assert float(loss[1]) == 1.0


def test_a_non_finite_pixel_makes_its_pair_nan_only():
    fixed, moving, weight = _pairs((24, 24))
    moving[1, 0, 5, 7] = float("nan")
    loss = PairNCCLoss()(fixed, moving, weight)
    expected = NCCLoss(reduction="none")(fixed, moving, weight)
    assert torch.isnan(loss[1]) and torch.isnan(expected[1])
    np.testing.assert_allclose(loss[[0, 2]], expected[[0, 2]], atol=1e-6)


def test_base_replaces_the_one_and_takes_its_gradient():
    fixed, moving, weight = (x.double() for x in _pairs((20, 18), seed=6))
    base = torch.tensor([1.5, 0.25, 3.0], dtype=torch.float64, requires_grad=True)
    loss_fn = PairNCCLoss()
    with_base = loss_fn(fixed, moving, weight, base=base)
    torch.testing.assert_close(with_base, loss_fn(fixed, moving, weight) + base - 1.0)
    v = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    (grad,) = torch.autograd.grad((with_base * v).sum(), base)
    torch.testing.assert_close(grad, v)
    with pytest.raises(ValueError, match="base needs reduction='none'"):
        PairNCCLoss(reduction="sum")(fixed, moving, weight, base=base)


def test_a_second_call_before_the_first_backward_keeps_the_first_gradient():
    fixed, moving, weight = _pairs((32, 28), seed=7)
    loss_fn = PairNCCLoss()
    other = moving.flip(-1) * 0.5
    a, b = moving.clone().requires_grad_(True), other.clone().requires_grad_(True)
    first, second = loss_fn(fixed, a, weight), loss_fn(fixed, b, weight)
    (grad_a,) = torch.autograd.grad(first.sum(), a)
    (grad_b,) = torch.autograd.grad(second.sum(), b)
    v = torch.ones(3)
    for x, grad in ((moving, grad_a), (other, grad_b)):
        _, expected = _loss_and_gradient(NCCLoss(reduction="none"), fixed, x, weight, v)
        np.testing.assert_allclose(grad.numpy(), expected, atol=1e-5 * np.abs(expected).max())


def test_what_it_does_not_cover_goes_to_nccloss():
    fixed, moving, weight = _pairs((20, 20), n=2)
    expected = NCCLoss(reduction="none")(fixed, moving)
    torch.testing.assert_close(PairNCCLoss()(fixed, moving), expected)  # no weight
    two = fixed.expand(-1, 2, -1, -1)
    torch.testing.assert_close(
        PairNCCLoss()(two, moving.expand(-1, 2, -1, -1), weight),
        NCCLoss(reduction="none")(two, moving.expand(-1, 2, -1, -1), weight),
    )
