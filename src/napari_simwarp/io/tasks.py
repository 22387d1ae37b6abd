"""Work as dask tasks: the distributed client, if any, and a cap on GPU tasks.

Scale-out is ``dask.distributed``: when a ``Client`` is active, dask arrays computed
anywhere in the package (chunked ``apply``, tiled maps, lazy aligned stacks, OME-Zarr
writes) run on its workers, and ``register_stack`` of a dask or zarr stack finds the client
through :func:`active_client` and submits its frame batches to the workers as tasks
(:mod:`napari_simwarp.registration._batches`; NumPy and torch stacks, already in the
caller's memory, are registered in the caller's process). A GPU is shared by the tasks of
one worker (threads) and must not be oversubscribed: every such task holds
:func:`device_slot`, which lets at most :data:`GPU_TASKS` tasks use one GPU of a process
at a time (``SIMWARP_GPU_TASKS``).

Workers started by dask's nanny inherit ``MALLOC_TRIM_THRESHOLD_=65536``; any explicit
glibc malloc setting turns its dynamic mmap threshold off, so torch's large CPU
temporaries are mapped and page-faulted afresh on every call (2 to 20 times slower
elementwise ops and FFTs, measured on 512² frames). Remove it from
``distributed.nanny.pre-spawn-environ`` for CPU workers (benchmarks/bench_large.py does).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

#: the environment variable that sets how many tasks of one process may use a GPU at once
GPU_TASKS_ENVIRONMENT = "SIMWARP_GPU_TASKS"
GPU_TASKS = 1

_slots: dict[str, threading.Semaphore] = {}
_slots_lock = threading.Lock()


def _gpu_tasks() -> int:
    text = os.environ.get(GPU_TASKS_ENVIRONMENT, str(GPU_TASKS))
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{GPU_TASKS_ENVIRONMENT} must be a positive int, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{GPU_TASKS_ENVIRONMENT} must be a positive int, got {text!r}")
    return value


@contextlib.contextmanager
def device_slot(device):
    """Hold one of the GPU's task slots in this process while the block runs (CPU and MPS:
    no cap, the thread pool is the cap)."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind != "cuda":
        yield
        return
    key = str(device)
    with _slots_lock:
        slot = _slots.setdefault(key, threading.Semaphore(_gpu_tasks()))
    with slot:
        yield


def active_client():
    """The active ``dask.distributed`` client, or None (also when distributed is not
    installed, or not imported: a client can only be active where it was, and importing
    it to ask costs about 0.6 s, as long as a small drift correction)."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_client
    except ImportError:
        return None
    try:
        return get_client()
    except ValueError:  # no client
        return None


def local_tasks() -> int:
    """How many tasks dask computes at once in this process: the threaded scheduler's
    threads (``num_workers`` in dask's config, else one per CPU), 1 with the synchronous
    scheduler; 1 with a ``dask.distributed`` client active (its tasks hold their workers'
    memory, not this process's). Tasks sized from a memory budget divide it by this."""
    if active_client() is not None:
        return 1
    import dask
    from dask.system import CPU_COUNT

    scheduler = dask.config.get("scheduler", None)
    if scheduler in ("sync", "synchronous", "single-threaded"):
        return 1
    return max(1, int(dask.config.get("num_workers", None) or CPU_COUNT))
