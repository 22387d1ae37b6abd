"""Tests of local_std against SciPy's uniform_filter (float64) and plain float64 autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage as ndi

from napari_simwarp.ops import local_std
from napari_simwarp.ops._reference import window_sums as _filters
from tests import images

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")

#: every local_std boundary is the SciPy mode of the same name.
PADDINGS = ["reflect", "mirror", "nearest", "constant"]


def _scipy_std(x: np.ndarray, window, padding: str = "reflect") -> np.ndarray:
    """sqrt(max(E[x²] - E[x]², 0)) over the window, float64, SciPy's boundary modes."""
    mode = padding
    m1 = ndi.uniform_filter(x, window, mode=mode)
    m2 = ndi.uniform_filter(x * x, window, mode=mode)
    return np.sqrt(np.maximum(m2 - m1 * m1, 0.0))


def _image(kind: str, rng, shape) -> np.ndarray:
    if kind == "natural":
        return images.natural(shape) if len(shape) == 2 else images.random_smooth(rng, shape)
    if kind == "random":
        return images.random_smooth(rng, shape, sigma=1.0)
    return images.microscopy(rng, shape)


def _as_tensor(x: np.ndarray, device, dtype=torch.float32) -> torch.Tensor:
    return torch.from_numpy(x).to(device=device, dtype=dtype)[None, None]


def _reference_std_torch(x: torch.Tensor, window, padding: str = "reflect") -> torch.Tensor:
    """Straightforward float64 autograd reference: explicit padding, conv with ones."""
    d = x.dim() - 2
    out = x
    for axis, k in enumerate(window):
        n = x.shape[2 + axis]
        r = k // 2
        i = torch.arange(-r, n + r, device=x.device)
        if padding == "reflect":
            i = torch.where(i < 0, -i - 1, torch.where(i >= n, 2 * n - 1 - i, i))
            out = out.index_select(2 + axis, i)
        elif padding == "mirror":
            i = torch.where(i < 0, -i, torch.where(i >= n, 2 * n - 2 - i, i))
            out = out.index_select(2 + axis, i)
        elif padding == "nearest":
            out = out.index_select(2 + axis, i.clamp(0, n - 1))
        else:
            pad = [0, 0] * d
            pad[2 * (d - 1 - axis)] = pad[2 * (d - 1 - axis) + 1] = r
            out = F.pad(out, pad)
    conv = F.conv2d if d == 2 else F.conv3d
    ones = torch.ones(1, 1, *window, dtype=x.dtype, device=x.device) / float(np.prod(window))
    flat = out.reshape(-1, 1, *out.shape[2:])
    m1 = conv(flat, ones)
    m2 = conv(flat * flat, ones)
    return (m2 - m1 * m1).clamp_min(0).sqrt().reshape(x.shape)


