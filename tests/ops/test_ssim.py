"""Tests for ``ssim``: values against scikit-image, gradients against float64 autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from napari_simwarp.ops import ssim
from tests import images
from tests.ops.ssim_reference import skimage_ssim_map

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")

SHAPES = {2: (72, 60), 3: (22, 26, 20)}


def _pair(kind: str, ndim: int, rng: np.random.Generator):
    """Two related float64 images of one kind and their data range."""
    shape = SHAPES[ndim]
    if kind == "natural":
        a = images.natural(shape) if ndim == 2 else np.stack([images.natural(shape[1:])] * shape[0])
        a = a[: shape[0]] if ndim == 3 else a
        b = np.clip(a + 0.08 * rng.standard_normal(shape), 0.0, 1.0)
    elif kind == "random":
        a = images.random_smooth(rng, shape)
        b = np.clip(0.7 * a + 0.3 * images.random_smooth(rng, shape), 0.0, 1.0)
    else:
        a = images.microscopy(rng, shape)
        b = images.microscopy(rng, shape)
    data_range = float(max(a.max(), b.max()) - min(a.min(), b.min()))
    return a, b, data_range


def _t(x: np.ndarray, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.as_tensor(x, dtype=dtype, device=device)[None, None]


# -- an independent reference: plain torch ops, autograd through everything ------------


def _reflect_pad(x: torch.Tensor, r: int) -> torch.Tensor:
    """SciPy "reflect" (NumPy "symmetric") padding by ``r`` on every spatial axis."""
    d = x.dim() - 2
    for axis in range(d):
        n = x.shape[2 + axis]
        idx = torch.as_tensor(np.pad(np.arange(n), r, mode="symmetric"), device=x.device)
        x = x.index_select(2 + axis, idx)
    return x


def _gaussian_conv(x: torch.Tensor, size: int, sigma: float) -> torch.Tensor:
    """Same-size Gaussian filter by one full N-D convolution with the outer-product kernel."""
    t = torch.arange(size, dtype=x.dtype, device=x.device) - size // 2
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    g = g / g.sum()
    d = x.dim() - 2
    kernel = g
    for _ in range(d - 1):
        kernel = kernel[..., None] * g
    conv = F.conv2d if d == 2 else F.conv3d
    n, c = x.shape[:2]
    padded = _reflect_pad(x, size // 2)
    y = conv(padded.reshape(n * c, 1, *padded.shape[2:]), kernel[None, None])
    return y.reshape(x.shape)


def _ssim_reference(a, b, window=11, sigma=1.5, data_range=1.0, k1=0.01, k2=0.03):
    """The textbook SSIM map, written with plain torch ops."""
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    f = lambda x: _gaussian_conv(x, window, sigma)
    mu_a, mu_b = f(a), f(b)
    var_a = f(a * a) - mu_a**2
    var_b = f(b * b) - mu_b**2
    cov = f(a * b) - mu_a * mu_b
    return ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / (
        (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    )


# -- tests ----------------------------------------------------------------------------


class TestSSIM:
    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("reduction", ["none", "mean"])
    def test_smoke(self, device, ndim, reduction):
        shape = (2, 3, *SHAPES[ndim])
        a = torch.rand(shape, device=device)
        b = torch.rand(shape, device=device)
        out = ssim(a, b, reduction=reduction)
        assert out.dtype == a.dtype and out.device == a.device
        assert out.shape == (shape if reduction == "none" else ())
        assert torch.isfinite(out).all()

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kind", ["natural", "random", "microscopy"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_skimage(self, device, rng, ndim, kind, dtype):
        """Same padding as scikit-image (SciPy "reflect"), so the whole map matches."""
        a, b, data_range = _pair(kind, ndim, rng)
        expected = skimage_ssim_map(a, b, data_range)
        out = ssim(
            _t(a, dtype, device), _t(b, dtype, device), data_range=data_range, reduction="none"
        )
        assert out.dtype == dtype
        np.testing.assert_allclose(out[0, 0].double().cpu().numpy(), expected, rtol=0, atol=1e-4)

    def test_mean_is_mean_of_map(self, device, rng):
        a = torch.rand(2, 2, 40, 36, device=device, dtype=torch.float64)
        b = torch.rand(2, 2, 40, 36, device=device, dtype=torch.float64)
        full = ssim(a, b, reduction="none")
        torch.testing.assert_close(ssim(a, b, reduction="mean"), full.mean())

    def test_batch_and_channels_are_independent(self, device, rng):
        """Every (N, C) slice is its own image (each gets its own centering offset)."""
        a = torch.as_tensor(np.stack([images.microscopy(rng, (48, 40)) * s for s in (1, 3)]))
        b = torch.as_tensor(np.stack([images.microscopy(rng, (48, 40)) * s for s in (1, 3)]))
        a, b = a.reshape(1, 2, 48, 40).to(device), b.reshape(1, 2, 48, 40).to(device)
        full = ssim(a, b, data_range=1200.0, reduction="none")
        for c in range(2):
            one = ssim(a[:, c : c + 1], b[:, c : c + 1], data_range=1200.0, reduction="none")
            torch.testing.assert_close(full[:, c : c + 1], one)

    def test_identical_images_give_one(self, device, rng):
        a = _t(images.random_smooth(rng, (40, 40)), torch.float32, device)
        torch.testing.assert_close(
            ssim(a, a, reduction="none"), torch.ones_like(a), atol=1e-5, rtol=0
        )

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_constant_images_are_finite(self, device, dtype):
        a = torch.full((1, 1, 24, 24), 0.3, device=device, dtype=dtype, requires_grad=True)
        b = torch.full((1, 1, 24, 24), 0.7, device=device, dtype=dtype, requires_grad=True)
        out = ssim(a, b, reduction="none")
        expected = (2 * 0.3 * 0.7 + 1e-4) / (0.3**2 + 0.7**2 + 1e-4)  # luminance term only
        torch.testing.assert_close(out, torch.full_like(out, expected))
        out.sum().backward()
        assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
        same = ssim(a.detach(), a.detach())
        torch.testing.assert_close(same, torch.ones_like(same))

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("reduction", ["none", "mean"])
    def test_gradcheck(self, device, ndim, reduction):
        shape = (1, 2, 11, 9) if ndim == 2 else (1, 1, 7, 8, 6)
        gen = torch.Generator().manual_seed(3)
        a = torch.rand(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
        b = torch.rand(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
        fn = lambda x, y: ssim(x, y, window=5, sigma=1.0, data_range=1.0, reduction=reduction)
        assert torch.autograd.gradcheck(fn, (a, b), fast_mode=ndim == 3)

    def test_gradcheck_offset_data(self, device):
        """Large offsets exercise the centering and its conversion back to plain moments."""
        gen = torch.Generator().manual_seed(4)
        a = (50 + torch.rand(1, 1, 9, 10, generator=gen, dtype=torch.float64)).to(device)
        b = (20 + 2 * torch.rand(1, 1, 9, 10, generator=gen, dtype=torch.float64)).to(device)
        fn = lambda x, y: ssim(x, y, window=5, data_range=60.0, reduction="none")
        assert torch.autograd.gradcheck(fn, (a.requires_grad_(), b.requires_grad_()))

    def test_gradient_float32_matches_float64_reference(self, device, rng):
        """256² float32 analytical gradients within 1e-4·max|g| of float64 autograd."""
        a64 = _t(images.natural((256, 256)))
        b64 = _t(np.clip(images.natural((256, 256)) + 0.1 * rng.standard_normal((256, 256)), 0, 1))
        v = torch.as_tensor(rng.standard_normal((1, 1, 256, 256)))  # random upstream gradient
        a_ref, b_ref = a64.clone().requires_grad_(), b64.clone().requires_grad_()
        (_ssim_reference(a_ref, b_ref) * v).sum().backward()
        a32 = a64.float().to(device).requires_grad_()
        b32 = b64.float().to(device).requires_grad_()
        (ssim(a32, b32, reduction="none") * v.float().to(device)).sum().backward()
        for got, ref in ((a32.grad, a_ref.grad), (b32.grad, b_ref.grad)):
            err = (got.double().cpu() - ref).abs().max()
            assert err <= 1e-4 * ref.abs().max(), err

    def test_reference_matches_skimage(self, rng):
        """Guards the test's own reference (it is what the gradients are checked against)."""
        a, b, data_range = _pair("random", 2, rng)
        ref = _ssim_reference(_t(a), _t(b), data_range=data_range)
        np.testing.assert_allclose(
            ref[0, 0].numpy(), skimage_ssim_map(a, b, data_range), atol=1e-10
        )

    @pytest.mark.parametrize("ndim", [2, 3])
    def test_noncontiguous(self, device, ndim):
        gen = torch.Generator().manual_seed(5)
        shape = (2, 3, 30, 28) if ndim == 2 else (2, 3, 14, 16, 12)
        a = torch.rand(shape, generator=gen).to(device)
        b = torch.rand(shape, generator=gen).to(device)
        expected = ssim(a, b, reduction="none")
        layout = torch.channels_last if ndim == 2 else torch.channels_last_3d
        variants = [
            (a.to(memory_format=layout), b.to(memory_format=layout)),
            (a.mT.contiguous().mT, b.transpose(0, 1).contiguous().transpose(0, 1)),
        ]
        for x, y in variants:
            assert not x.is_contiguous() and not y.is_contiguous()
            torch.testing.assert_close(ssim(x, y, reduction="none"), expected)

    def test_noncontiguous_strided_views(self, device):
        gen = torch.Generator().manual_seed(6)
        big_a = torch.rand(1, 1, 64, 60, generator=gen).to(device)
        big_b = torch.rand(1, 1, 64, 60, generator=gen).to(device)
        a, b = big_a[..., ::2, 1::2], big_b[..., ::2, 1::2]
        assert not a.is_contiguous()
        torch.testing.assert_close(
            ssim(a, b, reduction="none"), ssim(a.contiguous(), b.contiguous(), reduction="none")
        )

    def test_gradient_noncontiguous(self, device):
        gen = torch.Generator().manual_seed(7)
        a = torch.rand(1, 1, 32, 30, generator=gen, dtype=torch.float64).to(device)
        b = torch.rand(1, 1, 32, 30, generator=gen, dtype=torch.float64).to(device)
        grads = []
        for x, y in ((a, b), (a.mT.contiguous().mT, b.to(memory_format=torch.channels_last))):
            x = x.clone().requires_grad_()
            ssim(x, y, reduction="mean").backward()
            grads.append(x.grad)
        torch.testing.assert_close(grads[0], grads[1])

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_dtypes(self, device, rng, dtype):
        a = _t(images.random_smooth(rng, (40, 36)), dtype, device).requires_grad_()
        b = _t(images.random_smooth(rng, (40, 36)), dtype, device)
        out = ssim(a, b, reduction="none")
        assert out.dtype == dtype
        expected = ssim(a.detach().float(), b.float(), reduction="none")
        torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=0)
        out.float().mean().backward()
        assert a.grad.dtype == dtype and torch.isfinite(a.grad.float()).all()

    def test_per_axis_window_and_sigma(self, rng):
        a, b, data_range = _pair("random", 2, rng)
        out = ssim(
            _t(a), _t(b), window=(11, 11), sigma=(1.5, 1.5), data_range=data_range, reduction="none"
        )
        np.testing.assert_allclose(
            out[0, 0].numpy(), skimage_ssim_map(a, b, data_range), atol=1e-10
        )

    def test_exception(self, device):
        x = torch.rand(1, 1, 16, 16, device=device)
        cases = [
            (dict(a=x[0], b=x[0]), ValueError, "a must be"),
            (dict(a=x, b=torch.rand(1, 1, 16, 15, device=device)), ValueError, "same shape"),
            (dict(a=x, b=x, window=4), ValueError, "window must be odd"),
            (dict(a=x, b=x, window=0), ValueError, "window must be odd"),
            (dict(a=x, b=x, window=-3), ValueError, "window must be odd"),
            (dict(a=x, b=x, window=17), ValueError, "window .* larger"),
            (dict(a=x, b=x, window=(5, 5, 5)), ValueError, "window must have one size"),
            (dict(a=x, b=x, window=2.5), TypeError, "window"),
            (dict(a=(x * 255).to(torch.uint8), b=x), TypeError, "a must be a floating"),
            (dict(a=x, b=x > 0.5), TypeError, "b must be a floating"),
            (dict(a=x.to(torch.complex64), b=x.to(torch.complex64)), TypeError, "a must be real"),
            (
                dict(a=x.numpy() if device.type == "cpu" else x.cpu().numpy(), b=x),
                TypeError,
                "a must be a torch.Tensor",
            ),
            (dict(a=x[:, :, :0], b=x[:, :, :0]), ValueError, "a must not be empty"),
            (dict(a=x, b=x, reduction="sum"), ValueError, "reduction must be one of"),
            (dict(a=x, b=x, sigma=0.0), ValueError, "sigma must be positive"),
            (dict(a=x, b=x, data_range=-1.0), ValueError, "data_range must be positive"),
            (dict(a=x, b=x, k1=0), ValueError, "k1 must be positive"),
            (dict(a=x, b=x, k2=math.nan), ValueError, "k2 must be positive"),
        ]
        for kwargs, error, match in cases:
            a, b = kwargs.pop("a"), kwargs.pop("b")
            with pytest.raises(error, match=match):
                ssim(a, b, **kwargs)


