"""Tests of ``warp`` and ``warp_affine`` against SciPy and an independent Keys-cubic reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops import warp, warp_affine
from tests.images import random_smooth

# grid_sample's padding (align_corners=True) and the SciPy mode that computes the same.
#: every warp boundary is the SciPy mode of the same name.
PADDINGS = ["nearest", "grid-constant", "mirror", "reflect"]


def smooth_field(rng, shape, amplitude, sigma=4.0) -> np.ndarray:
    """A random smooth displacement ``(D, *S)`` whose largest component is ``amplitude``."""
    field = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    return field * (amplitude / np.abs(field).max())


def to_torch(array: np.ndarray, device, dtype=torch.float64) -> torch.Tensor:
    """``(*X)`` NumPy array to a ``(1, 1 or D, ...)`` batch-of-one tensor."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)[None]


def random_affine(rng, d: int) -> np.ndarray:
    matrix = np.eye(d + 1)
    matrix[:d, :d] += rng.normal(0.0, 0.15, (d, d))
    matrix[:d, d] = rng.normal(0.0, 3.0, d)
    return matrix


def keys_cubic_reference(
    image: np.ndarray, coords: np.ndarray, padding: str, a: float = -0.75
) -> np.ndarray:
    """Keys cubic-convolution interpolation of a 2D ``image`` at ``coords`` ``(2, *P)``.

    Written independently of torch: a 4 × 4 tap sum with the Keys kernel. "nearest" clamps
    each tap index into the image, "grid-constant" reads 0 for taps outside it (what grid_sample's
    bicubic does with each tap, after no clipping of the position itself).
    """

    def kernel(t):
        t = np.abs(t)
        near = ((a + 2) * t - (a + 3)) * t * t + 1
        far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
        return np.where(t <= 1, near, np.where(t < 2, far, 0.0))

    rows, cols = image.shape
    base = np.floor(coords).astype(int)
    out = np.zeros(coords.shape[1:])
    for i in range(-1, 3):
        for j in range(-1, 3):
            r, c = base[0] + i, base[1] + j
            weight = kernel(coords[0] - r) * kernel(coords[1] - c)
            inside = (r >= 0) & (r < rows) & (c >= 0) & (c < cols)
            value = image[np.clip(r, 0, rows - 1), np.clip(c, 0, cols - 1)]
            if padding == "grid-constant":
                value = np.where(inside, value, 0.0)
            out += weight * value
    return out


