"""The level solvers, peers behind one signature (as FireANTs keeps its optimizers):

    stopped, best = yield from SOLVERS[schedule.optimizer](level)   # a :class:`Level`

Each is a generator of :class:`~..progress.Progress` snapshots that stops within one
iteration when sent a true value and returns ``(stopped, best parameters)``; the pairs
of a batch converge each on its own. :mod:`.adam` (a plateau schedule per pair, no host
wait inside an iteration), :mod:`.lbfgs` (strong-Wolfe line search), :mod:`.gauss_newton`
(Levenberg–Marquardt steps of the linear models, :mod:`..gauss_newton`'s maths).
"""

from __future__ import annotations

from . import adam, gauss_newton, lbfgs
from ._level import Level

#: solver name (a :class:`~..optimize.Schedule`'s ``optimizer``) → its level generator
SOLVERS = {"adam": adam.solve, "lbfgs": lbfgs.solve, "gauss-newton": gauss_newton.solve}

__all__ = ["SOLVERS", "Level"]
