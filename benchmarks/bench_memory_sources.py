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

A source name ending in ``+cluster`` is computed by an in-process ``dask.distributed``
LocalCluster (one worker, two threads). Paths: ``register_stack`` (default), ``apply``
(``Transform.apply`` of a translation) and ``local_ncc`` (the tiled map of the stack and
itself shifted by a frame), the last two stored frame by frame to a Zarr store.

Usage: ``python benchmarks/bench_memory_sources.py [T N]`` (default 96 512), prints a
Markdown table; ``SIMWARP_BENCH_MEMORY_SOURCES``, ``..._BUDGETS``, ``..._MODELS`` and
``..._PATHS`` (comma-separated) pick the rows, ``SIMWARP_BENCH_MEMORY_ITERATIONS`` the
optimizer's iterations (default: register_stack's), ``..._REFERENCE`` the reference
(default "first").

``python benchmarks/bench_memory_sources.py cli [T N]``: the ``register-stack`` command on
a TIFF, ``.npy`` and Zarr file of the same frames, output beside (``.zarr``, or ``.npy``
for the ``.npy`` input), its peak resident set during ``_cli.main`` above that before.
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

source, budget, model, T, N, folder, path, iterations = sys.argv[1:9]
T, N = int(T), int(N)
options = {} if iterations == "default" else {"iterations": int(iterations)}
options["reference"] = os.environ.get("SIMWARP_BENCH_MEMORY_REFERENCE", "first")
if source.endswith("+cluster"):  # computed by an in-process dask.distributed cluster
    from distributed import Client, LocalCluster
    client = Client(LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                 dashboard_address=None))
    source = source[: -len("+cluster")]
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
    store = os.path.join(folder, "stack.zarr")
    if not os.path.exists(store):
        z = zarr.open_array(store, mode="w", shape=(T, N, N), chunks=(16, N, N), dtype=np.uint16)
        for s in range(0, T, 16):
            z[s:s + 16] = frames(s, min(T, s + 16))
    data = zarr.open_array(store, mode="r")
else:
    raise SystemExit(f"unknown source {source}")

def run(data):  # the measured call; apply and the map are stored frame by frame
    if path == "register_stack":
        return register_stack(data, model=model, memory_budget=budget, **options)
    import zarr
    from napari_simwarp import maps
    from napari_simwarp.registration.transforms import AffineTransform
    if path == "apply":
        t = AffineTransform(np.array([[1, 0, 2.5], [0, 1, -1.5], [0, 0, 1.0]]))
        os.environ["SIMWARP_MEMORY_BUDGET"] = budget  # what apply's default reads
        out = t.apply(data)
    else:  # a map of the stack with itself shifted by one frame
        a = data if hasattr(data, "dask") else da.from_array(data, chunks=data.chunks)
        b = da.concatenate([a[1:], a[:1]])
        out = maps.local_ncc(a, b, window=9, axes="tyx", memory_budget=budget)
    store = os.path.join(folder, "out.zarr")
    z = zarr.open_array(store, mode="w", shape=out.shape, chunks=(1, N, N), dtype=out.dtype)
    da.store(out, z, lock=False)

if path == "register_stack":
    register_stack(np.stack([frame(t) for t in range(3)]), model=model, **options)
else:
    run(da.from_array(np.stack([frame(t) for t in range(2)]), (1, N, N)))  # one-time costs

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = rss("VmRSS:")
run(data)
print(json.dumps({"growth": rss("VmHWM:") - before}))
"""

SOURCES = os.environ.get(
    "SIMWARP_BENCH_MEMORY_SOURCES", "map_blocks,delayed,dask-multi,zarr-multi"
).split(",")
BUDGETS = os.environ.get("SIMWARP_BENCH_MEMORY_BUDGETS", "16MiB,64MiB,1GiB").split(",")
MODELS = os.environ.get("SIMWARP_BENCH_MEMORY_MODELS", "translation").split(",")
#: what is measured: register_stack, apply (Transform.apply stored to Zarr), local_ncc (the
#: tiled map stored to Zarr)
PATHS = os.environ.get("SIMWARP_BENCH_MEMORY_PATHS", "register_stack").split(",")
ITERATIONS = os.environ.get("SIMWARP_BENCH_MEMORY_ITERATIONS", "default")


def measure(source, budget, model, T, N, folder, path="register_stack") -> float:
    # glibc's default malloc, as a user's process has it (run.py pins its thresholds)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCRIPT,
            source,
            budget,
            model,
            str(T),
            str(N),
            folder,
            path,
            ITERATIONS,
        ],
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
        "| path | source | model | memory_budget | peak RSS growth (MiB) |",
        "|---|---|---|---|---:|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for path in PATHS:
            for source in SOURCES:
                for model in MODELS if path == "register_stack" else ["-"]:
                    for budget in BUDGETS:
                        growth = measure(source, budget, model, T, N, folder, path)
                        cell = f"{growth:.0f}" if isinstance(growth, float) else growth
                        lines.append(f"| {path} | {source} | {model} | {budget} | {cell} |")
                        print(lines[-1], flush=True)
    return lines


def run(report) -> None:
    """For benchmarks/run.py: the table at the issue's size, as a note."""
    report.note(SECTION, "\n".join(table(160, 1024)))


