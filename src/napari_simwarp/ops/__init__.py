"""Differentiable image-similarity and warping operators on torch tensors.

Tensors are ``(N, C, H, W)`` in 2D and ``(N, C, D, H, W)`` in 3D; every operator works in
both, on float16/bfloat16 (computed in float32), float32 and float64, on any torch device.
No napari, no Qt. Each function lives in the module of its name; docs/maths.md gives the
mathematics, docs/architecture.md the layers beneath.
"""

from . import _op_self_checks  # noqa: F401 (adds their cases to the self-check)
from .affine_to_displacement import affine_to_displacement
from .compose import compose
from .fft_cc import fft_cc
from .integrate_velocity import integrate_velocity
from .invert import invert
from .jacobian_determinant import jacobian_determinant
from .local_ncc import local_ncc
from .local_std import local_std
from .losses import LOSSES, LocalNCCLoss, MILoss, MSELoss, NCCLoss, SSIMLoss, loss_for
from .match_template import match_template
from .mutual_information import mutual_information
from .ncc import ncc
from .similarity_gradient import similarity_gradient
from .splat import splat
from .ssim import ssim
from .warp import warp
from .warp_affine import warp_affine

__all__ = [
    "LOSSES",
    "LocalNCCLoss",
    "MILoss",
    "MSELoss",
    "NCCLoss",
    "SSIMLoss",
    "affine_to_displacement",
    "compose",
    "fft_cc",
    "integrate_velocity",
    "invert",
    "jacobian_determinant",
    "local_ncc",
    "local_std",
    "loss_for",
    "match_template",
    "mutual_information",
    "ncc",
    "similarity_gradient",
    "splat",
    "ssim",
    "warp",
    "warp_affine",
]
