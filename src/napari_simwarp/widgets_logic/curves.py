"""What the Register widget's plot shows: a :class:`Curve` of points in named series.

A pair run plots how alike the two images are as it goes: the similarity the result
reports (ZNCC; normalized MI for ``metric="mi"``) of the warped moving image with the
fixed one, against the iteration counted across the pyramid's levels, one series per
level (:func:`similarity_curve`). Its loss was plotted before (issue 27): each level's
loss is on its own scale (a coarse level's is smaller), so the curve climbed level by
level and ended higher than it began while the images came into line. The similarity is
on one scale from the first level to the last, and rises as the run converges. Levels
are named as napari names a multiscale layer's: level 0 is the full resolution.

A drift (time-lapse) run is plotted against the **frame index**: each frame's shift, one
series per axis (y, x; z first in 3-D), in pixels (:class:`FrameShifts` during the run,
:func:`shift_curve` at the end) -- the drift trace a drift user wants to see, with the
lowest frame similarity (ZNCC with the aligned reference) as text, so a frame that failed
is named.

No Qt, no napari.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the series names of the axes of a drift plot, by the number of spatial axes
AXIS_NAMES = {2: ("y", "x"), 3: ("z", "y", "x")}


@dataclass(frozen=True)
class Curve:
    """Points to plot, in series.

    x, y, levels : one entry per point (finite values only); ``levels`` is each point's
        series key (a pyramid level, napari's numbering: 0 the full resolution; or an
        axis)
    names : the legend's name of each series key, ``((key, name), ...)``; a key not
        named is "level <key>"
    x_label, y_label : the axes' titles
    now : the current value as text
    y_range : ``(low, high)`` the y axis spans at least; None: the values' own range
    log_allowed : a log y axis where every value is positive (losses), never (a ZNCC)
    max_markers : markers drawn per series at most (the others only joined by the line)
    joined : also one faint line through every point in ``x`` order, across the series
        (a pair run's similarity: one quantity through the levels, where a level run
        within the live display's quiet start has no point of its own and its
        neighbours' series would otherwise float unconnected); never for a drift plot's
        axes, which are different quantities
    """

    x: tuple = ()
    y: tuple = ()
    levels: tuple = ()
    x_label: str = "snapshot"
    y_label: str = "loss"
    now: str = ""
    y_range: tuple | None = None
    log_allowed: bool = True
    max_markers: int = 12
    names: tuple = ()
    joined: bool = False

    def name(self, key: int) -> str:
        """The legend's name of series ``key``."""
        return dict(self.names).get(key, f"level {key}")

    @property
    def log(self) -> bool:
        """Whether the y axis is logarithmic: allowed, and every value positive."""
        return self.log_allowed and bool(self.y) and all(v > 0 for v in self.y)


def _finite(xs, ys, levels):
    keep = [(float(x), float(y), int(lv)) for x, y, lv in zip(xs, ys, levels) if math.isfinite(y)]
    return tuple(k[0] for k in keep), tuple(k[1] for k in keep), tuple(k[2] for k in keep)


def snapshot_curve(losses, levels=None) -> Curve:
    """A pair run's curve: loss against the snapshot's index, one series per level."""
    losses = [float(v) for v in losses]
    levels = list(levels) if levels is not None else [0] * len(losses)
    x, y, lv = _finite(range(len(losses)), losses, levels)
    return Curve(x, y, lv, now=f"now {y[-1]:.4g}" if y else "")


def similarity_curve(iterations, values, levels, measure: str = "ZNCC", now="") -> Curve:
    """A pair run's curve: the similarity ``values`` (``measure``'s, e.g. ZNCC) against
    the iteration counted across levels, one series per pyramid level (napari's
    numbering, 0: full resolution, named so in the legend)."""
    x, y, lv = _finite(iterations, values, levels)
    # one legend row in a dock ~300 px wide: "level 4", "3", … "0 (full)"
    keys = sorted(set(lv), reverse=True)
    names = tuple(
        (k, ("level " if i == 0 else "") + str(k) + (" (full)" if k == 0 else ""))
        for i, k in enumerate(keys)
    )
    if not now and y:
        now = f"{measure} {y[-1]:.3f}"
    return Curve(
        x,
        y,
        lv,
        "iteration (all levels)",
        f"similarity ({measure})",
        now,
        log_allowed=False,
        names=names,
        joined=True,
    )


def empty_curve(mode: str, metric: str | None = None) -> Curve:
    """The plot before a run: no points, the axes a run of ``mode`` ("pair" or "stack")
    will draw, titled as it will title them (a pair run: the similarity it reports for
    ``metric``, ZNCC or normalized MI for "mi", per iteration; a drift run: the shift
    per frame). A "loss" against "snapshot" here named what no run plots (issue 27)."""
    if mode == "stack":
        return shift_curve(np.empty((0, 2)))
    if mode != "pair":
        raise ValueError(f"mode must be 'pair' or 'stack', got {mode!r}")
    label = "normalized MI" if metric == "mi" else "ZNCC"
    return similarity_curve((), (), (), label)


class FrameShifts:
    """A drift run's live curve: each frame's shift (pixels, per axis) so far; frames not
    reached yet are left out.

    total : frames in the stack
    ndim : spatial axes (2 or 3)
    """

    def __init__(self, total: int, ndim: int):
        self.shifts = np.full((int(total), int(ndim)), np.nan)
        self.now = ""

    def update(self, frames: dict) -> None:
        """``frames``: stack frame index -> its transform (translation in pixels)."""
        for t, transform in frames.items():
            translation = getattr(transform, "translation", None)
            if translation is not None and 0 <= t < len(self.shifts):
                self.shifts[t] = np.asarray(translation, np.float64)

    def curve(self) -> Curve:
        return shift_curve(self.shifts, now=self.now)


def shift_curve(shifts, similarity=None, now: str = "") -> Curve:
    """A drift run's curve: ``shifts`` ``(T, D)`` (pixels, array order) against the frame
    index, one series per axis; with ``similarity`` ``(T,)`` (each aligned frame's ZNCC
    with the aligned reference) the lowest is the text, naming its frame."""
    s = np.asarray(shifts, dtype=np.float64)
    d = s.shape[1]
    names = AXIS_NAMES.get(d, tuple(f"axis {i}" for i in range(d)))
    xs, ys, keys = [], [], []
    for axis in range(d):
        xs += list(range(len(s)))
        ys += list(s[:, axis])
        keys += [axis] * len(s)
    x, y, k = _finite(xs, ys, keys)
    if similarity is not None:
        sim = np.asarray(similarity, dtype=np.float64).reshape(-1)
        if np.isfinite(sim).any():
            worst = int(np.nanargmin(sim))
            now = f"lowest ZNCC {sim[worst]:.3f} (frame {worst})"
    return Curve(
        x,
        y,
        k,
        "frame",
        "shift (px)",
        now,
        log_allowed=False,
        max_markers=100,
        names=tuple(enumerate(names)),
    )


def frame_similarity_curve(similarity) -> Curve:
    """A finished drift run's curve when its transforms have no single shift (dense
    models): each frame's ZNCC ``(T,)`` with the aligned reference against the frame
    index; the y axis spans at least 0 to 1, so a well aligned stack is a flat line near
    the top and a failed frame a visible drop; the lowest as text."""
    sim = np.asarray(similarity, dtype=np.float64).reshape(-1)
    x, y, lv = _finite(range(len(sim)), sim, [0] * len(sim))
    now = ""
    if y:
        worst = int(np.argmin(y))
        now = f"lowest {y[worst]:.3f} (frame {int(x[worst])})"
    low = min(0.0, min(y)) if y else 0.0
    return Curve(
        x,
        y,
        lv,
        "frame",
        "similarity (ZNCC) per frame",
        now,
        (low, 1.0),
        False,
        max_markers=100,
        names=((0, "ZNCC"),),
    )