_CLI = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from napari_simwarp import _cli

small, big, out, budget, model = sys.argv[1:6]
warm = out.replace("out-", "warm-")
assert _cli.main(["register-stack", small, "-o", warm, "--quiet", "--model", model]) == 0

def rss(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = rss("VmRSS:")
code = _cli.main(["register-stack", big, "-o", out, "--memory-budget", budget, "--quiet",
                  "--model", model])
print(json.dumps({"code": code, "growth": rss("VmHWM:") - before}))
"""


def cli_table(T=96, N=512) -> list[str]:
    """``register-stack`` on TIFF, .npy and Zarr files of a (T, N, N) uint16 stack."""
    import numpy as np
    import tifffile
    import zarr
    from scipy import ndimage

    base = ndimage.gaussian_filter(np.random.default_rng(0).random((N + 8, N + 8)), 3)
    base = (base * 60000).astype(np.uint16)

    def frame(t):
        return base[t % 8 : t % 8 + N, t % 8 : t % 8 + N]

    lines = [
        f"`register-stack` on a (T, N, N) = ({T}, {N}, {N}) uint16 file "
        f"({T * N * N * 2 / 2**20:.0f} MiB)",
        "",
        "| input | output | model | --memory-budget | peak RSS growth (MiB) |",
        "|---|---|---|---|---:|",
    ]
    print("\n".join(lines), flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as folder:
        for name, n in (("small", 3), ("big", T)):
            with tifffile.TiffWriter(os.path.join(folder, f"{name}.tif"), bigtiff=True) as w:
                for t in range(n):
                    w.write(frame(t), contiguous=True)
            npy = np.lib.format.open_memmap(
                os.path.join(folder, f"{name}.npy"), "w+", np.uint16, (n, N, N)
            )
            z = zarr.open_array(os.path.join(folder, f"{name}.zarr"), mode="w", shape=(n, N, N),
                                chunks=(1, N, N), dtype=np.uint16)  # fmt: skip
            for t in range(n):
                npy[t] = z[t] = frame(t)
            npy.flush()
            del npy
        for ext, out, model in [(e, "zarr", m) for e in ("tif", "npy", "zarr")
                                for m in MODELS] + [("npy", "npy", MODELS[0])]:  # fmt: skip
            for budget in BUDGETS:
                target = os.path.join(folder, f"out-{ext}-{model}-{budget}.{out}")
                run = subprocess.run(
                    [sys.executable, "-c", _CLI, os.path.join(folder, f"small.{ext}"),
                     os.path.join(folder, f"big.{ext}"), target, budget, model],
                    capture_output=True, text=True, env=env,
                )  # fmt: skip
                if run.returncode != 0:
                    cell = f"error: {run.stderr.strip().splitlines()[-1][:160]}"
                else:
                    result = json.loads(run.stdout.strip().splitlines()[-1])
                    cell = f"{result['growth'] / 2**20:.0f}"
                    if result["code"]:
                        cell = f"exit {result['code']}"
                lines.append(f"| .{ext} | .{out} | {model} | {budget} | {cell} |")
                print(lines[-1], flush=True)
    return lines


def main(T=96, N=512):
    table(T, N)


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli"]:
        cli_table(*(int(v) for v in sys.argv[2:4]))
    else:
        main(*(int(v) for v in sys.argv[1:3]))
