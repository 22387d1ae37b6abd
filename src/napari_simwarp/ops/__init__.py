"""Differentiable image-similarity and warping operators on torch tensors.

Tensors are ``(N, C, H, W)`` in 2D and ``(N, C, D, H, W)`` in 3D; every operator works in
both, on float16/bfloat16 (computed in float32), float32 and float64, on any torch device.
No napari, no Qt.
"""

from .fft import fft_cc
from .fields import (
    affine_to_displacement,
    compose,
    integrate_velocity,
    invert,
    jacobian_determinant,
)
from .local_ncc import local_ncc
from .local_std import local_std
from .similarity_gradient import similarity_gradient
from .splat import splat
from .ssim import ssim
from .warp import warp, warp_affine
from .zncc import match_template, ncc

__all__ = [
    "affine_to_displacement",
    "compose",
    "fft_cc",
    "integrate_velocity",
    "invert",
    "jacobian_determinant",
    "local_ncc",
    "local_std",
    "match_template",
    "ncc",
    "similarity_gradient",
    "splat",
    "ssim",
    "warp",
    "warp_affine",
]
