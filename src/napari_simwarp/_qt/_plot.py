"""The Register widget's plot, drawn with pyqtgraph: the similarity against the iteration
of a pair run, the shift per frame of a drift run (see
:mod:`napari_simwarp.widgets_logic.curves`).

pyqtgraph rather than napari-matplotlib: it is a Qt widget made for live data (a new
curve is a ``setData`` on the items already drawn, no figure redrawn from scratch, which
is what a plot updated several times a second on the GUI thread needs), gives axes with
ticks, a log axis and a legend, and adds no napari plugin of its own (napari-matplotlib
docks a viewer-wide widget that follows layers, not a run).
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

from ..widgets_logic.curves import Curve, snapshot_curve

#: one colour per series (a pyramid level, napari's numbering; an axis), cycled; a marker
#: shape per series too
LEVEL_COLORS = ((255, 170, 0), (0, 200, 255), (120, 230, 80), (255, 90, 200), (200, 200, 90))
LEVEL_SYMBOLS = ("o", "s", "t", "d", "+")
BACKGROUND = (38, 41, 48)
DASH = Qt.PenStyle.DashLine


def log_scale(values) -> bool:
    """Whether a loss curve is drawn on a log axis: only when every value is positive (a
    loss such as −NCC is negative, and has no logarithm)."""
    return Curve(y=tuple(values)).log


class _ValueAxis(pg.AxisItem):
    """A y axis that can show ``log10`` positions as the values they stand for.

    pyqtgraph's own log mode labels every minor tick within a decade ("2·10²", "3·10²"
    …), which overlap on a plot this small; positions spaced as a linear axis spaces them,
    labelled ``10**v``, stay apart. No SI prefix either (a "(×0.001)" beside "loss" read as
    part of the loss).
    """

    log = False

    def __init__(self):
        super().__init__("left")
        self.enableAutoSIPrefix(False)

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph's name)
        if self.log:
            return [f"{10.0**v:.3g}" for v in values]
        return super().tickStrings(values, scale, spacing)


class LossPlot(QWidget):
    """A :class:`~napari_simwarp.widgets_logic.curves.Curve`: axes with their titles and
    ticks, one colour and marker per pyramid level (and a legend when there are several),
    a log axis for positive losses, the current value as text. Pairs: loss against
    snapshot; drift runs: per frame."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.curve = Curve()
        self._axis = _ValueAxis()
        self._view = pg.PlotWidget(background=BACKGROUND, axisItems={"left": self._axis})
        self._view.getPlotItem().getAxis("bottom").enableAutoSIPrefix(False)
        self._view.setMenuEnabled(False)
        self._view.setMouseEnabled(x=False, y=False)
        self._view.hideButtons()
        self._view.showGrid(x=True, y=True, alpha=0.15)
        self._series: dict[tuple, tuple] = {}  # (key, name) -> (line, markers)
        # behind the series (made first): see Curve.joined
        self._trend = self._view.plot(pen=pg.mkPen((150, 150, 150), width=1, style=DASH))
        self._spare: dict[int, tuple] = {}  # key -> (line, markers) of a series gone
        # the legend in one row over the plot, beside the title (the current value, to
        # the right): inside the axes it sat on the last level's points
        self._legend = pg.LegendItem(offset=(44, 1), colCount=5, labelTextSize="7pt")
        self._legend.setParentItem(self._view.getPlotItem())
        self._titles = None
        # the current value at the right of the row over the axes (the legend at its left;
        # an empty title keeps the row)
        item = self._view.getPlotItem()
        item.setTitle(" ", size="8pt")
        self._now = pg.TextItem(color=(230, 230, 230), anchor=(1, 0))
        self._now.setParentItem(item)
        item.geometryChanged.connect(lambda: self._now.setPos(item.size().width() - 4, 0))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._view)
        self.setMinimumHeight(150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.set_curve(self.curve)  # the axes' titles before the first run

    def sizeHint(self):  # noqa: N802 (Qt's name)
        """A dock's width, not pyqtgraph's 640 px (the plot set the Register dock's width
        to 660 px, issue 27); it widens with the dock."""
        from qtpy.QtCore import QSize

        return QSize(300, 170)

    def set_curve(self, curve: Curve) -> None:
        self.curve = curve
        plot = self._view.getPlotItem()
        log = curve.log
        if self._axis.log != log:
            self._axis.log = log
            self._axis.picture = None  # its cached labels were drawn for the other scale
            self._axis.update()
        # A title or label set anew re-lays the whole plot out (10 ms a display here):
        # only when it changes; the current value, which changes at every display, is a
        # text item of its own.
        titles = (curve.x_label, curve.y_label + (" (log)" if log else ""))
        if titles != self._titles:
            self._titles = titles
            plot.setLabel("bottom", titles[0])
            plot.setLabel("left", titles[1])
        self._now.setText(curve.now)
        ys = [math.log10(v) for v in curve.y] if log else list(curve.y)
        # a series by its key and name (a level's or an axis'): another run's series of
        # the same key under another name is a new one, with its own legend entry
        keys = sorted(set(curve.levels), reverse=curve.x_label != "frame")
        series = [(key, curve.name(key)) for key in keys]
        for gone in set(self._series) - set(series):
            # kept, hidden and empty, for the next run's series of that key: made anew,
            # a series (two plot items, a legend entry) cost a pause at each run's start
            line, dots = self._series.pop(gone)
            self._legend.removeItem(dots)
            if gone[0] in self._spare:  # one spare per key
                plot.removeItem(line)
                plot.removeItem(dots)
                continue
            for item in (line, dots):
                item.setData([], [])
                item.hide()
            self._spare[gone[0]] = (line, dots)
        for key, name in series:
            idx = [i for i, lv in enumerate(curve.levels) if lv == key]
            x = [curve.x[i] for i in idx]
            y = [ys[i] for i in idx]
            line, dots = self._series.get((key, name)) or self._new_series(key, name)
            line.setData(x, y)
            # markers on at most max_markers points of a series, the line through all
            every = max(1, -(-len(idx) // curve.max_markers))
            dots.setData(x[::every], y[::every])
        self._legend.setVisible(len(series) > 1)
        # the faint line through every point across the levels (Curve.joined)
        order = sorted(range(len(curve.x)), key=lambda i: curve.x[i]) if curve.joined else []
        self._trend.setData([curve.x[i] for i in order], [ys[i] for i in order])
        if curve.y_range is not None and not log:
            low = min([curve.y_range[0], *curve.y])
            high = max([curve.y_range[1], *curve.y])
            plot.setYRange(low, high, padding=0.05)
        else:
            plot.enableAutoRange(axis="y")
        plot.enableAutoRange(axis="x")

    def _new_series(self, level: int, name: str):
        """The line and the markers of a series (a pyramid level, an axis), and its legend
        entry ``name``."""
        spare = self._spare.pop(level, None)
        if spare is not None:
            line, dots = spare
            line.show()
            dots.show()
            self._legend.addItem(dots, name)
            self._series[(level, name)] = spare
            return spare
        color = LEVEL_COLORS[level % len(LEVEL_COLORS)]
        line = self._view.plot(pen=pg.mkPen(color, width=1.5))
        # markers as a data item of their own (no line): it follows the log axis too
        dots = self._view.plot(
            pen=None,
            symbol=LEVEL_SYMBOLS[level % len(LEVEL_SYMBOLS)],
            symbolSize=6,
            symbolBrush=pg.mkBrush(color),
            symbolPen=pg.mkPen(color),
        )
        self._legend.addItem(dots, name)
        self._series[(level, name)] = (line, dots)
        return line, dots

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
