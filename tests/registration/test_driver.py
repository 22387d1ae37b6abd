"""The generator driver (registration/_driver.py): drive() and relay()."""

from __future__ import annotations

import inspect

import pytest

from napari_simwarp.registration._driver import drive, relay


def counter(n: int, log: list):
    """Yields 0 .. n-1; a true value sent back stops it. Logs what it was sent and its end."""
    try:
        for i in range(n):
            signal = yield i
            log.append(signal)
            if signal:
                return ("stopped", i)
        return ("done", n)
    finally:
        log.append("closed")


def test_drive_returns_the_generators_value():
    log = []
    assert drive(counter(3, log)) == ("done", 3)
    assert log == [None, None, None, "closed"]


def test_drive_shows_every_progress_to_the_callback():
    seen = []
    assert drive(counter(4, []), lambda p: seen.append(p)) == ("done", 4)
    assert seen == [0, 1, 2, 3]


def test_drive_stops_on_a_true_callback():
    log, seen = [], []

    def callback(progress):
        seen.append(progress)
        return progress == 1

    assert drive(counter(10, log), callback) == ("stopped", 1)
    assert seen == [0, 1]
    assert log == [False, True, "closed"]


def test_drive_lets_the_generators_errors_through():
    def failing():
        yield 0
        raise FloatingPointError("nan")

    with pytest.raises(FloatingPointError, match="nan"):
        drive(failing())


def test_relay_converts_each_progress_and_returns_the_result():
    log = []
    run = relay(counter(3, log), lambda p: f"step {p}")
    assert list(run) == ["step 0", "step 1", "step 2"]
    assert log == [None, None, None, "closed"]
    assert drive(relay(counter(2, []), str)) == ("done", 2)


def test_relay_passes_a_sent_true_to_the_run():
    log = []
    run = relay(counter(10, log), lambda p: p * 10)
    assert next(run) == 0
    assert run.send(None) == 10
    with pytest.raises(StopIteration) as done:
        run.send(True)
    assert done.value.value == ("stopped", 1)
    assert log == [None, True, "closed"]


def test_relay_passes_stop_through():
    log, flag, out = [], [False], []
    run = relay(counter(10, log), lambda p: p, stop=lambda: flag[0])
    for progress in run:
        out.append(progress)
        flag[0] = progress == 2
    assert out == [0, 1, 2]
    assert log == [None, None, True, "closed"]


def test_closing_the_relay_early_closes_the_run():
    log = []
    inner = counter(10, log)
    run = relay(inner, str)
    assert next(run) == "0"
    run.close()
    assert inspect.getgeneratorstate(inner) == inspect.GEN_CLOSED
    assert log == ["closed"]
