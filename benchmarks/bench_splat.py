"""Forward warping (splatting): ours against a plain-autograd version and our backward warp.

Cases: one single-channel float32 image, 2048² and 128³, splatted along a smooth random
displacement of at most 5 px (normalised: the weighted average of what lands on each pixel).

- ours: ``napari_simwarp.ops.splat``: a custom autograd Function, scatter forward and a
  hand-written gather-only backward; forward and forward+backward (``out.sum()``,
  gradients with respect to the image and the displacement).
- peer: the straightforward version, ``index_add`` per corner into flat buffers with the
  gradient left to autograd (``napari_simwarp.ops.splat._splat_reference``, no custom
  Function), the same maths and result.
- ``napari_simwarp.ops.warp`` (backward warp, ``grid_sample``) forward+backward at the same
  size in the same run: not a peer (it computes something else) but the yardstick of the
  target "splat forward+backward within 3× of warp forward+backward".
"""

from __future__ import annotations

import torch

SECTION = "Splatting (forward warp)"


def _smooth_displacement(shape, amplitude: float, generator: torch.Generator) -> torch.Tensor:
    """A ``(1, D, *S)`` float32 field: coarse random noise upsampled, ``amplitude`` px at most."""
    d = len(shape)
    coarse = torch.randn((1, d) + tuple(max(n // 32, 2) for n in shape), generator=generator)
    mode = "bilinear" if d == 2 else "trilinear"
    field = torch.nn.functional.interpolate(coarse, size=tuple(shape), mode=mode, align_corners=True)
    return field * (amplitude / field.abs().max())


def _forward_backward(fn, image: torch.Tensor, displacement: torch.Tensor):
    """A closure running ``fn(image, displacement).sum().backward()`` on fresh leaves."""
    image = image.clone().requires_grad_()
    displacement = displacement.clone().requires_grad_()

    def step():
        image.grad = None
        displacement.grad = None
        fn(image, displacement).sum().backward()
        return image.grad, displacement.grad

    return step


def _run_case(report, label: str, shape) -> None:
    from napari_simwarp.ops import splat, warp
    from napari_simwarp.ops.splat import _splat_reference

    generator = torch.Generator().manual_seed(0)
    image = torch.rand((1, 1) + tuple(shape), generator=generator)
    displacement = _smooth_displacement(shape, 5.0, generator)
    group = f"splat {label} normalised"

    def reference(i, d):
        return _splat_reference(i, d)[0]

    report.measure(group, "simwarp splat (torch, custom backward)", "forward",
                   lambda: splat(image, displacement), ours=True, repeat=3)
    ours = report.measure(group, "simwarp splat (torch, custom backward)", "forward+backward",
                          _forward_backward(splat, image, displacement), ours=True, repeat=3)
    report.measure(group, "index_add + autograd (plain torch)", "forward",
                   lambda: reference(image, displacement), repeat=3)
    report.measure(group, "index_add + autograd (plain torch)", "forward+backward",
                   _forward_backward(reference, image, displacement), repeat=3)
    yardstick = report.measure(
        group, "simwarp warp (backward warp, grid_sample)", "forward+backward",
        _forward_backward(warp, image, displacement), repeat=3,
        note="not a peer: the yardstick of the 3× target",
    )
    report.note(SECTION, f"{label}: splat forward+backward takes "
                         f"{ours.seconds / yardstick.seconds:.2f}× the time of warp "
                         "forward+backward (target: at most 3×).")


def run(report) -> None:
    """Time splat at 2048² and 128³ against its plain-autograd version and warp."""
    _run_case(report, "2048²", (2048, 2048))
    _run_case(report, "128³", (128, 128, 128))
