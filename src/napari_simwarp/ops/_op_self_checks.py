"""The compiled self-check's cases of the ops built on the kernels (the scaling and
squaring, the Parzen mutual information, the fused SSIM, local std and local NCC),
against their pure torch paths.

They live here, beside the ops, and are added to
:data:`~._kernels.self_check.PRIMITIVE_CHECKS` when ``napari_simwarp.ops`` is imported
(always before its ``_kernels`` subpackage): the ops import ``_kernels``, so
``_kernels.self_check`` cannot import them (tests/test_architecture.py: no import cycles).
"""

from __future__ import annotations

import torch

from . import _reference
from ._kernels import calls
from ._kernels.self_check import PRIMITIVE_CHECKS, _compare_with_gradients, _random
from .mutual_information import _Parzen, parzen_score


def _check_squaring(device, dtype, gen) -> float:
    """Seven squarings of smooth 2-D and 3-D velocities of a few pixels (5 px waves and
    3.3 px along the first axis: samples leave the image, so the border's clamp counts):
    the field and its gradient against the torch path (grid_sampler). Smooth, because a
    rough field puts float32 sample positions within rounding of a cell boundary, where
    the bilinear derivative jumps."""
    from .integrate_velocity import torch_squarings

    errors = []
    for shape in ((2, 2, 9, 11), (1, 3, 5, 6, 7)):
        axes = torch.meshgrid(
            *[torch.linspace(0, 1, n, device=device, dtype=dtype) for n in shape[2:]],
            indexing="ij",
        )
        phase = torch.rand(shape[:2], generator=gen, device=device, dtype=dtype) * 6.28
        waves = torch.sin(3.1 * sum(axes)[None, None] + phase[(...,) + (None,) * len(axes)])
        v = 5.0 * waves + 3.3 * (torch.arange(shape[1], device=device) == 0).to(dtype).view(
            1, -1, *[1] * len(axes)
        )
        # the DenseModel's use: a scale per component folded into the first squaring, and
        # the scaled velocity returned too (its gradient: squaring_bwd's base)
        scale = [f / 2**7 for f in (1.0, 0.75, 1.25)[: shape[1]]]
        errors.append(
            _compare_with_gradients(
                lambda x, s=scale: calls.squarings(x, 7, s, with_input=True),
                lambda x, s=scale: torch_squarings(x, 7, s, with_input=True),
                [v.requires_grad_()],
                seed=6,
            )
        )
    return max(errors)


def _check_ssim_fused(device, dtype, gen) -> float:
    """The fused 2-D SSIM (CUDA, float32 only; nothing to check elsewhere) against the
    moment engine's pure torch path in float64, values and both gradients, on offset
    data whose size is no multiple of the tiles, "none" and "mean"."""
    if device.type != "cuda" or dtype != torch.float32:
        return 0.0
    from ._moments import _MomentMap
    from ._windows import make_window
    from .ssim import _SSIMMetric, fused_ssim

    window = make_window("gaussian", (11, 7), (1.5, 1.0))
    metric, errors = _SSIMMetric(0.01**2 * 25.0, 0.03**2 * 25.0), []
    a = _random(gen, (2, 2, 37, 45), device, dtype, grad=True, offset=100.0)
    b = (a.detach() + _random(gen, a.shape, device, dtype)).requires_grad_()
    for reduction in ("none", "mean"):
        errors.append(
            _compare_with_gradients(
                lambda x, y, r=reduction: fused_ssim(x, y, window, metric.c1, metric.c2, r),
                lambda x, y, r=reduction: _MomentMap.apply(
                    x.double(), y.double(), window, metric, r, _reference, None
                ).float(),
                [a, b],
                seed=2,
            )
        )
    return max(errors)


def _check_local_std_fused(device, dtype, gen) -> float:
    """The fused 2-D local std (CUDA, float32 only; nothing to check elsewhere) against the
    pure torch path in float64, values and gradients, every padding, both normalizations,
    on offset data whose size is no multiple of the tiles."""
    if device.type != "cuda" or dtype != torch.float32:
        return 0.0
    from .local_std import fused_local_std

    errors = []
    x = _random(gen, (2, 2, 37, 45), device, dtype, grad=True, offset=100.0)
    for padding in ("reflect", "mirror", "nearest", "constant"):
        for normalize in (True, False):
            errors.append(
                _compare_with_gradients(
                    lambda t, p=padding, n=normalize: fused_local_std(t, (7, 9), p, 1e-6, n),
                    lambda t, p=padding, n=normalize: _reference.local_std_2d(
                        t.double(), (7, 9), p, 1e-6, n
                    ).float(),
                    [x],
                    seed=3,
                )
            )
    return max(errors)


def _check_local_ncc_fused(device, dtype, gen) -> float:
    """The fused local NCC (CUDA, float32 only; nothing to check elsewhere) against the
    moment engine's pure torch path in float64, values and both gradients, 2-D and 3-D,
    box and Gaussian, on offset data whose size is no multiple of the tiles."""
    if device.type != "cuda" or dtype != torch.float32:
        return 0.0
    from ._moments import _MomentMap
    from ._windows import make_window
    from .local_ncc import _LocalNCCMetric, fused_local_ncc

    errors = []
    cases = [
        ((2, 2, 37, 45), make_window("gaussian", (9, 7), (1.5, 1.0))),
        ((1, 2, 11, 19, 21), make_window("box", (5, 3, 7))),
    ]
    for shape, window in cases:
        a = _random(gen, shape, device, dtype, grad=True, offset=100.0)
        b = (a.detach() + _random(gen, a.shape, device, dtype)).requires_grad_()
        for reduction in ("none", "mean"):
            errors.append(
                _compare_with_gradients(
                    lambda x, y, w=window, r=reduction: fused_local_ncc(x, y, w, r),
                    lambda x, y, w=window, r=reduction: _MomentMap.apply(
                        x.double(), y.double(), w, _LocalNCCMetric(), r, _reference, None
                    ).float(),
                    [a, b],
                    seed=4,
                )
            )
    return max(errors)


def _check_parzen(device, dtype, gen) -> float:
    """The B-spline Parzen mutual information, plain and normalized, with pixel weights:
    the score and both images' gradients against the torch path."""
    a = _random(gen, (2, 3000), device, dtype, grad=True)
    b = (torch.sin(3 * a.detach()) + 0.2 * _random(gen, (2, 3000), device, dtype)).requires_grad_()
    w = torch.rand((2, 3000), generator=gen, device=device, dtype=dtype)
    errors, parzen = [], _Parzen("bspline", 32, 1.0)
    for normalize in (True, False):
        errors.append(
            _compare_with_gradients(
                lambda x, y, n=normalize: calls.parzen_mutual_information(x, y, w, 32, n, None),
                lambda x, y, n=normalize: parzen_score(x, y, w, parzen, n, None),
                [a, b],
                seed=5,
            )
        )
    return max(errors)


PRIMITIVE_CHECKS.update(
    {
        "parzen": _check_parzen,
        "squaring": _check_squaring,
        "ssim_fused": _check_ssim_fused,
        "local_std_fused": _check_local_std_fused,
        "local_ncc_fused": _check_local_ncc_fused,
    }
)
