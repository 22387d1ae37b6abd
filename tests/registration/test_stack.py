"""register_stack(): drift correction against known shifts, references, batching."""

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.registration import register_stack
from tests.registration.cases import centered_affine, corner_error, shifted_stack, textured

#: register_stack runs on device "auto": the CPU gives one result bit for bit, run after
#: run; a GPU's atomic additions (grid_sample's backward, the splat) land in any order.
ON_GPU = torch.cuda.is_available() or torch.backends.mps.is_available()


def assert_same_run(actual, expected, atol):
    """Two runs that must agree: exactly on the CPU, within ``atol`` on a GPU."""
    if ON_GPU:
        np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)
    else:
        np.testing.assert_array_equal(actual, expected)


@pytest.fixture(scope="module")
def drift_case():
    rng = np.random.default_rng(21)
    return shifted_stack(rng, (128, 128), 8, max_shift=6.0)


def test_translation_drift_subpixel(drift_case):
    stack, truth = drift_case
    result = register_stack(stack)
    err = np.linalg.norm(result.shifts - truth, axis=1)
    assert np.median(err) < 0.03, err
    assert result.warped.shape == stack.shape and len(result.transforms) == len(stack)
    assert result.transforms[0].kind == "translation"


@pytest.mark.parametrize("reference", ["mean", "previous", 3])
def test_references(drift_case, reference):
    stack, truth = drift_case
    result = register_stack(stack, reference=reference, batch_size=3)
    shifts = result.shifts
    if reference == 3:
        truth = truth - truth[3]
    else:  # "mean" and "previous" are expressed in frame 0's frame up to a constant
        shifts = shifts - shifts[0]
    tol = 0.08 if reference == "previous" else 0.04  # chaining accumulates error
    assert np.median(np.linalg.norm(shifts - truth, axis=1)) < tol


def test_integer_stack_and_rigid_model(drift_case):
    stack, truth = drift_case
    ints = (stack[:4] * 1000 + 200).astype(np.uint16)
    result = register_stack(ints, model="rigid", metric="ncc")
    assert np.median(np.linalg.norm(result.shifts - truth[:4], axis=1)) < 0.1


