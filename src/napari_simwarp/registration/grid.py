"""Where an image's pixels are in physical space: a pixel size and an origin per axis.

A :class:`Grid` is napari's ``scale`` and ``translate`` of a layer (array-axis order):
pixel ``p`` of the image sits at the physical position ``origin + spacing · p``. The
registration works between two grids (docs/maths.md §6.1): a transform maps fixed
*physical* coordinates to moving physical coordinates, and its pixel form (``matrix``,
fixed pixels → moving pixels, what ``scipy.ndimage.affine_transform`` takes) is derived
from the two grids. With unit spacing and zero origin both forms are the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grid:
    """Pixel size ``spacing`` and position of pixel 0 ``origin``, per axis (array order)."""

    spacing: tuple[float, ...]
    origin: tuple[float, ...]

    @classmethod
    def make(cls, ndim: int, spacing=None, origin=None, *, name: str = "") -> Grid:
        """A checked grid of ``ndim`` axes (``spacing`` default 1, ``origin`` default 0).

        ``name`` prefixes the argument names in messages ("fixed" → ``fixed_spacing``).
        """
        prefix = f"{name}_" if name else ""
        spacing = _per_axis(spacing, ndim, 1.0, f"{prefix}spacing")
        origin = _per_axis(origin, ndim, 0.0, f"{prefix}origin")
        if any(s <= 0 for s in spacing):
            raise ValueError(f"{prefix}spacing must be positive on every axis, got {spacing}")
        return cls(spacing, origin)

    @property
    def ndim(self) -> int:
        return len(self.spacing)

    @property
    def is_unit(self) -> bool:
        """Unit spacing and zero origin: physical coordinates are pixel coordinates."""
        return all(s == 1.0 for s in self.spacing) and all(o == 0.0 for o in self.origin)

    def to_physical(self) -> np.ndarray:
        """Homogeneous ``(D + 1, D + 1)`` map from pixels to physical coordinates."""
        d = self.ndim
        out = np.eye(d + 1)
        out[:d, :d] = np.diag(self.spacing)
        out[:d, d] = self.origin
        return out

    def to_pixels(self) -> np.ndarray:
        """Homogeneous ``(D + 1, D + 1)`` map from physical coordinates to pixels."""
        d = self.ndim
        out = np.eye(d + 1)
        out[:d, :d] = np.diag([1.0 / s for s in self.spacing])
        out[:d, d] = [-o / s for o, s in zip(self.origin, self.spacing)]
        return out

    def as_dict(self) -> dict:
        return {"spacing": list(self.spacing), "origin": list(self.origin)}


def unit_grid(ndim: int) -> Grid:
    """The grid whose physical coordinates are its pixel coordinates."""
    return Grid((1.0,) * ndim, (0.0,) * ndim)


def _per_axis(value, ndim: int, default: float, name: str) -> tuple[float, ...]:
    if value is None:
        return (default,) * ndim
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        values = (float(value),) * ndim
    elif isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        try:
            values = tuple(float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be numbers, one per axis, got {value!r}") from exc
        if len(values) != ndim:
            raise ValueError(
                f"{name} must have one value per axis ({ndim}, array order), "
                f"got {len(values)}: {value!r}"
            )
    else:
        raise TypeError(f"{name} must be a number or a sequence of {ndim} numbers, got {value!r}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be finite, got {values}")
    return values
