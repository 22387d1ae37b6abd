"""The loss curve of the Register widget (QPainter; no plotting library needed)."""

from __future__ import annotations

import math

from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QFont, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget

#: one colour per pyramid level (coarsest first), cycled; a marker shape per level too
LEVEL_COLORS = ((255, 170, 0), (0, 200, 255), (120, 230, 80), (255, 90, 200), (200, 200, 90))


def log_scale(values) -> bool:
    """Whether the curve is drawn on a log axis: only when every value is positive (a loss
    such as −NCC is negative, and has no logarithm)."""
    return bool(values) and all(v > 0 for v in values)


class LossPlot(QWidget):
    """Loss against snapshot: axes with their range, one colour and marker per pyramid
    level, a log axis when every value is positive, the current value as text."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.values: list[float] = []
        self.levels: list[int] = []
        self.setMinimumHeight(120)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_values(self, values, levels=None) -> None:
        """``values``: the losses; ``levels``: the pyramid level of each (or None)."""
        pairs = [
            (float(v), int(lv))
            for v, lv in zip(values, levels if levels is not None else [0] * len(values))
            if math.isfinite(float(v))
        ]
        self.values = [v for v, _ in pairs]
        self.levels = [lv for _, lv in pairs]
        self.update()

    @property
    def log(self) -> bool:
        return log_scale(self.values)

    def paintEvent(self, event):  # noqa: N802 (Qt's name)
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
        log = self.log
        p.drawText(6, 13, f"loss{' (log scale)' if log else ''}")
        p.drawLine(plot.bottomLeft(), plot.bottomRight())
        p.drawLine(plot.bottomLeft(), plot.topLeft())
        p.drawText(QRectF(left, plot.bottom() + 2, plot.width(), 14),
                   int(Qt.AlignmentFlag.AlignHCenter), "snapshot")  # fmt: skip
        if self.values:
            ys = [math.log10(v) for v in self.values] if log else list(self.values)
            lo, hi = min(ys), max(ys)
            span = hi - lo if hi > lo else 1.0
            n = max(len(ys) - 1, 1)

            def point(i, y):
                return QPointF(
                    plot.left() + plot.width() * i / n,
                    plot.top() + plot.height() * (hi - y) / span,
                )

            for value, y_text in ((hi, plot.top()), (lo, plot.bottom() - 12)):
                shown = 10**value if log else value
                p.drawText(QRectF(0, y_text, left - 4, 12),
                           int(Qt.AlignmentFlag.AlignRight), f"{shown:.3g}")  # fmt: skip
            for level in sorted(set(self.levels)):
                color = QColor(*LEVEL_COLORS[level % len(LEVEL_COLORS)])
                idx = [i for i, lv in enumerate(self.levels) if lv == level]
                p.setPen(QPen(color, 1.5))
                if len(idx) > 1:
                    p.drawPolyline(QPolygonF([point(i, ys[i]) for i in idx]))
                p.setBrush(color)
                for i in idx[:: max(1, len(idx) // 12)]:  # markers, at most ~12 per level
                    c = point(i, ys[i])
                    if level % 2:
                        p.drawRect(QRectF(c.x() - 2.5, c.y() - 2.5, 5, 5))
                    else:
                        p.drawEllipse(c, 2.5, 2.5)
                p.drawText(QRectF(plot.left() + 80 + 30 * level, 2, 30, 14),
                           int(Qt.AlignmentFlag.AlignLeft), f"L{level}")  # fmt: skip
            p.setPen(QColor(230, 230, 230))
            p.drawText(
                self.rect().adjusted(0, 2, -6, 0),
                int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop),
                f"now {self.values[-1]:.4g}",
            )
        p.end()
