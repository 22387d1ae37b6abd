"""Backward warping by a dense displacement: ours against SciPy and MONAI.

Cases: one single-channel float32 image, 2048² and 128³, warped by a smooth random
displacement of a few pixels with linear interpolation and border padding.

- ours: ``napari_simwarp.ops.warp``, forward and forward+backward (``out.sum()``,
  gradients with respect to the image and the displacement).
- SciPy ``ndimage.map_coordinates(order=1, mode="nearest")`` (the same interpolant and
  boundary), forward only, float64 and float32 input; the absolute coordinates are built
  outside the timed call (a head start for SciPy: ours adds the identity grid inside).
- MONAI ``networks.blocks.Warp(mode="bilinear", padding_mode="border")``: the same
  convention as ours (displacement in pixels, array-axis order, ``out(x) = image(x + d(x))``,
  ``grid_sample`` with ``align_corners=True``), forward and forward+backward.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from _harness import forward_backward, smooth_displacement

SECTION = "Warping"


def _monai_warp():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from monai.networks.blocks import Warp

            return Warp(mode="bilinear", padding_mode="border")
    except Exception:  # a missing peer is reported, not fatal
        return None


def _run_case(report, label: str, shape) -> None:
    from scipy import ndimage as ndi

    from napari_simwarp.ops import warp

    generator = torch.Generator().manual_seed(0)
    image = torch.rand((1, 1) + tuple(shape), generator=generator)
    displacement = smooth_displacement(shape, 5.0, generator)
    group = f"warp {label} linear border"

    report.measure(
        group, "simwarp warp (torch)", "forward", lambda: warp(image, displacement), ours=True
    )
    report.measure(
        group,
        "simwarp warp (torch)",
        "forward+backward",
        forward_backward(warp, image, displacement),
        ours=True,
    )

    coords = np.indices(shape, dtype=np.float64) + displacement[0].double().numpy()
    image64 = image[0, 0].double().numpy()
    image32, coords32 = image64.astype(np.float32), coords.astype(np.float32)
    report.measure(
        group,
        "scipy map_coordinates order=1 (float64)",
        "forward",
        lambda: ndi.map_coordinates(image64, coords, order=1, mode="nearest"),
    )
    report.measure(
        group,
        "scipy map_coordinates order=1 (float32)",
        "forward",
        lambda: ndi.map_coordinates(image32, coords32, order=1, mode="nearest"),
    )

    monai_warp = _monai_warp()
    if monai_warp is None:
        report.note(SECTION, f"{label}: MONAI not installed, skipped.")
        return
    with torch.no_grad():
        difference = (monai_warp(image, displacement) - warp(image, displacement)).abs().max()
    report.measure(
        group,
        "MONAI Warp (grid_sample)",
        "forward",
        lambda: monai_warp(image, displacement),
        note=f"max |Δ| vs ours {difference:.1e}",
    )
    report.measure(
        group,
        "MONAI Warp (grid_sample)",
        "forward+backward",
        forward_backward(monai_warp, image, displacement),
    )


def run(report) -> None:
    report.note(
        SECTION,
        (
            "`warp(image, d)` (float32, one channel, linear, border) against SciPy "
            '`map_coordinates(order=1, mode="nearest")` (coordinates prebuilt, forward only) '
            "and MONAI `Warp` (same convention and engine, `grid_sample`). Forward+backward is "
            "`out.sum().backward()` with gradients for the image and the displacement."
        ),
    )
    _run_case(report, "2048²", (2048, 2048))
    _run_case(report, "128³", (128, 128, 128))
