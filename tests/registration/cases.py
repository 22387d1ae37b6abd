"""Synthetic registration problems with known ground truth, shared by the tests."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from tests.images import natural, random_smooth


def textured(rng, shape) -> np.ndarray:
    """An image with structure at several scales (camera picture + fine texture in 2-D)."""
    if len(shape) == 2:
        return 0.7 * natural(shape) + 0.3 * random_smooth(rng, shape, sigma=1.5)
    return 0.5 * random_smooth(rng, shape, 1.5) + 0.5 * random_smooth(rng, shape, 4.0)


def centered_affine(linear, shift, shape) -> np.ndarray:
    """Homogeneous matrix of ``y = L (x - c) + c + t`` (array order, c the center)."""
    d = len(shape)
    c = (np.asarray(shape, float) - 1) / 2
    m = np.eye(d + 1)
    m[:d, :d] = linear
    m[:d, d] = c + np.asarray(shift, float) - np.asarray(linear) @ c
    return m


def affine_pair(rng, shape, matrix):
    """``(fixed, moving)`` with ``fixed(x) = moving(M x)`` (moving = fixed warped by M⁻¹)."""
    fixed = textured(rng, shape)
    moving = ndi.affine_transform(fixed, np.linalg.inv(matrix), order=3, mode="nearest")
    return fixed, moving


def corner_error(m_est, m_true, shape) -> float:
    """Mean distance (pixels) between where the two matrices send the image's corners."""
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1)
    h = np.vstack([corners, np.ones(corners.shape[1])])
    return float(np.linalg.norm((m_est @ h - m_true @ h)[:d], axis=0).mean())


def smooth_field(rng, shape, amplitude, sigma) -> np.ndarray:
    """A smooth random displacement ``(D, *shape)`` with max magnitude about ``amplitude``."""
    d = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    return d * (amplitude / np.abs(d).max())


def deformed_pair(rng, shape, amplitude=3.0, sigma=None):
    """``(fixed, moving, d)`` with ``fixed(x) = moving(x + d(x))``.

    ``moving`` is found by sampling ``fixed`` at the inverse map, approximated by
    fixed-point iteration of ``u(y) = -d(y + u(y))``.
    """
    sigma = sigma or min(shape) / 8
    d = smooth_field(rng, shape, amplitude, sigma)
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=float) for n in shape], indexing="ij"))
    u = -d.copy()
    for _ in range(30):
        u = -np.stack([ndi.map_coordinates(c, grid + u, order=1, mode="nearest") for c in d])
    fixed = textured(rng, shape)
    moving = ndi.map_coordinates(fixed, grid + u, order=3, mode="nearest")
    return fixed, moving, d


def shifted_stack(rng, shape, frames, max_shift=6.0, noise=0.02):
    """``(stack, shifts)``: frames of one scene moved by random sub-pixel shifts, with
    ``frame_0(x) = frame_t(x + d_t)`` for the returned ``d_t``."""
    pad = int(np.ceil(max_shift)) + 4
    big = textured(rng, tuple(n + 2 * pad for n in shape))
    true = rng.uniform(-max_shift, max_shift, (frames, len(shape)))
    crop = tuple(slice(pad, pad + n) for n in shape)
    stack = np.stack([ndi.shift(big, -s, order=3, mode="nearest")[crop] for s in true])
    stack = stack + rng.normal(0, noise, stack.shape)
    return stack, true[0] - true


class Blobs:
    """A smooth image defined everywhere in physical space: a sum of Gaussian blobs.

    Sampling it on two grids (any pixel size, origin or transform) gives an exact pair,
    with no interpolation error in the ground truth.
    """

    def __init__(self, rng, n: int, low, high, sigma=(3.0, 6.0)):
        self.centers = rng.uniform(low, high, (n, len(low)))
        self.sigmas = rng.uniform(*sigma, n)
        self.amplitudes = rng.uniform(0.5, 1.5, n)

    def __call__(self, points: np.ndarray) -> np.ndarray:
        out = np.zeros(points.shape[:-1])
        for c, s, a in zip(self.centers, self.sigmas, self.amplitudes):
            out += a * np.exp(-((points - c) ** 2).sum(-1) / (2 * s * s))
        return out

    def sample(self, grid, shape, physical=None) -> np.ndarray:
        """The image on ``grid`` (a :class:`Grid`) of ``shape``, seen through the physical
        ``(D + 1, D + 1)`` map ``physical`` (image(y) = blobs(physical⁻¹ y)) if given."""
        axes = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
        points = np.stack(axes, -1) * np.array(grid.spacing) + np.array(grid.origin)
        if physical is not None:
            inverse = np.linalg.inv(physical)
            d = len(shape)
            points = points @ inverse[:d, :d].T + inverse[:d, d]
        return self(points)


def physical_corner_error(p_est, p_true, grid, shape) -> np.ndarray:
    """Per-axis error, in pixels of ``grid``, of where two physical matrices send the
    image's corners: ``(corners, D)``."""
    d = len(shape)
    corners = np.array(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij")).reshape(d, -1).T
    points = corners * np.array(grid.spacing) + np.array(grid.origin)
    est = points @ p_est[:d, :d].T + p_est[:d, d]
    true = points @ p_true[:d, :d].T + p_true[:d, d]
    return np.abs(est - true) / np.array(grid.spacing)
