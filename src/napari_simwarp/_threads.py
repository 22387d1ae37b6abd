"""The CPU threads of torch's operators in a napari session: one core left to the viewer.

torch runs its CPU operators on an OpenMP pool of one thread per core, whose threads spin
at the end of each operator for the next one. In a viewer, a worker's run shares the cores
with the GUI thread (and, with software OpenGL, the rasterizer's threads), and with every
core in the pool an operator waits for whichever of its threads lost its core, thousands of
operators a run. Measured on this project's 2-core machines (docs/benchmarks.md, "Issue
27, fifth pass"): under Xvfb, the Register widget's deformable runs took 0.74-0.89 s with
one thread and 0.89-1.25 s with two; headless, with another program busy on one core, an
affine ``register`` took a median of 3.8-9.8 s per call with two threads in three
processes of four (0.26 s quiet) and 0.36-0.43 s with one.

A viewer's widgets therefore leave one core out of the pool, once per process, unless the
user chose the count with ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) in the environment.
It holds for the threads that run torch after it (a widget's workers, the GUI thread): an
OpenMP thread keeps the count it started with. Scripts and the command line that make no
widget keep torch's default.
"""

from __future__ import annotations

import os

#: environment variables by which a user sets the CPU threads of torch and its libraries
USER_CHOICE = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_state = {"done": False}


def leave_a_core_for_the_viewer() -> int | None:
    """Let torch's CPU operators use one thread fewer (at least one), the first time this
    is called in the process; the thread count set, or None when nothing was changed (a
    later call, a count the user chose, a single thread already)."""
    if _state["done"]:
        return None
    _state["done"] = True
    if any(os.environ.get(name, "").strip() for name in USER_CHOICE):
        return None
    import torch

    threads = torch.get_num_threads()
    if threads <= 1:
        return None
    torch.set_num_threads(threads - 1)
    return threads - 1
