"""The compiled kernels: loading them, choosing them per call, and reporting the choice.

The kernels in ``csrc/`` are an optional speed layer. The first call of an op that has a
compiled implementation builds them (:mod:`._build`; cached between runs) and registers
their fake and autograd implementations (:mod:`._registrations`). Where the build fails
or no compiler exists, the pure torch twins in :mod:`.._reference` run instead, after one
warning that says why. Importing this package builds nothing.

An operator asks :func:`implementation` for the module to call: :mod:`.calls` (the
kernels) or :mod:`.._reference` (pure torch); both define the same functions.

Environment:
    SIMWARP_BACKEND    "auto" (default: compiled where it builds, else torch),
                       "torch" (never build), "compiled" (build or raise).
    SIMWARP_CACHE_DIR  where builds are cached (default ~/.cache/napari-simwarp).
"""

from __future__ import annotations

import os
import shutil
import threading
import warnings
from types import ModuleType

import torch

from .. import _reference
from . import _build

ENV_BACKEND = "SIMWARP_BACKEND"
ENV_CACHE = _build.ENV_CACHE
BACKENDS = ("auto", "torch", "compiled")

#: public op name -> the torch.ops.simwarp ops that implement it.
COMPILED_OPS = {
    "local_std": (
        "local_std_2d_fwd",
        "local_std_2d_bwd",
        "local_std_fwd",
        "local_std_bwd",
        "box_sum",
    ),
    "splat": ("splat_fwd", "splat_bwd"),
    "ssim": ("moments5", "correlate"),
    "local_ncc": ("moments5", "box_sum", "correlate"),
}

#: ops whose compiled kernel "auto" uses only on these device types, because the pure
#: torch path measured faster elsewhere (docs/benchmarks.md). SIMWARP_BACKEND=compiled
#: still runs the kernel on every device it is built for.
AUTO_DEVICE_TYPES = {
    # The CPU splat scatters serially per image (bitwise deterministic); torch's scatter_add_
    # was faster at 2048² on 2 cores (forward 46 against 76 ms), CUDA atomics are not serial.
    "splat": {"cuda"},
}

_lock = threading.Lock()
_state: dict = {
    "tried": False,
    "cpu": False,
    "cuda": False,
    "error": None,
    "cuda_error": None,
    "path": None,
    "cuda_path": None,
}


class CompiledBackendError(RuntimeError):
    """SIMWARP_BACKEND=compiled was asked for and the kernels could not be built or loaded."""


def requested_backend() -> str:
    """The backend asked for through ``SIMWARP_BACKEND`` (validated)."""
    value = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV_BACKEND} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value


def state() -> dict:
    """A copy of the load state: tried, cpu, cuda (loaded), error, cuda_error, paths."""
    return dict(_state)


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else repr(exc)}"


def _load(verbose: bool = False) -> None:
    """Build and load the CPU extension, then the CUDA one where possible (holds _lock)."""
    from ._registrations import register_fakes_and_autograd

    _state["path"] = str(_build.build("cpu", verbose))
    register_fakes_and_autograd()
    _state["cpu"] = True
    possible, why = _build.cuda_build_possible()
    if not possible:
        _state["cuda_error"] = why
        if torch.cuda.is_available():
            warnings.warn(
                f"napari-simwarp: CUDA kernels not built ({why}); CUDA tensors use "
                "the pure torch operators.",
                RuntimeWarning,
                stacklevel=4,
            )
        return
    try:
        _state["cuda_path"] = str(_build.build("cuda", verbose))
        _state["cuda"] = True
    except Exception as exc:  # the CPU kernels stay; CUDA tensors take the torch path
        _state["cuda_error"] = _short_error(exc)
        warnings.warn(
            f"napari-simwarp: the CUDA kernels failed to build "
            f"({_state['cuda_error']}); CUDA tensors use the pure torch operators.",
            RuntimeWarning,
            stacklevel=4,
        )


