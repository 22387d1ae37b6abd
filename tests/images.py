"""Test images shared by the test modules: natural, random and microscopy-like, 2D and 3D.

Every function returns a float64 NumPy array; tests convert to the dtype they need.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi


def natural(shape=(128, 128)) -> np.ndarray:
    """A crop of scikit-image's camera picture in [0, 1] (tiled for large shapes)."""
    from skimage import data

    img = data.camera().astype(np.float64) / 255.0
    reps = [-(-n // m) for n, m in zip(shape, img.shape)]
    return np.tile(img, reps)[tuple(slice(0, n) for n in shape)].copy()


def random_smooth(rng: np.random.Generator, shape, sigma: float = 2.0) -> np.ndarray:
    """Gaussian-filtered white noise rescaled to [0, 1]: texture at every position."""
    x = ndi.gaussian_filter(rng.standard_normal(shape), sigma)
    return (x - x.min()) / (x.max() - x.min())


def microscopy(rng: np.random.Generator, shape, offset=1000.0, noise=5.0, background=150.0):
    """Camera-like data: a large offset, a smooth background, some blobs and Gaussian noise.

    The background spans ``background`` counts over the field of view, so the local mean
    is far from the global mean: the case where naive float32 variance formulas fail.
    """
    grids = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    smooth = background * (0.5 + 0.5 * np.sin(2.0 * grids[0] + 1.0) * np.cos(1.5 * grids[-1]))
    blobs = np.zeros(shape)
    idx = tuple(rng.integers(0, n, size=12) for n in shape)
    blobs[idx] = 1.0
    blobs = ndi.gaussian_filter(blobs, 3.0)
    blobs *= 400.0 / max(blobs.max(), 1e-12)
    return offset + smooth + blobs + rng.normal(0.0, noise, shape)
