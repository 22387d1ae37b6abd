"""What the transform-file modules share: the error type, atomic writes, axis order.

Every reader and writer here works on plain NumPy data (matrices, fields, pixel sizes and
origins), never on the package's ``Transform`` objects, so that ``registration`` can use
them without an import cycle. Conventions of the data they exchange:

- matrices are homogeneous ``(D + 1, D + 1)`` float64, **array-axis order** (plane, row,
  column), map **fixed physical → moving physical** coordinates;
- displacement fields are ``(D, *S)`` in **physical units**, array-axis order, sampled on
  the fixed image's grid: ``moving_point(p) = p + u(p)`` for the physical point ``p`` of
  each fixed pixel;
- a grid is ``(spacing, origin)``, per axis, array order (napari's ``scale`` and
  ``translate``).

ITK, elastix and BigWarp write x, y, z: the reverse of array order. :func:`reverse_axes`
converts a homogeneous matrix between the two orders (it is its own inverse).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import numpy as np

from .. import atomic


class TransformFileError(ValueError):
    """A file that is not a transform of the expected kind; the message names the path."""


def where(path) -> str:
    return repr(str(path))


def reverse_axes(matrix: np.ndarray) -> np.ndarray:
    """A homogeneous ``(D + 1, D + 1)`` matrix with its spatial axes in reverse order
    (array order ↔ x, y, z); the homogeneous row and column stay last."""
    d = matrix.shape[0] - 1
    order = [*range(d - 1, -1, -1), d]
    return np.asarray(matrix, dtype=np.float64)[np.ix_(order, order)]


def write_atomic(path, write: Callable[[pathlib.Path], None], *, overwrite: bool) -> pathlib.Path:
    """Run ``write(partial)`` on a temporary path beside ``path``, then rename it to
    ``path``: the file is written whole or not at all (:mod:`napari_simwarp.io.atomic`).
    Refuses an existing ``path`` unless ``overwrite``."""
    path = pathlib.Path(path)
    atomic.check_name_length(path, "transform file")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{where(path)} exists; pass overwrite=True to replace it")
    if path.is_dir():
        raise IsADirectoryError(f"{where(path)} is a directory, expected a file path")
    return atomic.write_atomic(path, write)


def check_file(path, expected: str) -> pathlib.Path:
    """``path`` as a Path to an existing file: a missing one is a FileNotFoundError, a
    directory a :class:`TransformFileError` that says what was ``expected``."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"transform file {where(path)} does not exist")
    if path.is_dir():
        raise TransformFileError(f"{where(path)} is a directory, expected {expected}")
    return path


def read_head(path, expected: str, size: int = 8) -> bytes:
    """The first ``size`` bytes of the file ``path`` (checked by :func:`check_file`)."""
    with open(check_file(path, expected), "rb") as f:
        return f.read(size)


def read_text(path, expected: str) -> str:
    """The UTF-8 text of ``path``; a missing file is a FileNotFoundError, a directory or a
    binary file a :class:`TransformFileError` that says what was ``expected``."""
    path = check_file(path, expected)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TransformFileError(f"{where(path)} is not {expected}: it is not UTF-8 text") from None