class TestLocalStd:
    def test_smoke(self, device):
        x = torch.rand(2, 3, 20, 24, device=device)
        out = local_std(x, window=5)
        assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        x3 = torch.rand(1, 2, 9, 10, 11, device=device)
        assert local_std(x3, window=(3, 5, 7)).shape == x3.shape

    @pytest.mark.parametrize("kind", ["natural", "random", "microscopy"])
    @pytest.mark.parametrize("padding", PADDINGS)
    @pytest.mark.parametrize("method", ["auto", "box", "fft"])
    @pytest.mark.parametrize(
        "shape, window", [((96, 80), 15), ((64, 70), (3, 9)), ((24, 20, 22), 5)]
    )
    def test_float32_against_scipy_float64(self, device, rng, kind, padding, method, shape, window):
        x = _image(kind, rng, shape)
        ref = _scipy_std(x, window, padding)
        out = local_std(_as_tensor(x, device), window=window, method=method, padding=padding)
        out = out[0, 0].double().cpu().numpy()
        mask = ref > 1e-3 * (x.max() - x.min())
        rel = np.abs(out - ref)[mask] / ref[mask]
        assert rel.max() < 1e-4

    def test_float64_against_scipy(self, device, rng):
        x = images.microscopy(rng, (50, 60))
        for padding in PADDINGS:
            out = local_std(_as_tensor(x, device, torch.float64), window=(7, 5), padding=padding)
            np.testing.assert_allclose(
                out[0, 0].cpu().numpy(), _scipy_std(x, (7, 5), padding), rtol=1e-9, atol=1e-9
            )

    def test_large_image_chunks(self, device, rng):
        # 300 x 2000 float32 is split into several row slabs on the CPU.
        x = images.microscopy(rng, (300, 2000))
        out = local_std(_as_tensor(x, device), window=21)[0, 0].double().cpu().numpy()
        ref = _scipy_std(x, 21)
        assert (np.abs(out - ref) / ref).max() < 1e-4

    def test_chunked_equals_whole(self, device, rng, monkeypatch):
        x = _as_tensor(images.microscopy(rng, (40, 30)), device, torch.float64).requires_grad_()
        whole = local_std(x, window=5)
        (g_whole,) = torch.autograd.grad(whole.sum(), x)
        monkeypatch.setattr(_filters, "CHUNK_BYTES", 256)
        chunked = local_std(x, window=5)
        (g_chunked,) = torch.autograd.grad(chunked.sum(), x)
        torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_chunked, g_whole, rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("method", ["box", "fft"])
    def test_unnormalized_energy(self, device, rng, method):
        x = images.random_smooth(rng, (40, 36))
        eps = 1e-6
        out = local_std(
            _as_tensor(x, device, torch.float64), window=7, normalize=False, eps=eps, method=method
        )
        variance_sum = 49.0 * _scipy_std(x, 7) ** 2  # S2 - S1²/N
        np.testing.assert_allclose(out[0, 0].cpu().numpy(), np.sqrt(variance_sum + eps), rtol=1e-9)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_dtypes(self, device, rng, dtype):
        x = images.random_smooth(rng, (32, 30))
        out = local_std(_as_tensor(x, device, dtype), window=5)
        assert out.dtype == dtype
        ref = local_std(_as_tensor(x, device, dtype).float(), window=5)
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-3)

    @pytest.mark.parametrize("method", ["box", "fft"])
    @pytest.mark.parametrize("normalized", [True, False])
    @pytest.mark.parametrize("offset", [0.0, 1000.3, -7.1e5])
    def test_constant_is_flat(self, device, method, normalized, offset):
        x = torch.full((1, 2, 16, 12), offset, device=device, requires_grad=True)
        out = local_std(x, window=5, method=method, normalize=normalized, eps=1e-8)
        expected = 0.0 if normalized else 1e-4
        torch.testing.assert_close(out, torch.full_like(out, expected))
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all() and (grad == 0).all()

    def test_flat_region_finite_gradient(self, device):
        x = torch.zeros(1, 1, 20, 20, dtype=torch.float64, device=device)
        x[..., 10:, :] = torch.rand(10, 20, dtype=torch.float64, device=device)
        x += 1000.0
        x.requires_grad_()
        out = local_std(x, window=3)
        assert (out[..., :8, :] == 0).all()
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()

    def test_noncontiguous(self, device, rng):
        x = _as_tensor(images.random_smooth(rng, (30, 40)), device).expand(2, 3, 30, 40)
        x = x + torch.rand(2, 3, 1, 1, device=device)
        ref = local_std(x.contiguous(), window=(5, 3))
        torch.testing.assert_close(local_std(x, window=(5, 3)), ref)
        xt = x.transpose(-1, -2)  # non-contiguous
        torch.testing.assert_close(
            local_std(xt, window=(3, 5)), local_std(xt.contiguous(), window=(3, 5))
        )
        cl = x.contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(local_std(cl, window=(5, 3)), ref)
        sliced = torch.rand(1, 3, 40, 60, device=device)[:, ::2, ::2, 1::3]
        torch.testing.assert_close(
            local_std(sliced, window=3), local_std(sliced.contiguous(), window=3)
        )

    @pytest.mark.parametrize("method", ["box", "fft"])
    @pytest.mark.parametrize("padding", PADDINGS)
    @pytest.mark.parametrize("normalized", [True, False])
    def test_gradcheck(self, device, method, padding, normalized):
        x2 = torch.rand(1, 2, 7, 6, dtype=torch.float64, device=device, requires_grad=True)
        x3 = torch.rand(1, 1, 5, 4, 6, dtype=torch.float64, device=device, requires_grad=True)
        cases = ((x2, (3, 5)), (x3, 3)) if method == "box" else ((x2, (3, 5)),)  # FFT: slow
        for x, window in cases:
            fn = lambda t, window=window: local_std(
                t,
                window=window,
                method=method,
                padding=padding,
                normalize=normalized,
            )
            assert torch.autograd.gradcheck(fn, (x,))

    @pytest.mark.parametrize("kind", ["random", "microscopy"])
    @pytest.mark.parametrize("padding", PADDINGS)
    def test_gradient_float32_vs_float64_reference(self, device, rng, kind, padding):
        x = _image(kind, rng, (256, 256))
        upstream = torch.from_numpy(rng.standard_normal((1, 1, 256, 256))).to(device)
        x64 = _as_tensor(x, device, torch.float64).requires_grad_()
        (ref,) = torch.autograd.grad(_reference_std_torch(x64, (15, 15), padding), x64, upstream)
        x32 = _as_tensor(x, device).requires_grad_()
        (grad,) = torch.autograd.grad(
            local_std(x32, window=15, padding=padding), x32, upstream.float()
        )
        assert (grad.double() - ref).abs().max() < 1e-4 * ref.abs().max()

    def test_gradient_3d_vs_reference(self, device, rng):
        x = _as_tensor(images.microscopy(rng, (12, 14, 10)), device, torch.float64)
        x.requires_grad_()
        upstream = torch.from_numpy(rng.standard_normal(x.shape)).to(device)
        (ref,) = torch.autograd.grad(_reference_std_torch(x, (3, 5, 3)), x, upstream)
        (grad,) = torch.autograd.grad(local_std(x, window=(3, 5, 3)), x, upstream)
        # Box sums and the direct reference round differently; 1/std amplifies
        # that in flat windows, so the bound is relative to the largest gradient.
        atol = 1e-9 * float(ref.abs().max())
        torch.testing.assert_close(grad, ref, rtol=1e-9, atol=atol)

    def test_exception(self, device):
        x = torch.rand(1, 1, 10, 10, device=device)
        with pytest.raises(TypeError, match="x must be a torch.Tensor"):
            local_std(np.zeros((1, 1, 10, 10)), window=3)
        with pytest.raises(ValueError, match="x must be"):
            local_std(torch.rand(10, 10, device=device), window=3)
        with pytest.raises(ValueError, match="x must not be empty"):
            local_std(torch.rand(1, 1, 0, 10, device=device), window=3)
        for dtype in (torch.int32, torch.bool, torch.complex64):
            with pytest.raises(TypeError, match="x must be"):
                local_std(torch.zeros(1, 1, 10, 10, dtype=dtype, device=device), window=3)
        for window in (4, 0, -3, (3, 4)):
            with pytest.raises(ValueError, match="window must be odd"):
                local_std(x, window=window)
        with pytest.raises(ValueError, match="window .* larger"):
            local_std(x, window=11)
        with pytest.raises(ValueError, match="window must have one size per spatial axis"):
            local_std(x, window=(3, 3, 3))
        with pytest.raises(TypeError, match="window"):
            local_std(x, window=3.0)
        with pytest.raises(ValueError, match="method"):
            local_std(x, window=3, method="direct")
        with pytest.raises(ValueError, match="padding"):
            local_std(x, window=3, padding="wrap")
        with pytest.raises(TypeError, match="normalize"):
            local_std(x, window=3, normalize="yes")
        with pytest.raises(ValueError, match="eps"):
            local_std(x, window=3, eps=-1.0)


