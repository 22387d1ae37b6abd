"""Which implementation runs each operator, and building the compiled kernels on demand.

    napari_simwarp.backend_info()        # {"requested", "build", "ops": {op: {device: ...}}}
    napari_simwarp.backend.build_kernels()

The command line has the same: ``napari-simwarp info`` and ``napari-simwarp build-kernels``.
"""

from __future__ import annotations

from .ops import __all__ as _PUBLIC_OPS
from .ops import _kernels

_OPERATORS = [name for name in _PUBLIC_OPS if name[0].islower() and name not in ("loss_for",)]


def backend_info(build: bool = True) -> dict:
    """Which backend runs each op, per device type, and why.

    Parameters
    ----------
    build : bool
        True (default): trigger the one-time build where the requested backend allows
        one, so the answer is final. False: never build (cheap, for a GUI); ops whose
        kernels have not been loaded yet are reported as ``"pending"``.

    Returns
    -------
    dict
        ``{"requested": ..., "build": {...}, "ops": {op: {"cpu": (backend, reason),
        "cuda": (backend, reason)}}}``, backend one of "compiled", "torch", "pending".
    """
    return _kernels.report(_OPERATORS, build=build)


def build_kernels(verbose: bool = False) -> dict:
    """Build (or find in the cache) and load the kernels now, instead of on first use.

    Returns ``{"cpu": build directory, "cuda": build directory or why none}``; raises what
    the C++ compiler raised when the CPU kernels cannot be built.
    """
    return _kernels.build_all(verbose)