def test_callback_stops(drift_case):
    stack, _ = drift_case
    seen = []
    result = register_stack(stack, callback=lambda p: seen.append(p) or True)
    assert result.stopped and len(seen) == 1 and len(result.transforms) == len(stack)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"reference": "last"}, "reference"),
        ({"reference": 99}, "out of range"),
        ({"model": "spline"}, "model"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_stack_errors(drift_case, kwargs, match):
    with pytest.raises(ValueError, match=match):
        register_stack(drift_case[0][:3], **kwargs)


def test_stack_shape_error():
    with pytest.raises(ValueError, match="stack"):
        register_stack(np.random.rand(16, 16))


def test_mean_reference_for_a_linear_model(drift_case):
    stack, truth = drift_case
    result = register_stack(stack[:4], reference="mean", model="rigid", metric="ncc")
    shifts = result.shifts - result.shifts[0]
    # Looser than "first": the mean is slightly blurred by resampling (see the report).
    assert np.median(np.linalg.norm(shifts - truth[:4], axis=1)[1:]) < 0.15


def test_progress_transforms_are_in_full_resolution_pixels():
    rng = np.random.default_rng(4)
    stack, truth = shifted_stack(rng, (256, 256), 3, max_shift=4.0)
    seen = []
    register_stack(stack, callback=lambda p: seen.append(p.transforms) and False)
    last = np.stack([t.translation for t in seen[-1]])
    assert np.abs(last - truth).max() < 0.1


def test_deformable_stack_chained():
    rng = np.random.default_rng(8)
    stack, truth = shifted_stack(rng, (96, 96), 3, max_shift=2.0, noise=0.005)
    result = register_stack(stack, model="deformable", reference="previous")
    assert len(result.transforms) == 3 and result.warped.shape == stack.shape
    for t, d in zip(result.transforms, truth):
        mean = t.to_displacement((96, 96))[:, 16:-16, 16:-16].mean(axis=(1, 2))
        assert np.abs(mean - d).max() < 0.2


# -- lazy input, the memory budget ----------------------------------------------------------


@pytest.mark.parametrize("reference", ["first", "mean", "previous", 2])
def test_lazy_stacks_give_the_numpy_result(drift_case, reference):
    da = pytest.importorskip("dask.array")
    zarr = pytest.importorskip("zarr")

    stack = drift_case[0][:6].astype(np.float32)
    expected = register_stack(stack, reference=reference, batch_size=2)
    store = zarr.create_array(store=zarr.storage.MemoryStore(), shape=stack.shape,
                              chunks=(2, 64, 128), dtype=stack.dtype)  # fmt: skip
    store[:] = stack
    for lazy in (da.from_array(stack, chunks=(1, 50, 128)), store):
        got = register_stack(lazy, reference=reference, batch_size=2)
        assert_same_run(got.shifts, expected.shifts, atol=1e-4)
        assert_same_run(got.frame_similarity, expected.frame_similarity, atol=1e-5)
        assert isinstance(got.warped, da.Array) and got.warped.chunks[0] == (1,) * 6
        assert_same_run(got.warped[3].compute(), expected.warped[3], atol=1e-3 * np.ptp(stack))


def test_lazy_rigid_stack_gives_the_numpy_result(drift_case):
    da = pytest.importorskip("dask.array")

    stack = drift_case[0][:3].astype(np.float32)
    kw = dict(model="rigid", metric="ncc", reference="mean", batch_size=2)
    expected = register_stack(stack, **kw)
    got = register_stack(da.from_array(stack, chunks=1), **kw)
    assert_same_run(got.shifts, expected.shifts, atol=1e-4)


@pytest.mark.parametrize("chunks", [(1, 50, 128), (3, 128, 128)])
def test_lazy_aligned_frames_are_scipy_warps(rng, chunks):
    """Each frame of the lazy aligned stack is its own transform applied by SciPy (linear,
    zeros outside), for matrices and displacement fields, whatever the input chunking
    (frames split into pieces, or several frames per chunk)."""
    da = pytest.importorskip("dask.array")
    from scipy import ndimage

    from napari_simwarp.registration.stack import lazy_warped
    from napari_simwarp.registration.transforms import AffineTransform, DisplacementTransform

    stack = rng.random((4, 128, 128)).astype(np.float32)
    c, s = np.cos(0.1), np.sin(0.1)
    affine = [np.array([[c, -s, 1.5 * t], [s, c, -0.7 * t], [0, 0, 1]]) for t in range(4)]
    fields = [ndimage.gaussian_filter(rng.normal(size=(2, 128, 128)), (0, 6, 6)) * 40
              for _ in range(4)]  # fmt: skip
    grid = np.indices((128, 128)).astype(float)
    rigid = [AffineTransform(m, "rigid") for m in affine]
    by_scipy = [ndimage.affine_transform(f, m, order=1, mode="grid-constant")
                for f, m in zip(stack, affine)]  # fmt: skip
    dense = [DisplacementTransform(d.astype(np.float32)) for d in fields]
    by_map = [ndimage.map_coordinates(f, grid + d, order=1, mode="grid-constant")
              for f, d in zip(stack, fields)]  # fmt: skip
    read = []

    def record(block, block_info=None):
        read.append(tuple(block_info[0]["array-location"][0]))
        return block

    source = da.from_array(stack, chunks=chunks).map_blocks(record, dtype=stack.dtype)
    for transforms, expected in ((rigid, by_scipy), (dense, by_map)):
        got = lazy_warped(source, transforms, "cpu")
        assert got.chunks[0] == (1,) * 4 and got.dtype == np.float32
        read.clear()
        np.testing.assert_allclose(got[2].compute(), expected[2], atol=1e-4)
        assert read and all(lo <= 2 < hi for lo, hi in read), read  # frame 2's chunks only
        np.testing.assert_allclose(got.compute(), np.stack(expected), atol=1e-4)


def test_a_budget_too_small_for_one_frame_is_refused_before_reading(drift_case):
    da = pytest.importorskip("dask.array")

    read = []
    frames = da.from_array(drift_case[0], chunks=(1, 128, 128)).map_blocks(
        lambda b: read.append(1) or b, dtype=np.float64, meta=np.empty((0, 0, 0))
    )
    with pytest.raises(MemoryError, match=r"budget is 1.0 MiB \(memory_budget\)") as info:
        register_stack(frames, memory_budget="1MiB")
    assert not read
    # "auto" already took the largest batch that fits: no advice to make it smaller
    assert "batch_size" not in str(info.value) and "crop or downsample" in str(info.value)
    with pytest.raises(MemoryError, match="use a smaller batch_size"):
        register_stack(frames, memory_budget="1MiB", batch_size=2)
    with pytest.raises(MemoryError) as info:  # a batch of 1 cannot be made smaller
        register_stack(frames, memory_budget="1MiB", batch_size=1)
    assert "batch_size" not in str(info.value)
    assert not read
    with pytest.raises(ValueError, match="level"):
        register_stack([drift_case[0], drift_case[0][:, ::2, ::2]])


_PEAK = """
import json, resource, sys
import numpy as np, dask, dask.array as da
from napari_simwarp.registration import register_stack
from tests.registration.cases import shifted_stack

frames, _ = shifted_stack(np.random.default_rng(1), (256, 256), 4, max_shift=3.0)
frames = (frames * 1000).astype(np.uint16)
register_stack(frames, batch_size=1)  # warm up: kernels, allocator
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
T = int(sys.argv[1])
if sys.argv[2] == "lazy":  # made frame by frame, never held: 4x larger than the budget
    make = dask.delayed(lambda t: frames[t % 4][None])
    stack = da.concatenate([da.from_delayed(make(t), (1, 256, 256), np.uint16) for t in range(T)])
    result = register_stack(stack, memory_budget=sys.argv[3])
    np.asarray(result.warped[T - 1])
else:  # in memory, float32
    stack = np.stack([frames[t % 4] for t in range(T)]).astype(np.float32)
    result = register_stack(stack, batch_size=int(sys.argv[3]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"extra": peak - base, "shift": result.shifts[5].tolist()}))
"""


def _peak(*argv):
    import json
    import os
    import subprocess
    import sys

    # glibc's adaptive mmap threshold keeps freed frames in the heap (RSS that is not in
    # use); a fixed threshold measures what the code holds
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "262144"}
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, *map(str, argv)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_lazy_stack_larger_than_the_budget_runs_within_it():
    """96 frames of 256² (24 MiB as float32) against an 8 MiB budget: the process grows by
    about the budget, not by the stack."""
    pytest.importorskip("dask")  # the measuring child process imports it
    budget = 8 * 2**20
    got = _peak(96, "lazy", budget)
    assert got["extra"] < 2 * budget, got["extra"] / 2**20
    assert np.isfinite(got["shift"]).all()


