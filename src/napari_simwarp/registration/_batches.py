"""Where the frame batches of a stack run: here, one after the other, or as tasks on the
workers of an active ``dask.distributed`` client.

``register_stack`` passes over the stack in batches several times (align, average, score).
Each pass is written once, as a *job*: a module-level function of ``(source, frames slice,
...)`` that reads its own frames from the :class:`~._frames.FrameSource` and returns
something small (shifts, transforms, scores, or one frame-sized sum). A runner decides
where jobs run:

- :class:`LocalBatches` runs them in this process, batch after batch, relaying each job's
  progress snapshots (one per iteration) and its stop signal;
- :class:`ClusterBatches` submits one task per batch to the workers of a client. Each task
  reads its frames on the worker (the source's dask graph or zarr store is what travels,
  never the pixels), holds at most one batch, and returns its small result; a progress
  snapshot is yielded per finished batch (``as_completed``) and a stop cancels the tasks
  not finished. Frame-sized values that several tasks share (a reference frame, a mean)
  are made by tasks and passed on as futures, so they stay on the workers; sums over
  batches are reduced pairwise by tasks.

Values a runner hands back from :meth:`value` and :meth:`reduce` are opaque: tensors here,
futures on a cluster; they are only passed on as arguments of later jobs.
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import torch

from .._devices import resolve_device
from ..io import trim
from ..io.tasks import active_client, device_slot
from ._driver import drive


def batches(total: int, size: int, first: int = 0):
    """The slices ``first:first+size, ...`` covering ``range(first, total)``."""
    for start in range(first, total, size):
        yield slice(start, min(total, start + size))


def _args(sl, shared, sliced):
    """A job's arguments after its slice: its part of ``sliced`` (if any) first, so that
    a task receives only its own batch's share of a long list."""
    return shared if sliced is None else (sliced[sl], *shared)


class LocalBatches:
    """Jobs run in this process, in batch order (the source's own device)."""

    def __init__(self, src):
        self.src = src
        #: the resident set (bytes) above which a lazy batch is followed by a trim; None:
        #: after every lazy batch
        self.trim_above: int | None = None

    def bound(self, budget_bytes: int) -> None:
        """Trim only once the resident set exceeds what it is now by ``budget_bytes``: the
        run's memory stays within its budget and a batch's garbage, and a run well within
        its budget pays no trims (each makes the next batch fault its pages in again: a
        lazy 20 x 512² stack ran in 1.65 s with a trim per batch, 0.82 s without)."""
        now = trim.resident_bytes()
        self.trim_above = None if now is None else now + int(budget_bytes)

    def _release(self) -> None:
        """A lazy stack's batch, read through dask's threads and freed: its memory back to
        the system (io/trim.py) once the resident set is past :attr:`trim_above`. Not after
        a batch of an in-memory stack, which leaves nothing in those threads' arenas:
        trimming then only makes the next batch fault its pages in again (20 × 512² NumPy
        frames, translation: 0.31 -> 0.55 s)."""
        if not self.src.lazy:
            return
        if self.trim_above is not None and (trim.resident_bytes() or 0) <= self.trim_above:
            return
        trim.release()

    def map(self, job, total, size, *shared, history, state, progress=None):
        """Run generator job ``job(src, sl, history, *shared)`` (it yields progress
        snapshots and returns ``(result, stopped)``) on each batch of ``range(total)``
        (a generator returning the list of results, one per batch, None for the batches
        not reached after a stop). ``progress`` is not used here (each job yields its own
        snapshots, one per iteration)."""
        out = [None] * math.ceil(total / size)
        for i, sl in enumerate(batches(total, size)):
            out[i], stopped = yield from job(self.src, sl, history, *shared)
            self._release()
            if stopped:
                state["stopped"] = True
                break
        return out

    def each(self, fn, total, size, *shared, sliced=None):
        """``fn(src, sl, *shared)`` for each batch, in batch order (an iterator); with
        ``sliced`` (a sequence over ``range(total)``), ``fn(src, sl, sliced[sl], *shared)``."""
        for sl in batches(total, size):
            value = fn(self.src, sl, *_args(sl, shared, sliced))
            self._release()
            yield value

    def reduce(self, part, combine, total, size, *shared, sliced=None):
        """``combine`` of the ``part(src, sl, *shared)`` of every batch, in batch order
        (``sliced`` as in :meth:`each`)."""
        acc = None
        for sl in batches(total, size):
            value = part(self.src, sl, *_args(sl, shared, sliced))
            acc = value if acc is None else combine(acc, value)
            self._release()
        return acc

    def value(self, fn, *args):
        """``fn(src, *args)``."""
        return fn(self.src, *args)

    def task_budget(self):
        """No cap beyond this process's budget."""
        return None

    def tasks_at_once(self) -> int:
        """How many jobs hold memory at once in one process: one, here."""
        return 1


