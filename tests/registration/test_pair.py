"""register(): accuracy against known transforms on small cases, the live-use protocol,
and clear errors for bad input."""

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi
from scipy.spatial.transform import Rotation

from napari_simwarp.ops import jacobian_determinant
from napari_simwarp.registration import load_transform, register, register_iter
from napari_simwarp.registration.grid import Grid
from napari_simwarp.registration.transforms import AffineTransform, DisplacementTransform
from tests.registration.cases import (
    Blobs,
    affine_pair,
    centered_affine,
    corner_error,
    deformed_pair,
    physical_corner_error,
    textured,
)


def _rotation(deg, scale=1.0, shear=0.0):
    th = np.deg2rad(deg)
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    return rot @ np.array([[scale, shear], [0.0, 1.0 / scale]])


@pytest.fixture(scope="module")
def affine_case():
    rng = np.random.default_rng(7)
    shape = (128, 128)
    m = centered_affine(_rotation(6, 1.05, 0.03), [4.0, -3.0], shape)
    fixed, moving = affine_pair(rng, shape, m)
    return fixed, moving, m


@pytest.mark.parametrize("metric", ["lncc", "mse"])
def test_affine_recovers_known_matrix(affine_case, metric):
    fixed, moving, m = affine_case
    result = register(fixed, moving, model="affine", metric=metric)
    assert corner_error(result.transform.matrix, m, fixed.shape) < 0.15
    # float64 in, float64 out (float32 for every other input dtype)
    assert result.warped.shape == fixed.shape and result.warped.dtype == moving.dtype == np.float64
    assert result.loss_history[-1] < result.loss_history[0]


@pytest.mark.parametrize("metric", ["ncc", "ssim"])
def test_other_metrics_converge(affine_case, metric):
    fixed, moving, m = affine_case
    result = register(fixed, moving, model="affine", metric=metric)
    assert corner_error(result.transform.matrix, m, fixed.shape) < 0.3


@pytest.mark.parametrize(
    "model,lin",
    [
        ("translation", np.eye(2)),
        ("rigid", _rotation(8)),
        ("similarity", _rotation(-5) * 1.06),
    ],
)
def test_constrained_models(model, lin):
    rng = np.random.default_rng(3)
    shape = (96, 96)
    m = centered_affine(lin, [3.2, -2.7], shape)
    fixed, moving = affine_pair(rng, shape, m)
    result = register(fixed, moving, model=model)
    assert result.transform.kind == model
    assert corner_error(result.transform.matrix, m, shape) < 0.15


def test_integer_input_and_torch_input_and_moving_untouched(affine_case):
    fixed, moving, m = affine_case
    f16 = (fixed * 4000 + 100).astype(np.uint16)
    mt = torch.from_numpy(moving * 3 - 1)
    before = mt.clone()
    result = register(f16, mt, model="affine", metric="lncc")
    assert torch.equal(mt, before)
    assert corner_error(result.transform.matrix, m, fixed.shape) < 0.15


def test_mask_excludes_a_corrupted_region(affine_case):
    fixed, moving, m = affine_case
    fixed = fixed.copy()
    fixed[:40, :40] = 5.0  # garbage the mask hides
    mask = np.ones(fixed.shape, bool)
    mask[:44, :44] = False
    result = register(fixed, moving, model="affine", metric="ncc", mask=mask)
    assert corner_error(result.transform.matrix, m, fixed.shape) < 0.3


def test_deformable_recovers_smooth_field():
    rng = np.random.default_rng(11)
    fixed, moving, d = deformed_pair(rng, (128, 128), amplitude=3.0)
    result = register(fixed, moving, model="deformable", metric="lncc")
    est = result.transform.to_displacement(fixed.shape)
    inner = (slice(None), slice(8, -8), slice(8, -8))
    epe = np.linalg.norm(est - d, axis=0)[inner[1:]].mean()
    assert epe < 0.3, epe


def test_deformable_default_recovers_a_local_deformation_without_folding():
    # Structure 6 px wide, 2 px at most: the defaults (metric, regularization, grid, blur)
    # must follow it to a tenth of its size and keep the map one-to-one.
    rng = np.random.default_rng(16)
    fixed, moving, d = deformed_pair(rng, (128, 128), amplitude=2.0, sigma=6.0)
    result = register(fixed, moving, model="deformable")
    est = result.transform.to_displacement(fixed.shape)
    inner = (slice(8, -8), slice(8, -8))
    epe = np.linalg.norm(est - d, axis=0)[inner].mean()
    moved = np.linalg.norm(d, axis=0)[inner].mean()
    assert epe < 0.1 * 2.0 and epe < 0.2 * moved, (epe, moved)
    assert float(jacobian_determinant(torch.from_numpy(est)[None]).min()) > 0


