"""The two parts of lazy drift correction that 2048² frames made slow, old tree vs new.

``quality.masked_zncc`` (the score every frame gets: one float32 2048² pair with a mask)
and ``ops._padding.pad_spatial`` (every pyramid level: a (2, 1, 2048, 2048) float32 pad of
8 px per side, "nearest" and "reflect"), best of ``--repeat`` calls each, one thread.
Each tree runs in its own process, the trees alternating ``--rounds`` times, so both see
the same load; each process also prints the score (repr) and a hash of each padded array,
which must agree across the trees (docs/benchmarks.md, "Drift correction at 2048²"):

    OMP_NUM_THREADS=1 python benchmarks/drift_parts.py OLD/src NEW/src [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time

SIDE, PAD = 2048, 8


def best_of(fn, repeat):
    """The fastest of ``repeat`` calls of ``fn``, in ms (the first call is a warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def child(repeat: int) -> None:
    """Time both parts with the ``napari_simwarp`` on ``sys.path``; print one line."""
    import numpy as np
    import torch

    import napari_simwarp
    from napari_simwarp.ops._padding import pad_spatial
    from napari_simwarp.registration.quality import masked_zncc

    rng = np.random.default_rng(0)
    # an offset of 100 on a contrast of 1, as a camera's frames: a naive float32 sum of
    # squares loses the score to cancellation
    fixed = torch.from_numpy(rng.random((1, 1, SIDE, SIDE), dtype=np.float32) + 100)
    warped = torch.from_numpy(rng.random((1, 1, SIDE, SIDE), dtype=np.float32)) + 0.5 * fixed
    valid = torch.ones_like(fixed)
    valid[..., :, : SIDE // 8] = 0  # the border a shift leaves uncovered
    score = masked_zncc(fixed, warped, valid)
    zncc_ms = best_of(lambda: masked_zncc(fixed, warped, valid), repeat)

    frames = torch.from_numpy(rng.random((2, 1, SIDE, SIDE), dtype=np.float32))
    pads = [(PAD, PAD), (PAD, PAD)]
    tree = os.path.dirname(os.path.dirname(napari_simwarp.__file__))
    line = [f"{tree}: masked_zncc {zncc_ms:.1f} ms (score {float(score[0])!r}, {score.dtype})"]
    for mode in ("nearest", "reflect"):
        out = pad_spatial(frames, pads, mode)
        digest = hashlib.sha256(out.numpy().tobytes()).hexdigest()[:12]
        ms = best_of(lambda mode=mode: pad_spatial(frames, pads, mode), repeat)
        line.append(f"pad {mode} {ms:.1f} ms (sha {digest})")
    print("; ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", help="source folders (each a napari_simwarp's parent)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeat)
        return
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for _ in range(args.rounds):
        for tree in args.trees:
            env["PYTHONPATH"] = os.path.abspath(tree)
            command = [sys.executable, __file__, "--child", "--repeat", str(args.repeat)]
            subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