def _on_worker(src, device):
    """A copy of ``src`` reading onto this worker's device (resolved here: each worker
    picks its own GPU, or the CPU)."""
    dev = resolve_device(device)
    out = copy.copy(src)
    out.device = dev
    return out, dev


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


def _run(fn, src, device, *args):
    """The body of every task: the frames are read on the worker with dask's synchronous
    scheduler (a task that submitted the graph of its frames to the cluster it runs on
    could wait forever on a worker whose threads are all taken), and a GPU is used by at
    most :data:`~napari_simwarp.io.tasks.GPU_TASKS` tasks at once."""
    import dask

    src, dev = _on_worker(src, device)
    args = [_to(a, dev) for a in args]
    try:
        with dask.config.set(scheduler="synchronous"), device_slot(dev):
            return _to(fn(src, *args), "cpu")
    finally:
        # The batch freed in this worker thread's malloc arena goes back to the system, as
        # after a local batch (a threaded LocalCluster grew by 196 MiB over a 64 MiB budget)
        trim.release()


def _run_job(job, src, device, sl, *shared):
    history: list[float] = []

    def body(src, *args):
        result, _ = drive(job(src, sl, history, *args))
        return result

    return _run(body, src, device, *shared), history


def _run_each(fn, src, device, sl, *shared):
    return _run(lambda s, *a: fn(s, sl, *a), src, device, *shared)