class TestWarp:
    def test_smoke(self, device):
        image = torch.rand(2, 3, 9, 11, device=device)
        displacement = torch.randn(2, 2, 9, 11, device=device)
        out = warp(image, displacement)
        assert out.shape == image.shape and out.dtype == image.dtype and out.device == image.device

    @pytest.mark.parametrize("interpolation", ["nearest", "linear", "cubic"])
    def test_zero_displacement_is_identity(self, device, interpolation):
        image = torch.rand(1, 2, 7, 8, device=device, dtype=torch.float64)
        out = warp(
            image,
            torch.zeros(1, 2, 7, 8, device=device, dtype=torch.float64),
            interpolation=interpolation,
        )
        torch.testing.assert_close(out, image, atol=1e-12, rtol=0)

    def test_integer_shift(self, device):
        # Sampling at x + (1, -2): out[i, j] = image[i + 1, j - 2] where both exist.
        image = torch.rand(1, 1, 6, 7, device=device, dtype=torch.float64)
        shift = torch.tensor([1.0, -2.0], device=device, dtype=torch.float64)
        out = warp(image, shift.view(1, 2, 1, 1).expand(1, 2, 6, 7).contiguous())
        torch.testing.assert_close(out[..., :-1, 2:], image[..., 1:, :-2])

    @pytest.mark.parametrize("padding", PADDINGS)
    @pytest.mark.parametrize("shape", [(40, 52), (14, 12, 16)], ids=["2d", "3d"])
    def test_against_scipy_map_coordinates(self, device, rng, shape, padding):
        image = random_smooth(rng, shape)
        # Amplitude 6 px on a 12-16 px volume: many samples fall outside, testing padding.
        displacement = smooth_field(rng, shape, amplitude=6.0)
        expected = ndi.map_coordinates(
            image, np.indices(shape) + displacement, order=1, mode=padding
        )
        out = warp(to_torch(image, device)[None], to_torch(displacement, device), padding=padding)
        assert np.abs(out[0, 0].cpu().numpy() - expected).max() <= 1e-5

    @pytest.mark.parametrize("shape", [(1, 17), (17, 1), (1, 6, 7)])
    @pytest.mark.parametrize("padding", PADDINGS)
    def test_axis_of_length_one(self, device, rng, shape, padding):
        # grid_sample cannot place a sample off a length-1 axis; zeros padding must still fade.
        image = rng.random(shape)
        displacement = rng.uniform(-1.5, 1.5, (len(shape),) + shape)
        expected = ndi.map_coordinates(
            image, np.indices(shape) + displacement, order=1, mode=padding
        )
        out = warp(to_torch(image, device)[None], to_torch(displacement, device), padding=padding)
        assert np.abs(out[0, 0].cpu().numpy() - expected).max() <= 1e-10

    @pytest.mark.parametrize("padding", ["nearest", "grid-constant"])
    def test_cubic_against_keys_reference(self, device, rng, padding):
        shape = (30, 34)
        image = random_smooth(rng, shape)
        displacement = smooth_field(rng, shape, amplitude=5.0)
        coords = np.indices(shape) + displacement
        expected = keys_cubic_reference(image, coords, padding)
        out = warp(
            to_torch(image, device)[None],
            to_torch(displacement, device),
            interpolation="cubic",
            padding=padding,
        )
        assert np.abs(out[0, 0].cpu().numpy() - expected).max() <= 1e-10

    def test_cubic_near_scipy_bspline_in_interior(self, device, rng):
        # Different interpolants of the same samples (Keys a=-0.75 vs a prefiltered cubic
        # B-spline): on data smoothed with sigma 2 px, measured max difference 0.011
        # (seeds vary 0.008-0.015); 0.03 is a bound, not a match. Linear differs by 0.016.
        shape = (64, 64)
        image = random_smooth(rng, shape, sigma=2.0)
        displacement = smooth_field(rng, shape, amplitude=4.0, sigma=6.0)
        expected = ndi.map_coordinates(
            image, np.indices(shape) + displacement, order=3, mode="nearest"
        )
        out = (
            warp(
                to_torch(image, device)[None], to_torch(displacement, device), interpolation="cubic"
            )[0, 0]
            .cpu()
            .numpy()
        )
        interior = (slice(8, -8),) * 2
        assert np.abs(out - expected)[interior].max() <= 0.03

    def test_nearest_against_scipy(self, device, rng):
        shape = (20, 24)
        image = rng.random(shape)
        # Keep fractional parts away from .5, where rounding conventions differ.
        displacement = np.round(rng.uniform(-3, 3, (2,) + shape)) + rng.uniform(
            -0.3, 0.3, (2,) + shape
        )
        expected = ndi.map_coordinates(
            image, np.indices(shape) + displacement, order=0, mode="nearest"
        )
        out = warp(
            to_torch(image, device)[None], to_torch(displacement, device), interpolation="nearest"
        )
        np.testing.assert_array_equal(out[0, 0].cpu().numpy(), expected)

    def test_broadcast_batch(self, device):
        image = torch.rand(3, 2, 8, 9, device=device, dtype=torch.float64)
        field = torch.randn(1, 2, 8, 9, device=device, dtype=torch.float64)
        shared = warp(image, field)
        one_by_one = torch.cat([warp(image[i : i + 1], field) for i in range(3)])
        torch.testing.assert_close(shared, one_by_one)
        fields = torch.randn(4, 2, 8, 9, device=device, dtype=torch.float64)
        many = warp(image[:1], fields)
        assert many.shape == (4, 2, 8, 9)
        torch.testing.assert_close(many[2:3], warp(image[:1], fields[2:3]))

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("ndim", [2, 3])
    def test_dtype(self, device, dtype, ndim):
        shape = (1, 2) + (10,) * ndim
        image = torch.rand(shape, device=device, dtype=torch.float64)
        field = 2 * torch.randn((1, ndim) + (10,) * ndim, device=device, dtype=torch.float64)
        expected = warp(image, field)
        out = warp(image.to(dtype), field.to(dtype))
        assert out.dtype == dtype
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}[dtype]
        torch.testing.assert_close(out.double(), expected, atol=tol, rtol=0)

    def test_noncontiguous(self, device):
        image = torch.rand(1, 9, 8, 2, device=device, dtype=torch.float64).permute(0, 3, 1, 2)
        field = torch.randn(1, 8, 9, 2, device=device, dtype=torch.float64).permute(0, 3, 2, 1)
        torch.testing.assert_close(warp(image, field), warp(image.contiguous(), field.contiguous()))

    @pytest.mark.parametrize(
        "interpolation,padding,shape",
        [
            ("linear", "nearest", (5, 6)),
            ("linear", "grid-constant", (5, 6)),
            ("linear", "mirror", (5, 6)),
            ("linear", "reflect", (5, 6)),
            ("cubic", "nearest", (5, 6)),
            ("linear", "nearest", (3, 4, 5)),
            ("linear", "grid-constant", (3, 4, 5)),
        ],
    )
    def test_gradcheck(self, device, interpolation, padding, shape):
        generator = torch.Generator().manual_seed(0)
        d = len(shape)
        image = torch.rand((1, 2) + shape, generator=generator, dtype=torch.float64)
        # Fractional parts in [0.2, 0.8]: linear interpolation has kinks at integers.
        steps = torch.randint(-2, 2, (1, d) + shape, generator=generator).double()
        fraction = 0.2 + 0.6 * torch.rand((1, d) + shape, generator=generator, dtype=torch.float64)
        field = steps + fraction
        image = image.to(device).requires_grad_()
        field = field.to(device).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda i, f: warp(i, f, interpolation=interpolation, padding=padding),
            (image, field),
            eps=1e-6,
            atol=1e-6,
        )

    def test_exception(self, device):
        image = torch.rand(1, 1, 8, 9, device=device)
        field = torch.zeros(1, 2, 8, 9, device=device)
        with pytest.raises(TypeError, match="image"):
            warp(image.numpy() if device.type == "cpu" else image.cpu().numpy(), field)
        with pytest.raises(TypeError, match="image"):
            warp(image.to(torch.int32), field)
        with pytest.raises(TypeError, match="image"):
            warp(image.bool(), field)
        with pytest.raises(TypeError, match="image"):
            warp(image.to(torch.complex64), field)
        with pytest.raises(ValueError, match="image"):
            warp(torch.rand(0, 1, 8, 9, device=device), field)
        with pytest.raises(ValueError, match="image"):
            warp(image[0], field)
        with pytest.raises(TypeError, match="displacement"):
            warp(image, field.long())
        with pytest.raises(ValueError, match="displacement"):
            warp(image, torch.zeros(1, 3, 8, 9, device=device))
        with pytest.raises(ValueError, match="displacement"):
            warp(image, torch.zeros(1, 2, 8, 10, device=device))
        with pytest.raises(ValueError, match="displacement"):
            warp(image, torch.zeros(1, 3, 2, 8, 9, device=device))
        with pytest.raises(ValueError, match="displacement"):
            warp(torch.rand(2, 1, 8, 9, device=device), torch.zeros(3, 2, 8, 9, device=device))
        with pytest.raises(ValueError, match="interpolation"):
            warp(image, field, interpolation="bilinear")
        with pytest.raises(ValueError, match="padding='border' is torch's name.*'nearest'"):
            warp(image, field, padding="border")
        with pytest.raises(ValueError, match="padding='zeros' is torch's name.*'grid-constant'"):
            warp(image, field, padding="zeros")
        with pytest.raises(ValueError, match="padding must be one of"):
            warp(image, field, padding="constant")
        with pytest.raises(ValueError, match="interpolation"):
            warp(
                torch.rand(1, 1, 4, 5, 6, device=device),
                torch.zeros(1, 3, 4, 5, 6, device=device),
                interpolation="cubic",
            )


