"""The compiled kernels: loading them, choosing them per call, and reporting the choice.

The kernels in ``csrc/`` are an optional speed layer. The first call of an op that has a
compiled implementation builds them (:mod:`._build`; cached between runs) and registers
their fake and autograd implementations (:mod:`._registrations`). Where the build fails
or no compiler exists, the pure torch twins in :mod:`.._reference` run instead, after one
warning that says why. Importing this package builds nothing.

An operator asks :func:`implementation` for the module to call: :mod:`.calls` (the
kernels) or :mod:`.._reference` (pure torch); both define the same functions.

On CUDA, "auto" runs an op's kernels only once they have passed a self-check on that
device (:mod:`.self_check`: each primitive against its torch twin, values and gradients,
at the first use on each device); an op that fails it takes the torch path there, after
one warning, and :func:`report` says why. Under "auto" a child process also checks, once
per build and device type, that a call the C++ bindings refuse raises a Python exception
there (:mod:`.refusal_probe`); where it kills the child instead, the ops run pure torch on
that device type, after one warning. Under ``torch.use_deterministic_algorithms(True)``
"auto" sends splat on CUDA (whose kernel scatters with atomics) to the torch path, which
torch makes deterministic; "compiled" runs the kernel, which then raises torch's
non-determinism error.

Environment:
    SIMWARP_BACKEND    "auto" (default: compiled where it builds and, on CUDA, passes its
                       self-check; else torch), "torch" (never build), "compiled" (build
                       or raise; no self-check).
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
from . import _build, refusal_probe, self_check

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
    "mutual_information": ("parzen_fwd", "parzen_bwd"),
    # its scaling and squaring (also the diffeomorphic models' exponential)
    "integrate_velocity": ("squaring_fwd", "squaring_bwd"),
    "ssim": ("moments5", "correlate"),
    "local_ncc": ("moments5", "box_sum", "correlate"),
}

#: the device types the compiled kernels are built for; others (Apple's MPS, ...) always
#: take the pure torch path
KERNEL_DEVICE_TYPES = frozenset({"cpu", "cuda"})

#: ops whose compiled kernel "auto" uses only on these device types, because the pure
#: torch path measured faster elsewhere (docs/benchmarks.md). SIMWARP_BACKEND=compiled
#: still runs the kernel on every device it is built for.
AUTO_DEVICE_TYPES = {
    # The CPU splat scatters serially per image (bitwise deterministic); torch's scatter_add_
    # was faster at 2048² on 2 cores (forward 46 against 76 ms), CUDA atomics are not serial.
    "splat": {"cuda"},
}

#: device types on which "auto" runs a compiled op only after it passed the self-check
#: there. The CPU kernels are held to the same twins by the test suite on every CI run.
SELF_CHECKED_DEVICE_TYPES = {"cuda"}

#: ops whose kernels are not deterministic on these device types (atomic additions).
NONDETERMINISTIC = {
    "splat": {"cuda"},
    "mutual_information": {"cuda"},
    "integrate_velocity": {"cuda"},
}

_lock = threading.Lock()
_check_lock = threading.Lock()
#: str(device) -> {op: self_check.Check}, filled at the first use on each device
_checks: dict[str, dict[str, self_check.Check]] = {}
_state: dict = {
    "tried": False,
    "cpu": False,
    "cuda": False,
    "error": None,
    "cuda_error": None,
    "path": None,
    "cuda_path": None,
    #: device type -> why the refusal probe failed there (those run pure torch under "auto")
    "refusal": {},
}
#: set: operators called before the kernels are loaded take the torch path instead of
#: building them (or waiting for a build) first; the widgets' "pure torch while the kernels
#: build" (issue 13), whose own worker builds them meanwhile
_torch_until_loaded = threading.Event()


def torch_until_loaded(on: bool | None = None) -> bool:
    """Whether operators take the torch path until the kernels are loaded (instead of
    building them first); ``on`` sets it. Once loaded, the kernels run as usual."""
    if on is not None:
        _torch_until_loaded.set() if on else _torch_until_loaded.clear()
    return _torch_until_loaded.is_set()


class CompiledBackendError(RuntimeError):
    """SIMWARP_BACKEND=compiled was asked for and the kernels could not be built or loaded."""


def requested_backend() -> str:
    """The backend asked for through ``SIMWARP_BACKEND`` (validated)."""
    value = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV_BACKEND} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value


def state() -> dict:
    """A copy of the load state: tried, cpu, cuda (loaded), error, cuda_error, paths,
    refusal (device type -> why its refusal probe failed)."""
    return {**_state, "refusal": dict(_state["refusal"])}


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else repr(exc)}"


def _load(verbose: bool = False) -> None:
    """Build and load the CPU extension, then the CUDA one where possible (holds _lock)."""
    from ._registrations import register_fakes_and_autograd

    _state["path"] = str(_build.build("cpu", verbose))
    register_fakes_and_autograd()
    _state["cpu"] = True
    _probe_refusal(("cpu",), "cpu", _state["path"])
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
        from ._registrations import (
            register_fused_local_ncc_fakes,
            register_fused_local_std_fakes,
            register_fused_ssim_fakes,
        )

        register_fused_ssim_fakes("simwarp")  # the CUDA-only ops the CUDA build defines
        register_fused_local_std_fakes("simwarp")
        register_fused_local_ncc_fakes("simwarp")
        _state["cuda"] = True
        if torch.cuda.is_available():
            _probe_refusal(("cpu", "cuda"), "cuda", _state["cuda_path"])
    except Exception as exc:  # the CPU kernels stay; CUDA tensors take the torch path
        _state["cuda_error"] = _short_error(exc)
        warnings.warn(
            f"napari-simwarp: the CUDA kernels failed to build "
            f"({_state['cuda_error']}); CUDA tensors use the pure torch operators.",
            RuntimeWarning,
            stacklevel=4,
        )


def _probe_refusal(kinds: tuple[str, ...], device: str, directory: str) -> None:
    """Under "auto", the refusal probe of the extensions ``kinds`` on ``device``; a failure
    sends that device type to the torch path, after one warning."""
    if requested_backend() != "auto":
        return
    failure = refusal_probe.probe_once(kinds, device, directory)
    if failure is None or failure.startswith(refusal_probe.INCONCLUSIVE):
        return  # raised as it must, or no evidence of a crash: the kernels stay
    device_type = torch.device(device).type
    _state["refusal"][device_type] = failure
    warnings.warn(
        f"napari-simwarp: the compiled kernels are not used on {device_type}: {failure}. "
        f"The pure torch operators run there instead (same results, slower). Rebuilding "
        f"with another compiler (CXX=...) may fix it; {ENV_BACKEND}=torch silences this.",
        RuntimeWarning,
        stacklevel=5,
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


def device_checks(device: torch.device) -> dict[str, self_check.Check]:
    """The self-check's results on ``device``, running it first if it has not run there.

    One warning names the ops that failed, which then take the torch path on ``device``.
    """
    key = str(device)
    if key in _checks:
        return _checks[key]
    with _check_lock:
        if key not in _checks:
            results = self_check.check_device(device)
            failed = {op: c for op, c in results.items() if not c.passed}
            if failed:
                reasons = "; ".join(sorted({c.reason for c in failed.values()}))
                warnings.warn(
                    f"napari-simwarp: the compiled kernels of {', '.join(sorted(failed))} "
                    f"failed their self-check on {key} ({reasons}); these ops use the pure "
                    f"torch operators on {key}.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            _checks[key] = results
    return _checks[key]


def _deterministic_refusal(op: str, device_types: set[str]) -> str | None:
    """Why "auto" must not run ``op``'s kernels here under deterministic algorithms."""
    if torch.are_deterministic_algorithms_enabled() and device_types & NONDETERMINISTIC.get(
        op, set()
    ):
        return "torch.use_deterministic_algorithms(True): the kernel uses atomic additions"
    return None


