"""Real data sizes: lazy drift correction, chunked apply and tiled maps to OME-Zarr, each in
a subprocess whose peak RSS is the figure (and a two-worker LocalCluster).

Full sizes by default (a (600, 2048, 2048) uint16 stack, a (512, 2048, 2048) uint16 volume,
generated lazily); ``SIMWARP_BENCH_LARGE_SCALE=0.25`` shrinks every side-length and count
for a quick look; ``SIMWARP_BENCH_LARGE_CASES`` picks cases (``stack``, ``apply``, ``std``,
``cluster``, comma-separated). The figures go to docs/benchmarks.md through ``run.py``, and
to the standard output as each is measured. ``SIMWARP_BENCH_LARGE_SOURCE``: a folder where
the generated stack's Zarr store is kept between runs (its making is untimed either way).

The drift-correction figures say what each path includes: the lazy run reads the stack
from a Zarr store on disk and writes the aligned stack to an OME-Zarr store (registration
and writing timed apart); the in-memory run registers frames already in memory (its
throughput is the issue's reference) and then, timed apart, writes its aligned stack as the
lazy run does. Modules are imported, and four frames registered, before either clock
starts. CPU time per frame (all threads) is given beside the wall time: on a shared
machine it varies less with the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

SECTION = "Real data sizes (lazy input, OME-Zarr output, dask.distributed)"
SCALE = float(os.environ.get("SIMWARP_BENCH_LARGE_SCALE", "1"))
#: the cases to run (``SIMWARP_BENCH_LARGE_CASES=stack,std``; default all)
CASES = os.environ.get("SIMWARP_BENCH_LARGE_CASES", "stack,apply,std,cluster").split(",")

_SCRIPT = r"""
import json, os, resource, sys, time
import numpy as np, dask, dask.array as da
from scipy import ndimage
kind, out, T, N, Z = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
base_img = (ndimage.gaussian_filter(np.random.default_rng(0).random((N, N)), 3) * 60000)
base_img = base_img.astype(np.uint16)

def frame(t):  # a drifting frame, made on demand
    return ndimage.shift(base_img, (0.03 * t, -0.02 * t), order=1)[None]

def lazy_stack(T):
    make = dask.delayed(frame, pure=True)
    return da.concatenate([da.from_delayed(make(t), (1, N, N), np.uint16) for t in range(T)])

start = time.perf_counter()
if kind in ("stack", "stack-memory", "stack-cluster"):
    from napari_simwarp.registration import register_stack
    from napari_simwarp.io.omezarr import write_ome_zarr
    import ngff_zarr.v04.zarr_metadata  # imported before the clock, as torch is for both

    # one-time costs (kernels loaded, first calls of each op) before either clock starts
    register_stack(np.concatenate([frame(t) for t in range(4)]))
    if kind == "stack-memory":
        stack = np.concatenate([frame(t) for t in range(T)])
        start, cpu = time.perf_counter(), time.process_time()
        result = register_stack(stack)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        # and the aligned stack written as the lazy run writes it (timed apart)
        write = time.perf_counter()
        write_ome_zarr(out, result.warped, axes="tyx", dtype=np.uint16, chunks=(1, N, N),
                       memory_budget="1GiB")
        print(json.dumps({"write": time.perf_counter() - write}))
    else:
        client = None
        if kind == "stack-cluster":
            from distributed import Client, LocalCluster
            # glibc's defaults in the workers too, as in every case here: dask's nanny sets
            # MALLOC_TRIM_THRESHOLD_, and any explicit malloc setting turns glibc's dynamic
            # mmap threshold off, so every large temporary is mapped and page-faulted afresh
            # (torch's CPU ops on 512² frames 2 to 20 times slower in a worker: measured)
            environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
            environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            dask.config.set({"distributed.nanny.pre-spawn-environ": environ})
            client = Client(LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="4GiB"))
        # The stack on disk first, as a user's data is (untimed): the timed run reads it,
        # as the in-memory run times the registration of frames already made.
        path = os.environ.get("SIMWARP_BENCH_LARGE_SOURCE") or out + ".source"
        path = f"{path}/stack_{T}_{N}.zarr"
        if not os.path.exists(path + "/complete"):
            da.to_zarr(lazy_stack(T).rechunk((1, N, N)), path, overwrite=True)
            open(path + "/complete", "w").close()
        source = da.from_zarr(path)
        if client is not None:  # the workers' one-time costs too, on frames read as later
            register_stack(source[:8], batch_size=2)
        start, cpu = time.perf_counter(), time.process_time()
        result = register_stack(source, memory_budget="1GiB")
        register = time.perf_counter() - start
        write_ome_zarr(out, result.warped, axes="tyx", dtype=np.uint16, memory_budget="1GiB")
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(json.dumps({"register": register}))
        if client is not None:
            workers = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            print(json.dumps({"workers": list(workers.values())}))
