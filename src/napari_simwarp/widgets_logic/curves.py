"""What the Register widget's plot shows: a :class:`Curve` of points by pyramid level.

A pair run plots its loss against the snapshot (one series per pyramid level).

A drift (time-lapse) run is plotted against the **frame index** instead. Its frames are
registered in batches, and a snapshot's loss is its batch's mean loss: plotted against
the snapshot it is a sawtooth (each batch starts high and falls, and batches of other
content sit at other heights), which says nothing a user can act on. What a user wants
to know is which frames aligned, so:

- during the run, each frame shows the latest loss of its batch at each pyramid level
  (:class:`FrameLosses`; a step across the batch's frames, filled left to right);
- at the end, each frame's ZNCC with the aligned reference
  (:attr:`~napari_simwarp.registration.stack.StackRegistrationResult.frame_similarity`,
  :func:`frame_similarity_curve`): bounded and comparable between frames whatever the
  batch, so a drop marks a frame that failed. Losses normalised per batch were the
  other choice; they would hide a batch that failed as a whole.

No Qt, no napari.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Curve:
    """Points to plot, in series by pyramid level (0: coarsest).

    x, y, levels : one entry per point (finite values only)
    x_label, y_label : the axes' titles
    now : the current value as text
    y_range : ``(low, high)`` the y axis spans at least; None: the values' own range
    log_allowed : a log y axis where every value is positive (losses), never (a ZNCC)
    max_markers : markers drawn per series at most (the others only joined by the line)
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


class FrameLosses:
    """A drift run's live curve: per frame and pyramid level, the latest loss of the batch
    that frame belongs to.

    total : frames in the stack
    offset : stack index of moving frame 0 (1 with ``reference="previous"``: moving frame
        ``i`` is stack frame ``i + 1``)
    """

    def __init__(self, total: int, offset: int = 0):
        self.total, self.offset = int(total), int(offset)
        self._by_level: dict[int, np.ndarray] = {}
        self._last = ""

    def update(self, frames: slice, level: int, loss: float) -> None:
        """Batch ``frames`` (moving-frame indices) reached ``loss`` at ``level``."""
        row = self._by_level.setdefault(int(level), np.full(self.total, np.nan))
        start, stop = frames.start + self.offset, frames.stop + self.offset
        row[max(start, 0) : min(stop, self.total)] = float(loss)
        span = f"frame {start}" if stop - start == 1 else f"frames {start}–{stop - 1}"
        self._last = f"{span}: {float(loss):.4g}"

    def curve(self) -> Curve:
        xs, ys, lvs = [], [], []
        for level in sorted(self._by_level):
            row = self._by_level[level]
            for t in np.flatnonzero(np.isfinite(row)):
                xs.append(int(t))
                ys.append(float(row[t]))
                lvs.append(level)
        x, y, lv = _finite(xs, ys, lvs)
        return Curve(x, y, lv, "frame", "loss (its batch's)", self._last, max_markers=100)


def frame_similarity_curve(similarity) -> Curve:
    """A finished drift run's curve: each frame's ZNCC ``(T,)`` with the aligned reference
    against the frame index; the y axis spans at least 0 to 1, so a well aligned stack is a
    flat line near the top and a failed frame a visible drop; the lowest as text."""
    sim = np.asarray(similarity, dtype=np.float64).reshape(-1)
    x, y, lv = _finite(range(len(sim)), sim, [0] * len(sim))
    now = ""
    if y:
        worst = int(np.argmin(y))
        now = f"lowest {y[worst]:.3f} (frame {int(x[worst])})"
    low = min(0.0, min(y)) if y else 0.0
    return Curve(
        x, y, lv, "frame", "similarity (ZNCC) per frame", now, (low, 1.0), False, max_markers=100
    )
