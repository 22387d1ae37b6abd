"""Forward warping (splatting): ours against a plain-autograd version and our backward warp.

Cases: one single-channel float32 image, 2048² and 128³, splatted along a smooth random
displacement of at most 5 px (normalized: the weighted average of what lands on each pixel).

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

from _harness import forward_backward, smooth_displacement

SECTION = "Splatting (forward warp)"


def _run_case(report, label: str, shape) -> None:
    from napari_simwarp.ops import splat, warp
    from napari_simwarp.ops.splat import _splat_reference

    generator = torch.Generator().manual_seed(0)
    image = torch.rand((1, 1) + tuple(shape), generator=generator)
    displacement = smooth_displacement(shape, 5.0, generator)
    group = f"splat {label} normalized"

    def reference(i, d):
        return _splat_reference(i, d)[0]

    report.measure(
        group,
        "simwarp splat (torch, custom backward)",
        "forward",
        lambda: splat(image, displacement),
        ours=True,
        repeat=3,
    )
    ours = report.measure(
        group,
        "simwarp splat (torch, custom backward)",
        "forward+backward",
        forward_backward(splat, image, displacement),
        ours=True,
        repeat=3,
    )
    report.measure(
        group,
        "index_add + autograd (plain torch)",
        "forward",
        lambda: reference(image, displacement),
        repeat=3,
    )
    report.measure(
        group,
        "index_add + autograd (plain torch)",
        "forward+backward",
        forward_backward(reference, image, displacement),
        repeat=3,
    )
    yardstick = report.measure(
        group,
        "simwarp warp (backward warp, grid_sample)",
        "forward+backward",
        forward_backward(warp, image, displacement),
        repeat=3,
        note="not a peer: the yardstick of the 3× target",
    )
    report.note(
        SECTION,
        f"{label}: splat forward+backward takes "
        f"{ours.seconds / yardstick.seconds:.2f}× the time of warp "
        "forward+backward (target: at most 3×).",
    )


def run(report) -> None:
    """Time splat at 2048² and 128³ against its plain-autograd version and warp."""
    _run_case(report, "2048²", (2048, 2048))
    _run_case(report, "128³", (128, 128, 128))
