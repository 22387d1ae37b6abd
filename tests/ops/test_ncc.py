"""Tests of ``ops.ncc`` (ops/ncc.py): global zero-normalized cross-correlation against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops import ncc
from tests import images

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")


def _as_tensor(x: np.ndarray, device, dtype=torch.float64) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)[None, None]


class TestNcc:
    def test_smoke(self, device):
        a = torch.rand(2, 3, 8, 9, device=device)
        out = ncc(a, a)
        assert out.shape == (2, 3) and out.dtype == a.dtype
        torch.testing.assert_close(out, torch.ones_like(out))
        assert ncc(
            torch.rand(1, 1, 4, 5, 6, device=device), torch.rand(1, 1, 4, 5, 6, device=device)
        ).shape == (1, 1)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_against_numpy(self, device, rng, dtype):
        a = images.microscopy(rng, (2, 48, 40))
        b = 0.5 * a + rng.normal(0.0, 20.0, a.shape) - 300.0
        ref = [np.corrcoef(a[i].ravel(), b[i].ravel())[0, 1] for i in range(2)]
        a_t = torch.from_numpy(a).to(device=device, dtype=dtype)[:, None]  # (2, 1, H, W)
        b_t = torch.from_numpy(b).to(device=device, dtype=dtype)[:, None]
        out = ncc(a_t, b_t)
        np.testing.assert_allclose(
            out[:, 0].double().cpu().numpy(), ref, atol=1e-6 if dtype == torch.float32 else 1e-12
        )

    def test_3d_against_numpy(self, device, rng):
        a = images.random_smooth(rng, (10, 12, 9))
        b = images.random_smooth(rng, (10, 12, 9))
        out = ncc(_as_tensor(a, device), _as_tensor(b, device))
        np.testing.assert_allclose(float(out), np.corrcoef(a.ravel(), b.ravel())[0, 1], atol=1e-12)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_half_dtypes(self, device, dtype):
        a = torch.rand(1, 2, 16, 16, device=device)
        b = a + 0.3 * torch.rand(1, 2, 16, 16, device=device)
        out = ncc(a.to(dtype), b.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ncc(a, b), atol=2e-2, rtol=0)

    @pytest.mark.parametrize("value", [0.0, 1000.3])
    def test_flat_is_zero(self, device, value):
        a = torch.full((1, 2, 8, 8), value, device=device, requires_grad=True)
        b = torch.rand(1, 2, 8, 8, device=device, requires_grad=True)
        out = ncc(a, b)
        assert (out == 0).all()
        grads = torch.autograd.grad(out.sum(), (a, b))
        assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads)

    def test_noncontiguous(self, device):
        a = torch.rand(2, 3, 12, 10, device=device)
        b = torch.rand(2, 3, 12, 10, device=device)
        ref = ncc(a, b)
        torch.testing.assert_close(ncc(a.transpose(-1, -2), b.transpose(-1, -2)), ref)
        torch.testing.assert_close(ncc(a.contiguous(memory_format=torch.channels_last), b), ref)
        torch.testing.assert_close(
            ncc(a[..., ::2, :], b[..., ::2, :]),
            ncc(a[..., ::2, :].contiguous(), b[..., ::2, :].contiguous()),
        )

    def test_gradcheck(self, device):
        for shape in ((2, 2, 5, 4), (1, 1, 3, 4, 3)):
            a = torch.rand(shape, dtype=torch.float64, device=device, requires_grad=True)
            b = torch.rand(shape, dtype=torch.float64, device=device, requires_grad=True)
            assert torch.autograd.gradcheck(ncc, (a, b))

    def test_gradient_float32_vs_float64_reference(self, device, rng):
        a = images.microscopy(rng, (256, 256))
        b = np.roll(a, 3, axis=0) + rng.normal(0.0, 5.0, a.shape)

        def reference(x, y):
            x, y = x - x.mean(), y - y.mean()
            return (x * y).sum() / torch.sqrt((x * x).sum() * (y * y).sum())

        a64, b64 = _as_tensor(a, device).requires_grad_(), _as_tensor(b, device).requires_grad_()
        refs = torch.autograd.grad(reference(a64, b64), (a64, b64))
        a32 = _as_tensor(a, device, torch.float32).requires_grad_()
        b32 = _as_tensor(b, device, torch.float32).requires_grad_()
        grads = torch.autograd.grad(ncc(a32, b32).sum(), (a32, b32))
        for grad, ref in zip(grads, refs):
            assert (grad.double() - ref).abs().max() < 1e-4 * ref.abs().max()

    def test_exception(self, device):
        a = torch.rand(1, 1, 8, 8, device=device)
        with pytest.raises(TypeError, match="a must be a torch.Tensor"):
            ncc(np.zeros((1, 1, 8, 8)), a)
        with pytest.raises(ValueError, match="b must be"):
            ncc(a, torch.rand(8, 8, device=device))
        with pytest.raises(ValueError, match="a and b must have the same shape"):
            ncc(a, torch.rand(1, 1, 8, 7, device=device))
        with pytest.raises(ValueError, match="a must not be empty"):
            ncc(torch.rand(1, 1, 0, 8, device=device), torch.rand(1, 1, 0, 8, device=device))
        for dtype in (torch.int32, torch.bool, torch.complex64):
            with pytest.raises(TypeError, match="b must be"):
                ncc(a, a.to(dtype))


@pytest.mark.usefixtures("float32_moments")
class TestGpuPolicy:
    """The GPU's rule forced on the CPU: float32 data summed in float32, no float64."""

    def test_float32_against_numpy_float64_on_offset_data(self, rng):
        a = images.microscopy(rng, (2, 96, 80))
        b = 0.5 * a + rng.normal(0.0, 20.0, a.shape) - 300.0
        a[1] += 1.0e6  # an offset float32 holds only to 1/16
        a, b = (x.astype(np.float32).astype(np.float64) for x in (a, b))  # what f32 holds
        ref = [np.corrcoef(a[i].ravel(), b[i].ravel())[0, 1] for i in range(2)]
        out = ncc(torch.from_numpy(a).float()[:, None], torch.from_numpy(b).float()[:, None])
        assert out.dtype == torch.float32
        np.testing.assert_allclose(out[:, 0].double().numpy(), ref, rtol=0, atol=1e-6)

    def test_gradient_against_float64_reference(self, rng):
        a = images.microscopy(rng, (128, 120))
        b = np.roll(a, 3, axis=0) + rng.normal(0.0, 5.0, a.shape)

        def reference(x, y):
            x, y = x - x.mean(), y - y.mean()
            return (x * y).sum() / torch.sqrt((x * x).sum() * (y * y).sum())

        a64, b64 = _as_tensor(a, "cpu").requires_grad_(), _as_tensor(b, "cpu").requires_grad_()
        refs = torch.autograd.grad(reference(a64, b64), (a64, b64))
        a32 = _as_tensor(a, "cpu", torch.float32).requires_grad_()
        b32 = _as_tensor(b, "cpu", torch.float32).requires_grad_()
        grads = torch.autograd.grad(ncc(a32, b32).sum(), (a32, b32))
        for grad, ref in zip(grads, refs):
            assert (grad.double() - ref).abs().max() < 1e-4 * ref.abs().max()

    @pytest.mark.parametrize("value", [0.0, 1000.3, 3.0e30])
    def test_flat_is_zero(self, value):
        a = torch.full((1, 2, 8, 8), value, requires_grad=True)
        b = torch.rand(1, 2, 8, 8, requires_grad=True)
        out = ncc(a, b)
        assert (out == 0).all()
        grads = torch.autograd.grad(out.sum(), (a, b))
        assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads)
