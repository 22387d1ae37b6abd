"""Transforms: the conventions of docs/maths.md §6.1, apply/to_displacement agreement, save/load."""

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_simwarp.registration import (
    AffineTransform,
    DisplacementTransform,
    VelocityTransform,
    load_transform,
)
from tests.registration.cases import centered_affine, smooth_field, textured


def _matrix(shape):
    th = np.deg2rad(5)
    lin = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]]) * 1.03
    return centered_affine(lin, [2.5, -1.5], shape)


def test_affine_apply_matches_scipy(rng):
    img = textured(rng, (48, 56))
    m = _matrix(img.shape)
    out = AffineTransform(m).apply(img)
    ref = ndi.affine_transform(img, m, order=1, mode="grid-constant")
    inner = (slice(6, -6), slice(6, -6))
    np.testing.assert_allclose(out[inner], ref[inner], atol=1e-4)
    assert out.dtype == np.float64 and img.dtype == np.float64  # float dtypes are kept


def test_affine_displacement_convention(rng):
    shape = (40, 44)
    m = _matrix(shape)
    d = AffineTransform(m).to_displacement(shape)
    assert d.shape == (2, *shape)
    x = np.array([7.0, 30.0])
    np.testing.assert_allclose(x + d[:, 7, 30], m[:2, :2] @ x + m[:2, 2], atol=1e-4)


def test_displacement_apply_follows_tvl1_convention(rng):
    shape = (48, 48)
    img = textured(rng, shape)
    d = smooth_field(rng, shape, 2.0, 6.0).astype(np.float32)
    out = DisplacementTransform(d).apply(img)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")).astype(float)
    ref = ndi.map_coordinates(img, grid + d, order=1, mode="nearest")
    np.testing.assert_allclose(out[4:-4, 4:-4], ref[4:-4, 4:-4], atol=1e-4)


def test_apply_order0_keeps_labels_and_leading_axes(rng):
    labels = rng.integers(0, 5, (2, 32, 32)).astype(np.uint16)
    out = AffineTransform(_matrix((32, 32))).apply(labels, order=0)
    assert out.shape == labels.shape and out.dtype == np.uint16
    assert set(np.unique(out)) <= set(np.unique(labels)) | {0}
    with pytest.raises(ValueError, match="order"):
        AffineTransform(np.eye(3)).apply(labels, order=3)


def test_velocity_zero_is_identity_and_constant_is_shift():
    v = np.zeros((2, 16, 16), np.float32)
    v[0] = 1.5
    d = VelocityTransform(v).to_displacement()
    np.testing.assert_allclose(d[0], 1.5, atol=1e-4)
    np.testing.assert_allclose(d[1], 0, atol=1e-5)


def test_displacement_resize_rescales_components(rng):
    d = np.ones((2, 16, 20), np.float32)
    up = DisplacementTransform(d).to_displacement((32, 40))
    np.testing.assert_allclose(up, 2.0, atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AffineTransform(np.eye(4), "rigid"),
        lambda: DisplacementTransform(np.zeros((2, 8, 9))),
        lambda: VelocityTransform(np.ones((3, 4, 5, 6)), steps=5),
    ],
)
def test_save_load_roundtrip(tmp_path, make):
    t = make()
    path = t.save(tmp_path / "t")
    assert path.suffix == ".npz"
    back = load_transform(path)
    assert type(back) is type(t) and back.kind == t.kind
    np.testing.assert_array_equal(
        back.to_displacement((4, 5, 6)[: t.ndim]), t.to_displacement((4, 5, 6)[: t.ndim])
    )


def test_bad_transform_inputs(tmp_path):
    with pytest.raises(ValueError, match="matrix"):
        AffineTransform(np.eye(2))
    with pytest.raises(ValueError, match="displacement"):
        DisplacementTransform(np.zeros((3, 8, 8)))
    with pytest.raises(FileNotFoundError):
        load_transform(tmp_path / "missing.npz")


@pytest.mark.parametrize("steps", [64, -1, 2.5, True])
def test_velocity_steps_are_checked_when_made(steps):
    """steps=64 overflowed only when the field was integrated (2**64 in the division)."""
    with pytest.raises(ValueError, match=r"steps must be an int in \[0, 30\]"):
        VelocityTransform(np.zeros((2, 8, 8)), steps=steps)