def test_deformable_default_recovers_a_smooth_field_when_the_finest_level_is_skipped():
    # 320² is above Adam's full-resolution limit (256²): the field is fitted on the 160²
    # level alone, its cells 16 full-resolution pixels wide, with the bending energy
    # measured in that level's pixels (DenseModel). Measured 0.109 px (0.133 with the
    # energy in full-resolution units, which this bound refuses).
    rng = np.random.default_rng(21)
    fixed, moving, d = deformed_pair(rng, (320, 320), amplitude=3.0)
    fixed = fixed + rng.normal(0, 0.02, fixed.shape)
    moving = moving + rng.normal(0, 0.02, moving.shape)
    # The rule was measured with global NCC (weight 0.5), whose weight is the lighter.
    result = register(fixed, moving, model="deformable", metric="ncc")
    est = result.transform.to_displacement(fixed.shape)
    inner = (slice(16, -16), slice(16, -16))
    epe = np.linalg.norm(est - d, axis=0)[inner].mean()
    assert epe < 0.12, epe
    assert float(jacobian_determinant(torch.from_numpy(est)[None]).min()) > 0


def test_deformable_default_recovers_a_3d_deformation_without_folding():
    # The B-spline field and its bending energy in 3-D (issue 16): 2 px at most, structure
    # 5 px wide (under a 9-voxel local NCC window), followed to a tenth of its size and
    # one-to-one. Measured: 0.111 px, 22 % of the mean motion, with the default local NCC
    # (0.085 px with global NCC).
    rng = np.random.default_rng(17)
    fixed, moving, d = deformed_pair(rng, (40, 40, 40), amplitude=2.0, sigma=5.0)
    result = register(fixed, moving, model="deformable")
    est = result.transform.to_displacement(fixed.shape)
    inner = (slice(6, -6),) * 3
    epe = np.linalg.norm(est - d, axis=0)[inner].mean()
    moved = np.linalg.norm(d, axis=0)[inner].mean()
    assert epe < 0.1 * 2.0 and epe < 0.25 * moved, (epe, moved)
    assert float(jacobian_determinant(torch.from_numpy(est)[None]).min()) > 0


def test_diffeomorphic_keeps_jacobian_positive():
    rng = np.random.default_rng(12)
    fixed, moving, d = deformed_pair(rng, (96, 96), amplitude=3.0)
    result = register(fixed, moving, model="diffeomorphic", metric="lncc")
    est = result.transform.to_displacement(fixed.shape)
    jac = jacobian_determinant(torch.from_numpy(est)[None])
    assert float(jac.min()) > 0
    epe = np.linalg.norm(est - d, axis=0)[8:-8, 8:-8].mean()
    assert epe < 0.5, epe


def test_3d_affine():
    rng = np.random.default_rng(5)
    shape = (32, 32, 32)
    th = np.deg2rad(4)
    lin = np.array([[1, 0, 0], [0, np.cos(th), -np.sin(th)], [0, np.sin(th), np.cos(th)]])
    m = centered_affine(lin * 1.02, [1.5, -1.0, 2.0], shape)
    fixed, moving = affine_pair(rng, shape, m)
    result = register(fixed, moving, model="affine", metric="lncc", window=7)
    assert corner_error(result.transform.matrix, m, shape) < 0.3


def test_callback_stops_within_one_iteration(affine_case):
    fixed, moving, _ = affine_case
    calls = []

    def callback(progress):
        calls.append(progress)
        return len(calls) >= 2

    result = register(fixed, moving, model="affine", callback=callback, report_every=1)
    assert result.stopped and len(calls) == 2
    assert calls[-1].transform.matrix.shape == (3, 3)
    assert len(result.loss_history) <= 12  # two L-BFGS iterations and their line searches


def test_generator_send_stop_returns_result(affine_case):
    fixed, moving, _ = affine_case
    run = register_iter(fixed, moving, model="translation", report_every=1)
    first = next(run)
    assert first.level == 0 and np.isfinite(first.loss)
    with pytest.raises(StopIteration) as done:
        run.send(True)
    result = done.value.value
    assert result.stopped and result.warped.shape == fixed.shape


