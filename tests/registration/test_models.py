"""Transform models (registration/models.py): matrices of known parameters, warps against
SciPy at full resolution and at coarser levels, dense fields, regularizer, transforms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi
from scipy.interpolate import BSpline
from scipy.spatial.transform import Rotation

from napari_simwarp.registration.grid import Grid
from napari_simwarp.registration.models import DenseModel, LinearModel, bspline_weights
from napari_simwarp.registration.transforms import (
    AffineTransform,
    DisplacementTransform,
    VelocityTransform,
)
from tests.images import random_smooth
from tests.registration.cases import centered_affine


def _set(model: LinearModel, shift, linear=()) -> None:
    with torch.no_grad():
        model.shift.copy_(torch.as_tensor(shift, dtype=model.shift.dtype).view_as(model.shift))
        if model.linear.numel():
            model.linear.copy_(
                torch.as_tensor(linear, dtype=model.linear.dtype).view_as(model.linear)
            )


def _level_to_full(full, level) -> np.ndarray:
    """Level pixels to full-resolution pixels over the same field of view (pixel centers):
    ``p ↦ (p + 0.5) · N / n − 0.5`` per axis, as a homogeneous matrix."""
    d = len(full)
    m = np.eye(d + 1)
    for axis, (big, small) in enumerate(zip(full, level)):
        m[axis, axis] = big / small
        m[axis, d] = 0.5 * big / small - 0.5
    return m


class TestLinearModelMatrix:
    def test_translation(self):
        model = LinearModel("translation", (20, 30), (20, 30), 1, dtype=torch.float64)
        assert model.parameters() == [model.shift]
        _set(model, (2.0, -3.5))
        expected = np.array([[1, 0, 2.0], [0, 1, -3.5], [0, 0, 1]])
        np.testing.assert_allclose(model.matrix()[0].detach().numpy(), expected, atol=1e-15)

    def test_rigid_2d_rotates_about_the_center(self):
        shape = (40, 60)
        model = LinearModel("rigid", shape, shape, 1, dtype=torch.float64)
        angle, shift = 0.2, (1.5, -2.0)
        # One parameter unit moves the image's half-size radius by one pixel.
        _set(model, shift, [angle * model.radius])
        assert model.radius == 30.0
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        np.testing.assert_allclose(
            model.matrix()[0].detach().numpy(), centered_affine(rot, shift, shape), atol=1e-12
        )

    def test_rigid_3d_is_the_rotation_of_its_rotation_vector(self):
        shape = (16, 20, 24)
        model = LinearModel("rigid", shape, shape, 1, dtype=torch.float64)
        rotvec = np.array([0.1, -0.25, 0.15])
        _set(model, (0.5, 1.0, -1.5), rotvec * model.radius)
        rot = Rotation.from_rotvec(rotvec).as_matrix()
        np.testing.assert_allclose(
            model.matrix()[0].detach().numpy(),
            centered_affine(rot, (0.5, 1.0, -1.5), shape),
            atol=1e-12,
        )

    def test_similarity_scales_the_rotation(self):
        shape = (30, 30)
        model = LinearModel("similarity", shape, shape, 1, dtype=torch.float64)
        angle, scale = -0.3, 1.2
        _set(model, (0.0, 0.0), [angle * model.radius, np.log(scale) * model.radius])
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        m = model.matrix()[0].detach().numpy()
        np.testing.assert_allclose(m, centered_affine(scale * rot, (0, 0), shape), atol=1e-12)
        assert np.linalg.det(m[:2, :2]) == pytest.approx(scale**2)

    @pytest.mark.parametrize("shape", [(24, 32), (10, 12, 14)])
    def test_affine_with_an_initial_matrix(self, rng, shape):
        d = len(shape)
        model = LinearModel(
            "affine",
            shape,
            shape,
            2,
            dtype=torch.float64,
            init=centered_affine(np.diag([1.1] * d), [1.0] * d, shape),
        )
        linear = np.eye(d) + rng.normal(0, 0.1, (2, d, d))
        shift = rng.normal(0, 2, (2, d))
        _set(model, shift, (linear - np.eye(d)).reshape(2, -1) * model.radius)
        m = model.matrix().detach().numpy()
        init = centered_affine(np.diag([1.1] * d), [1.0] * d, shape)
        for n in range(2):
            np.testing.assert_allclose(
                m[n], init @ centered_affine(linear[n], shift[n], shape), atol=1e-12
            )

    def test_parameter_counts(self):
        counts = {
            kind: (
                LinearModel(kind, (8, 8), (8, 8), 1).linear.shape[1],
                LinearModel(kind, (8, 8, 8), (8, 8, 8), 1).linear.shape[1],
            )
            for kind in ("translation", "rigid", "similarity", "affine")
        }
        assert counts == {
            "translation": (0, 0),
            "rigid": (1, 3),
            "similarity": (2, 4),
            "affine": (4, 9),
        }


class TestLinearModelPhysical:
    """Models between two grids: the parameters move the sample in physical space."""

    def test_rigid_3d_rotates_the_sample_about_its_physical_center(self):
        fixed = Grid.make(3, (3.0, 0.5, 0.5), (10.0, -4.0, 2.0))
        moving = Grid.make(3, (2.0, 0.4, 0.6), (0.0, 1.0, -3.0))
        shape = (12, 60, 50)
        model = LinearModel(
            "rigid",
            shape,
            (20, 70, 40),
            1,
            dtype=torch.float64,
            fixed_grid=fixed,
            moving_grid=moving,
        )
        unit = 0.5  # the parameters count the fixed image's finest pixel size
        rotvec = np.array([0.05, -0.02, 0.08])
        _set(model, (2.0, -1.0, 0.5), rotvec * model.radius)
        # independent: y = R (x - c) + c + t in physical units, c the physical center
        rot = Rotation.from_rotvec(rotvec).as_matrix()
        center = np.array(fixed.origin) + np.array(fixed.spacing) * (np.array(shape) - 1) / 2
        physical = np.eye(4)
        physical[:3, :3] = rot
        physical[:3, 3] = center + unit * np.array([2.0, -1.0, 0.5]) - rot @ center
        pixels = moving.to_pixels() @ physical @ fixed.to_physical()
        np.testing.assert_allclose(model.matrix()[0].detach().numpy(), pixels, atol=1e-12)
        t = model.transforms()[0]
        np.testing.assert_allclose(t.physical_matrix, physical, atol=1e-12)
        assert np.allclose(np.linalg.svd(t.physical_matrix[:3, :3])[1], 1)  # rigid in space
        assert model.radius == 12 * 3.0 / 2 / unit  # the longest physical half-extent (z)

    def test_an_initial_pixel_matrix_is_kept_between_two_grids(self, rng):
        fixed, moving = Grid.make(2, (0.2, 0.3), (1.0, 2.0)), Grid.make(2, 0.5, (-1.0, 0.0))
        init = np.array([[0.5, 0.1, 3.0], [-0.05, 0.6, -2.0], [0, 0, 1]])
        model = LinearModel(
            "affine",
            (30, 40),
            (25, 20),
            1,
            init=init,
            dtype=torch.float64,
            fixed_grid=fixed,
            moving_grid=moving,
        )
        np.testing.assert_allclose(model.matrix()[0].detach().numpy(), init, atol=1e-12)


class TestLinearModelWarp:
    @pytest.mark.parametrize(
        "fixed_shape,moving_shape",
        [((40, 48), (40, 48)), ((36, 40), (44, 38)), ((16, 18, 20), (18, 16, 20))],
    )
    def test_full_resolution_equals_scipy_affine_transform(self, rng, fixed_shape, moving_shape):
        d = len(fixed_shape)
        moving = random_smooth(rng, moving_shape)
        model = LinearModel("affine", fixed_shape, moving_shape, 1, dtype=torch.float64)
        linear = np.eye(d) + rng.normal(0, 0.08, (d, d))
        _set(model, rng.normal(0, 2, d), (linear - np.eye(d)).ravel() * model.radius)
        m = model.matrix()[0].detach().numpy()
        warped, inside = model.warp(torch.from_numpy(moving)[None, None], fixed_shape)
        ref = ndi.affine_transform(moving, m, output_shape=fixed_shape, order=1, mode="nearest")
        np.testing.assert_allclose(warped[0, 0].detach().numpy(), ref, atol=1e-10)
        # In bounds: where the sample fell within half a pixel of the moving image.
        p = np.indices(fixed_shape).reshape(d, -1)
        q = m[:d, :d] @ p + m[:d, d:]
        expected = np.all((q >= -0.5) & (q <= np.array(moving_shape)[:, None] - 0.5), axis=0)
        assert 0 < expected.sum() < expected.size
        np.testing.assert_array_equal(inside[0, 0].numpy().reshape(-1), expected.astype(float))

    @pytest.mark.parametrize(
        "fixed_shape,fixed_level,moving_shape,moving_level",
        [
            ((64, 48), (16, 12), (64, 48), (16, 12)),
            ((60, 44), (30, 22), (52, 64), (13, 16)),
            ((32, 24, 40), (16, 12, 20), (32, 24, 40), (8, 6, 10)),
        ],
    )
    def test_coarser_level_equals_scipy_on_the_level(
        self, rng, fixed_shape, fixed_level, moving_shape, moving_level
    ):
        # The full-resolution matrix, expressed between the two levels' pixels (same field
        # of view, pixel centers), is what SciPy must apply to the moving level.
        d = len(fixed_shape)
        moving_lvl = random_smooth(rng, moving_level, sigma=1.5)
        model = LinearModel("rigid", fixed_shape, moving_shape, 1, dtype=torch.float64)
        _set(model, rng.normal(0, 3, d), rng.normal(0, 0.1, model.linear.shape[1]) * model.radius)
        m = model.matrix()[0].detach().numpy()
        at_level = (
            np.linalg.inv(_level_to_full(moving_shape, moving_level))
            @ m
            @ _level_to_full(fixed_shape, fixed_level)
        )
        warped, inside = model.warp(torch.from_numpy(moving_lvl)[None, None], fixed_level)
        assert warped.shape[2:] == fixed_level
        ref = ndi.affine_transform(
            moving_lvl, at_level, output_shape=fixed_level, order=1, mode="nearest"
        )
        np.testing.assert_allclose(warped[0, 0].detach().numpy(), ref, atol=1e-10)
        p = np.indices(fixed_level).reshape(d, -1)
        q = at_level[:d, :d] @ p + at_level[:d, d:]
        expected = np.all((q >= -0.5) & (q <= np.array(moving_level)[:, None] - 0.5), axis=0)
        np.testing.assert_array_equal(inside[0, 0].numpy().reshape(-1), expected.astype(float))

    def test_gradient_reaches_every_parameter(self, rng):
        model = LinearModel("affine", (20, 24), (20, 24), 1, dtype=torch.float64)
        moving = torch.from_numpy(random_smooth(rng, (20, 24)))[None, None]
        warped, _ = model.warp(moving, (20, 24))
        warped.pow(2).sum().backward()
        assert model.shift.grad.abs().min() > 0 and model.linear.grad.abs().min() > 0


class TestLinearModelJacobian:
    """``matrix_jacobian`` (Gauss–Newton's ∂M/∂θ) against float64 autograd of ``matrix``."""

    @pytest.mark.parametrize("kind", ["translation", "rigid", "similarity", "affine"])
    @pytest.mark.parametrize("ndim", [2, 3])
    def test_matches_autograd(self, rng, kind, ndim):
        fixed = Grid.make(ndim, [0.5 + 0.25 * i for i in range(ndim)], [1.0] * ndim)
        moving = Grid.make(ndim, 0.7, [-2.0] * ndim)
        shape = (20, 24, 30)[:ndim]
        init = np.eye(ndim + 1)
        init[:ndim] += 0.05 * rng.standard_normal((ndim, ndim + 1))
        model = LinearModel(kind, shape, shape, 2, init=init, fixed_grid=fixed, moving_grid=moving)
        with torch.no_grad():
            model.shift.copy_(torch.from_numpy(rng.normal(0, 2, model.shift.shape)))
            model.linear.copy_(torch.from_numpy(rng.normal(0, 3, model.linear.shape)))
        shift, linear = model.shift.detach().double(), model.linear.detach().double()
        ref = torch.autograd.functional.jacobian(model.matrix, (shift, linear))
        # (N, D+1, D+1, N, k) per argument: each pair depends on its own parameters only
        per_pair = [torch.cat([r[i, :, :, i] for r in ref], dim=-1) for i in range(2)]
        expected = torch.stack(per_pair).permute(0, 3, 1, 2)
        got = model.matrix_jacobian()
        assert got.shape == expected.shape == (2, model.flat_parameters().shape[1], *init.shape)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-12)

    def test_flat_parameters_round_trip(self):
        model = LinearModel("affine", (8, 9), (8, 9), 2)
        theta = torch.arange(12, dtype=torch.float64).view(2, 6) / 10  # 2 shifts, 4 linear
        model.set_flat_parameters(theta)
        np.testing.assert_allclose(model.flat_parameters().numpy(), theta.numpy(), atol=1e-6)
        np.testing.assert_allclose(model.shift.detach().numpy(), theta[:, :2].numpy(), atol=1e-6)


