"""What identifies an input, so that a resumed write never mixes two versions of it.

A rerun of an interrupted ``register-stack`` resumes the write it left: the transforms it
computed and the blocks it stored. That is right only if the input is the one they came
from. Its path alone does not say so (a file replaced by other frames of the same shape
keeps its path); :func:`input_identity` records what does, cheaply, without reading the
whole input:

- for a file: its size and modification time (nanoseconds);
- for a folder (a Zarr or OME-Zarr store): the names, sizes and modification times of
  the entries directly inside it (its metadata and, for an array at the root, its chunks);
- for both: the SHA-256 of a sample of the data, up to :data:`SAMPLES` frames spread
  over the first axis, each read whole up to :data:`SAMPLE_ELEMENTS` elements (a central
  box beyond that).

A copy of the same data (a new modification time) is taken for another input: the safe
side. :func:`differences` names what changed, for messages.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import numpy as np

#: frames sampled over the first axis
SAMPLES = 8
#: the most elements read from one sampled frame
SAMPLE_ELEMENTS = 1 << 21

_WHAT = {
    "size": "its size",
    "mtime_ns": "its modification time",
    "listing": "the files in it (names, sizes or times)",
    "sample": "the content of the sampled frames",
    "shape": "its shape",
    "dtype": "its data type",
}


def _listing(folder: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            info = entry.stat(follow_symlinks=True)
            digest.update(f"{entry.name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def _sample(data) -> str:
    """SHA-256 of up to :data:`SAMPLES` frames of ``data`` (any array with NumPy-style
    slicing: NumPy, dask, zarr), each cropped to a central box of at most
    :data:`SAMPLE_ELEMENTS` elements."""
    shape = tuple(int(n) for n in data.shape)
    digest = hashlib.sha256()
    if not shape or 0 in shape:
        return digest.hexdigest()[:32]
    frames = sorted({round(t) for t in np.linspace(0, shape[0] - 1, min(SAMPLES, shape[0]))})
    rest = shape[1:]
    side = max(1, int(SAMPLE_ELEMENTS ** (1 / max(len(rest), 1))))
    box = tuple(
        slice((n - min(n, side)) // 2, (n - min(n, side)) // 2 + min(n, side)) for n in rest
    )
    for t in frames:
        block = np.ascontiguousarray(np.asarray(data[(t, *box)]))
        digest.update(f"{t}:{block.shape}:{block.dtype}\n".encode())
        digest.update(block.tobytes())
    return digest.hexdigest()[:32]


def input_identity(path, data) -> dict:
    """What identifies the input at ``path`` whose data (opened lazily) is ``data``: a
    JSON-able dict (see the module's notes); two reads of an unchanged input give the
    same dict."""
    path = pathlib.Path(path)
    info = path.stat()
    out: dict = {"shape": [int(n) for n in data.shape], "dtype": str(np.dtype(data.dtype))}
    if path.is_dir():
        out["listing"] = _listing(path)
    else:
        out["size"] = int(info.st_size)
        out["mtime_ns"] = int(info.st_mtime_ns)
    out["sample"] = _sample(data)
    return out


def differences(before: dict, now: dict) -> list[str]:
    """What differs between two identities, in words ("its size", ...)."""
    keys = [k for k in _WHAT if k in before or k in now]
    return [_WHAT[k] for k in keys if before.get(k) != now.get(k)]


def describe(before: dict, now: dict, name: str) -> str:
    """A sentence saying that the input ``name`` changed, and how."""
    changed = differences(before, now) or ["its identity"]
    return (
        f"the {name} changed since the interrupted run ({', '.join(changed)} differ"
        f"{'s' if len(changed) == 1 else ''}); resuming would mix its old and new frames"
    )


__all__ = ["SAMPLES", "SAMPLE_ELEMENTS", "describe", "differences", "input_identity"]