def test_the_in_memory_path_holds_at_most_two_and_a_half_stacks():
    """The stack is never copied whole (batches of one frame here: the automatic batch of a
    stack this small may use up to CPU_BATCH_BYTES, more than the stack)."""
    pytest.importorskip("dask")  # the measuring child process imports it
    stack_bytes = 160 * 256 * 256 * 4
    got = _peak(160, "memory", 1)
    # the input itself (1x) counts: input + aligned output + batches
    assert got["extra"] <= 2.5 * stack_bytes, got["extra"] / stack_bytes


# -- physical space: one grid shared by the frames ------------------------------------------

ANISOTROPIC = (3.0, 1.0, 1.0)  # z step 3× the xy pixel size
ROTATIONS = [(0.0, 0.0, 0.0), (3.0, -2.0, 1.0), (-2.0, 2.5, -1.5)]  # degrees, (z, y, x) axes


def _physical_rotation_pixels(rotvec_deg, shape, spacing) -> np.ndarray:
    """The pixel matrix ``G⁻¹ P G`` of a physical rotation ``P`` about the volume's
    physical center (``G``: pixels → physical), built by hand from SciPy's rotation."""
    from scipy.spatial.transform import Rotation

    rot = Rotation.from_rotvec(np.deg2rad(rotvec_deg)).as_matrix()
    center = (np.asarray(shape, float) - 1) / 2 * np.asarray(spacing)
    physical = np.eye(4)
    physical[:3, :3], physical[:3, 3] = rot, center - rot @ center
    g = np.diag([*spacing, 1.0])
    return np.linalg.inv(g) @ physical @ g


@pytest.fixture(scope="module")
def rotated_volumes():
    """``(stack (T, Z, Y, X), truths)``: frame t is frame 0 resampled by a known physical
    rotation ``M_t`` (``frame_t(x) = frame_0(M_t x)``), so the transform of frame t (frame 0
    pixels → frame t pixels) is ``M_t⁻¹``."""
    from scipy import ndimage as ndi

    shape = (20, 64, 64)
    rng = np.random.default_rng(3)
    # Isotropic structure in physical space: σ = 3 units on every axis.
    first = ndi.gaussian_filter(rng.standard_normal(shape), sigma=3.0 / np.array(ANISOTROPIC))
    mats = [_physical_rotation_pixels(r, shape, ANISOTROPIC) for r in ROTATIONS]
    stack = np.stack([ndi.affine_transform(first, m, order=3, mode="nearest") for m in mats])
    return stack.astype(np.float32), [np.linalg.inv(m) for m in mats]