class TestLinearModelState:
    def test_restore_only_the_selected_pairs(self):
        model = LinearModel("rigid", (10, 10), (10, 10), 3, dtype=torch.float64)
        saved = model.snapshot()
        _set(model, torch.ones(3, 2), torch.full((3, 1), 2.0))
        model.restore(saved, which=torch.tensor([True, False, True]))
        np.testing.assert_array_equal(model.shift.detach().numpy(), [[0, 0], [1, 1], [0, 0]])
        np.testing.assert_array_equal(model.linear.detach().numpy(), [[0], [2], [0]])

    def test_transforms_are_affine_with_the_kind_and_matrix(self):
        model = LinearModel("similarity", (12, 14), (12, 14), 2, dtype=torch.float64)
        _set(model, torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(2, 2))
        ts = model.transforms()
        assert [type(t) for t in ts] == [AffineTransform, AffineTransform]
        assert {t.kind for t in ts} == {"similarity"}
        np.testing.assert_allclose(ts[1].matrix[:2, 2], (3.0, 4.0))
        # Given values are used without changing the model's own parameters.
        zero = model.transforms([torch.zeros(2, 2), torch.zeros(2, 2)])
        np.testing.assert_allclose(zero[0].matrix, np.eye(3), atol=1e-15)
        np.testing.assert_allclose(model.shift.detach().numpy(), [[1, 2], [3, 4]])


