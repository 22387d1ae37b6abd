"""fft_cc against scipy.ndimage.correlate (an independent direct-summation reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops import fft_cc


def _valid_slice(ksize, shape):
    return tuple(slice(k // 2, n - (k - 1 - k // 2)) for k, n in zip(ksize, shape))


@pytest.mark.parametrize(
    "shape,ksize",
    [((17, 23), (5, 4)), ((32, 32), (7, 7)), ((9, 10, 11), (3, 4, 5)), ((6, 6), (9, 3))],
)
def test_same_matches_scipy_constant(shape, ksize, rng, device):
    x = rng.standard_normal(shape)
    k = rng.standard_normal(ksize)
    ref = ndi.correlate(x, k, mode="constant")
    out = fft_cc(torch.from_numpy(x)[None, None].to(device), torch.from_numpy(k).to(device))
    assert out.shape == (1, 1, *shape)
    np.testing.assert_allclose(out[0, 0].cpu().numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("shape,ksize", [((17, 23), (5, 4)), ((9, 10, 11), (3, 4, 5))])
def test_valid_is_the_interior_of_same(shape, ksize, rng, device):
    x = rng.standard_normal(shape)
    k = rng.standard_normal(ksize)
    ref = ndi.correlate(x, k, mode="constant")[_valid_slice(ksize, shape)]
    out = fft_cc(
        torch.from_numpy(x)[None, None].to(device), torch.from_numpy(k).to(device), mode="valid"
    )
    assert out.shape[2:] == ref.shape
    np.testing.assert_allclose(out[0, 0].cpu().numpy(), ref, atol=1e-12)


def test_broadcast_kernel_per_channel(rng, device):
    x = torch.from_numpy(rng.standard_normal((2, 3, 20, 21))).to(device)
    k = torch.from_numpy(rng.standard_normal((1, 3, 5, 5))).to(device)
    out = fft_cc(x, k).cpu().numpy()
    for n in range(2):
        for c in range(3):
            ref = ndi.correlate(x[n, c].cpu().numpy(), k[0, c].cpu().numpy(), mode="constant")
            np.testing.assert_allclose(out[n, c], ref, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtype_is_preserved(dtype, rng):
    x = torch.from_numpy(rng.random((1, 1, 16, 16))).to(dtype)
    k = torch.ones(3, 3, dtype=dtype)
    out = fft_cc(x, k)
    assert out.dtype == dtype
    ref = ndi.correlate(x[0, 0].double().numpy(), np.ones((3, 3)), mode="constant")
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    np.testing.assert_allclose(out[0, 0].double().numpy(), ref, rtol=tol, atol=tol)


def test_gradcheck(rng):
    x = torch.from_numpy(rng.standard_normal((1, 2, 7, 8))).requires_grad_()
    k = torch.from_numpy(rng.standard_normal((3, 2))).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fft_cc(a, b), (x, k))
    assert torch.autograd.gradcheck(lambda a, b: fft_cc(a, b, mode="valid"), (x, k))
    x3 = torch.from_numpy(rng.standard_normal((1, 1, 4, 5, 6))).requires_grad_()
    k3 = torch.from_numpy(rng.standard_normal((2, 3, 2))).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fft_cc(a, b), (x3, k3))


def test_noncontiguous(rng):
    x = torch.from_numpy(rng.standard_normal((1, 1, 20, 30)))
    xt = x.transpose(-1, -2)
    k = torch.from_numpy(rng.standard_normal((5, 3)))
    np.testing.assert_allclose(
        fft_cc(xt, k).numpy(), fft_cc(xt.contiguous(), k).numpy(), atol=1e-12
    )


def test_exception():
    x = torch.zeros(1, 1, 8, 8)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fft_cc(np.zeros((1, 1, 8, 8)), torch.ones(3, 3))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        fft_cc(torch.zeros(1, 1, 8, 8, dtype=torch.int32), torch.ones(3, 3))
    with pytest.raises(ValueError, match="x must be"):
        fft_cc(torch.zeros(8, 8), torch.ones(3, 3))
    with pytest.raises(ValueError, match="kernel must be"):
        fft_cc(x, torch.ones(3, 3, 3))
    with pytest.raises(ValueError, match="mode must be one of"):
        fft_cc(x, torch.ones(3, 3), mode="full")
    with pytest.raises(ValueError, match="kernel spatial shape"):
        fft_cc(x, torch.ones(9, 3), mode="valid")
    with pytest.raises(ValueError, match="kernel's C"):
        fft_cc(x, torch.ones(1, 2, 3, 3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_values_near_the_types_maximum_do_not_overflow_the_transform(dtype):
    """A smoothing of an image near 3.4e38 is near 3.4e38 too: it came back all NaN (the
    float32 FFT summed the image to inf); now it matches direct summation in float64."""
    rng = np.random.default_rng(4)
    top = torch.finfo(dtype).max
    x = torch.as_tensor(rng.uniform(0.5, 0.9, (1, 1, 24, 20)) * top).to(dtype)
    kernel = torch.full((3, 3), 1 / 9)
    out = fft_cc(x, kernel).double().numpy()[0, 0]
    ref = ndi.correlate(x.double().numpy()[0, 0], kernel.double().numpy(), mode="constant")
    assert np.isfinite(out).all()
    # bfloat16: the output's own rounding (one eps); float32: the FFT's round-off
    rtol = {torch.bfloat16: torch.finfo(torch.bfloat16).eps, torch.float32: 1e-5}[dtype]
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=0)


def test_scaling_keeps_ordinary_results_and_gradients():
    """The power-of-two scaling is exact: the same bits as the unscaled transform in
    float64, and gradients that gradcheck accepts."""
    x = torch.rand(1, 1, 9, 8, dtype=torch.float64, requires_grad=True) * 1e-3
    kernel = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    ref = ndi.correlate(x.detach().numpy()[0, 0], kernel.detach().numpy(), mode="constant")
    np.testing.assert_allclose(fft_cc(x, kernel).detach().numpy()[0, 0], ref, rtol=1e-12)
    leaf = x.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_cc(a, k), (leaf, kernel))