def _corner_errors(transforms, truths, shape, spacing) -> np.ndarray:
    """Per frame, the largest distance (in the finest pixel size) between where the found
    and the true pixel matrices send the volume's corners, measured in physical space."""
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)
    h = np.vstack([corners, np.ones(corners.shape[1])])
    scale = np.asarray(spacing, float)[:, None] / min(spacing)
    return np.array(
        [
            np.linalg.norm(((t.matrix - m) @ h)[:d] * scale, axis=0).max()
            for t, m in zip(transforms, truths)
        ]
    )


def test_rigid_stack_in_physical_space_recovers_physical_rotations(rotated_volumes):
    from napari_simwarp.registration.grid import Grid

    stack, truths = rotated_volumes
    shape = stack.shape[1:]
    physical = register_stack(stack, model="rigid", metric="ncc", spacing=ANISOTROPIC)
    err = _corner_errors(physical.transforms, truths, shape, ANISOTROPIC)
    assert err.max() < 0.1, err
    # In voxel space a physical rotation of an anisotropic volume is not a rotation (it
    # shears z against x and y): a rigid model cannot follow it.
    voxels = register_stack(stack, model="rigid", metric="ncc")
    err_voxels = _corner_errors(voxels.transforms, truths, shape, ANISOTROPIC)
    assert err_voxels[1:].min() > 5 * err.max() and err_voxels[1:].min() > 0.5, err_voxels
    grid = Grid(ANISOTROPIC, (0.0, 0.0, 0.0))
    for t, m in zip(physical.transforms, truths):
        assert t.fixed_grid == grid and t.moving_grid == grid
        # The physical matrix is a rotation of the sample (orthonormal linear part).
        lin = t.physical_matrix[:3, :3]
        np.testing.assert_allclose(lin @ lin.T, np.eye(3), atol=1e-6)
        g = np.diag([*ANISOTROPIC, 1.0])
        np.testing.assert_allclose(t.physical_matrix, g @ m @ np.linalg.inv(g), atol=0.05)


def test_physical_stack_previous_reference_chains_on_the_grid(rotated_volumes):
    stack, truths = rotated_volumes
    result = register_stack(
        stack[:2], model="rigid", metric="ncc", spacing=ANISOTROPIC, reference="previous"
    )
    err = _corner_errors(result.transforms, truths[:2], stack.shape[1:], ANISOTROPIC)
    assert err.max() < 0.1, err
    assert all(t.fixed_grid.spacing == ANISOTROPIC for t in result.transforms)


def test_translation_route_gives_the_same_pixel_shifts_on_a_grid(drift_case):
    stack = drift_case[0][:4]
    plain = register_stack(stack)
    spacing, origin = (0.5, 0.25), (10.0, -3.0)
    placed = register_stack(stack, spacing=spacing, origin=origin)
    assert_same_run(placed.shifts, plain.shifts, atol=1e-4)
    for t in placed.transforms:
        assert t.fixed_grid.spacing == spacing and t.moving_grid.origin == origin
        # Physical translation: the pixel shift times the pixel size (same grid both sides).
        np.testing.assert_allclose(t.physical_matrix[:2, 2], t.translation * spacing, atol=1e-12)


