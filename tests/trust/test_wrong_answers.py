"""Class "silent wrong answers": each finding of the trust review, swept over its range.

References are independent: float64 computations written here with NumPy (sliding
windows), scikit-image, SciPy, or the same operator in float64 where the claim is that
float32 agrees with it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from scipy import ndimage as ndi

from napari_simwarp import ops, register, register_stack
from napari_simwarp.registration import AffineTransform, DisplacementTransform
from napari_simwarp.registration.quality import RegistrationWarning


def _smooth(rng, shape, sigma=2.0):
    return ndi.gaussian_filter(rng.random(shape), sigma)


# -- register_stack: shifts up to half the frame --------------------------------------------


@pytest.mark.parametrize("size,fraction", [(48, 0.4), (64, 0.45), (64, 0.5), (96, 0.48)])
def test_stack_shifts_up_to_half_the_frame_are_found(rng, size, fraction):
    base = _smooth(rng, (3 * size, 3 * size), 3)
    shift = np.array([round(fraction * size), -round(fraction * size / 2)])
    o = size
    frames = np.stack(
        [
            base[o : o + size, o : o + size],
            base[o + shift[0] : o + shift[0] + size, o + shift[1] : o + shift[1] + size],
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RegistrationWarning)
        result = register_stack(frames)
    # frame 1 = base(y + shift) = frame 0(y + shift): frame0(x) = frame1(x - shift).
    np.testing.assert_allclose(result.shifts[1], -shift, atol=0.1)


def test_stack_beyond_the_capture_range_says_so(rng):
    size = 48
    base = _smooth(rng, (200, 200), 3)
    frames = np.stack([base[:size, :size], base[150 : 150 + size, 150 : 150 + size]])  # no overlap
    with pytest.warns(RegistrationWarning):
        result = register_stack(frames)
    assert result.warnings


# -- register: pairs of different shapes --------------------------------------------------


@pytest.mark.parametrize("model", ["translation", "rigid", "similarity", "affine"])
@pytest.mark.parametrize("crop_first", [False, True])
def test_different_shapes_start_from_phase_correlation(rng, model, crop_first):
    whole = _smooth(rng, (64, 64))
    offset = np.array([7, 9])
    crop = whole[offset[0] : offset[0] + 50, offset[1] : offset[1] + 52]
    fixed, moving = (crop, whole) if crop_first else (whole, crop)
    result = register(fixed, moving, model=model)
    # fixed(x) = moving(x + t): t = +offset when the crop is fixed, -offset otherwise.
    expected = offset if crop_first else -offset
    corners = np.array(
        [
            [0, 0],
            [0, fixed.shape[1] - 1],
            [fixed.shape[0] - 1, 0],
            [fixed.shape[0] - 1, fixed.shape[1] - 1],
        ],
        float,
    )
    mapped = corners @ result.transform.matrix[:2, :2].T + result.transform.matrix[:2, 2]
    assert np.abs(mapped - (corners + expected)).max() < 0.3
    assert result.similarity > 0.99 and not result.warnings


def test_a_poor_result_is_reported_for_every_model(rng):
    fixed = _smooth(rng, (64, 64))
    unrelated = _smooth(np.random.default_rng(99), (64, 64))
    for model in ("translation", "affine", "deformable"):
        with pytest.warns(RegistrationWarning):
            result = register(fixed, unrelated, model=model, iterations=10)
        assert result.warnings and result.similarity < 0.5


# -- match_template in float32 -------------------------------------------------------------


def _zncc64(image, template):
    """Float64 ZNCC by explicit windows (each window centered on its own mean)."""
    w = sliding_window_view(image.astype(np.float64), template.shape)
    wc = w - w.mean(axis=(-1, -2), keepdims=True)
    t = template.astype(np.float64) - template.mean()
    num = (wc * t).sum(axis=(-1, -2))
    den = np.sqrt((wc**2).sum(axis=(-1, -2)) * (t**2).sum())
    return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


@pytest.mark.parametrize("contrast", [1.0, 1e2, 1e4])
@pytest.mark.parametrize("shape,tshape", [((60, 70), (9, 11)), ((96, 80), (16, 20))])
def test_match_template_float32_agrees_with_float64_in_bright_and_dark_regions(
    rng, backend, contrast, shape, tshape
):
    image = rng.random(shape).astype(np.float32)
    image[: shape[0] // 2] *= contrast  # a bright half beside a dark one
    r, c = shape[0] - tshape[0] - 3, 5  # the template comes from the dark half
    template = image[r : r + tshape[0], c : c + tshape[1]].copy()
    out = ops.match_template(
        torch.from_numpy(image)[None, None], torch.from_numpy(template)[None, None]
    )[0, 0].numpy()
    assert out.dtype == np.float32 and out.min() >= -1.0 and out.max() <= 1.0
    np.testing.assert_allclose(out, _zncc64(image, template), atol=1e-4)
    assert out[r, c] == pytest.approx(1.0, abs=1e-6)


def test_match_template_never_leaves_minus_one_to_one(rng):
    for _ in range(5):
        image = rng.random((40, 40)).astype(np.float32) * rng.uniform(1, 1e6)
        t = image[10:20, 12:22]
        out = ops.match_template(
            torch.from_numpy(image)[None, None],
            torch.from_numpy(t.copy())[None, None],
            pad_input=True,
        )
        assert float(out.abs().max()) <= 1.0


# -- scale invariance over the float32 range ----------------------------------------------


@pytest.mark.parametrize("scale", [1e-30, 1e-13, 1.0, 1e9, 1e19, 1e30])
@pytest.mark.parametrize("dims", [2, 3])
def test_normalized_metrics_are_scale_invariant(rng, scale, dims):
    shape = (1, 1, *([24] * dims))
    a = torch.from_numpy(rng.random(shape).astype(np.float32))
    b = a + 0.4 * torch.from_numpy(rng.random(shape).astype(np.float32))
    sa, sb = a * scale, b * scale
    assert torch.isfinite(sa).all() and torch.isfinite(sb).all()
    torch.testing.assert_close(ops.ncc(sa, sb), ops.ncc(a, b), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        ops.local_ncc(sa, sb, window=5), ops.local_ncc(a, b, window=5), rtol=0, atol=1e-5
    )
    t = (slice(None), slice(None), *[slice(4, 12)] * dims)
    torch.testing.assert_close(
        ops.match_template(sa, sa[t]), ops.match_template(a, a[t]), rtol=0, atol=1e-5
    )


# -- NaN pixels: one rule on every backend ----------------------------------------------


def _windows_with_nan(mask, window, mode):
    pads = [(k // 2, k // 2) for k in window]
    padded = np.pad(mask, pads, mode={"reflect": "symmetric", "constant": "constant"}[mode])
    return sliding_window_view(padded, window).any(axis=(-1, -2))


@pytest.mark.parametrize("padding", ["reflect", "constant"])
def test_local_std_is_nan_exactly_where_a_window_holds_a_nan(rng, backend, padding):
    x = rng.random((30, 41))
    x[3, 5] = np.nan
    x[20, 40] = np.inf
    x[29, 0] = -np.inf
    out = ops.local_std(torch.from_numpy(x)[None, None], window=(5, 7), padding=padding)[0, 0]
    nan = _windows_with_nan(~np.isfinite(x), (5, 7), padding)
    np.testing.assert_array_equal(np.isnan(out.numpy()), nan)
    padded = np.pad(
        np.where(np.isfinite(x), x, 0),
        [(2, 2), (3, 3)],
        mode={"reflect": "symmetric", "constant": "constant"}[padding],
    )
    ref = sliding_window_view(padded, (5, 7)).std(axis=(-1, -2))
    np.testing.assert_allclose(out.numpy()[~nan], ref[~nan], atol=1e-10)


def test_moment_metrics_and_template_matching_follow_the_nan_rule(rng, backend):
    a = rng.random((28, 33))
    b = a + 0.2 * rng.random((28, 33))
    b[10, 12] = np.nan
    ta, tb = (torch.from_numpy(v)[None, None] for v in (a, b))
    nan = _windows_with_nan(~np.isfinite(b), (7, 7), "reflect")
    for out in (ops.local_ncc(ta, tb, window=7), ops.ssim(ta, tb, window=7)):
        np.testing.assert_array_equal(np.isnan(out[0, 0].numpy()), nan)
    tpl = torch.from_numpy(a[2:8, 3:10].copy())[None, None]
    zncc = ops.match_template(tb, tpl)[0, 0].numpy()
    windows = sliding_window_view(~np.isfinite(b), (6, 7)).any(axis=(-1, -2))
    np.testing.assert_array_equal(np.isnan(zncc), windows)
    assert np.isnan(float(ops.ncc(ta, tb))) and np.isfinite(float(ops.ncc(ta, ta)))


# -- double backward: one error everywhere -----------------------------------------------


@pytest.mark.parametrize("op", ["local_std", "ssim", "local_ncc", "match_template", "splat"])
def test_double_backward_is_refused_the_same_way(backend, op):
    """Never silently zero: building the gradient's own graph through the op raises, on
    both backends, also in a loss that mixes in differentiable terms."""
    x = torch.rand(1, 1, 16, 16, dtype=torch.float64, requires_grad=True)
    other = torch.rand(1, 1, 16, 16, dtype=torch.float64)
    calls = {
        "local_std": lambda: ops.local_std(x, window=5),
        "ssim": lambda: ops.ssim(x, other, window=5),
        "local_ncc": lambda: ops.local_ncc(x, other, window=5),
        "match_template": lambda: ops.match_template(x, other[..., 2:8, 3:9]),
        "splat": lambda: ops.splat(x, 0.3 * other.expand(1, 2, 16, 16)),
    }
    for loss in (calls[op]().sum(), calls[op]().sum() + (x * x).sum()):
        with pytest.raises(RuntimeError, match="first derivatives only"):
            torch.autograd.grad(loss, x, create_graph=True)
    (g,) = torch.autograd.grad(calls[op]().sum(), x)  # first derivatives are fine
    assert torch.isfinite(g).all()


# -- labels never pass through floating point -----------------------------------------


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint16, np.bool_])
def test_labels_keep_their_exact_values(dtype):
    big = {
        np.int64: 2**62 + 1,
        np.uint64: 2**64 - 3,
        np.int32: 2**31 - 5,
        np.uint16: 65533,
        np.bool_: True,
    }[dtype]
    labels = np.zeros((20, 24), dtype=dtype)
    labels[5:12, 6:15] = big
    labels[14:18, 2:8] = 1 if dtype is not np.bool_ else True
    shift = AffineTransform(np.array([[1.0, 0, 1.0], [0, 1.0, -2.0], [0, 0, 1.0]]))
    out = shift.apply(labels, order=0)
    assert out.dtype == labels.dtype
    expected = ndi.shift(labels.astype(np.float64), (-1, 2), order=0, mode="constant")
    np.testing.assert_array_equal(out.astype(np.float64) != 0, expected != 0)
    assert set(np.unique(out).tolist()) <= set(np.unique(labels).tolist())
    assert (out == big).sum() == (labels == big).sum()  # all of the object moved in
    field = DisplacementTransform(np.stack([np.full((20, 24), 1.0), np.full((20, 24), -2.0)]))
    np.testing.assert_array_equal(field.apply(labels, order=0), out)


def test_labels_in_3d_and_with_leading_axes(rng):
    labels = rng.integers(0, 2**63 - 1, size=(2, 6, 7, 8), dtype=np.int64)
    out = AffineTransform(np.eye(4)).apply(labels, order=0)
    np.testing.assert_array_equal(out, labels)
