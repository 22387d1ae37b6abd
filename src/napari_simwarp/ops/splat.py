"""Differentiable forward warping (splatting), docs/maths.md §4.

Each source pixel ``i`` at grid position ``q_i`` moves to ``p_i = q_i + d_i`` and spreads
its value to the 2ᴰ integer neighbors ``j`` of ``p_i`` with bilinear (trilinear in 3D)
weights ``g(p_i, j)``:

    num(j) = Σ_i g(p_i, j) · f(i)        den(j) = Σ_i g(p_i, j)
    out(j) = num(j) / den(j)   (normalize=True)   or   num(j)   (normalize=False)

and ``out(j) = 0`` where ``den(j) <= eps`` (a hole: nothing, or almost nothing, landed).
The backward is written by hand as gathers only (:mod:`._reference.splat`, and the kernels).

Determinism: on CPU the same input gives bitwise the same output. On CUDA the scatter uses
atomic additions whose order varies between runs, so float32 results can differ in the
last bits from run to run.
"""

from __future__ import annotations

import torch

from . import _kernels
from ._numerics import compute_dtype
from ._validation import check_bool, check_displacement, check_image, check_nonnegative

__all__ = ["splat"]


def splat(image, displacement, *, normalize=True, eps=1e-6, return_weights=False):
    """Forward-warp ``image`` along ``displacement`` by differentiable bilinear splatting.

    Each source pixel ``x`` is moved to ``x + displacement(x)`` and spread to the 2ᴰ
    pixels around that position with linear weights (the adjoint of bilinear sampling).
    ``warp(splat(f, d), d) ≈ f`` for a smooth, invertible ``d``: the backward warp at
    ``x`` reads ``x + d(x)``, which is where the splat put ``f(x)``.

    Parameters
    ----------
    image : Tensor, shape ``(N, C, H, W)`` or ``(N, C, D, H, W)``
        Floating point; float16/bfloat16 are computed in float32.
    displacement : Tensor, shape ``(N or 1, len(S), *S)``
        Where each source pixel goes, in pixels, components in array-axis order
        (``(dy, dx)`` in 2D, ``(dz, dy, dx)`` in 3D), the same convention as ``warp``.
        A batch of 1 is shared by every image. A pixel whose displacement is NaN or
        infinite lands nowhere (it adds nothing, and gets a zero gradient).
    normalize : bool
        True: each output pixel is the weighted average of what landed on it.
        False: the plain weighted sum (mass-preserving: the total is kept except what
        leaves the image).
    eps : float
        Output pixels whose accumulated weight is ``<= eps`` are holes: 0 in the output,
        and no gradient flows through them (the weight map itself stays differentiable).
    return_weights : bool
        Also return the accumulated weight map ``den`` (holes where it is ``<= eps``).

    Returns
    -------
    Tensor, shape ``(N, C, *S)``, in ``image``'s dtype; with ``return_weights`` a tuple
    ``(out, weights)``, ``weights`` shaped ``(N, 1, *S)`` in the same dtype.
    Differentiable with respect to ``image`` and ``displacement`` (first order; the
    displacement gradient jumps where a source position crosses an integer).

    Notes
    -----
    Deterministic on CPU (bitwise); on CUDA the scatter uses atomics and float32 results
    may differ in the last bits between runs. Runs the fused kernel
    (``simwarp::splat_fwd``) where the compiled backend is available, else its pure torch
    twin (``_reference.splat``); both compute the same sums (see ``backend_info()``).
    """
    check_image(image, "image")
    # Non-finite displacements are allowed: such a source pixel lands nowhere (documented).
    check_displacement(
        displacement, tuple(image.shape[2:]), like=image, batch=image.shape[0], finite=False
    )
    check_bool(normalize, "normalize")
    eps = check_nonnegative(eps, "eps")
    check_bool(return_weights, "return_weights")

    dtype = torch.promote_types(compute_dtype(image.dtype), compute_dtype(displacement.dtype))
    n = image.shape[0]
    disp = displacement.to(dtype)
    if disp.shape[0] != n:
        # A shared field: autograd sums the per-image gradients back onto it.
        disp = disp.expand(n, *disp.shape[1:])
    impl = _kernels.implementation("splat", image, disp)
    out, weights = impl.splat_fwd(image.to(dtype), disp, normalize, eps)
    out = out.to(image.dtype)
    if return_weights:
        return out, weights.to(image.dtype)
    return out
