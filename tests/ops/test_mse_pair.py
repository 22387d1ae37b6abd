"""The registration loop's mean squared difference (ops/_mse_pair.py) against MSELoss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._mse_pair import PairMSELoss
from napari_simwarp.ops.losses import MSELoss
from tests.ops.test_ncc_pair import _loss_and_gradient, _pairs


@pytest.mark.parametrize("shape,fixed_pairs", [((40, 36), 3), ((40, 36), 1), ((12, 14, 10), 3)])
def test_loss_and_gradient_match_mseloss_in_float64(shape, fixed_pairs):
    fixed, moving, weight = (x.double() for x in _pairs(shape))
    fixed = fixed[:fixed_pairs]
    v = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    expected = _loss_and_gradient(MSELoss(reduction="none"), fixed, moving, weight, v)
    loss, grad = _loss_and_gradient(PairMSELoss(), fixed, moving, weight, v)
    np.testing.assert_allclose(loss, expected[0], rtol=1e-12, atol=0)
    np.testing.assert_allclose(grad, expected[1], rtol=0, atol=1e-12 * np.abs(expected[1]).max())


def test_float32_sums_stay_close_to_float64():
    fixed, moving, weight = _pairs((128, 128), n=2, seed=3)
    v = torch.ones(2)
    expected = _loss_and_gradient(
        MSELoss(reduction="none"), fixed.double(), moving.double(), weight.double(), v.double()
    )
    loss, grad = _loss_and_gradient(PairMSELoss(), fixed, moving, weight, v)
    general = _loss_and_gradient(MSELoss(reduction="none"), fixed, moving, weight, v)
    np.testing.assert_allclose(loss, expected[0], rtol=1e-6, atol=0)
    np.testing.assert_allclose(grad, expected[1], rtol=0, atol=1e-6 * np.abs(expected[1]).max())
    assert np.abs(loss - expected[0]).max() <= max(1e-9, 4 * np.abs(general[0] - expected[0]).max())


def test_gradcheck_in_float64():
    fixed, moving, weight = (x.double() for x in _pairs((11, 9), n=2, seed=1))
    loss_fn = PairMSELoss()
    moving.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed, m, weight), (moving,))
    assert torch.autograd.gradcheck(lambda m: loss_fn(fixed[:1], m, weight[:1]), (moving,))


def test_a_zero_weight_is_mseloss_floor_and_nan_stays_in_its_pair():
    fixed, moving, weight = _pairs((16, 16))
    weight[1] = 0.0
    moving[2, 0, 3, 4] = float("nan")
    expected = MSELoss(reduction="none")(fixed, moving, weight)
    loss = PairMSELoss()(fixed, moving, weight)
    assert float(loss[1]) == 0.0 and torch.isnan(loss[2]) and torch.isnan(expected[2])
    torch.testing.assert_close(loss[:2], expected[:2], rtol=1e-6, atol=0)


def test_a_second_call_before_the_first_backward_keeps_the_first_gradient():
    fixed, moving, weight = _pairs((32, 28), seed=7)
    loss_fn = PairMSELoss()
    other = moving.flip(-1) * 0.5
    a, b = moving.clone().requires_grad_(True), other.clone().requires_grad_(True)
    first, second = loss_fn(fixed, a, weight), loss_fn(fixed, b, weight)
    (grad_a,) = torch.autograd.grad(first.sum(), a)
    (grad_b,) = torch.autograd.grad(second.sum(), b)
    v = torch.ones(3)
    for x, grad in ((moving, grad_a), (other, grad_b)):
        _, expected = _loss_and_gradient(MSELoss(reduction="none"), fixed, x, weight, v)
        np.testing.assert_allclose(grad.numpy(), expected, atol=1e-6 * np.abs(expected).max())


def test_what_it_does_not_cover_goes_to_mseloss():
    fixed, moving, weight = _pairs((20, 20), n=2)
    torch.testing.assert_close(PairMSELoss()(fixed, moving), MSELoss("none")(fixed, moving))
    two, moving2 = fixed.expand(-1, 2, -1, -1), moving.expand(-1, 2, -1, -1)
    torch.testing.assert_close(
        PairMSELoss()(two, moving2, weight), MSELoss("none")(two, moving2, weight)
    )
    assert PairMSELoss(reduction="mean")(fixed, moving, weight).dim() == 0
