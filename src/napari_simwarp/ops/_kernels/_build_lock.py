"""One kernel build at a time per build directory, with a lock the OS releases when its
holder dies.

torch's ``cpp_extension`` serializes builds with a file baton: the first process creates
``<build directory>/lock`` and removes it when done; every other process polls until the
file is gone. A build killed hard (``kill -9``, the out-of-memory killer) never removes
it, and every later process (a user's napari, a CI test worker) then waits forever at 0%
CPU, silently.

Around torch's whole build and load we hold our own lock on
``<build directory>/simwarp-build.lock``: ``fcntl.flock`` on POSIX, ``msvcrt.locking``
on Windows, both released by the OS when their holder dies, however it dies. The process
that holds it is the only one of ours inside torch's build for that directory, so a baton
found then was left by a build that died: it is removed, with a warning, and the build
runs again (ninja rebuilds what the dead build left unfinished). A process that finds
the lock held waits for it and says so once, with the path.

Where the file system refuses locks (some network mounts), the build runs under torch's
baton alone, as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import time
import warnings
from collections.abc import Iterator

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None

#: torch.utils.file_baton's file in the build directory (cpp_extension._jit_compile)
BATON = "lock"
#: our lock file, beside it
LOCK = "simwarp-build.lock"
#: seconds between two tries where the lock cannot block (Windows)
POLL_SECONDS = 0.1


def _try_lock(fd: int) -> bool | None:
    """Take the lock on ``fd`` without waiting: True taken, False held by another process
    (or another open of the file), None where locks are not supported here."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError:  # ENOLCK, EOPNOTSUPP: a file system without locks
            return None
    if msvcrt is not None:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError as error:  # held elsewhere; any other error: no locks here
            return False if error.errno in (errno.EACCES, errno.EDEADLOCK) else None
    return None


def _wait_lock(fd: int) -> None:
    """Take the lock on ``fd``, waiting as long as its holder lives."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while not _try_lock(fd):
        time.sleep(POLL_SECONDS)


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    elif msvcrt is not None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _holder(fd: int) -> str:
    """ " (pid N)" from what the holder wrote into the lock file, or "" when unreadable."""
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        pid = int(os.read(fd, 32).decode().strip())
        return f" (pid {pid})"
    return ""


def _note_holder(fd: int) -> None:
    """Write our pid into the lock file, for the message of a process that waits."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())


def remove_stale_baton(directory: pathlib.Path) -> bool:
    """Remove torch's baton from ``directory`` if it is there, with a warning; only call it
    while holding :func:`build_lock` (then the baton's maker is dead). True if removed."""
    baton = directory / BATON
    if not baton.exists():
        return False
    with contextlib.suppress(FileNotFoundError):
        baton.unlink()
    warnings.warn(
        f"napari-simwarp: removed the lock file {baton}, left by a kernel build that was "
        "killed before it finished (kill -9, out of memory); building again.",
        RuntimeWarning,
        stacklevel=4,
    )
    return True


@contextlib.contextmanager
def build_lock(directory: pathlib.Path) -> Iterator[None]:
    """Hold the build lock of ``directory`` (waiting for a live builder, saying so once)
    and clear a baton left by a dead one, for the duration of the ``with`` block."""
    directory = pathlib.Path(directory)
    path = directory / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        taken = _try_lock(fd)
        if taken is False:
            warnings.warn(
                f"napari-simwarp: another process{_holder(fd)} is building the compiled "
                f"kernels in {directory}; waiting for it to finish (lock file {path}).",
                RuntimeWarning,
                stacklevel=3,
            )
            _wait_lock(fd)
            taken = True
        if taken:
            _note_holder(fd)
            remove_stale_baton(directory)
        try:
            yield
        finally:
            if taken:
                with contextlib.suppress(OSError):
                    _unlock(fd)
    finally:
        os.close(fd)
