"""Tests of ops/similarity_gradient.py: −∂loss/∂displacement, one vector per pixel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from napari_simwarp.ops import similarity_gradient
from tests.images import random_smooth

METRICS = ["lncc", "ncc", "ssim", "mse"]


# ----------------------------------------------------------------- independent reference


def _grid_sample_warp(image: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``image(x + d(x))`` by ``grid_sample`` (bilinear, border): image ``(N, C, *S)``,
    d ``(N or 1, D, *S)`` in pixels, array-axis order."""
    n, _, *spatial = image.shape
    grids = torch.meshgrid(
        *[torch.arange(s, dtype=d.dtype, device=d.device) for s in spatial], indexing="ij"
    )
    # grid_sample wants (x, y[, z]) normalized to [-1, 1] with corners at the pixel centers.
    coords = [(d[:, k] + grids[k]) * 2 / (s - 1) - 1 for k, s in enumerate(spatial)]
    grid = torch.stack(coords[::-1], dim=-1).expand(n, *spatial, len(spatial))
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)


def _pad_half_sample(x: torch.Tensor, r: int) -> torch.Tensor:
    """SciPy "reflect" padding (``b a | a b c | c b``) by ``r`` on every spatial axis."""
    for dim in range(2, x.dim()):
        n = x.shape[dim]
        x = torch.cat([x.narrow(dim, 0, r).flip(dim), x, x.narrow(dim, n - r, r).flip(dim)], dim)
    return x