@pytest.mark.parametrize(
    "fixed,moving,kwargs,match",
    [
        (np.zeros((8, 8)), np.zeros((8, 8, 8)), {}, "dimensionality"),
        (np.full((16, 16), np.nan), np.ones((16, 16)), {}, "NaN"),
        (np.zeros((0, 16)), np.ones((16, 16)), {}, "empty"),
        (np.ones((16, 16)), np.random.rand(16, 16), {}, "constant"),
        (np.random.rand(16, 16), np.random.rand(16, 16), {"model": "bspline"}, "model"),
        (np.random.rand(16, 16), np.random.rand(16, 16), {"metric": "mattes"}, "metric"),
        (np.random.rand(16), np.random.rand(16), {}, "2-D or 3-D"),
    ],
)
def test_bad_input_errors(fixed, moving, kwargs, match):
    with pytest.raises(ValueError, match=match):
        register(fixed, moving, **kwargs)


def test_memory_estimate_raises_clearly(monkeypatch):
    from napari_simwarp.registration import _inputs

    monkeypatch.setattr(_inputs, "available_memory", lambda device: 1000)
    with pytest.raises(MemoryError, match="GiB"):
        register(np.random.rand(64, 64), np.random.rand(64, 64))


def test_top_level_register_is_the_function_with_its_signature(affine_case):
    import inspect

    import napari_simwarp
    from napari_simwarp.registration import register as registration_register

    assert napari_simwarp.register is registration_register
    params = inspect.signature(napari_simwarp.register).parameters
    assert list(params)[:2] == ["fixed", "moving"]
    assert {"model", "metric", "mask", "levels", "device", "callback"} <= set(params)
    assert all(params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in list(params)[2:])
    fixed, moving, _ = affine_case
    result = napari_simwarp.register(fixed[:64, :64], moving[:64, :64], model="translation")
    assert result.transform.kind == "translation"


def test_float_masks_select_where_non_zero_and_big_endian_inputs_work():
    # A mask of 0.3 everywhere (a grey PNG) selects every pixel; it used to fall under a
    # 0.5 threshold and switch matching off silently. Big-endian arrays used to be
    # rejected with torch's byte-order error.
    from scipy import ndimage as ndi

    from napari_simwarp import data, register

    fixed = data.camera()[128:256, 128:256].astype(np.float64)
    moving = ndi.shift(fixed, (2.5, -1.5), order=3, mode="nearest")
    mask = np.full(fixed.shape, 0.3, np.float32)
    res = register(fixed, moving, model="translation", metric="ncc", mask=mask)
    # moving(x) = fixed(x - s): the fixed -> moving matrix translates by +s.
    np.testing.assert_allclose(res.transform.matrix[:2, 2], [2.5, -1.5], atol=0.1)
    big = register(fixed.astype(">f8"), moving.astype(">f8"), model="translation")
    np.testing.assert_allclose(big.transform.matrix[:2, 2], [2.5, -1.5], atol=0.1)


