"""The Register widget's plot (QPainter; no plotting library needed): the loss per
snapshot of a pair run, the loss or similarity per frame of a drift run (see
:mod:`napari_simwarp.widgets_logic.curves`)."""

from __future__ import annotations

import math

from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QFont, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget

from ..widgets_logic.curves import Curve, snapshot_curve

#: one colour per pyramid level (coarsest first), cycled; a marker shape per level too
LEVEL_COLORS = ((255, 170, 0), (0, 200, 255), (120, 230, 80), (255, 90, 200), (200, 200, 90))


def log_scale(values) -> bool:
    """Whether a loss curve is drawn on a log axis: only when every value is positive (a
    loss such as −NCC is negative, and has no logarithm)."""
    return Curve(y=tuple(values)).log


class LossPlot(QWidget):
    """A :class:`~napari_simwarp.widgets_logic.curves.Curve`: axes with their titles and
    range, one colour and marker per pyramid level, a log axis for positive losses, the
    current value as text. Pairs: loss against snapshot; drift runs: per frame."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.curve = Curve()
        self.setMinimumHeight(120)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_curve(self, curve: Curve) -> None:
        self.curve = curve
        self.update()

    def set_values(self, values, levels=None) -> None:
        """``values``: the losses per snapshot; ``levels``: the pyramid level of each."""
        self.set_curve(snapshot_curve(values, levels))

    @property
    def values(self) -> list[float]:
        return list(self.curve.y)

    @property
    def levels(self) -> list[int]:
        return list(self.curve.levels)

    @property
    def log(self) -> bool:
        return self.curve.log

    def paintEvent(self, event):  # noqa: N802 (Qt's name)
        curve = self.curve
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.fillRect(self.rect(), QColor(38, 41, 48))
        font = QFont(p.font())
        font.setPointSizeF(max(font.pointSizeF() * 0.85, 6))
        p.setFont(font)
        grey = QColor(170, 170, 170)
        left, top, right, bottom = 52, 18, 8, 18
        plot = QRectF(left, top, self.width() - left - right, self.height() - top - bottom)
        p.setPen(grey)
        log = curve.log
        p.drawText(6, 13, f"{curve.y_label}{' (log scale)' if log else ''}")
        p.drawLine(plot.bottomLeft(), plot.bottomRight())
        p.drawLine(plot.bottomLeft(), plot.topLeft())
        p.drawText(QRectF(left, plot.bottom() + 2, plot.width(), 14),
                   int(Qt.AlignmentFlag.AlignHCenter), curve.x_label)  # fmt: skip
        if curve.y:
            ys = [math.log10(v) for v in curve.y] if log else list(curve.y)
            lo, hi = min(ys), max(ys)
            if curve.y_range is not None and not log:
                lo, hi = min(lo, curve.y_range[0]), max(hi, curve.y_range[1])
            span = hi - lo if hi > lo else 1.0
            x0, x1 = min(curve.x), max(curve.x)
            n = max(x1 - x0, 1)

            def point(i, y):
                return QPointF(
                    plot.left() + plot.width() * (curve.x[i] - x0) / n,
                    plot.top() + plot.height() * (hi - y) / span,
                )

            for value, y_text in ((hi, plot.top()), (lo, plot.bottom() - 12)):
                shown = 10**value if log else value
                p.drawText(QRectF(0, y_text, left - 4, 12),
                           int(Qt.AlignmentFlag.AlignRight), f"{shown:.3g}")  # fmt: skip
            for value, align in ((x0, Qt.AlignmentFlag.AlignLeft),
                                 (x1, Qt.AlignmentFlag.AlignRight)):  # fmt: skip
                p.drawText(QRectF(left, plot.bottom() + 2, plot.width(), 14),
                           int(align), f"{value:g}")  # fmt: skip
            levels = sorted(set(curve.levels))
            for level in levels:
                color = QColor(*LEVEL_COLORS[level % len(LEVEL_COLORS)])
                idx = [i for i, lv in enumerate(curve.levels) if lv == level]
                p.setPen(QPen(color, 1.5))
                if len(idx) > 1:
                    p.drawPolyline(QPolygonF([point(i, ys[i]) for i in idx]))
                p.setBrush(color)
                every = max(1, -(-len(idx) // curve.max_markers))
                for i in idx[::every]:
                    c = point(i, ys[i])
                    if level % 2:
                        p.drawRect(QRectF(c.x() - 2.5, c.y() - 2.5, 5, 5))
                    else:
                        p.drawEllipse(c, 2.5, 2.5)
                if len(levels) > 1:  # a legend where there are levels to tell apart
                    p.drawText(QRectF(plot.left() + 80 + 30 * level, 2, 30, 14),
                               int(Qt.AlignmentFlag.AlignLeft), f"L{level}")  # fmt: skip
            p.setPen(QColor(230, 230, 230))
            p.drawText(
                self.rect().adjusted(0, 2, -6, 0),
                int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop),
                curve.now,
            )
        p.end()
