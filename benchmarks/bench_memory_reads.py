"""How many times does a lazy drift correction read each frame, and what does it cost on a
slow store? (issue 28, item 1: "each frame read once per pass where the pass allows")

``register_stack(lazy, ...)`` on a (T, N, N) uint16 ``map_blocks`` stack whose every frame
read sleeps ``latency`` seconds (a network or object store, a slow decoder); each read is
counted by frame. The run's time with and without the latency gives what the reads cost;
T × latency is the cost of reading every frame once.

Usage: ``python benchmarks/bench_memory_reads.py [T N latency_ms]`` (default 96 256 5),
prints a Markdown table; with ``--no-cache``, the frame cache
(:attr:`napari_simwarp.registration._frames.FrameSource.cache_bytes`) is turned off.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

import numpy as np
from scipy import ndimage

CASES = [
    ("translation", "first"),
    ("translation", "mean"),
    ("rigid", "first"),
]


def source(T, N, latency, reads):
    import dask.array as da

    base = (ndimage.gaussian_filter(np.random.default_rng(0).random((N, N)), 3) * 60000).astype(
        np.uint16
    )
    lock = threading.Lock()

    def block(block_info=None):
        t = block_info[None]["array-location"][0][0]
        with lock:
            reads[t] += 1
        time.sleep(latency)
        return ndimage.shift(base, (0.05 * t, -0.03 * t), order=1)[None]

    return da.map_blocks(block, chunks=((1,) * T, (N,), (N,)), dtype=np.uint16)


def measure(model, reference, T, N, latency, budget="256MiB"):
    """``(reads per frame, seconds)`` of one run on a stack of ``latency`` per frame read."""
    from napari_simwarp import register_stack

    reads = collections.Counter()
    data = source(T, N, latency, reads)
    start = time.perf_counter()
    result = register_stack(
        data, model=model, reference=reference, memory_budget=budget, iterations=5
    )
    seconds = time.perf_counter() - start
    warped_reads = collections.Counter()
    reads_before = dict(reads)
    result.warped[:8].compute()  # the aligned stack: read when computed
    warped_reads = {t: reads[t] - reads_before.get(t, 0) for t in range(8)}
    per_frame = sum(reads_before.values()) / T
    return per_frame, np.mean(list(warped_reads.values())), seconds


def table(T=96, N=256, latency_ms=5.0, cache=True):
    import warnings

    from napari_simwarp.registration import _frames

    if not cache:
        _frames.FrameSource.keep = lambda self, limit: None
    warnings.simplefilter("ignore")
    register_once = measure("translation", "first", 3, N, 0.0)  # one-time costs
    del register_once
    lat = latency_ms / 1000
    lines = [
        f"(T, N, N) = ({T}, {N}, {N}) uint16, {latency_ms:g} ms per frame read; frame cache "
        + ("on" if cache else "off"),
        "",
        "| model | reference | reads per frame (run) | reads per frame (aligned stack) "
        "| time, no latency (s) | time, latency (s) | cost of the reads (s) | T × latency (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    for model, reference in CASES:
        _, _, fast = measure(model, reference, T, N, 0.0)
        per_frame, warped, slow = measure(model, reference, T, N, lat)
        lines.append(
            f"| {model} | {reference} | {per_frame:.2f} | {warped:.0f} | {fast:.2f} | "
            f"{slow:.2f} | {slow - fast:.2f} | {T * lat:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    T, N, lat = (int(args[0]), int(args[1]), float(args[2])) if args else (96, 256, 5.0)
    table(T, N, lat, cache="--no-cache" not in sys.argv)