def ensure_loaded(verbose: bool = False) -> bool:
    """Build/load the kernels once per process; False (after one warning) if that fails."""
    if _state["tried"]:
        return _state["cpu"]
    with _lock:
        if _state["tried"]:
            return _state["cpu"]
        backend = requested_backend()
        error = None
        if backend == "torch":
            error = f"{ENV_BACKEND}=torch"
        elif shutil.which(os.environ.get("CXX", "c++")) is None:
            error = "no C++ compiler found (install g++ or set CXX)"
        else:
            try:
                _load(verbose)
            except Exception as exc:  # any build or load failure falls back to torch
                error = _short_error(exc)
        _state.update(tried=True, error=error)
        if error is not None and backend != "torch":
            if backend == "compiled":
                raise CompiledBackendError(
                    f"{ENV_BACKEND}=compiled, but the kernels could not be built: {error}"
                )
            warnings.warn(
                f"napari-simwarp: compiled kernels unavailable ({error}); using the pure "
                f"torch operators. Set {ENV_BACKEND}=torch to silence this.",
                RuntimeWarning,
                stacklevel=3,
            )
        return _state["cpu"]


def use_compiled(op: str, *tensors: torch.Tensor) -> bool:
    """Whether ``op`` should run its compiled implementation on these tensors' device."""
    backend = requested_backend()
    if op not in COMPILED_OPS or backend == "torch":
        return False
    device_types = {t.device.type for t in tensors}
    if not device_types <= {"cpu", "cuda"}:
        return False  # MPS and others: pure torch
    if backend == "auto" and not device_types <= AUTO_DEVICE_TYPES.get(op, {"cpu", "cuda"}):
        return False
    if not ensure_loaded():
        return False
    return "cuda" not in device_types or _state["cuda"]


def implementation(op: str, *tensors: torch.Tensor) -> ModuleType:
    """The module whose functions run ``op`` on these tensors: kernels or pure torch."""
    if use_compiled(op, *tensors):
        from . import calls

        return calls
    return _reference


def build_all(verbose: bool = False) -> dict:
    """Build (or find in the cache) and load every extension this machine can build.

    Returns ``{"cpu": path, "cuda": path or the reason it was not built}``; raises what
    the CPU build raised.
    """
    with _lock:
        if not _state["cpu"]:
            _load(verbose)
            _state.update(tried=True, error=None)
    return {"cpu": _state["path"], "cuda": _state["cuda_path"] or _state["cuda_error"]}


def report(public_ops, build: bool = True) -> dict:
    """Which backend runs each op, per device type, and why (``backend_info``'s body).

    ``public_ops``: the names to report besides the compiled ones. ``build=False`` never
    builds; ops whose kernels are not loaded yet are then ``"pending"``.
    """
    backend = requested_backend()
    pending = backend != "torch" and not build and not _state["tried"]
    loaded = backend != "torch" and (_state["cpu"] if not build else ensure_loaded())
    cuda_ok, cuda_reason = _build.cuda_build_possible()
    ops = {}
    for op in sorted(set(public_ops) | set(COMPILED_OPS)):
        if op not in COMPILED_OPS:
            why = "no compiled implementation (pure torch)"
            ops[op] = {"cpu": ("torch", why), "cuda": ("torch", why)}
        elif backend == "torch":
            ops[op] = dict.fromkeys(("cpu", "cuda"), ("torch", f"{ENV_BACKEND}=torch"))
        elif pending:
            ops[op] = dict.fromkeys(("cpu", "cuda"), ("pending", "kernels are built on first use"))
        elif not loaded:
            ops[op] = dict.fromkeys(("cpu", "cuda"), ("torch", f"build failed: {_state['error']}"))
        else:
            auto_devices = AUTO_DEVICE_TYPES.get(op, {"cpu", "cuda"})
            slower = "pure torch measured faster on this device type"
            cpu = ("compiled", "built kernels")
            if backend == "auto" and "cpu" not in auto_devices:
                cpu = ("torch", slower)
            cuda = (
                ("compiled", "built kernels")
                if _state["cuda"]
                else ("torch", _state["cuda_error"] or cuda_reason)
            )
            ops[op] = {"cpu": cpu, "cuda": cuda}
    return {
        "requested": backend,
        "build": {
            "tried": _state["tried"],
            "loaded": loaded,
            "cuda_kernels": bool(_state["cuda"]) and cuda_ok,
            "path": _state["path"],
            "cuda_path": _state["cuda_path"],
            "error": _state["error"],
            "cuda_error": _state["cuda_error"],
        },
        "ops": ops,
    }