@pytest.mark.usefixtures("float32_moments")
class TestGpuPolicy:
    """The GPU's rule forced on the CPU: float32 data summed in compensated float32, no
    float64 (the pure torch path: ops/_reference/compensated.py; the compiled CPU
    kernels keep their float64 sums and are tested above)."""

    @pytest.mark.parametrize("kind", ["natural", "microscopy"])
    @pytest.mark.parametrize("padding", PADDINGS)
    @pytest.mark.parametrize(
        "shape, window", [((96, 80), 15), ((64, 70), (3, 9)), ((24, 20, 22), 5)]
    )
    def test_float32_against_scipy_float64(self, rng, backend, kind, padding, shape, window):
        x = _image(kind, rng, shape)
        ref = _scipy_std(x, window, padding)
        out = local_std(_as_tensor(x, "cpu"), window=window, padding=padding)
        out = out[0, 0].double().numpy()
        mask = ref > 1e-3 * (x.max() - x.min())
        assert (np.abs(out - ref)[mask] / ref[mask]).max() < 1e-4

    @pytest.mark.parametrize("offset", [1000.0, -3.0e6])
    def test_dark_windows_beside_bright_ones(self, rng, backend, offset):
        # A large offset, a flat dim half (spread 1) beside a bright one (spread 1e4):
        # plain float32 sums lose every digit of the dim windows' variance.
        x = offset + rng.standard_normal((64, 48))
        x[:32] += 1e4 * rng.standard_normal((32, 48))
        x = x.astype(np.float32).astype(np.float64)  # the data float32 holds
        out = local_std(_as_tensor(x, "cpu"), window=7)[0, 0].double().numpy()
        # NumPy's two-pass std of every window (SciPy's E[x²] - E[x]² loses 1e-2 here,
        # even in float64), "reflect" being NumPy's "symmetric"
        windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, 3, "symmetric"), (7, 7))
        ref = windows.std(axis=(-2, -1))
        assert (np.abs(out - ref) / ref).max() < 1e-4

    @pytest.mark.parametrize("padding", ["reflect", "constant"])
    def test_gradient_against_float64_reference(self, rng, backend, padding):
        x = images.microscopy(rng, (96, 90))
        upstream = torch.from_numpy(rng.standard_normal((1, 1, 96, 90)))
        x64 = _as_tensor(x, "cpu", torch.float64).requires_grad_()
        (ref,) = torch.autograd.grad(_reference_std_torch(x64, (15, 15), padding), x64, upstream)
        x32 = _as_tensor(x, "cpu").requires_grad_()
        (grad,) = torch.autograd.grad(
            local_std(x32, window=15, padding=padding), x32, upstream.float()
        )
        assert (grad.double() - ref).abs().max() < 1e-4 * ref.abs().max()

    @pytest.mark.parametrize("normalized", [True, False])
    @pytest.mark.parametrize("offset", [0.0, 1000.3, -7.1e5, 3.0e30])
    def test_constant_is_flat(self, backend, normalized, offset):
        x = torch.full((1, 2, 16, 12), offset, requires_grad=True)
        out = local_std(x, window=5, normalize=normalized, eps=1e-8)
        torch.testing.assert_close(out, torch.full_like(out, 0.0 if normalized else 1e-4))
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all() and (grad == 0).all()


