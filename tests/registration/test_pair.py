"""register(): accuracy against known transforms on small cases, the live-use protocol,
and clear errors for bad input."""

import numpy as np
import pytest
import torch

from napari_simwarp.ops import jacobian_determinant
from napari_simwarp.registration import register, register_iter
from tests.registration.cases import affine_pair, centered_affine, corner_error, deformed_pair


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
        (np.random.rand(16, 16), np.random.rand(20, 16), {"model": "deformable"}, "same shape"),
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
