"""Checks of the registration options, made before any work.

Each check names the option and says what was expected; a value the optimizer cannot use
(a NaN learning rate, a negative regularization, a field of the wrong shape) is refused
here rather than reaching a kernel or diverging.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ..ops.integrate_velocity import MAX_STEPS  # one limit: the op's


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def positive(value, name: str) -> float:
    """A finite number > 0."""
    value = _real(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def non_negative(value, name: str) -> float:
    """A finite number >= 0."""
    value = _real(value, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def optional_positive(value, name: str) -> float | None:
    return None if value is None else positive(value, name)


def optional_non_negative(value, name: str) -> float | None:
    return None if value is None else non_negative(value, name)


def levels(value) -> str | int:
    """ "auto" (or None) or an int >= 1."""
    if value is None or value == "auto":
        return "auto"
    value = _int(value, "levels")
    if value < 1:
        raise ValueError(f"levels must be 'auto' or a positive int, got {value!r}")
    return value


def iterations(value):
    """None, an int >= 0, or a sequence of them (one per level)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [iterations(v) for v in value]
    value = _int(value, "iterations")
    if value < 0:
        raise ValueError(f"iterations must be >= 0, got {value!r}")
    return value


def steps(value) -> int:
    """Scaling-and-squaring steps: an int in ``[0, MAX_STEPS]``."""
    value = _int(value, "steps")
    if not 0 <= value <= MAX_STEPS:
        raise ValueError(f"steps must be an int in [0, {MAX_STEPS}], got {value!r}")
    return value


def report_every(value) -> int:
    value = _int(value, "report_every")
    if value < 1:
        raise ValueError(f"report_every must be a positive int, got {value!r}")
    return value


def window(value) -> float | None:
    """None or a positive number (a physical length; each level rounds it per axis to an
    odd number of pixels)."""
    return None if value is None else positive(value, "window")


def init_matrix(value, ndim: int, grids=None) -> np.ndarray | None:
    """A finite homogeneous ``(D + 1, D + 1)`` pixel matrix (fixed → moving), or None.

    An AffineTransform that carries grids is placed by its physical matrix, carried to the
    pixels of ``grids`` (``(fixed_grid, moving_grid)`` of the run), so that a transform
    found on other samplings of the same images starts the run where it belongs.
    """
    if value is None:
        return None
    from .transforms import AffineTransform, Transform

    if isinstance(value, AffineTransform):
        if grids is not None and (value.fixed_grid or value.moving_grid) is not None:
            if value.ndim != ndim:
                raise ValueError(f"init is a {value.ndim}-D transform, the images are {ndim}-D")
            fixed_grid, moving_grid = grids
            value = moving_grid.to_pixels() @ value.physical_matrix @ fixed_grid.to_physical()
        else:
            value = value.matrix
    elif isinstance(value, Transform):
        raise TypeError(
            f"init must be a matrix or an AffineTransform for a linear model, got "
            f"a {type(value).__name__}"
        )
    m = _array(value, "init")
    if m.shape != (ndim + 1, ndim + 1):
        raise ValueError(
            f"init must be a ({ndim + 1}, {ndim + 1}) homogeneous matrix for "
            f"{ndim}-D images, got shape {m.shape}"
        )
    return m


def init_field(value, shape) -> np.ndarray | None:
    """A finite displacement ``(D, *shape)`` in pixels (from a Transform or an array), or None."""
    if value is None:
        return None
    from .transforms import Transform

    d = value.to_displacement(shape) if isinstance(value, Transform) else _array(value, "init")
    expected = (len(shape), *shape)
    if d.shape != expected and d.shape != (1, *expected):
        raise ValueError(
            f"init must be a displacement field of shape {expected} (or a "
            f"Transform) for images of shape {tuple(shape)}, got {d.shape}"
        )
    if not np.isfinite(d).all():
        raise ValueError("init must be finite, got NaN or infinite displacements")
    return d.reshape(expected)


def _array(value, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of numbers, got {type(value).__name__}") from exc
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got NaN or infinite values")
    return a