def test_compensated_primitives_are_error_free(rng):
    from napari_simwarp.ops._reference import compensated

    a = torch.from_numpy(rng.standard_normal(4000) * 10.0 ** rng.integers(-8, 8, 4000)).float()
    b = torch.from_numpy(rng.standard_normal(4000) * 10.0 ** rng.integers(-8, 8, 4000)).float()
    s, e = compensated.two_sum(a, b)
    assert ((s.double() + e.double()) == a.double() + b.double()).all()
    p, e = compensated.exact_square(a)
    assert ((p.double() + e.double()) == a.double() ** 2).all()
    p, e = compensated.exact_scaled(a, 225.0)
    assert ((p.double() + e.double()) == a.double() * 225.0).all()
    # Window sums of 1 + tiny values: float32 alone loses the tiny ones, the pair keeps them.
    x = (1.0 + torch.from_numpy(rng.standard_normal((1, 40))) * 1e-9).float()
    tiny = torch.from_numpy(rng.standard_normal((1, 40)) * 1e-9).float()
    hi, lo = compensated.box_sum_valid((x, tiny), (9,))
    ref = np.convolve(x.double().numpy()[0] + tiny.double().numpy()[0], np.ones(9), "valid")
    assert np.abs(hi.double().numpy()[0] + lo.double().numpy()[0] - ref).max() < 1e-12
