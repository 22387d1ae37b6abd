"""Differentiable image-similarity and warping operators on torch tensors.

Tensors are ``(N, C, H, W)`` in 2D and ``(N, C, D, H, W)`` in 3D. No napari, no Qt.
"""

from .fft import fft_cc

__all__ = ["fft_cc"]
