"""Files written whole or not at all, alone or together, with errors that name the
user's paths.

Every file goes first to a temporary name beside its target (same folder, so the final
rename needs no space and is atomic), then is renamed into place. The temporary name is
short whatever the target's (a hash of the name, not the name itself): a target whose
name fits the file system's limit (255 bytes on most) always gets a temporary that fits.
Several outputs of one command (an image and its transform; a transform file and its
grids) are renamed only after all of them were written, and removed again if a later one
fails or the run is interrupted: they appear together or not at all.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
from collections.abc import Callable, Sequence

#: the longest file name (bytes) assumed where the file system does not say
NAME_MAX = 255


def name_max(folder) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or of its closest
    existing parent) takes."""
    folder = pathlib.Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def check_name_length(path, what: str) -> None:
    """Refuse a file name longer than its file system takes, naming ``what`` (the
    argument) and the length, before anything is computed or written."""
    path = pathlib.Path(path)
    size, limit = len(os.fsencode(path.name)), name_max(path.parent)
    if size > limit:
        raise OSError(
            errno.ENAMETOOLONG,
            f"{what} {str(path)!r}: the file name is {size} bytes, longer than the "
            f"{limit} bytes its file system takes; choose a shorter name",
        )


def partial_path(path) -> pathlib.Path:
    """The temporary name ``path`` is written under: hidden, beside it, with its suffix
    (writers that pick a format from it still can) and at most ~50 bytes long."""
    path = pathlib.Path(path)
    digest = hashlib.sha1(os.fsencode(path.name)).hexdigest()[:16]
    suffix = path.suffix if len(path.suffix) <= 16 else ""
    return path.with_name(f".{digest}.partial-{os.getpid()}{suffix}")


def _naming(exc: OSError, path: pathlib.Path) -> OSError:
    """``exc`` re-made to name ``path`` (the user's) instead of a temporary file."""
    if exc.errno is None:
        return exc
    return type(exc)(exc.errno, f"{exc.strerror}; writing {str(path)!r}")


def _check_folder(path: pathlib.Path) -> None:
    if not path.parent.is_dir():
        raise FileNotFoundError(
            errno.ENOENT,
            f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist",
        )


def write_together(
    items: Sequence[tuple[pathlib.Path, Callable[[pathlib.Path], None]]],
) -> list[pathlib.Path]:
    """Write several files as one: ``items`` is ``[(path, write), ...]``; each
    ``write(partial)`` writes its file at the temporary ``partial`` given. Only when every
    one has been written are they renamed into place (in order); any failure or interrupt
    (Ctrl-C included) removes the temporaries and the files already renamed, so the
    outputs appear together or not at all. Existing targets are replaced (check them
    first). An OSError names the user's path, never a temporary one. Returns the paths.
    """
    paths = [pathlib.Path(p) for p, _ in items]
    for path in paths:
        _check_folder(path)
        check_name_length(path, "output")
    partials = [partial_path(p) for p in paths]
    renamed: list[pathlib.Path] = []
    try:
        for path, partial, (_, write) in zip(paths, partials, items):
            try:
                write(partial)
            except OSError as exc:
                raise _naming(exc, path) from exc
        for path, partial in zip(paths, partials):
            try:
                os.replace(partial, path)
            except OSError as exc:
                raise _naming(exc, path) from exc
            renamed.append(path)
    except BaseException:
        for path in renamed:
            path.unlink(missing_ok=True)
        raise
    finally:
        for partial in partials:
            if partial.is_dir():
                import shutil

                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
    return paths


def write_atomic(path, write: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """One file through :func:`write_together`; returns its path."""
    return write_together([(pathlib.Path(path), write)])[0]