elif kind in ("apply", "std", "std-memory"):
    slab = dask.delayed(lambda z: np.stack([base_img] * 16)[:, :N, :N], pure=True)
    vol = da.concatenate([da.from_delayed(slab(z), (16, N, N), np.uint16) for z in range(0, Z, 16)])
    vol = vol.rechunk((64, 512, 512))
    if kind == "apply":
        from napari_simwarp.registration.transforms import AffineTransform
        from napari_simwarp.io.omezarr import write_ome_zarr
        m = np.eye(4); m[:3, :3] = [[1, 0.02, 0], [0, 0.99, 0.05], [0.01, 0, 1.01]]; m[:3, 3] = 3.5
        warped = AffineTransform(m).apply(vol, chunks=(64, 512, 512))
        write_ome_zarr(out, warped, axes="zyx", dtype=np.uint16, memory_budget="1GiB")
    elif kind == "std":
        from napari_simwarp import maps
        # The volume on disk first, as a user's is (untimed, and its peak not counted): a
        # Zarr store in 64 x 512² chunks. (Straight from the generator above, dask's local
        # scheduler holds slabs for many tiles at once: past 3.2 GiB at full size when stopped.)
        path = os.environ.get("SIMWARP_BENCH_LARGE_SOURCE") or out + ".source"
        path = f"{path}/volume_{Z}_{N}.zarr"
        if not os.path.exists(path + "/complete"):
            da.to_zarr(vol, path, overwrite=True)
            open(path + "/complete", "w").close()
        with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) restarts here
            f.write("5")
        start = time.perf_counter()
        # reduced block by block (the whole map is 8 GiB of float32 at full size: holding
        # it is what tiling avoids; writing it is measured by the apply case). The uint16
        # volume goes in as a user's does: each tile is made float32 in its own task.
        maps.local_std(da.from_zarr(path), window=15, axes="zyx").sum().compute()
    else:
        import torch
        from napari_simwarp import ops
        x = torch.from_numpy(np.asarray(vol, dtype=np.float32))[None, None]
        start = time.perf_counter()
        ops.local_std(x, window=15)
if kind not in ("stack", "stack-memory", "stack-cluster"):
    seconds, cpu = time.perf_counter() - start, None
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if kind == "std":  # since the clear_refs above
    peak = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"seconds": seconds, "cpu": cpu, "peak": peak}))
"""


def _run(kind, T=0, N=0, Z=0):
    # run.py's malloc settings keep freed memory mapped (for steady timings of the kernels);
    # here they would turn every freed chunk into resident memory and inflate the peak RSS
    # this benchmark is about, so each run gets glibc's defaults.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-c", _SCRIPT, kind, f"{tmp}/out.zarr", str(T), str(N), str(Z)],
            capture_output=True,
            text=True,
            env=env,
        )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    merged = {}
    for line in lines:
        merged.update(line)
    return merged


def _say(report, text: str) -> None:
    """A figure into the report, and printed at once (a long run shows what it has)."""
    print(text, flush=True)
    report.note(SECTION, text)


def run(report) -> None:
    gib = 2**30

    n = int(2048 * SCALE)
    t_big, t_fit, z = int(600 * SCALE), int(150 * SCALE), int(512 * SCALE) // 16 * 16
    if "stack" in CASES:
        lazy = _run("stack", t_big, n)
        memory = _run("stack-memory", t_fit, n)
        lazy_fps, memory_fps = t_big / lazy["seconds"], t_fit / memory["seconds"]
        written_fps = t_fit / (memory["seconds"] + memory["write"])
        writing = lazy["seconds"] - lazy["register"]
        cpu_ratio = (t_big / lazy["cpu"]) / (t_fit / memory["cpu"])
        _say(
            report,
            f"Drift correction of a lazy ({t_big}, {n}, {n}) uint16 stack (a Zarr store on "
            f"disk) written to OME-Zarr: {lazy['seconds']:.0f} s ({lazy_fps:.2f} frames/s; "
            f"registration {lazy['register']:.0f} s, writing {writing:.0f} s), "
            f"peak RSS {lazy['peak'] / gib:.2f} GiB; in memory ({t_fit} frames, "
            f"registration only): {memory_fps:.2f} frames/s, peak {memory['peak'] / gib:.2f} "
            f"GiB; throughput ratio lazy/in-memory {lazy_fps / memory_fps:.2f} (CPU time per "
            f"frame: {cpu_ratio:.2f}); against the in-memory registration followed by writing "
            f"its aligned stack to OME-Zarr ({written_fps:.2f} frames/s): "
            f"{lazy_fps / written_fps:.2f}.",
        )
    if "apply" in CASES:
        apply = _run("apply", 0, n, z)
        _say(
            report,
            f"Affine applied chunk-wise to a ({z}, {n}, {n}) uint16 volume written to "
            f"OME-Zarr: {apply['seconds']:.0f} s, peak RSS {apply['peak'] / gib:.2f} GiB.",
        )
    if "std" in CASES:
        std = _run("std", 0, n, z)
        fit = max(16, z // 8) // 16 * 16
        std_memory = _run("std-memory", 0, n, fit)
        per_voxel = (std["seconds"] / z) / (std_memory["seconds"] / fit)
        _say(
            report,
            f"Local std (15³) of that volume read from a Zarr store on disk (64 × 512² "
            f"chunks), tiled (summed block by block, not held): "
            f"{std['seconds']:.0f} s, peak RSS "
            f"{std['peak'] / gib:.2f} GiB; the in-memory call on a ({fit}, {n}, {n}) volume: "
            f"{std_memory['seconds']:.1f} s; time per voxel tiled / in memory {per_voxel:.2f}.",
        )
    if "cluster" in CASES:
        load = os.getloadavg()[0]
        cluster = _run("stack-cluster", t_big, n)
        workers = ", ".join(f"{w / gib:.2f}" for w in cluster.get("workers", []))
        writing = cluster["seconds"] - cluster["register"]
        _say(
            report,
            f"The same stack on a two-worker LocalCluster (one thread each; frame batches, "
            f"scores and the write as tasks on the workers): {cluster['seconds']:.0f} s "
            f"({t_big / cluster['seconds']:.2f} frames/s; registration "
            f"{cluster['register']:.0f} s, writing {writing:.0f} s), peak RSS of the client "
            f"{cluster['peak'] / gib:.2f} GiB, per worker [{workers}] GiB (load average "
            f"{load:.1f} before, {os.getloadavg()[0]:.1f} after).",
        )
