"""BigWarp (Fiji) landmark tables: point pairs as CSV.

BigWarp's *File › Export landmarks* writes one row per pair, no header, every field
quoted: ``name, active, moving x, y[, z], target x, y[, z]``, in physical (calibrated)
units and x, y, z order. BigWarp's "target" image is our fixed image. Here points are
``(n, D)`` arrays in array-axis order (the reverse of x, y, z), as everywhere in the
package.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from ._common import TransformFileError, read_text, where, write_atomic


def as_points(points, name: str) -> np.ndarray:
    """``points`` as a new float64 ``(n, D)`` array, D in {2, 3}, all finite (checked)."""
    try:
        array = np.array(points, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of numbers of shape (n, D): {exc}") from None
    if array.ndim != 2 or array.shape[1] not in (2, 3):
        raise ValueError(
            f"{name} must have shape (n, 2) or (n, 3) (points in array-axis order), "
            f"got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        rows = np.unique(np.nonzero(~np.isfinite(array))[0]).tolist()
        raise ValueError(f"{name} holds NaN or infinite coordinates (rows {rows[:10]})")
    return array


def as_point_pairs(fixed_points, moving_points) -> tuple[np.ndarray, np.ndarray]:
    """Both point arrays checked by :func:`as_points`, and of one shape."""
    x = as_points(fixed_points, "fixed_points")
    y = as_points(moving_points, "moving_points")
    if x.shape != y.shape:
        raise ValueError(
            f"fixed_points and moving_points must have the same shape (one moving point "
            f"per fixed point), got {x.shape} and {y.shape}"
        )
    return x, y


def read_bigwarp_landmarks(path, *, include_inactive: bool = False):
    """Read a BigWarp landmark CSV: ``(fixed_points, moving_points)``, each ``(n, D)``.

    Points come back in array-axis order (BigWarp's x, y, z reversed) and in BigWarp's
    physical units; its "target" points are the fixed points. Rows marked inactive are
    skipped unless ``include_inactive``. A missing file is a FileNotFoundError; anything
    that is not a BigWarp landmark table a :class:`TransformFileError` naming the path
    and the row.
    """
    expected = "a BigWarp landmark CSV"
    text = read_text(path, expected)
    fixed, moving, ndim = [], [], None
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not any(field.strip() for field in row):
            continue
        here = f"{where(path)} row {number}"
        if len(row) not in (6, 8):
            raise TransformFileError(
                f"{here} has {len(row)} fields; {expected} has 6 (2-D) or 8 (3-D) per row: "
                "name, active, moving x, y[, z], target x, y[, z]"
            )
        d = (len(row) - 2) // 2
        if ndim is not None and d != ndim:
            raise TransformFileError(f"{here} is {d}-D, the rows before it {ndim}-D")
        ndim = d
        active = row[1].strip().lower()
        if active not in ("true", "false"):
            raise TransformFileError(
                f"{here}: the active field must be true or false, got {row[1]!r}"
            )
        try:
            values = [float(v) for v in row[2:]]
        except ValueError:
            raise TransformFileError(
                f"{here} holds a coordinate that is not a number: {row}"
            ) from None
        if active == "true" or include_inactive:
            moving.append(values[:d][::-1])
            fixed.append(values[d:][::-1])
    if ndim is None:
        raise TransformFileError(f"{where(path)} is not {expected}: it holds no rows")
    return (
        np.array(fixed, dtype=np.float64).reshape(-1, ndim),
        np.array(moving, dtype=np.float64).reshape(-1, ndim),
    )


def write_bigwarp_landmarks(path, fixed_points, moving_points, *, overwrite: bool = False):
    """Write point pairs as a BigWarp landmark CSV (*File › Import landmarks*); return
    the path.

    ``fixed_points`` and ``moving_points`` are ``(n, D)``, array-axis order, physical
    units. The file holds them in x, y, z order, moving first, all rows active, named
    ``Pt-0``, ``Pt-1``... Written whole or not at all; an existing file is replaced only
    with ``overwrite=True``.
    """
    x, y = as_point_pairs(fixed_points, moving_points)
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for i, (fixed, moving) in enumerate(zip(x, y)):
        coordinates = [*moving[::-1].tolist(), *fixed[::-1].tolist()]
        writer.writerow([f"Pt-{i}", "true", *map(repr, coordinates)])
    text = buffer.getvalue()
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"), overwrite=overwrite)
