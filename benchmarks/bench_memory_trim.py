"""What do the malloc_trim calls cost? (issue 28, io/trim.py)

1. One ``trim.release()`` call: in an idle process, after a lazy batch (8 frames of
   512² uint16 read through dask's threads, converted to float32 and freed), and after a
   torch batch of the same size freed in this thread.
2. ``register_stack`` of the speed guard's stack (20 × 512² uint16, translation): NumPy
   (no trim: nothing was read in dask's threads) and the same frames as a dask array (a
   trim per batch and per pass), with the trims on and off (``trim.release`` a no-op), in
   rotating order, median of 7 calls; the number of trims and their time.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/bench_memory_trim.py``; prints Markdown.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _per_call(prepare, calls=20) -> float:
    from napari_simwarp.io import trim

    times = []
    for _ in range(calls):
        prepare()
        start = time.perf_counter()
        trim.release()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_call_rows() -> list[str]:
    import dask.array as da
    import torch

    frames = np.random.default_rng(0).integers(0, 60000, (8, 512, 512), dtype=np.uint16)

    def idle():
        pass

    def lazy_batch():
        x = da.from_array(frames, chunks=(1, 512, 512)).astype(np.float32).compute()
        del x

    def torch_batch():
        x = torch.from_numpy(frames.astype(np.float32)) * 2
        del x

    rows = []
    for name, prepare in [("idle", idle), ("after a lazy batch", lazy_batch),
                          ("after a torch batch", torch_batch)]:  # fmt: skip
        rows.append(f"| {name} | {_per_call(prepare) * 1e3:.3f} |")
    return ["| state | one malloc_trim(0) (ms) |", "|---|---:|", *rows]


def stack_rows(calls=7) -> list[str]:
    """register_stack of the guard's stack, NumPy and dask, with each trim mode in turn
    (rotating which goes first), median of ``calls`` runs per mode."""
    import dask.array as da

    from bench_register import drift_stack
    from napari_simwarp.io import trim
    from napari_simwarp.registration import register_stack

    stack, _ = drift_stack(np.random.default_rng(2026), frames=20)
    inputs = {"NumPy": stack, "dask (one frame per chunk)": da.from_array(stack, (1, 512, 512))}
    real = trim.release
    spent = {}

    def mode(above):
        def release(*_):
            if above is None:
                return False
            start = time.perf_counter()
            done = real()
            count = spent.setdefault(above, [0, 0.0])
            count[0] += done
            count[1] += time.perf_counter() - start
            return done

        return release

    modes = {"off": None, "on": 0}
    rows = [
        "| input | trims | trims per run | trim time per run (ms) | run time (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, data in inputs.items():
        register_stack(data)  # warm-up
        spent.clear()
        times = {m: [] for m in modes}
        order = list(modes)
        for i in range(calls):
            for m in order[i % len(order) :] + order[: i % len(order)]:
                trim.release = mode(modes[m])
                start = time.perf_counter()
                register_stack(data)
                times[m].append(time.perf_counter() - start)
        trim.release = real
        for m, above in modes.items():
            n, seconds = spent.get(above, [0, 0.0]) if above is not None else (0, 0.0)
            rows.append(
                f"| {name} | {m} | {n / calls:.1f} | {seconds / calls * 1e3:.1f} | "
                f"{statistics.median(times[m]):.3f} |"
            )
    return rows


def main():
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print("\n".join(per_call_rows()), flush=True)
    print()
    print("\n".join(stack_rows()), flush=True)


if __name__ == "__main__":
    main()
