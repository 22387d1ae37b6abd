"""The refusal probe: does a C++ argument check end in a Python exception on this machine?

A ``TORCH_CHECK`` that fails throws a C++ exception, which torch turns into a
``RuntimeError``. On one GPU machine (issue 23) every such throw from our extensions ended
the process with SIGSEGV instead. :mod:`.preconditions` keeps our own calls away from the
C++ refusals, but a machine whose exceptions cannot cross the extension boundary is one
where any other error in a kernel call (a failed allocation, a launch error) kills the
process too. So under "auto", once per build and device type, a child process loads the
extension the way this process does and makes one call its binding refuses; if the child
dies (a signal, a hang) or the call does not raise, :mod:`._kernels` runs the pure torch
operators on that device type, after one warning that says why.

A probe that passed is remembered beside the build (``refusal-probe-<device>.ok`` in its
cache directory, with the interpreter that ran it), so it costs one child process (about
2 s) per build, not per process.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys

import torch

#: the child: load the extensions of ``kinds`` as :func:`._build.build` does, register the
#: autograd wrappers (the crash was seen inside them), then make ``{call}`` on a
#: ``(1, 2, 8, 9)`` tensor ``x``. Exit 0: it raised a RuntimeError saying ``{says}``.
_CHILD_TEMPLATE = """
import sys
import torch
from napari_simwarp.ops._kernels import _build, _registrations

kinds, device = sys.argv[1].split(","), sys.argv[2]
for kind in kinds:
    _build.build(kind)
_registrations.register_fakes_and_autograd()
x = torch.rand(1, 2, 8, 9, device=device)
try:
    {call}
except RuntimeError as exc:
    sys.exit(0 if {says!r} in str(exc) else 4)
sys.exit(3)
"""


def child_code(call: str, says: str = "") -> str:
    """The code of a child that makes ``call`` (a refused one) and checks what it raised."""
    return _CHILD_TEMPLATE.format(call=call, says=says)


#: the probe's own refused call: a window size of 0 (``checks::window``)
CHILD = child_code("torch.ops.simwarp.box_sum(x, [0, 3], False)", "window sizes must be at least 1")

#: what a child's exit code other than 0 means
_EXIT_MEANING = {
    3: "the call it must refuse ran",
    4: "the call was refused with an unexpected message",
}

#: the start of what :func:`run` returns when the child could not make the call at all (a
#: Python error on the way, no process): no evidence either way, so the kernels stay
INCONCLUSIVE = "inconclusive: "

#: seconds a child may take (it loads cached builds: about 2 s; a hang is a failure)
TIMEOUT = 120.0


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the process died with {name}"
    return _EXIT_MEANING.get(returncode, f"the process exited with status {returncode}")


def run(kinds: tuple[str, ...], device: str, *, child: str | None = None) -> str | None:
    """Run the probe in a child process; ``None`` if the refusal raised, else why not
    (starting with :data:`INCONCLUSIVE` when the child never made the call).

    ``kinds``: the extensions to load (``("cpu",)`` or ``("cpu", "cuda")``); ``device``:
    where the refused call runs. ``child`` replaces the child's code (tests).
    """
    if getattr(sys, "frozen", False):  # a bundled app: sys.executable is not a Python
        return None
    package_root = pathlib.Path(__file__).resolve().parents[3]  # holds napari_simwarp/
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), *filter(None, [env.get("PYTHONPATH")])])
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD if child is None else child, ",".join(kinds), device],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"a refused argument hung the process for over {TIMEOUT:.0f} s"
    except OSError as exc:  # no child possible at all: say so, do not guess
        return f"{INCONCLUSIVE}the probe could not start a process ({exc})"
    if done.returncode == 0:
        return None
    if done.returncode == 1 and "Traceback" in done.stderr:  # it never reached the call
        last = done.stderr.strip().splitlines()[-1][:200]
        return f"{INCONCLUSIVE}the probe's child failed before the call ({last})"
    tail = done.stderr.strip().splitlines()[-1:] if done.stderr else []
    detail = f"; its last words: {tail[0][:200]}" if tail else ""
    return (
        f"a refused argument did not raise a Python exception in a child process "
        f"({_describe(done.returncode)}{detail})"
    )


def marker(directory: str | os.PathLike, device_type: str) -> pathlib.Path:
    """The file that records a passed probe of one build on one device type."""
    return pathlib.Path(directory) / f"refusal-probe-{device_type}.ok"


def probe_once(kinds: tuple[str, ...], device: str, directory: str | os.PathLike) -> str | None:
    """:func:`run`, unless a probe of this build on this device type passed before, with
    this interpreter."""
    device_type = torch.device(device).type
    path = marker(directory, device_type)
    try:
        if path.read_text().strip() == sys.executable:
            return None
    except OSError:  # not probed yet
        pass
    failure = run(kinds, device)
    if failure is None:
        with contextlib.suppress(OSError):  # a read-only cache: probe again next time
            path.write_text(f"{sys.executable}\n")
    return failure