class ClusterBatches:
    """Jobs run as ``dask.distributed`` tasks on ``client``'s workers, one per batch.

    ``device`` is the device argument as the user gave it: each worker resolves it
    (``"auto"``: the worker's GPU if it has one).
    """

    def __init__(self, src, client, device):
        self.src = src
        self.client = client
        self.device = device
        # The source (a dask graph or a zarr store, not pixels) goes to each worker once,
        # not with every task; raises when it cannot be pickled.
        self.source = client.scatter(src, broadcast=True, hash=False)

    def _submit(self, fn, *args, priority=0):
        return self.client.submit(fn, *args, pure=False, priority=priority)

    def map(self, job, total, size, *shared, history, state, progress):
        """As :meth:`LocalBatches.map`, the batches as tasks: yields
        ``progress(sl, result, losses)`` per finished batch; a true value sent back
        cancels the tasks not finished (their batches' results are None)."""
        from distributed import as_completed

        slices = list(batches(total, size))
        futures = [
            self._submit(_run_job, job, self.source, self.device, sl, *shared) for sl in slices
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(slices)
        losses = [None] * len(slices)
        try:
            for future in as_completed(futures):
                i = index[future.key]
                out[i], losses[i] = future.result()
                future.release()
                if (yield progress(slices[i], out[i], losses[i])):
                    state["stopped"] = True
                    break
        finally:
            self.client.cancel([f for f in futures if not f.done()])
        for part in losses:  # the loss history in batch order, as a local run gives it
            history.extend(part or [])
        return out

    def each(self, fn, total, size, *shared, sliced=None):
        futures = [
            self._submit(_run_each, fn, self.source, self.device, sl, *_args(sl, shared, sliced))
            for sl in batches(total, size)
        ]
        try:
            for future in futures:
                yield future.result()
                future.release()
        finally:
            self.client.cancel([f for f in futures if not f.done()])

    def reduce(self, part, combine, total, size, *shared, sliced=None):
        """A future of the pairwise (tree) reduction of the batches' parts: each pair is
        combined as soon as both are ready (combining comes first among ready tasks), so
        few parts wait on the workers at once."""
        level = [
            self._submit(_run_each, part, self.source, self.device, sl, *_args(sl, shared, sliced))
            for sl in batches(total, size)
        ]
        while len(level) > 1:
            pairs = [
                self._submit(combine, level[i], level[i + 1], priority=1)
                for i in range(0, len(level) - 1, 2)
            ]
            level = pairs + level[len(pairs) * 2 :]
        return level[0]

    def value(self, fn, *args):
        return self._submit(_run, fn, self.source, self.device, *args, priority=1)

    def bound(self, budget_bytes: int) -> None:
        """Each task trims after its batch (its worker's memory is not this process's)."""

    def tasks_at_once(self) -> int:
        """How many tasks a worker runs at once (its threads; the most of any worker)."""
        workers = self.client.scheduler_info()["workers"].values()
        return max([int(w.get("nthreads") or 1) for w in workers] or [1])

    def task_budget(self):
        """The RAM one task may hold by default: :data:`~napari_simwarp.io.budget.
        DEFAULT_FRACTION` of the smallest worker's memory limit per thread (None when no
        worker has a limit)."""
        from ..io import budget

        shares = [
            w["memory_limit"] // max(1, w["nthreads"])
            for w in self.client.scheduler_info()["workers"].values()
            if w.get("memory_limit")
        ]
        if not shares:
            return None
        share = int(budget.DEFAULT_FRACTION * min(shares))
        return budget.Budget(
            share,
            f"{budget.DEFAULT_FRACTION:.0%} of a dask worker's memory limit per thread "
            f"({budget.format_bytes(min(shares))})",
        )


#: a dask graph holding an in-memory array larger than this is not sent to workers
GRAPH_ARRAY_BYTES = 16 * 2**20


def _holds_pixels(data) -> bool:
    """Whether the dask array ``data``'s graph holds a large in-memory (or memory-mapped)
    array: sending it to workers would move those pixels, not a way to read them."""
    if not hasattr(data, "__dask_graph__"):
        return False
    values = dict(data.__dask_graph__()).values()  # a zarr array in it is a store, not pixels
    return any(isinstance(v, np.ndarray) and v.nbytes > GRAPH_ARRAY_BYTES for v in values)


def runner_for(src, device):
    """The runner of ``src``'s batches: on the active client's workers when there is one
    and the stack is lazy (dask or zarr: each task reads its own frames) and can be sent
    to them; here otherwise (a NumPy or torch stack is already in this process's memory:
    sending it to workers would move every pixel through it).

    A lazy stack that cannot be sent (it cannot be pickled, e.g. an open file's Zarr view,
    or its graph holds the pixels themselves) runs here too, with a warning saying why.
    """
    client = active_client()
    if client is None or not src.lazy:
        return LocalBatches(src)
    why = None
    if _holds_pixels(src.data):
        why = "its dask graph holds the pixels themselves (an in-memory or memory-mapped array)"
    else:
        try:
            return ClusterBatches(src, client, device)
        except Exception as exc:  # pickling errors come as TypeError, PicklingError, ...
            why = f"it cannot be sent to them ({type(exc).__name__}: {exc})"
    warnings.warn(
        f"the stack's frame batches run in this process, not on the dask workers: {why}; "
        "give a dask array that reads the frames from files by path, or a Zarr store",
        RuntimeWarning,
        stacklevel=3,
    )
    return LocalBatches(src)