class TestPhysicalSpace:
    """Images with pixel sizes and origins: the transform is found in physical space."""

    @staticmethod
    def _rigid(rotvec_deg, shift, center) -> np.ndarray:
        d = len(center)
        if d == 3:
            rot = Rotation.from_rotvec(np.deg2rad(rotvec_deg)).as_matrix()
        else:
            a = np.deg2rad(rotvec_deg)
            rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        m = np.eye(d + 1)
        m[:d, :d] = rot
        m[:d, d] = np.asarray(center) + shift - rot @ center
        return m

    def test_anisotropic_3d_rigid_is_a_rotation_of_the_sample(self, rng):
        # z voxels 2.5x deeper than x and y; a rotation of the sample about all three axes
        shape, grid = (20, 48, 48), Grid.make(3, (2.5, 1.0, 1.0))
        blobs = Blobs(rng, 40, [0, 0, 0], [50, 48, 48])
        center = np.array(grid.spacing) * (np.array(shape) - 1) / 2
        truth = self._rigid([4, -3, 6], [1.5, -2.0, 1.2], center)
        fixed, moving = blobs.sample(grid, shape), blobs.sample(grid, shape, truth)
        res = register(
            fixed,
            moving,
            model="rigid",
            metric="ncc",
            fixed_spacing=grid.spacing,
            moving_spacing=grid.spacing,
        )
        assert physical_corner_error(res.transform.physical_matrix, truth, grid, shape).max() < 0.1
        # the same pair registered in voxel units, as if the voxels were cubes, is wrong
        voxels = register(fixed, moving, model="rigid", metric="ncc")
        as_physical = grid.to_physical() @ voxels.transform.matrix @ grid.to_pixels()
        assert physical_corner_error(as_physical, truth, grid, shape).max() > 1.0

    def test_two_pixel_sizes_and_origins_match_the_pair_resampled_onto_one_grid(self, rng):
        fixed_grid = Grid.make(2, (0.2, 0.2), (2.0, 3.0))
        moving_grid = Grid.make(2, (0.35, 0.3), (-1.0, 1.5))
        fixed_shape, moving_shape = (160, 150), (110, 120)
        blobs = Blobs(rng, 60, [0, 0], [40, 40], sigma=(1.0, 2.5))
        truth = self._rigid(5, [0.7, -1.1], [20.0, 20.0])
        truth[:2, :2] *= 1.03
        fixed = blobs.sample(fixed_grid, fixed_shape)
        moving = blobs.sample(moving_grid, moving_shape, truth)
        grids = dict(
            fixed_spacing=fixed_grid.spacing,
            fixed_origin=fixed_grid.origin,
            moving_spacing=moving_grid.spacing,
            moving_origin=moving_grid.origin,
        )
        res = register(fixed, moving, model="affine", **grids)
        # the same pair on one grid: moving resampled by SciPy onto the fixed grid
        onto = moving_grid.to_pixels() @ fixed_grid.to_physical()
        resampled = ndi.affine_transform(
            moving, onto, output_shape=fixed_shape, order=3, mode="nearest"
        )
        one_grid = register(fixed, resampled, model="affine")
        one_grid_physical = (
            fixed_grid.to_physical() @ one_grid.transform.matrix @ fixed_grid.to_pixels()
        )
        ours = res.transform.physical_matrix
        assert physical_corner_error(ours, one_grid_physical, fixed_grid, fixed_shape).max() < 0.25
        assert physical_corner_error(ours, truth, fixed_grid, fixed_shape).max() < 0.15
        # .matrix keeps meaning pixels, fixed → moving: what SciPy resamples the moving with
        scipy_warped = ndi.affine_transform(
            moving, res.transform.matrix, output_shape=fixed_shape, order=1, mode="constant"
        )
        inside = ndi.binary_erosion(scipy_warped != 0, iterations=2)
        np.testing.assert_allclose(res.warped[inside], scipy_warped[inside], atol=1e-4)
        assert res.similarity > 0.999

    def test_dense_models_take_images_on_two_grids(self, rng, tmp_path):
        fixed_grid, moving_grid = (
            Grid.make(2, 0.5, (1.0, 2.0)),
            Grid.make(2, (0.8, 0.7), (0.0, 0.5)),
        )
        fixed_shape, moving_shape = (80, 76), (56, 62)
        blobs = Blobs(rng, 50, [0, 0], [42, 42], sigma=(1.5, 3.0))
        truth = self._rigid(3, [0.6, -0.4], [21.0, 21.0])
        fixed = blobs.sample(fixed_grid, fixed_shape)
        moving = blobs.sample(moving_grid, moving_shape, truth)
        res = register(
            fixed,
            moving,
            model="deformable",
            fixed_spacing=fixed_grid.spacing,
            fixed_origin=fixed_grid.origin,
            moving_spacing=moving_grid.spacing,
            moving_origin=moving_grid.origin,
        )
        t = res.transform
        assert t.moving_shape == moving_shape and t.displacement.shape == (2, *fixed_shape)
        # where x + d(x) sends each fixed pixel, SciPy samples the same values
        x = np.stack(np.meshgrid(*[np.arange(n) for n in fixed_shape], indexing="ij"))
        scipy_warped = ndi.map_coordinates(moving, x + t.displacement, order=1, mode="constant")
        inside = ndi.binary_erosion(scipy_warped != 0, iterations=2)
        np.testing.assert_allclose(res.warped[inside], scipy_warped[inside], atol=1e-4)
        np.testing.assert_allclose(t.apply(moving), res.warped, atol=1e-5)
        before = ndi.affine_transform(
            moving,
            moving_grid.to_pixels() @ fixed_grid.to_physical(),
            output_shape=fixed_shape,
            order=1,
        )
        err, err_before = np.abs(res.warped - fixed)[inside], np.abs(before - fixed)[inside]
        assert err.mean() < 0.2 * err_before.mean()
        back = load_transform(t.save(tmp_path / "field.npz"))
        np.testing.assert_allclose(back.apply(moving), res.warped, atol=1e-5)
        with pytest.raises(ValueError, match="moving image's spatial shape"):
            t.apply(fixed)

    def test_the_result_does_not_depend_on_how_the_volume_was_sampled(self, rng):
        # one sample, imaged with 2-unit and with 1-unit rows: the same physical answer
        blobs = Blobs(rng, 50, [0, 0], [64, 64], sigma=(2.0, 4.0))
        truth = self._rigid(4, [1.2, -0.8], [31.5, 31.5])
        answers = []
        for spacing in ((2.0, 1.0), (1.0, 1.0)):
            grid = Grid.make(2, spacing)
            shape = (int(64 / spacing[0]), 64)
            fixed, moving = blobs.sample(grid, shape), blobs.sample(grid, shape, truth)
            res = register(
                fixed, moving, model="rigid", fixed_spacing=spacing, moving_spacing=spacing
            )
            answers.append(res.transform.physical_matrix)
        unit = Grid.make(2, 1.0)
        assert physical_corner_error(answers[0], answers[1], unit, (64, 64)).max() < 0.1
        assert physical_corner_error(answers[0], truth, unit, (64, 64)).max() < 0.1

    @pytest.mark.filterwarnings("ignore::napari_simwarp.registration.quality.RegistrationWarning")
    def test_an_initial_transform_is_placed_by_its_physical_matrix(self, rng):
        image = rng.random((40, 40))
        physical = self._rigid(10, [1.0, 2.0], [5.0, 5.0])
        # a transform found between other samplings of the same two images
        other_fixed, other_moving = Grid.make(2, 0.25, 1.0), Grid.make(2, 0.5, -2.0)
        init = AffineTransform(
            other_moving.to_pixels() @ physical @ other_fixed.to_physical(), "rigid"
        ).with_grids(other_fixed, other_moving)
        res = register(
            image,
            image,
            model="rigid",
            init=init,
            iterations=0,
            fixed_spacing=0.2,
            moving_spacing=0.3,
            moving_origin=(4.0, 4.0),
        )
        np.testing.assert_allclose(res.transform.physical_matrix, physical, atol=1e-9)


