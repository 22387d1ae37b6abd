"""Measure the per-pixel memory constants of the memory estimates (not a ``bench_`` module:
run.py does not run it).

    OMP_NUM_THREADS=1 python benchmarks/maps_per_pixel.py

Prints, in float32 maps per pixel (bytes / 4 / pixels):

- ``register`` (``registration/_inputs.py`` ``MAPS_PER_PIXEL``): the peak resident set of
  one run (``model="affine"``, one level, 5 iterations) on a 1024² pair, above the level
  before it, per pixel of the pair, for each metric;
- the translation route of ``register_stack`` (``registration/stack.py``
  ``TRANSLATION_MAPS_PER_PIXEL``): the peak of 16 frames of 512² aligned in batches of 16
  minus that in batches of 4, per frame of the 12 extra frames, less the one map of each
  extra frame as read (counted apart, in ``_held_bytes``); the same for 64 frames of 192²
  (under 256 px a side: no half-resolution pass) in batches of 64 and 4.

Each figure comes from a fresh subprocess (no heap left over from another measurement);
the peak is Linux's VmHWM after resetting it (``/proc/self/clear_refs``), as
``benchmarks/_harness.py`` measures.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import gc, json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
from _harness import peak_memory_mb
what, arg = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
if what == "register":
    from scipy import ndimage as ndi
    from napari_simwarp.registration import register
    n = 1024
    fixed = ndi.gaussian_filter(rng.standard_normal((n, n)), 2).astype(np.float32)
    moving = np.roll(fixed, (2, -1), axis=(0, 1))
    run = lambda: register(fixed, moving, model="affine", metric=arg, levels=1, iterations=5,
                           full_resolution=True)
    pixels = n * n
else:
    from scipy import ndimage as ndi
    from napari_simwarp.registration import register_stack
    n, t = (512, 16) if what == "stack" else (192, 64)
    base = ndi.gaussian_filter(rng.standard_normal((n, n)), 2)
    stack = np.stack([np.roll(base, (k, -k), axis=(0, 1)) for k in range(t)]).astype(np.float32)
    run = lambda: register_stack(stack, batch_size=int(arg))
    pixels = n * n
run()  # warm-up: imports, thread pools, kernels
print(json.dumps({"mib": peak_memory_mb(run), "pixels": pixels}))
"""


def measure(what: str, arg: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, what, arg], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    for metric in ("mse", "ncc", "lncc", "ssim", "mi"):
        m = measure("register", metric)
        maps = m["mib"] * 2**20 / 4 / m["pixels"]
        print(f"register metric={metric}: peak {m['mib']:.1f} MiB = {maps:.1f} maps/pixel")
    for what, side, batches in (("stack", 512, (4, 16)), ("stack-small", 192, (4, 64))):
        small, large = (measure(what, str(b)) for b in batches)
        extra = batches[1] - batches[0]
        per_frame = (large["mib"] - small["mib"]) * 2**20 / extra / 4 / small["pixels"] - 1
        print(
            f"register_stack translation, {side}² frames: batch {batches[0]} peak "
            f"{small['mib']:.1f} MiB, batch {batches[1]} {large['mib']:.1f} MiB: "
            f"{per_frame:.1f} maps/pixel per frame of a batch"
        )


if __name__ == "__main__":
    main()