def use_compiled(op: str, *tensors: torch.Tensor) -> bool:
    """Whether ``op`` should run its compiled implementation on these tensors' device."""
    backend = requested_backend()
    if op not in COMPILED_OPS or backend == "torch":
        return False
    device_types = {t.device.type for t in tensors}
    if not device_types <= KERNEL_DEVICE_TYPES:
        return False  # MPS and others: pure torch
    if backend == "auto" and not device_types <= AUTO_DEVICE_TYPES.get(op, KERNEL_DEVICE_TYPES):
        return False
    if not _state["tried"] and _torch_until_loaded.is_set():
        return False  # not loaded yet, and asked not to wait: a build may be under way
    if not ensure_loaded():
        return False
    if "cuda" in device_types and not _state["cuda"]:
        return False
    if backend == "compiled":
        return True
    if device_types & _state["refusal"].keys():
        return False
    if _deterministic_refusal(op, device_types):
        return False
    checked = {t.device for t in tensors if t.device.type in SELF_CHECKED_DEVICE_TYPES}
    return all(device_checks(device)[op].passed for device in checked)


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


def _report_device(device_type: str) -> torch.device | None:
    """The device whose self-check a report shows for a device type, if there is one."""
    if device_type == "cuda":
        if not (_state["cuda"] and torch.cuda.is_available()):
            return None
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def _checked_backend(op: str, device_type: str, build: bool) -> tuple[str, str]:
    """``(backend, reason)`` of a built op on a self-checked device type under "auto"."""
    device = _report_device(device_type)
    if device is None:
        return ("compiled", "built kernels")
    checks = device_checks(device) if build else _checks.get(str(device))
    if checks is None:
        return ("pending", f"self-check on first use on {device}")
    check = checks[op]
    if not check.passed:
        return ("torch", f"self-check failed on {device}: {check.reason}")
    return (
        "compiled",
        f"self-check passed on {device} (largest relative difference from pure torch "
        f"{check.error:.1e}, tolerance {check.tolerance:.0e})",
    )


