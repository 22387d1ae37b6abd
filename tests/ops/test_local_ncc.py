"""Tests for ``local_ncc``: values against SciPy filter sums, gradients against autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage as ndi

from napari_simwarp.ops import local_ncc
from tests import images

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")

SHAPES = {2: (70, 62), 3: (22, 24, 20)}


def _t(x: np.ndarray, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.as_tensor(x, dtype=dtype, device=device)[None, None]


def _sigma(window: int) -> float:
    return (window - 1) / 6.0


def _scipy_local_ncc(a: np.ndarray, b: np.ndarray, window: int, kernel: str) -> np.ndarray:
    """Float64 reference from SciPy window means (SciPy "reflect" borders)."""
    if kernel == "box":
        f = lambda x: ndi.uniform_filter(x, window, mode="reflect")
    else:
        sigma = _sigma(window)
        # truncate so that the radius int(truncate·σ + 0.5) is window // 2.
        f = lambda x: ndi.gaussian_filter(x, sigma, mode="reflect", truncate=(window // 2) / sigma)
    a = a - a.mean()
    b = b - b.mean()
    mu_a, mu_b = f(a), f(b)
    var_a = f(a * a) - mu_a**2
    var_b = f(b * b) - mu_b**2
    cov = f(a * b) - mu_a * mu_b
    return cov / np.sqrt(var_a * var_b)


def _pair(kind: str, ndim: int, rng: np.random.Generator):
    shape = SHAPES[ndim]
    if kind == "natural":
        base = images.natural(shape[-2:])
        a = np.broadcast_to(base, shape).copy() if ndim == 3 else base
        a = a + 0.02 * rng.standard_normal(shape)  # keeps every window textured
        b = a + 0.1 * rng.standard_normal(shape)
    elif kind == "random":
        a = images.random_smooth(rng, shape)
        b = 0.5 * a + 0.5 * images.random_smooth(rng, shape)
    else:
        a = images.microscopy(rng, shape)
        b = images.microscopy(rng, shape)
    return a, b


# -- an independent reference with autograd: plain torch convolutions -------------------


def _reflect_pad(x: torch.Tensor, r: int) -> torch.Tensor:
    for axis in range(x.dim() - 2):
        n = x.shape[2 + axis]
        idx = torch.as_tensor(np.pad(np.arange(n), r, mode="symmetric"), device=x.device)
        x = x.index_select(2 + axis, idx)
    return x


def _window_mean(x: torch.Tensor, window: int, kernel: str) -> torch.Tensor:
    if kernel == "box":
        g = torch.ones(window, dtype=x.dtype, device=x.device)
    else:
        t = torch.arange(window, dtype=x.dtype, device=x.device) - window // 2
        g = torch.exp(-0.5 * (t / _sigma(window)) ** 2)
    g = g / g.sum()
    d = x.dim() - 2
    k = g
    for _ in range(d - 1):
        k = k[..., None] * g
    conv = F.conv2d if d == 2 else F.conv3d
    n, c = x.shape[:2]
    padded = _reflect_pad(x, window // 2)
    return conv(padded.reshape(n * c, 1, *padded.shape[2:]), k[None, None]).reshape(x.shape)


def _torch_local_ncc(a, b, window, kernel):
    f = lambda x: _window_mean(x, window, kernel)
    mu_a, mu_b = f(a), f(b)
    var_a = f(a * a) - mu_a**2
    var_b = f(b * b) - mu_b**2
    return (f(a * b) - mu_a * mu_b) / torch.sqrt(var_a * var_b)


# -- tests ----------------------------------------------------------------------------


class TestLocalNCC:
    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    @pytest.mark.parametrize("reduction", ["none", "mean"])
    def test_smoke(self, device, ndim, kernel, reduction):
        shape = (2, 3, *SHAPES[ndim])
        a = torch.rand(shape, device=device)
        b = torch.rand(shape, device=device)
        out = local_ncc(a, b, window=5, kernel=kernel, reduction=reduction)
        assert out.dtype == a.dtype and out.device == a.device
        assert out.shape == (shape if reduction == "none" else ())
        assert torch.isfinite(out).all()

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kind", ["natural", "random", "microscopy"])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_scipy(self, device, rng, ndim, kind, kernel, dtype):
        a, b = _pair(kind, ndim, rng)
        window = 9 if ndim == 2 else 5
        expected = _scipy_local_ncc(a, b, window, kernel)
        out = local_ncc(_t(a, dtype, device), _t(b, dtype, device), window=window, kernel=kernel)
        assert out.dtype == dtype
        atol = 1e-10 if dtype == torch.float64 else 2e-4
        np.testing.assert_allclose(out[0, 0].double().cpu().numpy(), expected, rtol=0, atol=atol)

    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    def test_range_and_extremes(self, device, rng, kernel):
        a = _t(images.random_smooth(rng, (64, 64)), torch.float32, device)
        b = _t(images.random_smooth(rng, (64, 64)), torch.float32, device)
        out = local_ncc(a, b, window=7, kernel=kernel)
        assert out.min() >= -1 and out.max() <= 1
        assert out.min() < -0.5 and out.max() > 0.5  # unrelated textures: both signs
        ones = torch.ones_like(a)
        torch.testing.assert_close(
            local_ncc(a, a, window=7, kernel=kernel), ones, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            local_ncc(a, -a, window=7, kernel=kernel), -ones, atol=1e-5, rtol=0
        )
        # Invariant to gain and offset of either image.
        torch.testing.assert_close(
            local_ncc(a, 3 * a + 100, window=7, kernel=kernel), ones, atol=1e-4, rtol=0
        )

    def test_mean_is_mean_of_map(self, device):
        a = torch.rand(2, 2, 30, 26, device=device, dtype=torch.float64)
        b = torch.rand(2, 2, 30, 26, device=device, dtype=torch.float64)
        torch.testing.assert_close(local_ncc(a, b, reduction="mean"), local_ncc(a, b).mean())

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    def test_flat_regions_give_zero_and_finite_gradients(self, device, rng, dtype, kernel):
        a = images.random_smooth(rng, (48, 48))
        a[10:30, 12:34] = 0.37  # a flat block inside texture
        a = _t(a, dtype, device).requires_grad_()
        b = _t(images.random_smooth(rng, (48, 48)), dtype, device).requires_grad_()
        out = local_ncc(a, b, window=5, kernel=kernel)
        assert torch.isfinite(out).all()
        assert (out[0, 0, 12:28, 14:32] == 0).all()  # windows wholly inside the block
        out.sum().backward()
        assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_constant_images(self, device, dtype):
        a = torch.full((1, 2, 20, 20), 0.1, device=device, dtype=dtype, requires_grad=True)
        b = torch.full((1, 2, 20, 20), 1234.5, device=device, dtype=dtype, requires_grad=True)
        out = local_ncc(a, b, reduction="mean")
        assert out == 0
        out.backward()
        assert (a.grad == 0).all() and (b.grad == 0).all()

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    def test_gradcheck(self, device, ndim, kernel):
        shape = (1, 2, 10, 9) if ndim == 2 else (1, 1, 7, 6, 8)
        gen = torch.Generator().manual_seed(11)
        a = torch.rand(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
        b = torch.rand(shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
        for reduction in ("none", "mean"):
            fn = lambda x, y, reduction=reduction: local_ncc(
                x, y, window=5 if ndim == 2 else 3, kernel=kernel, reduction=reduction
            )
            assert torch.autograd.gradcheck(fn, (a, b), fast_mode=ndim == 3)

    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    def test_gradient_float32_matches_float64_reference(self, device, rng, kernel):
        """256² float32 analytical gradients within 1e-4·max|g| of float64 autograd."""
        a64 = _t(images.natural((256, 256)) + 0.02 * rng.standard_normal((256, 256)))
        b64 = _t(images.random_smooth(rng, (256, 256)))
        v = torch.as_tensor(rng.standard_normal((1, 1, 256, 256)))
        a_ref, b_ref = a64.clone().requires_grad_(), b64.clone().requires_grad_()
        (_torch_local_ncc(a_ref, b_ref, 9, kernel) * v).sum().backward()
        a32 = a64.float().to(device).requires_grad_()
        b32 = b64.float().to(device).requires_grad_()
        (local_ncc(a32, b32, window=9, kernel=kernel) * v.float().to(device)).sum().backward()
        for got, ref in ((a32.grad, a_ref.grad), (b32.grad, b_ref.grad)):
            err = (got.double().cpu() - ref).abs().max()
            assert err <= 1e-4 * ref.abs().max(), err

    def test_reference_matches_scipy(self, rng):
        a, b = _pair("random", 2, rng)
        for kernel in ("box", "gaussian"):
            ref = _torch_local_ncc(_t(a), _t(b), 9, kernel)[0, 0].numpy()
            np.testing.assert_allclose(ref, _scipy_local_ncc(a, b, 9, kernel), atol=1e-10)

    @pytest.mark.parametrize("ndim", [2, 3])
    def test_noncontiguous(self, device, ndim):
        gen = torch.Generator().manual_seed(12)
        shape = (2, 3, 30, 28) if ndim == 2 else (2, 3, 14, 16, 12)
        a = torch.rand(shape, generator=gen).to(device)
        b = torch.rand(shape, generator=gen).to(device)
        expected = local_ncc(a, b, window=5)
        layout = torch.channels_last if ndim == 2 else torch.channels_last_3d
        variants = [
            (a.to(memory_format=layout), b.to(memory_format=layout)),
            (a.mT.contiguous().mT, b.transpose(0, 1).contiguous().transpose(0, 1)),
        ]
        for x, y in variants:
            assert not x.is_contiguous() and not y.is_contiguous()
            torch.testing.assert_close(local_ncc(x, y, window=5), expected)
        big_a = torch.rand(1, 1, 60, 58, generator=gen).to(device)
        big_b = torch.rand(1, 1, 60, 58, generator=gen).to(device)
        view_a, view_b = big_a[..., ::2, 1::2], big_b[..., 1::2, ::2]
        assert not view_a.is_contiguous()
        torch.testing.assert_close(
            local_ncc(view_a, view_b, window=5),
            local_ncc(view_a.contiguous(), view_b.contiguous(), window=5),
        )

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_dtypes(self, device, rng, dtype):
        a = _t(images.random_smooth(rng, (40, 36)), dtype, device).requires_grad_()
        b = _t(images.random_smooth(rng, (40, 36)), dtype, device)
        out = local_ncc(a, b, window=7)
        assert out.dtype == dtype
        torch.testing.assert_close(
            out.float(), local_ncc(a.detach().float(), b.float(), window=7), atol=2e-2, rtol=0
        )
        out.float().mean().backward()
        assert a.grad.dtype == dtype and torch.isfinite(a.grad.float()).all()

    def test_large_box_window(self, device, rng):
        """Windows past the direct-sum limit take the prefix-sum route, both ways."""
        a, b = _pair("random", 2, rng)
        out = local_ncc(_t(a, device=device), _t(b, device=device), window=21)
        np.testing.assert_allclose(
            out[0, 0].cpu().numpy(), _scipy_local_ncc(a, b, 21, "box"), atol=1e-10
        )
        x = torch.rand(1, 1, 30, 28, dtype=torch.float64, device=device, requires_grad=True)
        y = torch.rand(1, 1, 30, 28, dtype=torch.float64, device=device, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda p, q: local_ncc(p, q, window=(19, 21), reduction="mean"), (x, y)
        )

    def test_per_axis_window_and_sigma(self, rng):
        a, b = _pair("random", 2, rng)
        out_iso = local_ncc(
            _t(a), _t(b), window=(9, 9), kernel="gaussian", sigma=(_sigma(9), _sigma(9))
        )
        np.testing.assert_allclose(
            out_iso[0, 0].numpy(), _scipy_local_ncc(a, b, 9, "gaussian"), atol=1e-10
        )
        out = local_ncc(_t(a), _t(b), window=(9, 5))
        assert out.shape == (1, 1, *a.shape)

    def test_exception(self, device):
        x = torch.rand(1, 1, 16, 16, device=device)
        cases = [
            (dict(a=x[0], b=x[0]), ValueError, "a must be"),
            (dict(a=x, b=x[0]), ValueError, "b must be"),
            (dict(a=x, b=torch.rand(1, 2, 16, 16, device=device)), ValueError, "same shape"),
            (dict(a=x, b=x, window=8), ValueError, "window must be odd"),
            (dict(a=x, b=x, window=0), ValueError, "window must be odd"),
            (dict(a=x, b=x, window=19), ValueError, "window .* larger"),
            (dict(a=x, b=x, window="9"), TypeError, "window"),
            (dict(a=x.to(torch.int32), b=x), TypeError, "a must be a floating"),
            (dict(a=x, b=x.bool()), TypeError, "b must be a floating"),
            (dict(a=x, b=x.to(torch.complex128)), TypeError, "b must be real"),
            (dict(a=x[..., :0], b=x[..., :0]), ValueError, "a must not be empty"),
            (dict(a=x, b=x, kernel="triangle"), ValueError, "kernel must be one of"),
            (dict(a=x, b=x, reduction="sum"), ValueError, "reduction must be one of"),
            (dict(a=x, b=x, kernel="box", sigma=1.0), ValueError, "sigma is only used"),
            (dict(a=x, b=x, kernel="gaussian", sigma=-1.0), ValueError, "sigma must be positive"),
        ]
        for kwargs, error, match in cases:
            a, b = kwargs.pop("a"), kwargs.pop("b")
            with pytest.raises(error, match=match):
                local_ncc(a, b, **kwargs)


@pytest.mark.parametrize("metric", ["local_ncc", "ssim"])
def test_float32_where_local_means_are_far_from_the_image_mean(metric):
    # Two halves ±450 apart with unit noise: centering on the image mean leaves Σa² huge
    # against the windows' variance; float32 sums cancelled to "flat" (0) here before.
    from napari_simwarp import ops

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1, 1, 64, 64, generator=gen) + 100.0
    a[..., 32:] += 900.0
    b = a + 0.3 * torch.randn(a.shape, generator=gen)
    if metric == "local_ncc":
        f32, f64 = ops.local_ncc(a, b, window=5), ops.local_ncc(a.double(), b.double(), window=5)
    else:
        kw = dict(reduction="none", data_range=1000.0)
        f32, f64 = ops.ssim(a, b, **kw), ops.ssim(a.double(), b.double(), **kw)
    assert f32.dtype == torch.float32
    assert (f32.double() - f64).abs().max() < 1e-5
    if metric == "local_ncc":
        assert (f32 == 0).float().mean() == 0


#: shapes whose tile grids leave outputs past the image in the last tiles
FLOAT32_SHAPES = {2: (151, 139), 3: (30, 34, 28)}


@pytest.mark.usefixtures("float32_moments")
class TestFloat32Path:
    """float32 data on the GPU's path, run on the CPU (tests/conftest.py): float32 sums,
    each tile centered on its own mean, risky windows redone two-pass (ops/_moments.py).
    Microscopy-like data (offset 1000, blobs, noise); references in float64 on the same
    float32 values; tile grids that do not divide the image."""

    def _data(self, rng, ndim):
        shape = FLOAT32_SHAPES[ndim]
        a = images.microscopy(rng, shape).astype(np.float32).astype(np.float64)
        b = (0.5 * a + 0.5 * images.microscopy(rng, shape)).astype(np.float32).astype(np.float64)
        return a, b

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    @pytest.mark.parametrize("window", [3, 9])
    def test_matches_scipy(self, rng, ndim, kernel, window):
        a, b = self._data(rng, ndim)
        out = local_ncc(_t(a, torch.float32), _t(b, torch.float32), window=window, kernel=kernel)
        assert out.dtype == torch.float32
        expected = _scipy_local_ncc(a, b, window, kernel)
        np.testing.assert_allclose(out[0, 0].double().numpy(), expected, rtol=0, atol=1e-4)

    @pytest.mark.parametrize("ndim", [2, 3])
    @pytest.mark.parametrize("kernel", ["box", "gaussian"])
    @pytest.mark.parametrize("reduction", ["none", "mean"])
    def test_gradients_match_float64_autograd(self, rng, ndim, kernel, reduction):
        a, b = self._data(rng, ndim)
        window = 9 if ndim == 2 else 5
        v = torch.as_tensor(rng.standard_normal((1, 1, *a.shape)))
        a_ref, b_ref = _t(a).requires_grad_(), _t(b).requires_grad_()
        ref = _torch_local_ncc(a_ref, b_ref, window, kernel)
        (ref.mean() if reduction == "mean" else (ref * v).sum()).backward()
        a32, b32 = _t(a, torch.float32).requires_grad_(), _t(b, torch.float32).requires_grad_()
        out = local_ncc(a32, b32, window=window, kernel=kernel, reduction=reduction)
        (out if reduction == "mean" else (out * v.float()).sum()).backward()
        for got, expected in ((a32.grad, a_ref.grad), (b32.grad, b_ref.grad)):
            err = (got.double() - expected).abs().max()
            assert err <= 1e-4 * expected.abs().max(), err

    def test_step_edge_with_little_noise(self):
        """Two flat halves 900 apart, noise 1: windows across the step are redone two-pass."""
        rng = np.random.default_rng(0)
        a = rng.standard_normal((64, 64)) + 100.0
        a[:, 32:] += 900.0
        b = a + 0.3 * rng.standard_normal(a.shape)
        a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
        out = local_ncc(_t(a, torch.float32), _t(b, torch.float32), window=5)
        expected = _scipy_local_ncc(a, b, 5, "box")
        np.testing.assert_allclose(out[0, 0].double().numpy(), expected, rtol=0, atol=1e-4)


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("shape", [(70, 66), (26, 30, 28)])
@pytest.mark.parametrize("kernel", ["box", "gaussian"])
def test_float32_step_on_offset_data_is_decided_by_the_two_pass_redo(monkeypatch, shape, kernel):
    """Microscopy-like data (offset 1000, noise 0.5) with a step of 3000: the windows by the
    step are redone two-pass in float32 (ops/_moments.py); the map within 1e-4 of SciPy on
    the same values in float64, and far off without the redo.

    The gradients' bound is looser: the backward's float32 adjoint pass (unchanged by the
    redo) combines maps about the tile's shift, which cancel by the step; measured 0.6e-4
    to 1.3e-4 of max|g| here (1.5e-4 to 3.6e-4 with the float64 redo this replaced, whose
    inputs were first centered on the image mean: ops/_moments._tile_inputs)."""
    from napari_simwarp.ops import _moments

    rng = np.random.default_rng(7)
    a = images.microscopy(rng, shape, noise=0.5)
    a[..., shape[-1] // 2 :] += 3000.0
    b = 0.7 * a + rng.normal(0.0, 0.3, shape) + 200.0
    a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    expected = _scipy_local_ncc(a, b, 5, kernel)
    v = torch.as_tensor(rng.standard_normal((1, 1, *shape)))
    a_ref, b_ref = _t(a).requires_grad_(), _t(b).requires_grad_()
    (_torch_local_ncc(a_ref, b_ref, 5, kernel) * v).sum().backward()

    a32, b32 = _t(a, torch.float32).requires_grad_(), _t(b, torch.float32).requires_grad_()
    out = local_ncc(a32, b32, window=5, kernel=kernel)
    (out * v.float()).sum().backward()
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out[0, 0].detach().double().numpy(), expected, rtol=0, atol=1e-4)
    for got, want in ((a32.grad, a_ref.grad), (b32.grad, b_ref.grad)):
        assert (got.double() - want).abs().max() <= 2e-4 * want.abs().max()

    monkeypatch.setattr(_moments, "FLOAT32_RISK", float("inf"))  # no window redone
    plain = local_ncc(_t(a, torch.float32), _t(b, torch.float32), window=5, kernel=kernel)
    assert np.abs(plain[0, 0].double().numpy() - expected).max() > 1e-3
