"""DenseModel.warp_regularized (one _SplineGrid2d, in 3-D one _SplineGrid3d) against warp()
and regularizer() apart, values and gradients, and its autograd Functions against gradcheck
in float64."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.registration.models import (
    FUSED_LAYOUT,
    DenseModel,
    _SplineGrid2d,
    _SplineGrid3d,
)

# (shape, level, batch, spacing, regularizer)
CASES = [
    ((64, 64), (64, 64), 1, None, "bending"),
    ((64, 48), (32, 24), 3, (1.0, 1.5), "bending"),
    ((40, 56), (40, 56), 2, None, "diffusion"),
    ((24, 16), (24, 16), 1, (2.0, 1.0), "bending"),  # a grid of 3 × 2 cells
    ((24, 28, 32), (24, 28, 32), 1, None, "bending"),
    ((24, 20, 32), (12, 10, 16), 2, (2.0, 1.0, 1.0), "bending"),
    ((16, 20, 24), (16, 20, 24), 2, None, "diffusion"),
]


def _model(shape, level, batch, spacing, regularizer, dtype):
    model = DenseModel(
        "deformable", shape, batch, dtype=dtype, spacing=spacing, regularizer_kind=regularizer
    )
    model.set_level(level)
    with torch.no_grad():  # about ±2 px, some samples past the border
        gen = torch.Generator().manual_seed(5)
        model.field.copy_(2.0 * torch.randn(model.field.shape, generator=gen, dtype=torch.float64))
    return model


@pytest.mark.parametrize("shape,level,batch,spacing,regularizer", CASES)
def test_warp_regularized_equals_warp_and_regularizer(shape, level, batch, spacing, regularizer):
    model = _model(shape, level, batch, spacing, regularizer, torch.float64)
    assert model.field.permute(*FUSED_LAYOUT[len(shape)]).is_contiguous()  # the stored layout
    gen = torch.Generator().manual_seed(6)
    moving = torch.rand(1, 1, *level, generator=gen, dtype=torch.float64)
    v_warped = torch.randn(batch, 1, *level, generator=gen, dtype=torch.float64)
    v_term = torch.rand(batch, generator=gen, dtype=torch.float64)
    weight = 0.7

    warped, valid, term = model.warp_regularized(moving, level, weight)
    assert term is not None  # the fused path ran
    plus = model.warp_regularized(moving, level, weight, plus_one=True)[2]
    torch.testing.assert_close(plus, 1.0 + term, rtol=1e-12, atol=1e-14)
    valid = valid.clone()  # (the model writes its next mask into the same tensor)
    (grad,) = torch.autograd.grad((warped * v_warped).sum() + (term * v_term).sum(), model.field)

    ref_warped, ref_valid = model.warp(moving, level)
    ref_term = weight * model.regularizer_by_differences()
    loss = (ref_warped * v_warped).sum() + (ref_term * v_term).sum()
    (ref_grad,) = torch.autograd.grad(loss, model.field)

    torch.testing.assert_close(warped, ref_warped, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(valid, ref_valid)
    torch.testing.assert_close(term, ref_term, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-11)
    assert 0 < valid.mean() < 1  # the mask has both kinds of pixels


def test_warp_regularized_in_float32_is_float64_rounded():
    fields = {}
    for dtype in (torch.float32, torch.float64):
        model = _model((64, 48), (64, 48), 2, None, "bending", dtype)
        moving = torch.rand(1, 1, 64, 48, generator=torch.Generator().manual_seed(2))
        warped, _, term = model.warp_regularized(moving.to(dtype), (64, 48), 4.0)
        (grad,) = torch.autograd.grad(warped.sum() + term.sum(), model.field)
        fields[dtype] = (warped, term, grad)
    for a, b in zip(fields[torch.float32], fields[torch.float64]):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch,plus_one", [(1, False), (2, False), (2, True)])
def test_spline_grid_gradcheck(batch, plus_one):
    model = _model((20, 28), (20, 28), batch, (1.0, 1.5), "bending", torch.float64)
    consts = model._fused_constants((20, 28), 0.5)
    ones = torch.ones(batch, 1, 1, dtype=torch.float64) if plus_one else None

    def fn(field):
        # the stored layout, (N, c_y, D, c_x) in memory
        field = field.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        return _SplineGrid2d.apply(field, *consts, ones)

    field = model.field.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (field,))


@pytest.mark.parametrize("batch,plus_one", [(1, False), (2, True)])
def test_spline_grid_3d_gradcheck(batch, plus_one):
    model = _model((12, 10, 14), (12, 10, 14), batch, (1.5, 1.0, 1.0), "bending", torch.float64)
    consts = model._fused_constants((12, 10, 14), 0.5)
    ones = torch.ones(batch, 1, 1, dtype=torch.float64) if plus_one else None
    order = FUSED_LAYOUT[3]

    def fn(field):
        # the stored layout, (N, c_z, c_y, D, c_x) in memory
        field = field.permute(*order).contiguous().permute(0, 3, 1, 2, 4)
        return _SplineGrid3d.apply(field, *consts, ones)

    field = model.field.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (field,))


def test_other_fields_take_the_separate_path():
    for kwargs, level in [
        (dict(kind="diffeomorphic", shape=(32, 32)), (32, 32)),
        (dict(kind="deformable", shape=(16, 16, 16), control="linear"), (16, 16, 16)),
        (dict(kind="deformable", shape=(32, 32), control="linear"), (32, 32)),
    ]:
        model = DenseModel(batch=1, **kwargs)
        model.set_level(level)
        moving = torch.rand(1, 1, *level)
        warped, _, term = model.warp_regularized(moving, level, 1.0)
        assert term is None
        torch.testing.assert_close(warped, model.warp(moving, level)[0])
    model = DenseModel("deformable", (32, 32), 1)
    model.set_level((32, 32))
    assert model.warp_regularized(torch.rand(1, 1, 32, 32), (32, 32), 0.0)[2] is None


def test_set_level_keeps_the_field_on_the_same_grid_and_refits_onto_a_finer_one():
    model = _model((64, 48), (32, 24), 2, None, "bending", torch.float32)
    before = model.field.detach().clone()
    model.set_level((32, 24))  # the same control grid: the same field, a new leaf
    assert torch.equal(model.field.detach(), before) and model.field.requires_grad
    model.set_level((64, 48))  # a finer grid: the least-squares refit, stored as before
    assert model.field.shape[2:] != before.shape[2:]
    assert model.field.permute(0, 2, 1, 3).is_contiguous()
    coarse = DenseModel("deformable", (64, 48), 2)
    coarse.set_level((32, 24))
    with torch.no_grad():
        coarse.field.copy_(before)
    # the knots nest (half the cells): the refit field gives the coarse field's
    # displacement (±2 px) up to float32 rounding
    torch.testing.assert_close(
        model.displacement((64, 48)), coarse.displacement((64, 48)), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(
    "kwargs,level",
    [
        (dict(kind="diffeomorphic", shape=(32, 40)), (32, 40)),
        (dict(kind="diffeomorphic", shape=(12, 16, 20)), (12, 16, 20)),
        (dict(kind="deformable", shape=(32, 40), control="linear"), (16, 20)),
    ],
)
def test_other_fields_give_one_plus_the_term_as_a_base(kwargs, level):
    model = DenseModel(batch=2, dtype=torch.float64, **kwargs)
    model.set_level(level)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        model.field.copy_(torch.randn(model.field.shape, generator=gen, dtype=torch.float64))
    v = torch.rand(2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    moving = torch.rand(1, 1, *level, dtype=torch.float64)
    _, _, base = model.warp_regularized(moving, level, 0.3, plus_one=True)
    (grad,) = torch.autograd.grad((base * v).sum(), model.field)
    ref = 1.0 + 0.3 * model.regularizer_by_differences()
    (ref_grad,) = torch.autograd.grad((ref * v).sum(), model.field)
    torch.testing.assert_close(base, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-14)


def test_set_level_refits_a_3d_field_in_the_fused_layout():
    model = _model((32, 16, 48), (16, 8, 24), 2, None, "bending", torch.float32)
    before = model.field.detach().clone()
    model.set_level((32, 16, 48))  # a finer grid: the least-squares refit, stored as before
    assert model.field.shape[2:] != before.shape[2:]
    assert model.field.permute(*FUSED_LAYOUT[3]).is_contiguous() and model.field.requires_grad
    coarse = DenseModel("deformable", (32, 16, 48), 2)
    coarse.set_level((16, 8, 24))
    with torch.no_grad():
        coarse.field.copy_(before)
    # the knots nest (half the cells): the same displacement up to float32 rounding
    torch.testing.assert_close(
        model.displacement((32, 16, 48)), coarse.displacement((32, 16, 48)), atol=1e-5, rtol=0
    )