def report(public_ops, build: bool = True) -> dict:
    """Which backend runs each op, per device type, and why (``backend_info``'s body).

    ``public_ops``: the names to report besides the compiled ones. ``build=False`` never
    builds and never runs the self-check; ops whose kernels are not loaded yet (or not
    checked yet on a device that needs it) are then ``"pending"``. ``"self_check"`` holds
    the self-check's figures per device and op.
    """
    backend = requested_backend()
    pending = backend != "torch" and not build and not _state["tried"]
    loaded = backend != "torch" and (_state["cpu"] if not build else ensure_loaded())
    cuda_ok = _build.cuda_build_possible()[0]
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
            ops[op] = {
                device_type: _device_backend(op, device_type, backend, build)
                for device_type in ("cpu", "cuda")
            }
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
            "refusal_probe": dict(_state["refusal"]),
        },
        "self_check": {
            device: {op: check.as_dict() for op, check in checks.items()}
            for device, checks in _checks.items()
        },
        "ops": ops,
    }


def _device_backend(op: str, device_type: str, backend: str, build: bool) -> tuple[str, str]:
    """``(backend, reason)`` of an op whose kernels are loaded, on one device type."""
    if device_type == "cuda" and not _state["cuda"]:
        return ("torch", _state["cuda_error"] or _build.cuda_build_possible()[1])
    if backend == "compiled":
        return ("compiled", "built kernels (SIMWARP_BACKEND=compiled: no self-check)")
    if device_type not in AUTO_DEVICE_TYPES.get(op, KERNEL_DEVICE_TYPES):
        return ("torch", "pure torch measured faster on this device type")
    if device_type in _state["refusal"]:
        return ("torch", _state["refusal"][device_type])
    refusal = _deterministic_refusal(op, {device_type})
    if refusal:
        return ("torch", refusal)
    if device_type in SELF_CHECKED_DEVICE_TYPES:
        return _checked_backend(op, device_type, build)
    return ("compiled", "built kernels")