class TestWarpAffine:
    def test_smoke(self, device):
        image = torch.rand(2, 3, 9, 11, device=device)
        out = warp_affine(image, torch.eye(3, device=device), output_shape=(5, 6))
        assert out.shape == (2, 3, 5, 6) and out.dtype == image.dtype
        torch.testing.assert_close(out, image[..., :5, :6])

    def test_an_output_that_cannot_fit_is_refused_before_allocating(self, monkeypatch):
        """(60000, 60000) reached the allocator; refused now with the output_shape named,
        by the free memory (set here to 2 GiB), whatever the machine has."""
        from napari_simwarp import _devices

        calls = []

        def free(device):
            calls.append(device)
            return 2 * 2**30

        monkeypatch.setattr(_devices, "available_memory", free)
        image = torch.rand(1, 1, 8, 8)
        with pytest.raises(MemoryError, match=r"output_shape \(60000, 60000\) needs about 40"):
            warp_affine(image, torch.eye(3), output_shape=(60000, 60000))
        assert calls == [image.device]
        # a large output that fits is made (1000 x 1000 float32: 4 MB and its grid)
        assert warp_affine(image, torch.eye(3), output_shape=(1000, 1000)).shape[-1] == 1000

    @pytest.mark.parametrize("padding", PADDINGS)
    @pytest.mark.parametrize(
        "shape,output_shape", [((40, 50), (33, 61)), ((12, 14, 16), (10, 17, 13))], ids=["2d", "3d"]
    )
    def test_against_scipy_affine_transform(self, device, rng, shape, output_shape, padding):
        image = random_smooth(rng, shape)
        matrix = random_affine(rng, len(shape))
        expected = ndi.affine_transform(
            image, matrix, output_shape=output_shape, order=1, mode=padding
        )
        out = warp_affine(
            to_torch(image, device)[None],
            torch.from_numpy(matrix).to(device),
            output_shape=output_shape,
            padding=padding,
        )
        assert out.shape[2:] == output_shape
        assert np.abs(out[0, 0].cpu().numpy() - expected).max() <= 1e-5

    def test_numpy_and_short_matrix(self, device, rng):
        image = torch.rand(1, 1, 10, 12, device=device, dtype=torch.float64)
        matrix = random_affine(rng, 2)
        reference = warp_affine(image, torch.from_numpy(matrix).to(device))
        torch.testing.assert_close(warp_affine(image, matrix), reference)
        torch.testing.assert_close(warp_affine(image, matrix[:2]), reference)

    def test_batch_of_matrices(self, device, rng):
        image = torch.rand(2, 1, 10, 12, device=device, dtype=torch.float64)
        matrices = torch.from_numpy(np.stack([random_affine(rng, 2) for _ in range(2)])).to(device)
        out = warp_affine(image, matrices)
        for i in range(2):
            torch.testing.assert_close(out[i : i + 1], warp_affine(image[i : i + 1], matrices[i]))

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
    def test_dtype(self, device, rng, dtype):
        image = torch.rand(1, 1, 12, 12, device=device, dtype=torch.float64)
        matrix = torch.from_numpy(random_affine(rng, 2)).to(device)
        out = warp_affine(image.to(dtype), matrix)
        assert out.dtype == dtype
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}[dtype]
        torch.testing.assert_close(out.double(), warp_affine(image, matrix), atol=tol, rtol=0)

    def test_gradcheck(self, device):
        image = torch.rand(1, 1, 6, 7, dtype=torch.float64, device=device, requires_grad=True)
        # (2, 3): gradcheck perturbs every entry, and a homogeneous last row must stay exact.
        # Entries chosen so that every sample lies >= 0.01 px from an integer (no kinks).
        matrix = torch.tensor(
            [[0.93, 0.113, 0.27], [-0.071, 1.04, 0.33]],
            dtype=torch.float64,
            device=device,
            requires_grad=True,
        )
        assert torch.autograd.gradcheck(
            lambda i, m: warp_affine(i, m, padding="nearest"), (image, matrix), eps=1e-6, atol=1e-6
        )

    def test_exception(self, device):
        image = torch.rand(1, 1, 8, 9, device=device)
        eye = torch.eye(3, device=device)
        with pytest.raises(ValueError, match="matrix"):
            warp_affine(image, torch.full((3, 3), float("nan"), device=device))
        with pytest.raises(ValueError, match="matrix"):
            warp_affine(image, eye * float("inf"))
        with pytest.raises(ValueError, match="matrix"):
            warp_affine(image, torch.eye(4, device=device))
        with pytest.raises(ValueError, match="matrix"):
            warp_affine(image, torch.tensor([[1.0, 0, 0], [0, 1, 0], [0.1, 0, 1]], device=device))
        with pytest.raises(TypeError, match="matrix"):
            warp_affine(image, torch.eye(3, dtype=torch.int64, device=device))
        with pytest.raises(TypeError, match="matrix"):
            warp_affine(image, "identity")
        with pytest.raises(ValueError, match="matrix"):
            warp_affine(torch.rand(2, 1, 8, 9, device=device), eye.expand(3, 3, 3))
        with pytest.raises(ValueError, match="output_shape"):
            warp_affine(image, eye, output_shape=(4, 5, 6))
        with pytest.raises(ValueError, match="output_shape"):
            warp_affine(image, eye, output_shape=(0, 5))
        with pytest.raises(ValueError, match="padding"):
            warp_affine(image, eye, padding="constant")
        with pytest.raises(TypeError, match="image"):
            warp_affine(image.long(), eye)