def test_dense_run_from_a_linear_init_on_two_grids(rng):
    # A dense model resamples the moving image onto the fixed grid first; a linear init
    # (carrying the grids) must start it where its physical matrix says, not at its pixel
    # matrix read in the resampled frame.
    shape = (48, 40)
    fixed = textured(rng, shape)
    moving = ndi.zoom(fixed, 0.5, order=1, grid_mode=True, mode="nearest")
    fg, mg = Grid.make(2), Grid.make(2, 2.0, 0.5)
    physical = np.array([[1.0, 0.1, 2.0], [-0.05, 1.0, -3.0], [0, 0, 1]])
    init = AffineTransform(np.linalg.inv(mg.to_physical()) @ physical).with_grids(fg, mg)
    res = register(
        fixed, moving, model="deformable", init=init, iterations=0, levels=1,
        moving_spacing=2.0, moving_origin=0.5,
    )  # fmt: skip
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in shape], indexing="ij"))
    moved = np.einsum("ij,j...->i...", physical[:2, :2], grid) + physical[:2, 2].reshape(2, 1, 1)
    expected = (moved - 0.5) / 2.0 - grid  # fixed pixels -> the small image's pixels
    np.testing.assert_allclose(res.transform.to_displacement(shape), expected, atol=1e-4)


def test_dense_run_from_a_field_on_the_same_two_grids(rng):
    # A field from a run on two grids maps fixed pixels into the moving image's own pixels;
    # restarting a run from it must start where it ends (x + d(x) there), not read those
    # positions as positions in the moving image resampled onto the fixed grid.
    shape = (48, 40)
    fixed = textured(rng, shape)
    moving = ndi.zoom(fixed, 0.5, order=1, grid_mode=True, mode="nearest")
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in shape], indexing="ij"))
    bend = np.stack([0.8 * np.sin(grid[1] / 7.0), 0.6 * np.cos(grid[0] / 9.0)])
    expected = (grid + bend - 0.5) / 2.0 - grid  # into the small image's pixels
    init = DisplacementTransform(expected, moving_shape=moving.shape)
    res = register(
        fixed, moving, model="deformable", init=init, iterations=0, levels=1,
        moving_spacing=2.0, moving_origin=0.5,
    )  # fmt: skip
    np.testing.assert_allclose(res.transform.to_displacement(shape), expected, atol=1e-4)
    other = DisplacementTransform(expected[:, :-1], moving_shape=moving.shape)
    with pytest.raises(ValueError, match="this pair has shapes"):
        register(fixed, moving, model="deformable", init=other, moving_spacing=2.0)
