"""Work as dask tasks: the distributed client, if any, and a cap on GPU tasks.

Scale-out is ``dask.distributed``: when a ``Client`` is active, dask arrays computed
anywhere in the package run on its workers, and :func:`active_client` lets the stack
driver submit its frame batches there too. A GPU is shared by the tasks of one worker
(threads) and must not be oversubscribed: :func:`device_slot` lets at most
:data:`GPU_TASKS` tasks use one GPU of a process at a time (``SIMWARP_GPU_TASKS``).
"""

from __future__ import annotations

import contextlib
import os
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
    installed)."""
    try:
        from distributed import get_client
    except ImportError:
        return None
    try:
        return get_client()
    except ValueError:  # no client
        return None
