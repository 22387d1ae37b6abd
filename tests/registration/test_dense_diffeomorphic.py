"""DenseModel("diffeomorphic").warp (the velocity integrated by ops/integrate_velocity.py's
one autograd Function, the level's grid as one product) against the definition written
with the separate ops: scaling and squaring by ``resample_field``, bilinear upsampling,
``ops.warp``; values, in-bounds mask and gradients, in float64."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.ops import warp
from napari_simwarp.ops.compose import resample_field
from napari_simwarp.registration.models import DenseModel
from napari_simwarp.registration.pyramid import resize
from tests.compiled import require_compiled


def _reference(model, moving, shape):
    """(warped, in-bounds) by the definition, differentiable with respect to the field."""
    f = model.field
    cshape = f.shape[2:]
    view = (1, -1) + (1,) * model.ndim
    to_control = torch.tensor([c / n for c, n in zip(cshape, model.shape)], dtype=f.dtype)
    u = f * to_control.view(view) / 2**model.steps
    for _ in range(model.steps):
        u = u + resample_field(u, u)
    to_level = torch.tensor([m / c for m, c in zip(shape, cshape)], dtype=f.dtype)
    d = resize(u, shape) * to_level.view(view)
    warped = warp(moving.expand(f.shape[0], *moving.shape[1:]), d, padding="nearest")
    inside = torch.ones_like(d[:, :1])
    for axis, n in enumerate(shape):
        pos = torch.arange(n, dtype=d.dtype).view(
            [n if a == axis else 1 for a in range(len(shape))]
        )
        p = pos + d[:, axis].detach()
        inside = inside * ((p >= -0.5) & (p <= n - 0.5)).unsqueeze(1).to(d.dtype)
    return warped, inside


# (full shape, level, batch)
CASES = [((64, 48), (64, 48), 1), ((64, 48), (32, 24), 2), ((20, 24, 28), (20, 24, 28), 2)]


@pytest.mark.parametrize("shape,level,batch", CASES)
def test_diffeomorphic_warp_equals_the_definition(shape, level, batch):
    model = DenseModel("diffeomorphic", shape, batch, dtype=torch.float64)
    model.set_level(level)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # velocities of about ±4 px: some samples past the border
        model.field.copy_(4.0 * torch.randn(model.field.shape, generator=gen, dtype=torch.float64))
    moving = torch.rand(1, 1, *level, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, 1, *level, generator=gen, dtype=torch.float64)

    warped, valid = model.warp(moving, level)
    (grad,) = torch.autograd.grad((warped * v).sum(), model.field)
    ref_warped, ref_valid = _reference(model, moving, level)
    (ref_grad,) = torch.autograd.grad((ref_warped * v).sum(), model.field)

    torch.testing.assert_close(warped, ref_warped, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(valid, ref_valid)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-10)
    assert 0 < valid.mean() < 1
    # the same displacement as the model's displacement() (the transforms' path)
    d = model.displacement(level)
    torch.testing.assert_close(
        model.warp(moving, level)[0], warp(moving.expand(batch, -1, *level), d)
    )


def _model_on_one_path(compiled, monkeypatch, shape, batch, seed):
    """A float64 diffeomorphic model at its full level with a random velocity of about
    ±3 px, its squarings on the compiled op (``compiled``) or the torch path; and the
    generator, for the test's other inputs."""
    from napari_simwarp.ops import _kernels

    if compiled:
        require_compiled()
    monkeypatch.setattr(_kernels, "use_compiled", lambda op, *tensors: compiled)
    model = DenseModel("diffeomorphic", shape, batch, dtype=torch.float64)
    model.set_level(shape)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.field.copy_(3.0 * torch.randn(model.field.shape, generator=gen, dtype=torch.float64))
    return model, gen


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_squaring_constants_are_made_only_for_the_torch_path(compiled, monkeypatch):
    """The torch twin's grid constants (squaring_constants) are made, and kept, only where
    the twin runs; the compiled op needs none. Both paths give the definition's warp."""
    shape = (32, 40)
    model, gen = _model_on_one_path(compiled, monkeypatch, shape, 1, seed=3)
    moving = torch.rand(1, 1, *shape, generator=gen, dtype=torch.float64)

    warped, _ = model.warp(moving, shape)

    made = [key for key in model._constants if key[0] == "squaring"]
    assert bool(made) == (not compiled), model._constants.keys()
    with torch.no_grad():
        torch.testing.assert_close(
            warped, _reference(model, moving, shape)[0], rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("shape", [(40, 36), (14, 16, 18)], ids=["2d", "3d"])
def test_warp_regularized_takes_the_term_of_the_scaled_velocity(compiled, shape, monkeypatch):
    """warp_regularized(plus_one=True) of a diffeomorphic field: the regularizer of the
    scaled velocity the squarings return (its weights over the scale's squares), whose
    gradient the compiled backward adds in; against the warp and 1 + weight times the
    regularizer by differences (the definition), values and gradients, in float64."""
    model, gen = _model_on_one_path(compiled, monkeypatch, shape, 2, seed=5)
    moving = torch.rand(1, 1, *shape, generator=gen, dtype=torch.float64)
    v_warped = torch.randn(2, 1, *shape, generator=gen, dtype=torch.float64)
    v_term = torch.rand(2, generator=gen, dtype=torch.float64)
    weight = 0.7

    warped, valid, term = model.warp_regularized(moving, shape, weight, plus_one=True)
    (grad,) = torch.autograd.grad((warped * v_warped).sum() + (term * v_term).sum(), model.field)

    ref_warped, ref_valid = _reference(model, moving, shape)
    ref_term = 1.0 + weight * model.regularizer_by_differences()
    loss = (ref_warped * v_warped).sum() + (ref_term * v_term).sum()
    (ref_grad,) = torch.autograd.grad(loss, model.field)
    torch.testing.assert_close(warped, ref_warped, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(valid, ref_valid)
    torch.testing.assert_close(term, ref_term, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-10)
    assert (ref_term > 1.0 + 1e-6).all()  # the term counts