def _window_mean(x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """Separable weighted window mean (``taps`` sum to 1), SciPy "reflect" borders."""
    r = len(taps) // 2
    x = _pad_half_sample(x, r)
    conv = F.conv2d if x.dim() == 4 else F.conv3d
    c = x.shape[1]
    for axis in range(x.dim() - 2):
        shape = [1, 1] + [1] * (x.dim() - 2)
        shape[2 + axis] = len(taps)
        x = conv(x, taps.view(shape).expand(c, *shape[1:]), groups=c)
    return x


def _gaussian_taps(window, sigma, like):
    i = torch.arange(window, dtype=like.dtype, device=like.device) - window // 2
    g = torch.exp(-0.5 * (i / sigma) ** 2)
    return g / g.sum()


def _reference_loss(metric, fixed, warped):
    """Σ over the batch of each image's loss, in plain torch (float64)."""
    dims = tuple(range(1, fixed.dim()))
    if metric == "mse":
        return ((warped - fixed) ** 2).mean(dims).sum()
    if metric == "ncc":
        sdims = tuple(range(2, fixed.dim()))
        a = fixed - fixed.mean(sdims, keepdim=True)
        b = warped - warped.mean(sdims, keepdim=True)
        rho = (a * b).sum(sdims) / torch.sqrt((a * a).sum(sdims) * (b * b).sum(sdims))
        return (1 - rho).mean(1).sum()
    if metric == "lncc":  # box window of 7
        taps = torch.full((7,), 1 / 7, dtype=fixed.dtype, device=fixed.device)
        ma, mb = _window_mean(fixed, taps), _window_mean(warped, taps)
        va = _window_mean(fixed * fixed, taps) - ma * ma
        vb = _window_mean(warped * warped, taps) - mb * mb
        cov = _window_mean(fixed * warped, taps) - ma * mb
        return (1 - cov / torch.sqrt(va * vb)).mean(dims).sum()
    if metric == "ssim":  # 7 taps, σ = 1.5, data range 1
        taps = _gaussian_taps(7, 1.5, fixed)
        c1, c2 = 0.01**2, 0.03**2
        ma, mb = _window_mean(fixed, taps), _window_mean(warped, taps)
        va = _window_mean(fixed * fixed, taps) - ma * ma
        vb = _window_mean(warped * warped, taps) - mb * mb
        cov = _window_mean(fixed * warped, taps) - ma * mb
        s = (2 * ma * mb + c1) * (2 * cov + c2) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
        return (1 - s).mean(dims).sum()
    raise AssertionError(metric)


_REFERENCE_KW = {"lncc": dict(window=7), "ssim": dict(window=7, sigma=1.5), "ncc": {}, "mse": {}}


def _reference_gradient(metric, fixed, moving, d):
    """−∂loss/∂d by float64 autograd through ``grid_sample`` and the plain-torch loss."""
    d = d.detach().double().requires_grad_()
    loss = _reference_loss(metric, fixed.double(), _grid_sample_warp(moving.double(), d))
    (g,) = torch.autograd.grad(loss, d)
    return -g


def _textured_pair(shape, device, seed=0):
    """Two different textured images (no flat windows) ``(N, C, *S)`` in float64."""
    rng = np.random.default_rng(seed)
    n, c, *spatial = shape
    stack = [random_smooth(rng, spatial, 1.5) for _ in range(2 * n * c)]
    both = torch.from_numpy(np.stack(stack)).view(2, n, c, *spatial).to(device)
    return both[0], 0.7 * both[0] + 0.3 * both[1]


def _blob(spatial, center, sigma, device):
    grids = torch.meshgrid(
        *[torch.arange(s, dtype=torch.float64, device=device) for s in spatial], indexing="ij"
    )
    r2 = sum((g - c) ** 2 for g, c in zip(grids, center))
    return torch.exp(-r2 / (2 * sigma**2))[None, None]


# ----------------------------------------------------------------------------------- tests


class TestSimilarityGradient:
    @pytest.mark.parametrize("metric", METRICS)
    def test_smoke(self, device, metric):
        fixed, moving = _textured_pair((2, 1, 24, 20), device)
        d = torch.zeros(2, 2, 24, 20, dtype=torch.float64, device=device)
        field = similarity_gradient(fixed, moving, d, metric=metric)
        assert field.shape == d.shape and field.dtype == d.dtype
        assert torch.isfinite(field).all() and field.abs().max() > 0
        assert not field.requires_grad

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("metric", METRICS)
    def test_matches_float64_autograd_reference(self, device, dims, metric):
        shape = (2, 2, 24, 22) if dims == 2 else (1, 1, 12, 11, 10)
        fixed, moving = _textured_pair(shape, device, seed=dims)
        g = torch.Generator().manual_seed(7)
        d = torch.rand(shape[0], dims, *shape[2:], generator=g, dtype=torch.float64) * 3 - 1.5
        d = d.to(device)
        ours = similarity_gradient(fixed, moving, d, metric=metric, **_REFERENCE_KW[metric])
        ref = _reference_gradient(metric, fixed, moving, d)
        scale = ref.abs().max()
        torch.testing.assert_close(ours / scale, ref / scale, rtol=0, atol=1e-9)

    @pytest.mark.parametrize("dims", [2, 3])
    @pytest.mark.parametrize("metric", METRICS)
    def test_points_along_the_shift(self, device, dims, metric):
        # moving is fixed's blob moved by +2 px along the last axis, so fixed(x) = moving(x + d)
        # with d = +2 there: at the blob, the field must point along +last axis.
        spatial = (40, 40) if dims == 2 else (24, 24, 24)
        center = [s / 2 for s in spatial]
        moved = list(center)
        moved[-1] += 2
        fixed = _blob(spatial, center, 3.0, device) + 0.1
        moving = _blob(spatial, moved, 3.0, device) + 0.1
        d = torch.zeros(1, dims, *spatial, dtype=torch.float64, device=device)
        field = (
            similarity_gradient(fixed, moving, d, metric=metric, window=7)
            if metric in ("lncc", "ssim")
            else similarity_gradient(fixed, moving, d, metric=metric)
        )
        weight = _blob(spatial, center, 5.0, device)[0, 0]
        mean_vector = (field[0] * weight).sum(tuple(range(1, dims + 1)))
        along = mean_vector[-1]
        assert along > 0
        assert along > 5 * mean_vector[:-1].abs().max()

    def test_displacement_broadcast_sums_over_batch(self, device):
        fixed, moving = _textured_pair((3, 1, 16, 18), device)
        d = torch.full((1, 2, 16, 18), 0.3, dtype=torch.float64, device=device)
        shared = similarity_gradient(fixed, moving, d, metric="mse")
        each = similarity_gradient(fixed, moving, d.expand(3, 2, 16, 18), metric="mse")
        assert shared.shape == (1, 2, 16, 18)
        torch.testing.assert_close(shared, each.sum(0, keepdim=True))

    def test_batch_does_not_dilute(self, device):
        fixed, moving = _textured_pair((3, 1, 16, 18), device)
        d = torch.zeros(3, 2, 16, 18, dtype=torch.float64, device=device)
        whole = similarity_gradient(fixed, moving, d, metric="lncc", window=5)
        first = similarity_gradient(fixed[:1], moving[:1], d[:1], metric="lncc", window=5)
        torch.testing.assert_close(whole[:1], first)

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
    def test_dtype(self, device, dtype):
        fixed, moving = _textured_pair((1, 1, 20, 20), device)
        # Away from integer positions, where the bilinear gradient is one-sided and the
        # side depends on the grid's rounding.
        d = torch.full((1, 2, 20, 20), 0.375, device=device)
        field = similarity_gradient(fixed.to(dtype), moving.to(dtype), d.to(dtype), metric="mse")
        assert field.dtype == dtype
        ref = similarity_gradient(
            fixed.to(dtype).double(), moving.to(dtype).double(), d.double(), metric="mse"
        )
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
        torch.testing.assert_close(field.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())

    def test_does_not_touch_callers_graph(self, device):
        fixed, moving = _textured_pair((1, 1, 16, 16), device)
        moving = moving.clone().requires_grad_()
        d = torch.zeros(1, 2, 16, 16, dtype=torch.float64, device=device, requires_grad=True)
        with torch.no_grad():
            field = similarity_gradient(fixed, moving, d, metric="mse")
        assert field.abs().max() > 0
        assert moving.grad is None and d.grad is None

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            (dict(fixed=torch.rand(1, 1, 16, 16).long()), TypeError, "fixed"),
            (dict(moving=torch.rand(1, 1, 16, 16) > 0.5), TypeError, "moving"),
            (dict(moving=torch.rand(1, 1, 16, 16, dtype=torch.complex64)), TypeError, "moving"),
            (dict(fixed=torch.rand(16, 16)), ValueError, "fixed"),
            (dict(moving=torch.rand(1, 1, 16, 15)), ValueError, "moving"),
            (dict(displacement=torch.zeros(1, 2, 0, 16)), ValueError, "displacement"),
            (
                dict(displacement=torch.zeros(1, 3, 16, 16)),
                ValueError,
                "displacement must have 2 channels",
            ),
            (
                dict(displacement=torch.zeros(1, 2, 16, 17)),
                ValueError,
                "displacement.s spatial shape",
            ),
            (dict(displacement=torch.zeros(1, 2, 16, 16).int()), TypeError, "displacement"),
            (dict(metric="nmi"), ValueError, "metric"),
            (dict(metric="mse", window=5), TypeError, "window"),
            (dict(metric="lncc", data_range=2.0), TypeError, "data_range"),
            (dict(metric="lncc", kernel="disk"), ValueError, "kernel"),
        ],
    )
    def test_exception(self, kwargs, error, match):
        args = dict(
            fixed=torch.rand(1, 1, 16, 16),
            moving=torch.rand(1, 1, 16, 16),
            displacement=torch.zeros(1, 2, 16, 16),
        )
        args.update(kwargs)
        fixed, moving, d = args.pop("fixed"), args.pop("moving"), args.pop("displacement")
        with pytest.raises(error, match=match):
            similarity_gradient(fixed, moving, d, **args)


@pytest.mark.usefixtures("float32_moments")
@pytest.mark.parametrize("metric", ["ncc", "mse"])
def test_gpu_policy_float32_against_float64_reference_on_offset_data(metric):
    # The GPU's rule (float32 sums, no float64) forced on the CPU, on a pair with a
    # camera-like offset of 1000: the field against float64 autograd, to 1e-4 of its peak.
    fixed, moving = _textured_pair((2, 1, 40, 36), "cpu", seed=3)
    fixed, moving = 1000.0 + 200.0 * fixed, 1000.0 + 200.0 * moving
    g = torch.Generator().manual_seed(5)
    d = torch.rand(2, 2, 40, 36, generator=g, dtype=torch.float64) * 3 - 1.5
    fixed32, moving32 = fixed.float(), moving.float()
    ours = similarity_gradient(fixed32, moving32, d.float(), metric=metric)
    assert ours.dtype == torch.float32
    ref = _reference_gradient(metric, fixed32.double(), moving32.double(), d.float().double())
    scale = ref.abs().max()
    assert (ours.double() - ref).abs().max() < 1e-4 * scale
