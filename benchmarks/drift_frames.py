"""Lazy drift correction of large frames, one process per run: time, peak RSS, shift error.

Compares two checkouts side by side (run it alternately with each one's ``src`` first on
``PYTHONPATH``; docs/benchmarks.md, "Drift correction at 2048²"):

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/drift_frames.py [FRAMES] [SIDE] [MODEL]

A dask stack of ``FRAMES`` float32 frames of ``SIDE``² (default 16, 2048, "translation"),
each a smooth random scene shifted by a known sub-pixel amount (at most 6 px), made on
demand, registered by ``register_stack`` with its defaults; the aligned stack is lazy and
is computed (the warp of every frame) inside the timing.
"""

from __future__ import annotations

import hashlib
import resource
import sys
import time
import warnings

import dask
import dask.array as da
import numpy as np
from scipy import ndimage as ndi

import napari_simwarp


def main(frames: int = 16, side: int = 2048, model: str = "translation") -> None:
    rng = np.random.default_rng(0)
    scene = ndi.gaussian_filter(rng.random((side + 32, side + 32)), 3).astype(np.float32)
    shifts = rng.uniform(-6, 6, (frames, 2))
    shifts[0] = 0

    def frame(t):
        moved = ndi.shift(scene, shifts[t], order=1, mode="nearest")
        return moved[16:-16, 16:-16][None]

    stack = da.concatenate(
        [
            da.from_delayed(dask.delayed(frame)(t), (1, side, side), np.float32)
            for t in range(frames)
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        result = napari_simwarp.register_stack(stack, model=model, device="cpu")
        aligned = np.asarray(result.warped)
        seconds = time.perf_counter() - start
    # result.shifts: each frame's translation (for rigid, about the array origin, which
    # holds the drift here: the frames are not rotated)
    error = np.abs(result.shifts - shifts).max()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    # hashes of the shifts and of the aligned stack, to compare two trees bit for bit; the
    # per-frame scores to compare them in value (a tree may score in float32)
    found, warped = (
        hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:12]
        for a in (result.shifts, aligned)
    )
    scores = np.asarray(result.frame_similarity, np.float64)
    print(
        f"{napari_simwarp.__file__.rsplit('/', 3)[0]}: {frames} x {side}² {model}: "
        f"{seconds:.2f} s, peak RSS {peak:.2f} GiB, max shift error {error:.6g} px, "
        f"aligned {aligned.shape}; sha shifts {found}, aligned {warped}; "
        f"frame ZNCC min {scores.min()!r}, sum {scores.sum()!r}"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(int(a) for a in args[:2]), *args[2:3])
