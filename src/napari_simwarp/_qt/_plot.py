"""A tiny loss-curve plot (QPainter; no plotting library needed)."""

from __future__ import annotations

import math

from qtpy.QtCore import QPointF, Qt
from qtpy.QtGui import QColor, QPainter, QPen, QPolygonF
from qtpy.QtWidgets import QSizePolicy, QWidget


class LossPlot(QWidget):
    """Loss against snapshot, rescaled to the widget; the last value written in a corner."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.values: list[float] = []
        self.setMinimumHeight(90)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_values(self, values) -> None:
        self.values = [float(v) for v in values if math.isfinite(float(v))]
        self.update()

    def paintEvent(self, event):  # noqa: N802 (Qt's name)
        p = QPainter(self)
        p.fillRect(self.rect(), QColor(38, 41, 48))
        p.setPen(QColor(180, 180, 180))
        p.drawText(6, 14, "loss")
        if len(self.values) >= 2:
            lo, hi = min(self.values), max(self.values)
            span = hi - lo if hi > lo else 1.0
            w, h, m = self.width(), self.height(), 6
            n = len(self.values) - 1
            poly = QPolygonF(
                [
                    QPointF(m + (w - 2 * m) * i / n, m + 12 + (h - 2 * m - 12) * (hi - v) / span)
                    for i, v in enumerate(self.values)
                ]
            )
            p.setPen(QPen(QColor(255, 170, 0), 1.5))
            p.drawPolyline(poly)
        if self.values:
            p.setPen(QColor(220, 220, 220))
            p.drawText(
                self.rect().adjusted(0, 2, -6, 0),
                int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop),
                f"{self.values[-1]:.4g}",
            )
        p.end()