@pytest.mark.usefixtures("float32_moments")
class TestFloat32Path:
    """float32 data on the GPU's path, run on the CPU (tests/conftest.py): float32 sums,
    each tile centered on its own mean, risky windows redone two-pass in float32
    (ops/_moments.py).
    Microscopy-like data (offset 1000, blobs, noise); references in float64 on the same
    float32 values; a tile grid that does not divide the image."""

    SHAPE = (150, 140)

    def _data(self, rng, shape=SHAPE):
        a = images.microscopy(rng, shape).astype(np.float32).astype(np.float64)
        b = images.microscopy(rng, shape).astype(np.float32).astype(np.float64)
        return a, b

    @pytest.mark.parametrize("data_range", [None, 50.0])
    def test_matches_skimage(self, rng, data_range):
        a, b = self._data(rng)
        if data_range is None:
            data_range = float(max(a.max(), b.max()) - min(a.min(), b.min()))
        out = ssim(_t(a, torch.float32), _t(b, torch.float32), data_range=data_range)
        assert out.dtype == torch.float32
        expected = skimage_ssim_map(a, b, data_range)
        np.testing.assert_allclose(out[0, 0].double().numpy(), expected, rtol=0, atol=1e-4)

    def test_matches_float64_reference_3d(self, rng):
        a, b = self._data(rng, (30, 34, 28))
        out = ssim(_t(a, torch.float32), _t(b, torch.float32), window=7, data_range=50.0)
        expected = _ssim_reference(_t(a), _t(b), window=7, data_range=50.0)
        np.testing.assert_allclose(out.double().numpy(), expected.numpy(), rtol=0, atol=1e-4)

    @pytest.mark.parametrize("reduction", ["none", "mean"])
    def test_gradients_match_float64_autograd(self, rng, reduction):
        a, b = self._data(rng)
        v = torch.as_tensor(rng.standard_normal((1, 1, *self.SHAPE)))
        a_ref, b_ref = _t(a).requires_grad_(), _t(b).requires_grad_()
        ref = _ssim_reference(a_ref, b_ref, data_range=50.0)
        (ref.mean() if reduction == "mean" else (ref * v).sum()).backward()
        a32, b32 = _t(a, torch.float32).requires_grad_(), _t(b, torch.float32).requires_grad_()
        out = ssim(a32, b32, data_range=50.0, reduction=reduction)
        (out if reduction == "mean" else (out * v.float()).sum()).backward()
        for got, expected in ((a32.grad, a_ref.grad), (b32.grad, b_ref.grad)):
            err = (got.double() - expected).abs().max()
            assert err <= 1e-4 * expected.abs().max(), err

    def test_nan_where_a_window_sees_one(self, rng):
        a, b = self._data(rng)
        a[70, 30] = np.nan
        out = ssim(_t(a, torch.float32), _t(b, torch.float32), data_range=50.0)[0, 0].numpy()
        filled = np.where(np.isnan(a), 0.0, a)
        expected = skimage_ssim_map(filled, b, 50.0)
        seen = np.zeros(a.shape, bool)
        seen[65:76, 25:36] = True  # the 11 × 11 windows that hold (70, 30)
        assert np.array_equal(np.isnan(out), seen)
        np.testing.assert_allclose(out[~seen], expected[~seen], rtol=0, atol=1e-4)

    def test_layouts_batches_and_half_types(self, rng):
        """channels_last, a batch of images with other offsets and float16 give what each
        contiguous float32 image gives on its own."""
        a, b = self._data(rng, (48, 44))
        a32, b32 = _t(a, torch.float32), _t(b, torch.float32)
        other_a, other_b = 3 * a32 - 500, 3 * b32 - 500
        batch_a = torch.cat([a32, other_a, a32]).expand(3, 2, -1, -1)
        batch_b = torch.cat([b32, other_b, b32]).expand(3, 2, -1, -1)
        out = ssim(
            batch_a.to(memory_format=torch.channels_last),
            batch_b.to(memory_format=torch.channels_last),
            data_range=50.0,
        )
        single = ssim(a32, b32, data_range=50.0)
        torch.testing.assert_close(out[0:1, 0:1], single, rtol=0, atol=1e-6)
        torch.testing.assert_close(out[2:3, 1:2], single, rtol=0, atol=1e-6)
        other = ssim(other_a, other_b, data_range=50.0)
        torch.testing.assert_close(out[1:2, 0:1], other, rtol=0, atol=1e-6)
        half = ssim(a32.half(), b32.half(), data_range=50.0)
        assert half.dtype == torch.float16
        expected = ssim(a32.half().float(), b32.half().float(), data_range=50.0)
        torch.testing.assert_close(half.float(), expected, rtol=0, atol=1e-3)
