"""Gauss–Newton (Levenberg–Marquardt steps) of the linear models: the level generator over
:mod:`..gauss_newton`'s maths. A pair that converged stops moving; the batch goes on."""

from __future__ import annotations

from .. import gauss_newton
from ._level import Level


def solve(level: Level):
    """One level by :func:`~..gauss_newton.run_level` (a generator returning ``(stopped,
    best)``: the parameters it ends on, each pair's best)."""
    model, schedule = level.model, level.schedule
    if level.iterations == 0:
        return False, model.snapshot()
    problem = gauss_newton.level_problem(
        model, level.fixed, level.moving, level.weight, level.loss_fn, schedule.metric
    )

    def progress(iteration, loss):
        return level.progress(iteration, loss, model.snapshot())

    stopped = yield from gauss_newton.run_level(
        problem, level.iterations, level.history, schedule.report_every, progress,
        level.pair_history,
    )  # fmt: skip
    return stopped, model.snapshot()
