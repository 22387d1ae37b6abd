"""Tests of ops/splat.py: forward warping by differentiable splatting (docs/maths.md §4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from napari_simwarp.ops import splat, warp
from tests.images import random_smooth
from tests.ops.splat_plain import splat_plain

# Every test runs on the pure torch path and on the compiled kernels (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("backend")


def _splat_loops(image: np.ndarray, displacement: np.ndarray, normalize: bool, eps: float = 1e-6):
    """Independent oracle: explicit loops over source pixels and their 2ᴰ neighbors.

    image ``(N, C, *S)``, displacement ``(N, D, *S)`` float64 arrays; returns
    ``(out (N, C, *S), den (N, *S))``.
    """
    n, _c, *spatial = image.shape
    num = np.zeros(image.shape)
    den = np.zeros((n, *spatial))
    for b in range(n):
        for q in np.ndindex(*spatial):
            p = np.array(q) + displacement[(b, slice(None), *q)]
            lower = np.floor(p)
            frac = p - lower
            for bits in itertools.product((0, 1), repeat=len(spatial)):
                j = (lower + bits).astype(int)
                if np.all(j >= 0) and np.all(j < spatial):
                    w = np.prod([f if bit else 1 - f for f, bit in zip(frac, bits)])
                    num[(b, slice(None), *j)] += w * image[(b, slice(None), *q)]
                    den[(b, *j)] += w
    landed = den > eps
    out = np.where(
        landed[:, None], num / np.where(landed, den, 1.0)[:, None] if normalize else num, 0.0
    )
    return out, den


def _random_field(shape, device, *, amplitude=2.0, seed=0, dtype=torch.float64):
    """A displacement ``(N, D, *S)`` with fractions in [0.2, 0.8]: away from integers."""
    g = torch.Generator().manual_seed(seed)
    whole = torch.randint(-int(amplitude), int(amplitude) + 1, shape, generator=g)
    frac = 0.2 + 0.6 * torch.rand(shape, generator=g, dtype=torch.float64)
    return (whole + frac).to(device=device, dtype=dtype)


def _run_to_run(device: torch.device, dtype: torch.dtype, scale: float = 1.0) -> dict:
    """Tolerances between two splats that must agree: bit for bit on the CPU (serial
    sums); on a GPU, whose atomic additions land in any order, a few ulp of the values'
    magnitude ``scale``."""
    if device.type == "cpu":
        return dict(rtol=0, atol=0)
    eps = torch.finfo(dtype).eps
    return dict(rtol=16 * eps, atol=16 * eps * scale)


def _shape_2d_3d(dims, n=2, c=2):
    return (n, c, 7, 9) if dims == 2 else (n, c, 4, 5, 6)


class TestSplat:
    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("normalize", [True, False])
    def test_smoke(self, device, dims, normalize):
        image = torch.rand(_shape_2d_3d(dims), device=device)
        d = torch.zeros(2, dims, *image.shape[2:], device=device)
        out, weights = splat(image, d, normalize=normalize, return_weights=True)
        assert out.shape == image.shape and out.dtype == image.dtype
        assert weights.shape == (2, 1, *image.shape[2:])
        # Zero displacement: every pixel lands on itself with weight 1.
        torch.testing.assert_close(out, image)
        torch.testing.assert_close(weights, torch.ones_like(weights))

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("normalize", [True, False])
    def test_integer_shift_exact(self, device, dims, normalize):
        shape = (1, 3, 12, 10) if dims == 2 else (1, 2, 8, 7, 9)
        image = torch.rand(shape, device=device)
        shift = (2, -3) if dims == 2 else (1, -2, 3)
        d = torch.tensor(shift, dtype=torch.float32, device=device).view(1, dims, *[1] * dims)
        out, weights = splat(
            image, d.expand(1, dims, *shape[2:]), normalize=normalize, return_weights=True
        )
        expected = torch.roll(image, shifts=shift, dims=tuple(range(2, 2 + dims)))
        # Pixels that received a source pixel hold it exactly; the rest are holes.
        landed = tuple(slice(max(s, 0), n + min(s, 0)) for s, n in zip(shift, shape[2:]))
        assert torch.equal(out[(..., *landed)], expected[(..., *landed)])
        hole = torch.ones_like(weights, dtype=torch.bool)
        hole[(..., *landed)] = False
        assert torch.all(weights[hole] == 0) and torch.all(weights[~hole] == 1)
        assert torch.all(out[hole.expand_as(out)] == 0)

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("normalize", [True, False])
    def test_matches_loop_oracle(self, device, dims, normalize):
        shape = _shape_2d_3d(dims)
        image = torch.rand(shape, dtype=torch.float64, device=device)
        # Smooth-ish random field with collisions and some pixels leaving the image.
        d = torch.randn(shape[0], dims, *shape[2:], dtype=torch.float64, device=device) * 1.5
        out, weights = splat(image, d, normalize=normalize, return_weights=True)
        ref_out, ref_den = _splat_loops(image.cpu().numpy(), d.cpu().numpy(), normalize)
        np.testing.assert_allclose(out.cpu().numpy(), ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights[:, 0].cpu().numpy(), ref_den, rtol=1e-12, atol=1e-12)

    def test_holes(self, device):
        # d(x) = x along the last axis: pixel x lands on 2x, so odd columns get nothing.
        image = torch.rand(1, 1, 6, 8, dtype=torch.float64, device=device, requires_grad=True)
        x = torch.arange(8, dtype=torch.float64, device=device)
        d = torch.stack([torch.zeros(6, 8, dtype=torch.float64, device=device), x.expand(6, 8)])[
            None
        ].requires_grad_()
        out, weights = splat(image, d, return_weights=True)
        odd = torch.zeros(8, dtype=torch.bool, device=device)
        odd[1::2] = True
        assert torch.all(weights[..., odd] == 0) and torch.all(out[..., odd] == 0)
        assert torch.all(weights[..., ~odd] == 1)
        _ref_out, ref_den = _splat_loops(
            image.detach().cpu().numpy(), d.detach().cpu().numpy(), True
        )
        np.testing.assert_array_equal(weights[:, 0].detach().cpu().numpy() == 0, ref_den == 0)
        # No gradient flows through a hole.
        v = torch.zeros_like(out)
        v[..., odd] = 1.0
        g_image, g_d = torch.autograd.grad((out * v).sum(), (image, d))
        assert torch.all(g_image == 0) and torch.all(g_d == 0)

    def test_plain_sum_preserves_mass(self, device):
        rng = torch.Generator().manual_seed(12)
        image = torch.rand(2, 1, 20, 20, dtype=torch.float64, generator=rng).to(device)
        # At most 2.5 px: with 3 still pixels at each edge every pixel lands inside (an
        # unbounded, unseeded draw once pushed one out: CI lost 5e-4 of the mass).
        d = (0.8 * torch.randn(2, 2, 20, 20, dtype=torch.float64, generator=rng)).clamp(-2.5, 2.5)
        d = d.to(device)
        d[..., :3, :] = 0
        d[..., -3:, :] = 0
        d[..., :3] = 0
        d[..., -3:] = 0  # nothing leaves the image
        out = splat(image, d, normalize=False)
        torch.testing.assert_close(out.sum((1, 2, 3)), image.sum((1, 2, 3)))

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("normalize", [True, False])
    def test_gradcheck(self, device, dims, normalize):
        shape = (1, 2, 5, 6) if dims == 2 else (1, 2, 4, 3, 5)
        image = torch.rand(shape, dtype=torch.float64, device=device, requires_grad=True)
        d = _random_field((1, dims, *shape[2:]), device, amplitude=1).requires_grad_()

        def fn(image, d):
            return splat(image, d, normalize=normalize, return_weights=True)

        assert torch.autograd.gradcheck(fn, (image, d), eps=1e-6, atol=1e-8)

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("normalize", [True, False])
    def test_gradient_matches_autograd_reference(self, device, dims, normalize):
        # The hand-written gather-only backward against plain autograd through index_add.
        shape = (2, 3, 9, 8) if dims == 2 else (2, 2, 5, 6, 4)
        image = torch.rand(shape, dtype=torch.float64, device=device, requires_grad=True)
        d = _random_field((2, dims, *shape[2:]), device, seed=3).requires_grad_()
        out, weights = splat(image, d, normalize=normalize, return_weights=True)
        ref_out, ref_weights = splat_plain(image, d, normalize=normalize)
        torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
        v_out, v_w = torch.randn_like(out), torch.randn_like(weights)
        ours = torch.autograd.grad((out * v_out).sum() + (weights * v_w).sum(), (image, d))
        ref = torch.autograd.grad((ref_out * v_out).sum() + (ref_weights * v_w).sum(), (image, d))
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)

    def test_deterministic_cpu(self):
        # Heavy collisions (everything lands in a few pixels) in float32, several images and
        # channels, the whole thread pool: two runs must agree bit for bit.
        g = torch.Generator().manual_seed(1)
        image = torch.rand(3, 4, 64, 64, generator=g, requires_grad=True)
        d = (torch.rand(3, 2, 64, 64, generator=g) * 6 - 3).requires_grad_()
        grid = torch.stack(torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij"))
        d_collide = (32.5 - grid[None] + 0.4 * d.detach()).requires_grad_()
        for field in (d, d_collide):
            runs = []
            for _ in range(2):
                out, w = splat(image, field, return_weights=True)
                grads = torch.autograd.grad((out * out).sum() + w.sum(), (image, field))
                runs.append((out, w, *grads))
            for a, b in zip(*runs):
                assert torch.equal(a, b)

    @pytest.mark.cuda
    def test_deterministic_algorithms_on_cuda(self, backend):
        # Under torch.use_deterministic_algorithms(True) a CUDA splat is deterministic (the
        # torch path's scatter, which torch makes so) or raises torch's own error (the
        # compiled kernel's atomics, SIMWARP_BACKEND=compiled). Never silently neither.
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        g = torch.Generator().manual_seed(2)
        image = torch.rand(2, 3, 96, 96, generator=g).cuda()
        grid = torch.stack(torch.meshgrid(torch.arange(96.0), torch.arange(96.0), indexing="ij"))
        d = (48.5 - grid[None] + 0.3 * torch.rand(2, 2, 96, 96, generator=g)).cuda()  # collide
        from napari_simwarp.ops import _kernels

        atomics = backend == "compiled" and _kernels.state()["cuda"]  # the kernel runs
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            if atomics:
                with pytest.raises(RuntimeError, match="deterministic"):
                    splat(image, d)
                return
            runs = [splat(image, d, return_weights=True) for _ in range(3)]
        finally:
            torch.use_deterministic_algorithms(deterministic)
        for run in runs[1:]:
            for a, b in zip(run, runs[0]):
                assert torch.equal(a, b)

    def test_displacement_broadcast(self, device):
        image = torch.rand(3, 2, 10, 11, dtype=torch.float64, device=device, requires_grad=True)
        d = _random_field((1, 2, 10, 11), device).requires_grad_()
        out = splat(image, d)
        expanded = d.detach().expand(3, 2, 10, 11).clone().requires_grad_()
        out_expanded = splat(image, expanded)
        scale = float(out.detach().abs().max())
        torch.testing.assert_close(out, out_expanded, **_run_to_run(device, out.dtype, scale))
        v = torch.randn_like(out)
        (g_shared,) = torch.autograd.grad((out * v).sum(), d)
        (g_each,) = torch.autograd.grad((out_expanded * v).sum(), expanded)
        torch.testing.assert_close(g_shared, g_each.sum(0, keepdim=True))

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
    def test_dtype(self, device, dtype):
        image = torch.rand(1, 2, 16, 16, device=device)
        d = torch.randn(1, 2, 16, 16, device=device)
        out, w = splat(image.to(dtype), d.to(dtype), return_weights=True)
        assert out.dtype == dtype and w.dtype == dtype
        # Low precision is computed in float32: the only difference is the final rounding
        # (and the rounding of the inputs).
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        expected = splat(image.to(dtype).to(compute), d.to(dtype).to(compute))
        tolerance = _run_to_run(device, dtype, float(expected.abs().max()))
        torch.testing.assert_close(out, expected.to(dtype), **tolerance)

    def test_noncontiguous(self, device):
        image = torch.rand(2, 16, 12, 3, device=device).permute(0, 3, 1, 2)
        d = torch.randn(2, 16, 12, 2, device=device).permute(0, 3, 1, 2)
        assert not image.is_contiguous() and not d.is_contiguous()
        torch.testing.assert_close(splat(image, d), splat(image.contiguous(), d.contiguous()))

    def test_outputs_are_independent_tensors(self, device):
        image = torch.rand(1, 2, 8, 8, device=device)
        d = torch.rand(1, 2, 8, 8, device=device)
        out, weights = splat(image, d, return_weights=True)
        before = out.clone()
        weights.mul_(2)  # not views of one buffer: each may be edited in place
        out += 1
        torch.testing.assert_close(out, before + 1)
        out = splat(image.requires_grad_(), d)
        out.add_(1)  # allowed (autograd only objects if a backward then needs the old values)

    def test_nonfinite_displacement_lands_nowhere(self, device):
        image = torch.ones(1, 1, 5, 5, dtype=torch.float64, device=device, requires_grad=True)
        d = torch.zeros(1, 2, 5, 5, dtype=torch.float64, device=device)
        d[0, 0, 2, 2] = float("nan")
        d[0, 1, 1, 1] = float("inf")
        d.requires_grad_()
        out, w = splat(image, d, return_weights=True)
        assert w[0, 0, 2, 2] == 0 and w[0, 0, 1, 1] == 0 and torch.isfinite(out).all()
        g_image, g_d = torch.autograd.grad(out.sum() + w.sum(), (image, d))
        assert torch.isfinite(g_image).all() and torch.isfinite(g_d).all()

    @pytest.mark.parametrize("dims", [2, 3])
    def test_splat_then_warp_constant_shift(self, device, dims):
        # A constant sub-pixel shift t: splat spreads each pixel over [1 − t, t] and warp reads
        # back with [1 − t, t], so the round trip is exactly the blur
        # [t(1 − t), 1 − 2t(1 − t), t(1 − t)] along each axis (interior, away from borders).
        shape = (1, 1, 24, 20) if dims == 2 else (1, 1, 12, 10, 11)
        rng = np.random.default_rng(5)
        image = torch.from_numpy(random_smooth(rng, shape[2:], 2.0))[None, None].to(device)
        t = (0.3, 0.6, 0.45)[:dims]
        d = torch.tensor(t, dtype=torch.float64, device=device).view(1, dims, *[1] * dims)
        d = d.expand(1, dims, *shape[2:])
        back = warp(splat(image, d), d)
        blur = image
        for axis, ti in enumerate(t):
            taps = torch.tensor(
                [ti * (1 - ti), 1 - 2 * ti * (1 - ti), ti * (1 - ti)],
                dtype=torch.float64,
                device=device,
            )
            kshape = [1, 1] + [1] * dims
            kshape[2 + axis] = 3
            conv = F.conv2d if dims == 2 else F.conv3d
            pad = [0] * (2 * dims)
            pad[2 * (dims - 1 - axis)] = pad[2 * (dims - 1 - axis) + 1] = 1
            blur = conv(F.pad(blur, pad, mode="replicate"), taps.view(kshape))
        inner = (..., *[slice(2, -2)] * dims)
        torch.testing.assert_close(back[inner], blur[inner], rtol=1e-12, atol=1e-12)

    def test_splat_then_warp_smooth_field(self, device):
        # warp(splat(f, d), d) reads at x + d(x), exactly where splat put f(x), so the round
        # trip with the same field (defined on the source grid) returns f up to the blur of
        # the two linear interpolations. Measured on this smooth image (values in [0, 1],
        # Gaussian-filtered noise, σ = 4 px) with |d| up to 1.5 px and |∇d| up to 0.2,
        # inside an 8 px border: max error 0.0081, mean 0.0017; the round trip of a
        # constant half-pixel shift (the strongest blur) gives max 0.0103, mean 0.0023.
        rng = np.random.default_rng(0)
        image = torch.from_numpy(random_smooth(rng, (96, 96), 4.0))[None, None].to(device)
        y, x = torch.meshgrid(
            torch.arange(96.0, dtype=torch.float64, device=device),
            torch.arange(96.0, dtype=torch.float64, device=device),
            indexing="ij",
        )
        d = torch.stack(
            [1.5 * torch.sin(2 * np.pi * x / 64), 1.5 * torch.cos(2 * np.pi * y / 48 + 0.3)]
        )[None]
        out, weights = splat(image, d, return_weights=True)
        inner = (..., slice(8, -8), slice(8, -8))
        assert torch.all(weights[inner] > 0.9)  # no holes inside: the map is invertible
        error = (warp(out, d) - image)[inner].abs()
        half = torch.full_like(d, 0.5)
        blur = (warp(splat(image, half), half) - image)[inner].abs()
        assert error.max() < 0.009 and error.mean() < 0.002
        assert error.max() < blur.max() and error.mean() < blur.mean()

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(image=torch.rand(1, 1, 8, 8).long()), TypeError, "image"),
            (dict(image=torch.rand(1, 1, 8, 8) > 0.5), TypeError, "image"),
            (dict(image=torch.rand(1, 1, 8, 8, dtype=torch.complex64)), TypeError, "image"),
            (
                dict(image=torch.rand(1, 1, 0, 8), displacement=torch.zeros(1, 2, 0, 8)),
                ValueError,
                "image",
            ),
            (dict(image=torch.rand(8, 8)), ValueError, "image"),
            (dict(image=np.zeros((1, 1, 8, 8))), TypeError, "image"),
            (dict(displacement=torch.zeros(1, 2, 8, 8).int()), TypeError, "displacement"),
            (
                dict(displacement=torch.zeros(1, 3, 8, 8)),
                ValueError,
                "displacement must have 2 channels",
            ),
            (
                dict(displacement=torch.zeros(1, 2, 8, 7)),
                ValueError,
                "displacement.s spatial shape",
            ),
            (
                dict(displacement=torch.zeros(1, 3, 8, 8, 8)),
                ValueError,
                "displacement must be \\(N, 2, \\*S\\)",
            ),
            (
                dict(displacement=torch.zeros(2, 2, 8, 8), image=torch.rand(3, 1, 8, 8)),
                ValueError,
                "displacement.s batch size",
            ),
            (dict(eps=-1.0), ValueError, "eps"),
            (dict(normalize="yes"), TypeError, "normalize"),
        ],
    )
    def test_exception(self, kwargs, error, match):
        args = dict(image=torch.rand(1, 1, 8, 8), displacement=torch.zeros(1, 2, 8, 8))
        args.update(kwargs)
        image, displacement = args.pop("image"), args.pop("displacement")
        with pytest.raises(error, match=match):
            splat(image, displacement, **args)
