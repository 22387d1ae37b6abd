"""One driver for every generator-shaped run: progress out, a stop signal in, a result back.

``register_iter`` and ``register_stack_iter`` (and the refinements under them) are
generators: each ``yield`` hands out a progress snapshot, a true value sent back stops the
run within one iteration, and the generator's return value is the result. :func:`drive`
turns such a generator and an optional callback into that result, for the blocking
functions (``register``, ``register_stack``); the widgets iterate the generators
themselves, through :func:`relay`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any


def drive(run: Generator, callback: Callable[[Any], object] | None = None):
    """Run ``run`` to the end; ``callback(progress)`` returning true stops it early.

    Returns the generator's return value (the run's result).
    """
    signal = None
    while True:
        try:
            progress = run.send(signal)
        except StopIteration as done:
            return done.value
        signal = bool(callback(progress)) if callback is not None else None


def relay(run: Generator, convert: Callable[[Any], Any], stop: Callable[[], bool] | None = None):
    """A generator over ``run`` yielding ``convert(progress)`` for each of its snapshots.

    A true value sent into it, or ``stop()`` turning true, is passed on to ``run`` as its
    stop signal. Returns ``run``'s result; closing this generator closes ``run``.
    """
    signal = None
    try:
        while True:
            try:
                progress = run.send(signal)
            except StopIteration as done:
                return done.value
            sent = yield convert(progress)
            signal = True if sent or (stop is not None and stop()) else None
    finally:
        run.close()