def test_window_and_grid_spacing_are_physical_units(rotated_volumes, monkeypatch):
    """window / grid_spacing in physical units reach the loss and the control grid as the
    same finest-pixel counts as register's (spacing (3, 1, 1): finest unit 1 → unchanged;
    spacing (6, 2, 2): unit 2 → halved)."""
    from napari_simwarp.registration import models, optimize

    seen = {}
    original = optimize.make_schedule

    def spy_schedule(*args, **kwargs):
        schedule = original(*args, **kwargs)
        seen["window"] = schedule.metric_options.get("window")
        return schedule

    class SpyDense(models.DenseModel):
        def __init__(self, *args, **kwargs):
            seen["grid_spacing"] = kwargs["grid_spacing"]
            seen["spacing"] = kwargs["spacing"]
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(optimize, "make_schedule", spy_schedule)
    monkeypatch.setattr(models, "DenseModel", SpyDense)
    small = rotated_volumes[0][:2, :8, :24, :24]
    register_stack(small, model="deformable", metric="lncc", spacing=(6.0, 2.0, 2.0),
                   window=14.0, grid_spacing=20.0, iterations=1, levels=1)  # fmt: skip
    assert seen == {"window": 7.0, "grid_spacing": 10.0, "spacing": (6.0, 2.0, 2.0)}
    register_stack(small, model="deformable", spacing=(6.0, 2.0, 2.0), iterations=1, levels=1)
    assert seen["window"] is None and seen["grid_spacing"] == 8.0  # register's defaults


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"spacing": (1.0, 2.0)}, "spacing must have one value per axis"),
        ({"spacing": (1.0, 0.0, 1.0)}, "spacing must be positive"),
        ({"origin": (0.0, np.nan, 0.0)}, "origin must be finite"),
        ({"origin": "zero"}, "origin must be a number"),
        ({"grid_spacing": -1.0, "model": "deformable"}, "grid_spacing"),
    ],
)
def test_spacing_errors(rotated_volumes, kwargs, match):
    stack = rotated_volumes[0][:2]
    before = stack.copy()
    with pytest.raises((ValueError, TypeError), match=match):
        register_stack(stack, **kwargs)
    np.testing.assert_array_equal(stack, before)


# -- the default metric (chosen by benchmarks/bench_stack.py) ------------------------------


def _rigid_drift_stack(rng, frames, shape, bleach=1.0):
    """``(stack, truths)``: one scene under a rigid drift (±2°, ±5 px, cubic-interpolated
    from a larger scene, then cropped), the signal decaying to ``bleach`` over the stack
    above a constant offset (photobleaching), noise; ``truths[t]`` maps frame-0 pixels to
    frame-t pixels (``frame_t(T_t x) = frame_0(x)``), built independently of the code."""
    pad = 12
    big = textured(rng, tuple(n + 2 * pad for n in shape))
    to_big = np.eye(3)
    to_big[:2, 2] = pad
    drifts = [
        centered_affine(
            np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]),
            rng.uniform(-5, 5, 2),
            shape,
        )
        for a in np.deg2rad(np.r_[0.0, rng.uniform(-2, 2, frames - 1)])
    ]
    decay = bleach ** (np.arange(frames) / (frames - 1))
    stack = np.stack(
        [
            0.1 + k * ndi.affine_transform(big, to_big @ a, output_shape=shape, order=3)
            for a, k in zip(drifts, decay)
        ]
    )
    stack = stack + rng.normal(0, 0.01, stack.shape)
    return stack, [np.linalg.inv(a) @ drifts[0] for a in drifts]


def test_default_metric_is_global_ncc_for_linear_models_and_local_ncc_for_dense_ones():
    """The default the stack benchmark chose (docs/benchmarks.md, "Drift correction:
    register_stack's metric"): metric=None runs "ncc" (Gauss–Newton) for the linear models,
    "lncc" for the dense ones, as ``register`` does; an explicit metric is kept."""
    import inspect

    from napari_simwarp.registration import register_stack_iter
    from napari_simwarp.registration._names import DEFAULT_METRICS

    for fn in (register_stack, register_stack_iter):
        assert inspect.signature(fn).parameters["metric"].default is None
    rng = np.random.default_rng(5)
    stack, _ = _rigid_drift_stack(rng, 2, (48, 48))
    for model, expected in (("rigid", "ncc"), ("deformable", "lncc"), ("diffeomorphic", "lncc")):
        result = register_stack(stack, model=model, iterations=2)
        assert result.metric == DEFAULT_METRICS[model] == expected
    assert register_stack(stack, model="rigid", metric="mse", iterations=2).metric == "mse"


@pytest.mark.parametrize("bleach", [1.0, 0.25])
@pytest.mark.parametrize("reference", ["first", "mean"])
def test_default_rigid_stack_recovers_known_drift_under_photobleaching(bleach, reference):
    """Defaults (global NCC, Gauss–Newton) against the drift the stack was built with,
    with and without the signal bleaching to a quarter over the stack."""
    stack, truths = _rigid_drift_stack(np.random.default_rng(9), 6, (96, 96), bleach)
    result = register_stack(stack, model="rigid", reference=reference)
    mats = [t.matrix for t in result.transforms]
    mats = [m @ np.linalg.inv(mats[0]) for m in mats]  # "mean": relative to frame 0's
    errors = [corner_error(m, t, (96, 96)) for m, t in zip(mats[1:], truths[1:])]
    # "mean": looser, the mean is slightly blurred by resampling (as above)
    assert max(errors) < (0.1 if reference == "first" else 0.15), errors