class TestDenseModel:
    def _model(self, kind, shape, field, **kw) -> DenseModel:
        """A model whose control field is ``field`` ``(N, D, *control)`` (full-res pixels)."""
        model = DenseModel(kind, shape, field.shape[0], dtype=torch.float64, **kw)
        model.set_level(shape)
        model.field = torch.as_tensor(field, dtype=torch.float64).clone().requires_grad_()
        return model

    def test_control_grid_size(self):
        model = DenseModel("deformable", (64, 50), 2, grid_spacing=8, control="linear")
        model.set_level((64, 50))
        assert model.field.shape == (2, 2, 8, 7) and float(model.field.abs().max()) == 0
        model.set_level((16, 13))  # coarse levels: at least 2 control points per axis
        assert model.field.shape == (2, 2, 2, 2)
        # B-spline: one knot more past each end and one more beyond (8 cells: 11 knots)
        spline = DenseModel("deformable", (64, 50), 2, grid_spacing=8, control="bspline")
        spline.set_level((64, 50))
        assert spline.field.shape == (2, 2, 11, 10)
        spline.set_level((4, 3))
        assert spline.field.shape == (2, 2, 4, 4)

    @pytest.mark.parametrize(
        "shape,level", [((64, 48), (32, 24)), ((64, 48), (64, 48)), ((24, 32, 16), (12, 16, 8))]
    )
    def test_displacement_is_the_upsampled_field_in_level_pixels(self, rng, shape, level):
        d = len(shape)
        control = tuple(n // 8 for n in shape)
        field = rng.normal(0, 2, (1, d, *control))
        model = self._model("deformable", shape, field, control="linear")
        out = model.displacement(level).detach().numpy()[0]
        assert out.shape == (d, *level)
        for axis in range(d):
            up = ndi.zoom(
                field[0, axis],
                [n / c for n, c in zip(level, control)],
                order=1,
                grid_mode=True,
                mode="nearest",
            )
            # full-resolution pixels → level pixels along this component's axis
            np.testing.assert_allclose(out[axis], up * level[axis] / shape[axis], atol=1e-10)

    def test_initial_field_is_added_in_level_pixels(self, rng):
        shape, level = (32, 40), (16, 20)
        init = rng.normal(0, 1, (2, *shape))
        model = DenseModel("deformable", shape, 1, dtype=torch.float64, init=init)
        model.set_level(level)
        out = model.displacement(level).detach().numpy()[0]
        for axis in range(2):
            down = ndi.zoom(init[axis], 0.5, order=1, grid_mode=True, mode="nearest")
            np.testing.assert_allclose(out[axis], 0.5 * down, atol=1e-10)

    def test_diffeomorphic_keeps_the_jacobian_positive_where_deformable_folds(self, rng):
        shape = (48, 48)
        field = ndi.gaussian_filter(rng.normal(size=(1, 2, 6, 6)), (0, 0, 1, 1))
        field *= 18.0 / np.abs(field).max()  # large: x + d(x) folds
        dets = {}
        for kind in ("deformable", "diffeomorphic"):
            model = self._model(kind, shape, field, control="linear")
            d = model.displacement(shape).detach().numpy()[0]
            # det(I + ∇d) by NumPy central differences
            (d00, d01), (d10, d11) = [np.gradient(c) for c in d]
            dets[kind] = (1 + d00) * (1 + d11) - d01 * d10
        assert dets["deformable"].min() < 0
        assert dets["diffeomorphic"].min() > 0

    def test_warp_follows_the_displacement_convention(self, rng):
        shape = (32, 36)
        moving = random_smooth(rng, shape)
        field = np.broadcast_to(np.array([1.5, -2.25]).reshape(1, 2, 1, 1), (1, 2, 4, 5))
        model = self._model("deformable", shape, field.copy())
        warped, inside = model.warp(torch.from_numpy(moving)[None, None], shape)
        ref = ndi.shift(moving, (-1.5, 2.25), order=1, mode="nearest")  # moving(x + d)
        np.testing.assert_allclose(warped[0, 0].detach().numpy(), ref, atol=1e-10)
        rows = np.arange(shape[0])[:, None] + 1.5
        cols = np.arange(shape[1])[None, :] - 2.25
        expected = (rows <= shape[0] - 0.5) & (cols >= -0.5)
        np.testing.assert_array_equal(inside[0, 0].numpy(), expected.astype(float))

    def test_regularizer_is_zero_for_constant_fields_and_positive_otherwise(self, rng):
        constant = np.broadcast_to(np.array([3.0, -1.0]).reshape(1, 2, 1, 1), (2, 2, 6, 5))
        model = self._model("deformable", (48, 40), constant.copy())
        np.testing.assert_allclose(model.regularizer().detach().numpy(), [0.0, 0.0], atol=1e-15)
        bumpy = constant.copy()
        bumpy[1, 0, 2, 3] += 0.5
        reg = self._model("deformable", (48, 40), bumpy).regularizer().detach().numpy()
        assert reg[0] == pytest.approx(0.0, abs=1e-15) and reg[1] > 0

    @pytest.mark.parametrize("control", [(4, 5), (8, 10), (16, 20)])
    def test_regularizer_of_a_linear_field_is_its_gradient_whatever_the_grid(self, control):
        # d(x) = G x in full-resolution pixels: the mean squared derivative over the D
        # components is Σ G_ij² / D on every control grid (the unit is full-res pixels).
        shape = (64, 80)
        g = np.array([[0.02, -0.05], [0.03, 0.01]])
        centers = [(np.arange(c) + 0.5) * n / c - 0.5 for c, n in zip(control, shape)]
        x = np.stack(np.meshgrid(*centers, indexing="ij"))
        field = np.einsum("ij,j...->i...", g, x)[None]
        model = self._model("deformable", shape, field, control="linear")
        np.testing.assert_allclose(
            model.regularizer().detach().numpy(), [(g**2).sum() / 2], rtol=1e-12
        )

    def test_regularizer_is_physical_on_anisotropic_grids(self):
        # u(x) = G x in physical units on a grid of pixel sizes (3, 0.5): the field holds
        # u in pixels (u_a / s_a) on the control nodes; the energy is Σ G_ij² / D again.
        shape, control, spacing = (20, 80), (5, 10), np.array([3.0, 0.5])
        g = np.array([[0.02, -0.05], [0.03, 0.01]])
        centers = [(np.arange(c) + 0.5) * n / c - 0.5 for c, n in zip(control, shape)]
        x = np.stack(np.meshgrid(*centers, indexing="ij")) * spacing.reshape(2, 1, 1)
        field = (np.einsum("ij,j...->i...", g, x) / spacing.reshape(2, 1, 1))[None]
        model = self._model("deformable", shape, field, spacing=tuple(spacing), control="linear")
        np.testing.assert_allclose(
            model.regularizer().detach().numpy(), [(g**2).sum() / 2], rtol=1e-12
        )

    def test_control_grid_is_isotropic_in_physical_space(self):
        # z voxels 4x deeper: nodes 8 pixels apart in y, x and 2 pixels apart in z
        for control, extra in (("linear", 0), ("bspline", 3)):
            model = DenseModel(
                "deformable", (16, 64, 64), 1, grid_spacing=8, spacing=(4, 1, 1), control=control
            )
            model.set_level((16, 64, 64))
            assert model.field.shape[2:] == (8 + extra,) * 3
            model.set_level((16, 32, 32))  # the level where z has not shrunk: 2x deeper
            assert model.field.shape[2:] == (4 + extra,) * 3

    def test_transforms_compose_the_resampling_onto_the_fixed_grid(self, rng):
        fixed, moving = Grid.make(2, 0.5, (2.0, 1.0)), Grid.make(2, (1.0, 0.8), (0.0, 3.0))
        shape, moving_shape = (40, 36), (30, 28)
        model = DenseModel(
            "diffeomorphic",
            shape,
            1,
            dtype=torch.float64,
            fixed_grid=fixed,
            moving_grid=moving,
            moving_shape=moving_shape,
        )
        model.set_level(shape)
        with torch.no_grad():
            model.field.copy_(torch.as_tensor(rng.normal(0, 0.5, model.field.shape)))
        (t,) = model.transforms()
        assert isinstance(t, DisplacementTransform) and t.moving_shape == moving_shape
        d = model.displacement(shape).detach().numpy()[0]
        x = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")).astype(float)
        onto = moving.to_pixels() @ fixed.to_physical()
        expected = np.einsum("ij,j...->i...", onto[:2, :2], x + d) + onto[:2, 2].reshape(2, 1, 1)
        np.testing.assert_allclose(t.displacement, expected - x, atol=1e-4)
        assert t.grids() == (fixed, moving)

    def test_transforms_types(self, rng):
        shape = (32, 32)
        field = rng.normal(0, 0.5, (2, 2, 4, 4))
        deformable = self._model("deformable", shape, field)
        ts = deformable.transforms()
        assert [type(t) for t in ts] == [DisplacementTransform] * 2
        np.testing.assert_allclose(
            ts[1].to_displacement(shape),
            deformable.displacement(shape)[1].detach().numpy(),
            atol=1e-5,
        )
        velocity = self._model("diffeomorphic", shape, field).transforms()
        assert [type(t) for t in velocity] == [VelocityTransform] * 2
        init = rng.normal(0, 0.5, (2, *shape))
        with_init = DenseModel("diffeomorphic", shape, 2, dtype=torch.float64, init=init)
        with_init.set_level(shape)
        assert [type(t) for t in with_init.transforms()] == [DisplacementTransform] * 2


def _spline_design(n_control: int, size: int) -> np.ndarray:
    """SciPy's cubic B-spline design matrix ``(size, n_control)`` for the knot layout of
    ``bspline_weights``: knots 1 apart in knot coordinates, basis ``k`` centered on knot
    ``k``, pixel ``x`` at ``(x + 0.5) / h + 1`` with ``h = size / (n_control - 3)``."""
    knots = np.arange(n_control + 4, dtype=float) - 2.0
    t = (np.arange(size) + 0.5) * (n_control - 3) / size + 1.0
    return BSpline.design_matrix(t, knots, 3).toarray()


def _knot_positions(n_control: int, size: int) -> np.ndarray:
    """Where the knots sit, in pixels of an axis of ``size``."""
    h = size / (n_control - 3)
    return (np.arange(n_control) - 1.0) * h - 0.5


class TestBSplineControl:
    @pytest.mark.parametrize("n_control,size", [(4, 7), (11, 64), (35, 256), (7, 30)])
    def test_weights_are_scipy_cubic_bsplines(self, n_control, size):
        w = bspline_weights(n_control, size).numpy()
        np.testing.assert_allclose(w, _spline_design(n_control, size), atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)  # partition of unity
        # Linear functions are reproduced: knot values of x give x at every pixel.
        np.testing.assert_allclose(
            w @ _knot_positions(n_control, size), np.arange(size), atol=1e-10
        )

    def test_too_few_control_points_are_refused(self):
        with pytest.raises(ValueError, match="n_control"):
            bspline_weights(3, 16)

    @pytest.mark.parametrize("shape,level", [((64, 48), (32, 24)), ((24, 32, 16), (24, 32, 16))])
    def test_displacement_is_the_tensor_spline_in_level_pixels(self, rng, shape, level):
        d = len(shape)
        control = tuple(n // 8 + 3 for n in shape)
        field = rng.normal(0, 2, (1, d, *control))
        model = DenseModel("deformable", shape, 1, dtype=torch.float64, control="bspline")
        model.field = torch.from_numpy(field).requires_grad_()
        out = model.displacement(level).detach().numpy()[0]
        designs = [_spline_design(c, n) for c, n in zip(control, level)]
        for axis in range(d):
            ref = field[0, axis]
            for a, m in enumerate(designs):  # apply each axis's design matrix
                ref = np.moveaxis(np.tensordot(m, ref, axes=([1], [a])), 0, a)
            np.testing.assert_allclose(out[axis], ref * level[axis] / shape[axis], atol=1e-10)

    @pytest.mark.parametrize("shape", [(64, 48), (32, 48, 64)])
    def test_refining_the_grid_keeps_the_field(self, rng, shape):
        # From a level to one twice as fine (whole cells on both) the knots nest: the fit
        # is exact.
        coarse = tuple(n // 2 for n in shape)
        model = DenseModel("deformable", shape, 2, dtype=torch.float64, control="bspline")
        model.set_level(coarse)
        with torch.no_grad():
            model.field.copy_(torch.from_numpy(rng.normal(0, 2, model.field.shape)))
        before = model.displacement(shape).detach().clone()
        grid = tuple(model.field.shape[2:])
        model.set_level(shape)
        assert tuple(model.field.shape[2:]) != grid and model.field.requires_grad
        np.testing.assert_allclose(model.displacement(shape).detach(), before, atol=1e-9)

    def test_gradients_match_finite_differences(self, rng):
        model = DenseModel("deformable", (20, 18, 12), 1, dtype=torch.float64, control="bspline")
        field = torch.from_numpy(rng.normal(0, 1, (1, 3, 5, 6, 4))).requires_grad_()
        model.field = field
        assert torch.autograd.gradcheck(lambda f: model.displacement((10, 9, 12), f), (field,))
        for kind in ("diffusion", "bending"):
            model.regularizer_kind = kind

            def energy(f, model=model):
                model.field = f
                return model.regularizer()

            assert torch.autograd.gradcheck(energy, (field,))

    @pytest.mark.parametrize("spacing", [(1.0, 1.0), (3.0, 0.5)])
    @pytest.mark.parametrize("p", [1, 2])
    def test_energies_of_polynomial_fields(self, spacing, p):
        # u(x) = G x + (a x_0² + b x_0 x_1) e_0 in physical units; the B-spline coefficients
        # of such a field are its knot values up to a constant (quadratics: − h²/3), so the
        # diffusion energy of the linear part is Σ G_ij² / D, and the bending energy is the
        # mean of (∂00 u)² + 2 (∂01 u)² + (∂11 u)² over the components: ((2a)² + 2 b²) / 2.
        # On a level of pixels p full-resolution pixels wide, the energies are in that
        # level's pixels (displacements and lengths both divided by p): second derivatives
        # are p times those in full-resolution pixels, so the bending energy is p² times the
        # analytic value; first derivatives do not change, nor does the diffusion energy.
        shape, spacing = (40, 64), np.asarray(spacing)
        g, a, b = np.array([[0.02, -0.05], [0.03, 0.01]]), 0.003, -0.002
        model = DenseModel(
            "deformable", shape, 1, dtype=torch.float64, control="bspline", spacing=spacing
        )
        model.set_level(tuple(n // p for n in shape))
        cshape = model.field.shape[2:]
        knots = [_knot_positions(c, n) * s for c, n, s in zip(cshape, shape, spacing)]
        x = np.stack(np.meshgrid(*knots, indexing="ij"))
        linear = np.einsum("ij,j...->i...", g, x)
        quadratic = np.zeros_like(linear)
        quadratic[0] = a * x[0] ** 2 + b * x[0] * x[1]
        for field, kind, expected in (
            (linear, "diffusion", (g**2).sum() / 2),
            (linear, "bending", 0.0),
            (quadratic, "bending", p**2 * ((2 * a) ** 2 + 2 * b**2) / 2),
        ):
            model.field = torch.from_numpy(field / spacing.reshape(2, 1, 1))[None]
            model.regularizer_kind = kind
            reg = model.regularizer().detach().numpy()
            np.testing.assert_allclose(reg, [expected], rtol=1e-10, atol=1e-15)

    def test_bad_options_are_refused(self):
        with pytest.raises(ValueError, match="control"):
            DenseModel("deformable", (16, 16), 1, control="cubic")
        with pytest.raises(ValueError, match="control"):
            DenseModel("diffeomorphic", (16, 16), 1, control="bspline")
        with pytest.raises(ValueError, match="regularizer_kind"):
            DenseModel("deformable", (16, 16), 1, regularizer_kind="tv")


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("shape", [(9, 9), (9, 13), (1, 12), (5, 6, 7)])
def test_inside_mask_is_grid_inside(shape, norm, monkeypatch):
    """The loop's in-bounds mask (limits made once; one norm on square images) against
    ops._sampling.grid_inside, on a grid that crosses every border."""
    from napari_simwarp.ops._sampling import grid_inside
    from napari_simwarp.registration import models
    from napari_simwarp.registration.models import inside_mask

    if norm:  # the GPU's form
        monkeypatch.setattr(models, "INF_NORM_DEVICE_TYPES", frozenset({"cpu"}))
    rng = np.random.default_rng(0)
    grid = torch.from_numpy(rng.uniform(-1.3, 1.3, (2, 8, 9, len(shape)))).float()
    cache = {}
    expected = grid_inside(grid, shape)
    torch.testing.assert_close(inside_mask(grid, shape, cache), expected, rtol=0, atol=0)
    torch.testing.assert_close(inside_mask(grid, shape, cache), expected, rtol=0, atol=0)


def test_linear_warp_at_a_level_is_level_matrix_of_the_full_matrix():
    """LinearModel.warp's constants made once per level against ops._sampling.level_matrix
    of the full-resolution matrix, applied as warp_affine applies it."""
    from napari_simwarp.ops._sampling import affine_grid, grid_sample, level_matrix

    rng = np.random.default_rng(1)
    model = LinearModel("affine", (40, 36), (44, 30), 2, dtype=torch.float64)
    with torch.no_grad():
        model.shift.copy_(torch.from_numpy(rng.uniform(-2, 2, (2, 2))))
        model.linear.copy_(torch.from_numpy(rng.uniform(-1, 1, (2, 4))))
    moving = torch.from_numpy(rng.uniform(0, 1, (2, 1, 22, 15)))
    warped, _ = model.warp(moving, (20, 18))
    matrix = level_matrix(model.matrix().detach(), (44, 30), (22, 15), (40, 36), (20, 18))
    expected = grid_sample(moving, affine_grid(matrix, (22, 15), (20, 18)), "linear", "nearest")
    torch.testing.assert_close(warped.detach(), expected, rtol=0, atol=1e-12)


# -- rotations in closed form (issue 24: no matrix exponential on the device) -----------


def _rotation_vectors(rng, n=6):
    """Rotation vectors from 0 and 1e-8 rad to 3 rad, random axes."""
    axes = rng.standard_normal((n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    return axes * np.array([0.0, 1e-8, 1e-3, 0.2, 1.5, 3.0])[:n, None]


def test_rodrigues_is_scipys_rotation_and_the_matrix_exponential(rng):
    from scipy.spatial.transform import Rotation

    from napari_simwarp.registration.models import rodrigues, rotation_generators

    v = _rotation_vectors(rng)
    gens = rotation_generators(3).numpy()
    for dtype, atol in ((torch.float64, 1e-14), (torch.float32, 1e-6)):
        got = rodrigues(torch.from_numpy(v).to(dtype)).double().numpy()
        skew = np.einsum("nk,kij->nij", v, gens)
        expm = torch.linalg.matrix_exp(torch.from_numpy(skew)).numpy()
        np.testing.assert_allclose(got, expm, atol=atol)
        # the generators' skew [v]× is the cross product v × ·: SciPy's rotation vector
        assert np.allclose(skew @ np.ones(3), np.cross(v, np.ones(3)))
        np.testing.assert_allclose(got, Rotation.from_rotvec(v).as_matrix(), atol=atol)


def test_rodrigues_derivatives_are_van_loans_and_autograds(rng):
    """∂R/∂v_k against the upper-right block of exp([[S, G_k], [0, S]]) (Van Loan), in
    float64 and float32 (small angles included), and autograd of R (float64)."""
    from napari_simwarp.registration.models import rodrigues, rotation_generators

    v = _rotation_vectors(rng)
    gens = rotation_generators(3)
    skew = torch.einsum("nk,kij->nij", torch.from_numpy(v), gens)
    block = torch.zeros(len(v), 3, 6, 6, dtype=torch.float64)
    block[:, :, :3, :3] = block[:, :, 3:, 3:] = skew[:, None]
    block[:, :, :3, 3:] = gens
    expected = torch.linalg.matrix_exp(block)[:, :, :3, 3:].numpy()
    for dtype, atol in ((torch.float64, 1e-13), (torch.float32, 2e-6)):
        _, got = rodrigues(torch.from_numpy(v).to(dtype), jacobian=True)
        np.testing.assert_allclose(got.double().numpy(), expected, atol=atol)
    x = torch.from_numpy(v).requires_grad_(True)
    jac = torch.autograd.functional.jacobian(lambda y: rodrigues(y), x)  # (N,3,3,N,3)
    auto = torch.stack([jac[i, :, :, i] for i in range(len(v))]).permute(0, 3, 1, 2)
    np.testing.assert_allclose(auto.numpy(), expected, atol=1e-12)
