"""Building the compiled kernels: sources, compiler flags, the build cache, the loader.

Two extensions, built and loaded separately so that a CUDA failure never costs the CPU
kernels: ``cpu`` (``csrc/ops.cpp`` with the op schemas and ``csrc/cpu/*.cpp``) and, where
torch has CUDA and a matching ``nvcc`` is found, ``cuda`` (``csrc/cuda/*.cu`` kernels and
``csrc/cuda/*.cpp`` registrations), loaded after the first. Each is built once with
``torch.utils.cpp_extension`` into a cache directory keyed by everything that makes a
build differ (sources, torch, flags, CPU; for CUDA also the compiler and architectures).

A third, ``host_shim``, is for tests: the CUDA sources compiled as host C++ against the
shim in ``csrc/host_shim/`` (every block in turn, its threads in turn or, for kernels
with barriers, as fibers that switch at each barrier), registered as the CPU
implementation of the ``simwarp_host_shim`` library, so that the CUDA kernels' logic is
compared with the CPU kernels on machines without a GPU (``tests/csrc/test_host_shim.py``).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import re
import subprocess
import sys
import time

import torch

from ._build_lock import build_lock

ENV_CACHE = "SIMWARP_CACHE_DIR"
KINDS = ("cpu", "cuda", "host_shim")
#: the flags that make the CUDA sources host code (csrc/host_shim/cuda_runtime.h); hidden
#: symbols, so that the shim's simwarp::cuda functions never stand in for a real CUDA
#: build's in the same process.
HOST_SHIM_FLAGS = ["-DSIMWARP_HOST_SHIM", "-fvisibility=hidden"]


def csrc_root() -> pathlib.Path:
    """The kernel sources: ``napari_simwarp/csrc`` when installed, ``csrc/`` in a checkout."""
    package = pathlib.Path(__file__).resolve().parents[2]
    for root in (package / "csrc", package.parent.parent / "csrc"):
        if (root / "ops.cpp").is_file():
            return root
    raise FileNotFoundError(
        f"the kernel sources (csrc/ops.cpp) are neither in {package / 'csrc'} (an installed "
        f"wheel) nor in {package.parent.parent / 'csrc'} (a checkout)"
    )


def sources(kind: str) -> list[pathlib.Path]:
    """The source files of one extension (one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    root = csrc_root()
    if kind == "cpu":
        return [root / "ops.cpp", *sorted((root / "cpu").glob("*.cpp"))]
    cuda = sorted((root / "cuda").glob("*.cu")) + sorted((root / "cuda").glob("*.cpp"))
    if kind == "cuda":
        return cuda
    # library.cpp first (it defines the library); then the shim's test ops (barrier_probe).
    shim = [root / "host_shim" / "library.cpp"]
    shim += [f for f in sorted((root / "host_shim").glob("*.cpp")) if f.name != "library.cpp"]
    return [*shim, *cuda]


def _host_source(directory: pathlib.Path, source: pathlib.Path) -> pathlib.Path:
    """A ``.cpp`` in ``directory`` that includes the ``.cu`` ``source``, so the host compiler
    builds it (cpp_extension hands every ``.cu`` to nvcc). Rewritten only when it changes,
    so ninja's timestamps stay meaningful."""
    wrapper = directory / f"{source.stem}_cu.cpp"
    text = f'// The host-shim build of {source.name} (generated).\n#include "{source}"\n'
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.write_text(text)
    return wrapper


def headers() -> list[pathlib.Path]:
    """Every header under ``csrc`` (part of the cache key)."""
    return sorted(csrc_root().rglob("*.h"))


def host_cflags() -> list[str]:
    """Compiler flags of the C++ sources for this machine.

    On Linux x86-64 the kernels are built for the CPU they run on (``-march=native``: AVX2
    or AVX-512 instead of SSE2: at 2048² on a 2-core EPYC the local std backward ran 13%
    and the SSIM forward about 20% faster with it), as torch's inductor builds its C++
    too. The build cache is then keyed by the CPU (:func:`cpu_fingerprint`), so a home
    directory shared by different machines never loads another CPU's build.
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


def nvcc_version(cuda_home: str) -> str | None:
    """``"13.0"`` from ``CUDA_HOME/bin/nvcc --version``, or None when it cannot run."""
    try:
        out = subprocess.run(
            [os.path.join(cuda_home, "bin", "nvcc"), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def cuda_build_possible() -> tuple[bool, str]:
    """Whether the CUDA extension can be built here, and why not when it cannot.

    Checks, before any compiler runs: torch has CUDA and a device; ``CUDA_HOME`` is a
    toolkit (``bin/nvcc`` and ``include/cuda_runtime_api.h``, not the folder of an
    ``nvcc`` link); ``nvcc``'s major version is torch's (a CUDA 13 ``nvcc`` against a
    CUDA 12 torch builds a library that fails at load or at its first launch).
    """
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False, "torch has no usable CUDA"
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home is None:
        return False, "nvcc was not found (set CUDA_HOME to the CUDA toolkit)"
    for part in ("bin/nvcc", "include/cuda_runtime_api.h"):
        if not os.path.exists(os.path.join(home, part)):
            return False, (
                f"CUDA_HOME={home} is not a CUDA toolkit (no {part}); set "
                "CUDA_HOME to the toolkit's own folder"
            )
    nvcc = nvcc_version(home)
    if nvcc is None:
        return False, f"{home}/bin/nvcc --version did not run"
    if nvcc.split(".")[0] != torch.version.cuda.split(".")[0]:
        return False, (
            f"nvcc {nvcc} does not match torch's CUDA {torch.version.cuda}: install "
            f"a CUDA {torch.version.cuda.split('.')[0]}.x toolkit (e.g. NVIDIA's "
            "pip packages nvidia-cuda-nvcc) and point CUDA_HOME at it"
        )
    return True, f"torch CUDA {torch.version.cuda}, nvcc {nvcc}"


def cuda_fingerprint() -> str:
    """What a CUDA build depends on beyond its sources: nvcc, architectures, the GPUs."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME or ""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    gpus = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return f"nvcc {nvcc_version(home)} at {home} | arch {arch!r} | gpus {gpus}"


def build_directory(kind: str, files: list[pathlib.Path], cflags: list[str]) -> pathlib.Path:
    """The cache directory of one build: one per source location and content, torch, flags
    and machine.

    A stale build, or one made for another machine's instruction set or GPU, is never
    loaded.
    """
    digest = hashlib.sha256()
    # torch's ninja file names the sources by absolute path: two checkouts (or a checkout
    # and an installed copy) with the same sources in one directory would rebuild in turn
    # and could replace a library another process has loaded.
    digest.update(str(csrc_root()).encode())
    for f in files + headers():
        digest.update(f.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(" ".join(cflags).encode())
    digest.update(cpu_fingerprint().encode())
    if kind == "cuda":
        digest.update(cuda_fingerprint().encode())
    root = pathlib.Path(
        os.environ.get(ENV_CACHE, pathlib.Path.home() / ".cache" / "napari-simwarp")
    )
    path = root / f"{kind}-{digest.hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: what each extension is called in the build messages, and about how long it builds
_NAMES = {
    "cpu": "compiled CPU kernels",
    "cuda": "compiled CUDA kernels",
    "host_shim": "host-shim build of the CUDA kernels (tests)",
}
_DURATIONS = {"cpu": "1 to 3 minutes", "cuda": "2 to 10 minutes", "host_shim": "1 to 3 minutes"}


def announce(text: str) -> None:
    """One line on stderr: the build messages of a command-line or script user, who
    would otherwise wait minutes in silence (the widgets show their own progress bar)."""
    print(text, file=sys.stderr, flush=True)


def library_path(kind: str, directory: pathlib.Path) -> pathlib.Path:
    """The library ``cpp_extension.load`` writes for extension ``kind`` in ``directory``."""
    from torch.utils import cpp_extension

    return directory / f"simwarp_ops_{kind}{cpp_extension.LIB_EXT}"


def built(kind: str, directory: pathlib.Path) -> bool:
    """Whether ``directory`` (keyed by the sources, torch, flags and machine) holds a
    finished build of ``kind``: loading it then takes seconds, not minutes."""
    return library_path(kind, directory).is_file()


def starting_message(kind: str, directory: pathlib.Path) -> str:
    """What is built, why, about how long it takes, where it is cached, how to skip it."""
    return (
        f"napari-simwarp: building the {_NAMES[kind]} (once per torch version and machine: "
        f"the fused kernels make the ops faster); about {_DURATIONS[kind]}, cached in "
        f"{directory}. To skip it, set SIMWARP_BACKEND=torch (the pure torch ops, slower); "
        "`napari-simwarp build-kernels` builds ahead of time"
    )


def _took(started: float) -> str:
    seconds = time.monotonic() - started
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


def build(kind: str, verbose: bool = False) -> pathlib.Path:
    """Build (or find in the cache) and load one extension; return its build directory.

    Processes building one directory take turns (:func:`._build_lock.build_lock`); a
    build left unfinished by a killed process is resumed. A build that compiles (not one
    found in the cache) says so on stderr when it starts and when it ends
    (:func:`announce`). Raises whatever the compiler or loader raised.
    """
    from torch.utils import cpp_extension

    files = sources(kind)
    cflags = host_cflags() + (HOST_SHIM_FLAGS if kind == "host_shim" else [])
    directory = build_directory(kind, files, cflags)
    root = csrc_root()
    includes = [root / "include", root]
    # One build per directory at a time, under a lock the OS releases if its holder is
    # killed: torch's own (a file that only its maker removes) hung every later process
    # after a build killed with kill -9 (_build_lock).
    with build_lock(directory):
        fresh = not built(kind, directory)  # after the lock: another process may have built it
        if fresh:
            announce(starting_message(kind, directory))
        started = time.monotonic()
        if kind == "host_shim":
            # The shim's cuda_runtime.h first; the bindings' local headers beside the wrappers.
            includes = [root / "host_shim", *includes, root / "cuda"]
            files = [_host_source(directory, f) if f.suffix == ".cu" else f for f in files]
        try:
            cpp_extension.load(
                name=f"simwarp_ops_{kind}",
                sources=[str(f) for f in files],
                extra_include_paths=[str(p) for p in includes],
                extra_cflags=cflags,
                extra_cuda_cflags=["-O3"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                with_cuda=kind == "cuda",
                is_python_module=False,
                verbose=verbose,
            )
        except BaseException:
            if fresh:
                announce(f"napari-simwarp: the {_NAMES[kind]} build failed after {_took(started)}")
            raise
        if fresh:
            announce(f"napari-simwarp: {_NAMES[kind]} built in {_took(started)}")
    return directory
