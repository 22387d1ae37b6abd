"""npe2 sample-data contributions, built on :mod:`napari_simwarp.data` (no download).

Each function returns napari ``LayerDataTuple`` s ``(data, kwargs, "image")``; the true
displacement / drift travels in the layer's ``metadata`` so that a result can be checked.
No Qt and no napari imports.
"""

from __future__ import annotations

from . import data


def deformed_pair():
    """The camera picture (fixed) and a smoothly deformed copy (moving), 512×512."""
    fixed, moving, displacement = data.deformed_pair()
    return [
        (
            fixed,
            {
                "name": "fixed",
                "colormap": "green",
                "blending": "additive",
                "contrast_limits": (0.0, 1.0),
            },
            "image",
        ),
        (
            moving,
            {
                "name": "moving",
                "colormap": "magenta",
                "blending": "additive",
                "contrast_limits": (0.0, 1.0),
                "metadata": {"true_displacement": displacement},
            },
            "image",
        ),
    ]


def drifting_timelapse():
    """A 20-frame 256×256 camera crop drifting by random sub-pixel shifts, with noise."""
    stack, shifts = data.drifting_timelapse()
    return [
        (
            stack,
            {"name": "time-lapse", "colormap": "gray", "metadata": {"true_shifts": shifts}},
            "image",
        )
    ]


def deformed_volume_pair():
    """A 64³ blob volume (fixed) and a smoothly deformed copy (moving)."""
    fixed, moving, displacement = data.deformed_volume_pair()
    return [
        (fixed, {"name": "fixed 3D", "colormap": "green", "blending": "additive"}, "image"),
        (
            moving,
            {
                "name": "moving 3D",
                "colormap": "magenta",
                "blending": "additive",
                "metadata": {"true_displacement": displacement},
            },
            "image",
        ),
    ]


def anisotropic_volume_pair():
    """A blob volume with a z step 3x its pixel (fixed) and the same specimen tilted and
    moved (moving), both shown at their physical scale."""
    fixed, moving, spacing, physical = data.anisotropic_volume_pair()
    return [
        (
            fixed,
            {
                "name": "fixed (z step 3)",
                "colormap": "green",
                "blending": "additive",
                "scale": spacing,
            },
            "image",
        ),
        (
            moving,
            {
                "name": "moving (z step 3)",
                "colormap": "magenta",
                "blending": "additive",
                "scale": spacing,
                "metadata": {"true_physical_matrix": physical},
            },
            "image",
        ),
    ]
