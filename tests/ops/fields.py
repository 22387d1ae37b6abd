"""Random displacement fields and affines shared by the displacement-field tests
(test_compose, test_invert, test_integrate_velocity, test_jacobian_determinant,
test_affine_to_displacement)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage as ndi

SHAPES = [(48, 52), (20, 22, 24)]
SHAPE_IDS = ["2d", "3d"]


def smooth_field(rng, shape, amplitude, sigma=5.0, taper=False) -> torch.Tensor:
    """A random smooth ``(1, D, *S)`` float64 field with largest component ``amplitude``.

    ``taper`` multiplies it by a window that is 0 on the border, so that ``x + d(x)``
    never leaves the image (no extrapolation error in compositions).
    """
    field = np.stack([ndi.gaussian_filter(rng.standard_normal(shape), sigma) for _ in shape])
    if taper:
        window = np.ones(shape)
        for axis, n in enumerate(shape):
            profile = np.sin(np.pi * np.arange(n) / (n - 1))
            window = window * profile.reshape([-1 if a == axis else 1 for a in range(len(shape))])
        field = field * window
    return torch.from_numpy(field * (amplitude / np.abs(field).max()))[None]


def random_affine(rng, d: int) -> np.ndarray:
    """A homogeneous ``(d + 1, d + 1)`` matrix near the identity, with a shift of a few pixels."""
    matrix = np.eye(d + 1)
    matrix[:d, :d] += rng.normal(0.0, 0.1, (d, d))
    matrix[:d, d] = rng.normal(0.0, 2.0, d)
    return matrix
