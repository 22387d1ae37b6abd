"""The kernel build's lock (ops/_kernels/_build_lock.py): a build killed hard must not hang
the next one, and concurrent builders still take turns.

The builders are separate processes (a lock the OS releases on death can only be tested
across processes) running the real ``_build.build`` and torch's real ``cpp_extension.load``
(its file baton included) in a temporary SIMWARP_CACHE_DIR, with torch's compile and
import steps replaced by a stand-in that notes when it runs and waits for the test's
go-ahead: no compiler runs, and the order of events is set by the test, not by speed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import napari_simwarp
from napari_simwarp.ops._kernels import _build_lock

#: seconds a step may take on a loaded machine before the test calls it a hang
PATIENCE = 120

BUILDER = textwrap.dedent(
    """
    import pathlib, sys, time
    from torch.utils import cpp_extension
    from napari_simwarp.ops._kernels import _build

    name, log, go = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])

    def compile_and_link(**kwargs):  # stands in for ninja, inside torch's baton
        with log.open("a") as f:
            f.write(f"{name} enter\\n")
        while not go.exists():
            time.sleep(0.02)
        with log.open("a") as f:
            f.write(f"{name} exit\\n")

    for attr in ("_write_ninja_file_and_build_library", "_import_module_from_library"):
        assert hasattr(cpp_extension, attr), f"torch.utils.cpp_extension.{attr} is gone"
    cpp_extension._write_ninja_file_and_build_library = compile_and_link
    cpp_extension._import_module_from_library = lambda *args, **kwargs: None
    print(_build.build("cpu"), flush=True)
    """
)


@pytest.fixture
def builders(tmp_path):
    """Starts builder processes sharing one temporary cache; kills the ones left at the end."""
    package_root = str(pathlib.Path(napari_simwarp.__file__).parents[1])
    env = {
        **os.environ,
        "SIMWARP_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    started = []

    def start(name: str) -> subprocess.Popen:
        err = (tmp_path / f"{name}.err").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-c", BUILDER, name, str(tmp_path / "log"), str(tmp_path / "go")],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        proc.err_path = tmp_path / f"{name}.err"
        started.append(proc)
        return proc

    start.env, start.tmp = env, tmp_path
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _log(tmp_path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def _wait_until(condition, what: str, *procs) -> None:
    """Poll ``condition`` (bounded); fail early, with their stderr, if a process ended."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(
                    f"a builder ended (exit {proc.returncode}) before {what}: "
                    f"{proc.err_path.read_text()[-3000:]}"
                )
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {PATIENCE} s")
        time.sleep(0.05)


def _finish(proc) -> str:
    """The builder's stderr once it has ended with exit 0 (a hang fails the test)."""
    try:
        proc.wait(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the build hung for {PATIENCE} s: {proc.err_path.read_text()[-3000:]}")
    err = proc.err_path.read_text()
    assert proc.returncode == 0, err[-3000:]
    return err


def test_a_build_killed_hard_does_not_hang_the_next_one(builders):
    tmp = builders.tmp
    killed = builders("killed")
    _wait_until(lambda: "killed enter" in _log(tmp), "compile step", killed)
    killed.kill()  # SIGKILL mid-build: no finally, no atexit
    killed.wait()
    (baton,) = (tmp / "cache").glob(f"cpu-*/{_build_lock.BATON}")  # torch's lock, left behind

    (tmp / "go").touch()
    err = _finish(builders("next"))  # torch alone waits on that baton forever
    assert _log(tmp) == ["killed enter", "next enter", "next exit"]
    assert f"removed the lock file {baton}, left by a kernel build that was killed" in err
    assert not baton.exists()


def test_concurrent_builders_take_turns_and_the_waiting_one_says_so(builders):
    tmp = builders.tmp
    first = builders("first")
    _wait_until(lambda: "first enter" in _log(tmp), "compile step", first)
    second = builders("second")
    _wait_until(
        lambda: "is building the compiled kernels" in second.err_path.read_text(),
        "message from the waiting builder",
        second,
    )
    assert _log(tmp) == ["first enter"]  # the second is waiting, not building
    (tmp / "go").touch()
    _finish(first)
    err = _finish(second)
    assert _log(tmp) == ["first enter", "first exit", "second enter", "second exit"]
    (directory,) = (tmp / "cache").glob("cpu-*")
    assert (
        f"another process (pid {first.pid}) is building the compiled kernels in {directory}; "
        "waiting for it to finish" in err
    )
    assert err.count("is building the compiled kernels") == 1
    assert "removed the lock file" not in err  # a live builder's baton is never removed
    assert not (directory / _build_lock.BATON).exists()


def test_a_stale_baton_is_removed_with_a_warning_and_none_is_quiet(tmp_path):
    baton = tmp_path / _build_lock.BATON
    baton.touch()
    removed = "removed the lock file .* killed before it finished"
    with pytest.warns(RuntimeWarning, match=removed), _build_lock.build_lock(tmp_path):
        assert not baton.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _build_lock.build_lock(tmp_path):
            pass


def test_without_os_locks_the_baton_is_left_to_torch(tmp_path, monkeypatch):
    # A file system that refuses locks: nothing proves the baton's maker dead, so it stays
    # (torch's own waiting, as before).
    monkeypatch.setattr(_build_lock, "_try_lock", lambda fd: None)
    baton = tmp_path / _build_lock.BATON
    baton.touch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _build_lock.build_lock(tmp_path):
            assert baton.exists()
