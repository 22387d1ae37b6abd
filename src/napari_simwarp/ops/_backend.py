"""Which implementation runs each op: compiled kernels (built on first use) or pure torch.

The kernels in ``napari_simwarp/csrc`` are an optional speed layer. On the first call of an
op that has a compiled implementation, this module builds them with
``torch.utils.cpp_extension`` (the CPU sources always; the CUDA sources only where torch
has CUDA and ``nvcc`` is found), caches the build between runs, and registers the ops'
fake and autograd implementations. Where the build fails or no compiler exists, the pure
torch operators run instead, after one warning that says why. Importing this module builds
nothing.

Environment:
    SIMWARP_BACKEND    "auto" (default: compiled where it builds, else torch),
                       "torch" (never build), "compiled" (build or raise).
    SIMWARP_CACHE_DIR  where builds are cached (default ~/.cache/napari-simwarp).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import shutil
import threading
import warnings

import torch

ENV_BACKEND = "SIMWARP_BACKEND"
ENV_CACHE = "SIMWARP_CACHE_DIR"
BACKENDS = ("auto", "torch", "compiled")

CSRC = pathlib.Path(__file__).resolve().parent.parent / "csrc"

#: public op name -> the torch.ops.simwarp ops that implement it.
COMPILED_OPS = {
    "local_std": ("local_std_2d_fwd", "local_std_2d_bwd", "local_std_fwd", "local_std_bwd",
                  "box_sum"),
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
_state: dict = {"tried": False, "loaded": False, "cuda": False, "error": None, "path": None}


class CompiledBackendError(RuntimeError):
    """SIMWARP_BACKEND=compiled was asked for and the kernels could not be built or loaded."""


def requested_backend() -> str:
    """The backend asked for through ``SIMWARP_BACKEND`` (validated)."""
    value = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV_BACKEND} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value


def cuda_build_possible() -> tuple[bool, str]:
    """Whether the CUDA sources can be built here, and why not when they cannot."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False, "torch has no usable CUDA"
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return False, "nvcc was not found (set CUDA_HOME)"
    return True, "torch has CUDA and nvcc was found"


def sources(with_cuda: bool) -> list[pathlib.Path]:
    """The C++ (and, with CUDA, .cu and binding) sources of the extension."""
    files = [CSRC / "ops.cpp", *sorted((CSRC / "cpu").glob("*.cpp"))]
    if with_cuda:
        files += sorted((CSRC / "cuda").glob("*.cu")) + [CSRC / "cuda" / "bindings.cpp"]
    return files


def host_cflags() -> list[str]:
    """Compiler flags of the C++ sources for this machine.

    On Linux x86-64 the kernels are built for the CPU they run on (``-march=native``: AVX2
    or AVX-512 instead of SSE2: at 2048² on a 2-core EPYC the local std backward ran 13%
    and the SSIM forward about 20% faster with it), as torch's inductor builds its C++ too. The build cache is then keyed by the CPU
    (``cpu_fingerprint``), so a home directory shared by different machines never loads
    another CPU's build.
    """
    # No -std flag: cpp_extension sets the standard torch's headers need.
    flags = ["-O3", "-fopenmp"]
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
        flags.append("-march=native")
    return flags


def cpu_fingerprint() -> str:
    """The CPU model and instruction-set flags (Linux), or the platform's processor name."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keys = ("model name", "flags", "Features", "CPU part")  # x86 and ARM spellings
    seen = {}
    for line in info:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keys and key not in seen:
            seen[key] = value.strip()
    return f"{platform.machine()} " + " | ".join(f"{k}: {seen[k]}" for k in sorted(seen))


def _build_directory(files: list[pathlib.Path], with_cuda: bool, cflags: list[str]) -> pathlib.Path:
    # A new directory per source content, torch version, flags and CPU: a stale build,
    # or one made for another machine's instruction set, is never loaded.
    digest = hashlib.sha256()
    for f in files + sorted(CSRC.rglob("*.h")):
        digest.update(f.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(" ".join(cflags).encode())
    digest.update(cpu_fingerprint().encode())
    root = pathlib.Path(os.environ.get(ENV_CACHE, pathlib.Path.home() / ".cache" / "napari-simwarp"))
    tag = f"{'cuda' if with_cuda else 'cpu'}-{digest.hexdigest()[:16]}"
    path = root / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


def build(verbose: bool = False) -> pathlib.Path:
    """Build (or find in the cache) and load the kernels; return the build directory.

    Raises whatever the compiler or loader raised; ``ensure_loaded`` turns that into a
    warning and a torch fallback.
    """
    from torch.utils import cpp_extension

    with_cuda, _ = cuda_build_possible()
    files = sources(with_cuda)
    cflags = host_cflags()
    build_dir = _build_directory(files, with_cuda, cflags)
    cpp_extension.load(
        name=f"simwarp_ops_{'cuda' if with_cuda else 'cpu'}",
        sources=[str(f) for f in files],
        extra_include_paths=[str(CSRC / "include"), str(CSRC)],
        extra_cflags=cflags,
        extra_cuda_cflags=["-O3"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        with_cuda=with_cuda,
        is_python_module=False,
        verbose=verbose,
    )
    from . import _compiled  # registers fake and autograd implementations

    _compiled.register()
    _state.update(cuda=with_cuda, path=str(build_dir))
    return build_dir


def ensure_loaded() -> bool:
    """Build/load the kernels once per process; False (after one warning) if that fails."""
    if _state["tried"]:
        return _state["loaded"]
    with _lock:
        if _state["tried"]:
            return _state["loaded"]
        backend = requested_backend()
        if backend == "torch":
            _state.update(tried=True, loaded=False, error=f"{ENV_BACKEND}=torch")
            return False
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            error = "no C++ compiler found (install g++ or set CXX)"
        else:
            try:
                build()
                error = None
            except Exception as exc:  # any build or load failure falls back to torch
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}"
        _state.update(tried=True, loaded=error is None, error=error)
        if error is not None:
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
        return _state["loaded"]


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
    backend = requested_backend()
    pending = backend != "torch" and not build and not _state["tried"]
    loaded = backend != "torch" and (_state["loaded"] if not build else ensure_loaded())
    cuda_ok, cuda_reason = cuda_build_possible()
    from . import __all__ as public_ops

    ops = {}
    for op in sorted(set(public_ops) | set(COMPILED_OPS)):
        if op not in COMPILED_OPS:
            why = "no compiled implementation (pure torch)"
            ops[op] = {"cpu": ("torch", why), "cuda": ("torch", why)}
        elif backend == "torch":
            ops[op] = {d: ("torch", f"{ENV_BACKEND}=torch") for d in ("cpu", "cuda")}
        elif pending:
            ops[op] = {d: ("pending", "kernels are built on first use") for d in ("cpu", "cuda")}
        elif not loaded:
            ops[op] = {d: ("torch", f"build failed: {_state['error']}") for d in ("cpu", "cuda")}
        else:
            auto_devices = AUTO_DEVICE_TYPES.get(op, {"cpu", "cuda"})
            slower = "pure torch measured faster on this device type"
            cpu = ("compiled", "built kernels")
            if backend == "auto" and "cpu" not in auto_devices:
                cpu = ("torch", slower)
            cuda = ("compiled", "built kernels") if _state["cuda"] else ("torch", cuda_reason)
            ops[op] = {"cpu": cpu, "cuda": cuda}
    return {
        "requested": backend,
        "build": {"tried": _state["tried"], "loaded": loaded,
                  "cuda_kernels": bool(_state["cuda"]) and cuda_ok,
                  "path": _state["path"], "error": _state["error"]},
        "ops": ops,
    }
