"""Does the memory budget hold for every kind of lazy source? (issue 28, item 1)

``register_stack(lazy, model=..., memory_budget=B)`` on a (T, N, N) uint16 stack made on
demand by different readers, each run in its own subprocess: the figure is the peak
resident set during the call above the resident set just before it (Linux: ``VmHWM``
after writing 5 to ``/proc/self/clear_refs``). dask.distributed is imported beforehand
(as in the issue's measurement); no client is started, so dask's threaded scheduler
computes the sources.

Sources: ``map_blocks`` (one frame per chunk, computed on demand), ``delayed`` (a
``da.stack`` of ``da.from_delayed`` reads), ``dask-multi`` (a dask array whose chunks
span 16 frames) and ``zarr-multi`` (a Zarr store on disk with 16 frames per chunk).

Usage: ``python benchmarks/bench_memory_sources.py [T N]`` (default 96 512), prints a
Markdown table; ``SIMWARP_BENCH_MEMORY_SOURCES`` and ``SIMWARP_BENCH_MEMORY_BUDGETS``
(comma-separated) pick the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_SCRIPT = r"""
import json, os, sys, tempfile
import numpy as np, dask, dask.array as da
import distributed  # imported beforehand, as in the issue
from scipy import ndimage
from napari_simwarp.registration import register_stack

source, budget, model, T, N, folder = sys.argv[1:7]
T, N = int(T), int(N)
base = (ndimage.gaussian_filter(np.random.default_rng(0).random((N, N)), 3) * 60000)
base = base.astype(np.uint16)

def frame(t):
    return ndimage.shift(base, (0.05 * t, -0.03 * t), order=1)

def frames(lo, hi):
    return np.stack([frame(t) for t in range(lo, hi)])

if source == "map_blocks":
    def block(block_info=None):
        lo, hi = block_info[None]["array-location"][0]
        return frames(lo, hi)
    data = da.map_blocks(block, chunks=((1,) * T, (N,), (N,)), dtype=np.uint16)
elif source == "delayed":
    make = dask.delayed(frame, pure=True)
    data = da.stack([da.from_delayed(make(t), (N, N), np.uint16) for t in range(T)])
elif source == "dask-multi":
    def block(block_info=None):
        lo, hi = block_info[None]["array-location"][0]
        return frames(lo, hi)
    chunks = tuple(min(16, T - s) for s in range(0, T, 16))
    data = da.map_blocks(block, chunks=(chunks, (N,), (N,)), dtype=np.uint16)
elif source == "zarr-multi":
    import zarr
    path = os.path.join(folder, "stack.zarr")
    if not os.path.exists(path):
        z = zarr.open_array(path, mode="w", shape=(T, N, N), chunks=(16, N, N), dtype=np.uint16)
        for s in range(0, T, 16):
            z[s:s + 16] = frames(s, min(T, s + 16))
    data = zarr.open_array(path, mode="r")
else:
    raise SystemExit(f"unknown source {source}")

register_stack(np.stack([frame(t) for t in range(3)]), model=model)  # one-time costs

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = rss("VmRSS:")
register_stack(data, model=model, memory_budget=budget)
print(json.dumps({"growth": rss("VmHWM:") - before}))
"""

SOURCES = os.environ.get(
    "SIMWARP_BENCH_MEMORY_SOURCES", "map_blocks,delayed,dask-multi,zarr-multi"
).split(",")
BUDGETS = os.environ.get("SIMWARP_BENCH_MEMORY_BUDGETS", "16MiB,64MiB,1GiB").split(",")
MODELS = os.environ.get("SIMWARP_BENCH_MEMORY_MODELS", "translation").split(",")


def measure(source, budget, model, T, N, folder) -> float:
    # glibc's default malloc, as a user's process has it (run.py pins its thresholds)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, source, budget, model, str(T), str(N), folder],
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        return f"error: {run.stderr.strip().splitlines()[-1]}"
    return json.loads(run.stdout.strip().splitlines()[-1])["growth"] / 2**20


SECTION = "Memory budget and lazy sources (issue 28)"


def table(T=96, N=512) -> list[str]:
    """The Markdown table of every source, model and budget (printed as measured)."""
    stack_mib = T * N * N * 2 / 2**20
    lines = [
        f"(T, N, N) = ({T}, {N}, {N}) uint16: {stack_mib:.0f} MiB",
        "",
        "| source | model | memory_budget | peak RSS growth (MiB) |",
        "|---|---|---|---:|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for source in SOURCES:
            for model in MODELS:
                for budget in BUDGETS:
                    growth = measure(source, budget, model, T, N, folder)
                    cell = f"{growth:.0f}" if isinstance(growth, float) else growth
                    lines.append(f"| {source} | {model} | {budget} | {cell} |")
                    print(lines[-1], flush=True)
    return lines


def run(report) -> None:
    """For benchmarks/run.py: the table at the issue's size, as a note."""
    report.note(SECTION, "\n".join(table(160, 1024)))


def main(T=96, N=512):
    table(T, N)


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:3]))
