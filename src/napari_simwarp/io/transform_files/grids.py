"""The grids a transform file cannot hold, in a small JSON file beside it.

A transform's pixel form depends on both images' grids (pixel size and origin): ITK
linear files hold neither, ITK displacement fields and elastix files only the fixed one.
``Transform.save`` writes both grids to ``NAME.grids.json`` beside such a file (together
with it: both or neither), and ``load_transform`` reads them back, so a save and load
round trip is exact in pixels. The sidecar holds the SHA-256 of the transform file it
was written with: one left beside a file that something else rewrote since is ignored,
with a warning, rather than applied to a transform it does not belong to.

Layout::

    {"napari_simwarp": "grids", "version": 1, "file": "t.tfm", "sha256": "...",
     "fixed_grid": {"spacing": [...], "origin": [...]},
     "moving_grid": {"spacing": [...], "origin": [...]}}

spacing and origin per axis, in array order (napari's ``scale`` and ``translate``).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import warnings
from collections.abc import Callable

from ._common import where

SUFFIX = ".grids.json"
_VERSION = 1


def sidecar_path(path) -> pathlib.Path:
    """Where the grids of the transform file ``path`` go: ``NAME.grids.json`` beside it."""
    path = pathlib.Path(path)
    return path.with_name(path.name + SUFFIX)


def file_digest(path) -> str:
    """The SHA-256 (hex) of the file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def writers(
    path, write_file: Callable[[pathlib.Path], None], fixed_grid, moving_grid
) -> list[tuple[pathlib.Path, Callable[[pathlib.Path], None]]]:
    """The ``(path, write)`` items of a transform file and its grids sidecar, for
    :func:`napari_simwarp.io.atomic.write_together` (both or neither). ``fixed_grid`` and
    ``moving_grid`` are ``(spacing, origin)`` pairs in array order."""
    path = pathlib.Path(path)
    digest: list[str] = []

    def file(partial):
        write_file(partial)
        digest.append(file_digest(partial))

    def sidecar(partial):
        body = {
            "napari_simwarp": "grids",
            "version": _VERSION,
            "file": path.name,
            "sha256": digest[0],
            "fixed_grid": {"spacing": list(fixed_grid[0]), "origin": list(fixed_grid[1])},
            "moving_grid": {"spacing": list(moving_grid[0]), "origin": list(moving_grid[1])},
        }
        partial.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")

    return [(path, file), (sidecar_path(path), sidecar)]


def read_grids(path) -> tuple[tuple | None, tuple | None] | None:
    """``(fixed_grid, moving_grid)`` as ``(spacing, origin)`` pairs from the sidecar of
    the transform file ``path``; None when there is none, or (with a warning) when it is
    unreadable or was written with another version of the file."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        body = json.loads(side.read_text(encoding="utf-8"))
        digest = body["sha256"]
        pairs = tuple(
            (tuple(body[key]["spacing"]), tuple(body[key]["origin"]))
            for key in ("fixed_grid", "moving_grid")
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(
            f"{where(side)} (the grids of {where(path)}) cannot be read ({exc}); ignored",
            stacklevel=3,
        )
        return None
    if digest != file_digest(path):
        warnings.warn(
            f"{where(side)} was written with another version of {where(path)} (the file "
            "changed since); its grids are ignored",
            stacklevel=3,
        )
        return None
    return pairs
