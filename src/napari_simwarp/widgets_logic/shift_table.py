"""A drift run's shifts as a table (CSV), as napari-correct-drift and pystackreg users keep
them beside their transforms. No Qt, no napari.

One row per frame: the frame index, then the shift of each spatial axis in pixels, then
the same in the layer's physical units (pixels times the layer's ``scale``). The shift
of frame ``t`` is the translation of its transform, which maps reference coordinates to
frame ``t``'s coordinates: where the reference's content lies in frame ``t``, i.e. how
far the sample drifted by frame ``t``.
"""

from __future__ import annotations

import csv
import pathlib

import numpy as np

from .curves import AXIS_NAMES


def shift_rows(shifts, spacing=None, unit: str = "world") -> tuple[list[str], list[list]]:
    """``(header, rows)`` of the table of ``shifts`` ``(T, D)`` (pixels, array order) with
    ``spacing`` ``(D,)`` (physical size of a pixel per axis; None: 1). ``unit`` names the
    physical columns (``shift_y_<unit>``)."""
    s = np.asarray(shifts, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] not in AXIS_NAMES:
        raise ValueError(f"shifts must be (T, 2) or (T, 3) pixels, got shape {s.shape}")
    d = s.shape[1]
    sp = np.ones(d) if spacing is None else np.asarray(spacing, dtype=np.float64).reshape(-1)
    if sp.shape != (d,):
        raise ValueError(f"spacing must hold {d} values (one per spatial axis), got {sp.shape}")
    names = AXIS_NAMES[d]
    header = ["frame", *(f"shift_{a}_px" for a in names), *(f"shift_{a}_{unit}" for a in names)]
    rows = [[t, *s[t].tolist(), *(s[t] * sp).tolist()] for t in range(len(s))]
    return header, rows


def write_shift_table(path, shifts, spacing=None, unit: str = "world") -> pathlib.Path:
    """Write :func:`shift_rows` to ``path`` (CSV); returns the path."""
    header, rows = shift_rows(shifts, spacing, unit)
    path = pathlib.Path(path)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([[r[0], *(repr(float(v)) for v in r[1:])] for r in rows])
    return path
