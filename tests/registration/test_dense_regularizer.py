"""DenseModel.regularizer (one convolution) against its definition by differences."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp.registration.models import DenseModel

CASES = [
    ("deformable", "bspline", (64, 48), None, (64, 48)),
    ("deformable", "bspline", (64, 48), (1.0, 3.0), (8, 6)),  # a grid of 4 × 4
    ("deformable", "bspline", (32, 40, 24), (2.0, 1.0, 1.0), (16, 20, 12)),
    ("diffeomorphic", "linear", (64, 48), (1.0, 1.5), (32, 24)),
    ("diffeomorphic", "linear", (20, 24, 28), None, (20, 24, 28)),
    ("deformable", "linear", (40, 40), None, (8, 8)),  # bending on a 2 × 2 grid
]


@pytest.mark.parametrize("kind,control,shape,spacing,level", CASES)
def test_regularizer_equals_its_definition_by_differences(kind, control, shape, spacing, level):
    model = DenseModel(
        kind, shape, 2, control=control, spacing=spacing, dtype=torch.float64,
        regularizer_kind="bending" if kind == "deformable" else "diffusion",
    )  # fmt: skip
    model.set_level(level)
    with torch.no_grad():
        model.field.copy_(
            torch.randn(model.field.shape, generator=torch.Generator().manual_seed(1))
        )
    value = model.regularizer()
    (grad,) = torch.autograd.grad(value.sum(), model.field)
    reference = model.regularizer_by_differences()
    (grad_ref,) = torch.autograd.grad(reference.sum(), model.field)
    torch.testing.assert_close(value, reference, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-15)
