"""The refusals step of scripts/gpu_check.sh: issue 23's crash, looked at on a GPU machine.

Each call that ended the process with SIGSEGV there runs in a child process of its own
(``ops/_kernels/refusal_probe.py``), so this script survives it and reports every one; then
what "auto" decided (its own probe). If a call crashed, it prints what may cause it (the
C++ compiler, the libstdc++ the extension and the process load, torch's C++ ABI) and
rebuilds the extensions with each other compiler found (the system g++, clang++) in a
cache of their own, probing again: which compiler fixes it.

    python scripts/gpu_refusals.py ALT_CACHE_DIR

Exit 0 when every refused call raised and "auto" kept the kernels (on a machine without a
GPU: the CPU side alone); 1 otherwise.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from napari_simwarp.ops import _kernels
from napari_simwarp.ops._kernels import refusal_probe

#: the calls issue 23 saw crash, on CUDA (and the host shim's CPU side through box_sum)
CALLS = {
    "box_sum(x, [0, 3])": "torch.ops.simwarp.box_sum(x, [0, 3], False)",
    "box_sum(x, [9, 3])": "torch.ops.simwarp.box_sum(x, [9, 3], False)",
    "box_sum(x, [1] * 5)": "torch.ops.simwarp.box_sum(x, [1] * 5, False)",
    "local_std_fwd(x, [0, 3])": "torch.ops.simwarp.local_std_fwd(x, [0, 3], 0.0, True, 1e-14)",
    "local_std_fwd(x, [9, 3])": "torch.ops.simwarp.local_std_fwd(x, [9, 3], 0.0, True, 1e-14)",
    "local_std_fwd(x, [1] * 5)": "torch.ops.simwarp.local_std_fwd(x, [1] * 5, 0.0, True, 1e-14)",
}


def probe_all(kinds: tuple[str, ...], device: str) -> dict[str, str | None]:
    """Each call in a child of its own, all at once; ``{call: None or why it failed}``."""
    with ThreadPoolExecutor(len(CALLS)) as pool:
        futures = {
            name: pool.submit(
                refusal_probe.run, kinds, device, child=refusal_probe.child_code(call)
            )
            for name, call in CALLS.items()
        }
        return {name: future.result() for name, future in futures.items()}


def _run(*command: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"


def diagnose() -> None:
    """What the crash may come from: compilers, the libstdc++ in play, torch's ABI."""
    state = _kernels.state()
    print("\n-- what may cause it")
    print("torch C++11 ABI:", torch._C._GLIBCXX_USE_CXX11_ABI, "| torch", torch.__version__)
    print("CXX:", os.environ.get("CXX", "(unset: c++)"), "->", shutil.which("c++"))
    for cxx in ("c++", "g++", "/usr/bin/g++", "clang++"):
        path = shutil.which(cxx)
        if path:
            print(f"{cxx} = {os.path.realpath(path)}: {_run(path, '--version').splitlines()[0]}")
    for key in ("path", "cuda_path"):
        if state[key]:
            for so in pathlib.Path(state[key]).glob("*.so"):
                print(f"ldd {so.name}:")
                print(
                    "\n".join(
                        line
                        for line in _run("ldd", str(so)).splitlines()
                        if any(k in line for k in ("stdc++", "gcc_s", "libc.so", "c10", "torch"))
                    )
                )
    print("libstdc++ in this process:")
    with open("/proc/self/maps") as maps:
        print("\n".join(sorted({line.split()[-1] for line in maps if "libstdc++" in line})))


def try_other_compilers(alt_cache: str, seconds: float = 60.0) -> None:
    """Rebuild the CPU extension (the crash was seen there too: the host shim; it builds in
    well under a minute) in a cache of its own with each other compiler, within
    ``seconds`` in all: does the refusal raise then?"""
    deadline = time.monotonic() + seconds
    current = os.path.realpath(shutil.which(os.environ.get("CXX", "c++")) or "")
    tried = set()
    for cxx in ("/usr/bin/g++", "g++", "clang++"):
        path = shutil.which(cxx)
        if not path or os.path.realpath(path) in tried | {current}:
            continue
        tried.add(os.path.realpath(path))
        env = {**os.environ, "CXX": path, "SIMWARP_CACHE_DIR": f"{alt_cache}/{len(tried)}"}
        code = refusal_probe.child_code(CALLS["box_sum(x, [0, 3])"])
        try:
            done = subprocess.run(
                [sys.executable, "-c", code, "cpu", "cpu"],
                env=env,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            print(f"rebuilt with CXX={path}: not finished in the time left")
            return
        verdict = "raises (fixes it)" if done.returncode == 0 else f"exit {done.returncode}"
        print(f"rebuilt with CXX={path}: the refusal {verdict}")
        if done.returncode not in (0, 3):
            print("  " + "\n  ".join(done.stderr.strip().splitlines()[-5:]))


def main() -> int:
    alt_cache = sys.argv[1] if len(sys.argv) > 1 else "/tmp/simwarp-alt-cache"
    _kernels.ensure_loaded()
    crashed = failed = False
    for kinds, device in ((("cpu",), "cpu"), (("cpu", "cuda"), "cuda")):
        if device == "cuda" and not (torch.cuda.is_available() and _kernels.state()["cuda"]):
            print("cuda: the CUDA kernels are not loaded:", _kernels.state()["cuda_error"])
            failed |= torch.cuda.is_available()
            continue
        for name, failure in probe_all(kinds, device).items():
            print(f"{device}: {name}: {'raised RuntimeError' if failure is None else failure}")
            crashed |= failure is not None
    refusal = _kernels.state()["refusal"]
    print('"auto" refusal probe:', refusal or "passed on every device type")
    if crashed:
        diagnose()
        try_other_compilers(alt_cache)
    return int(crashed or failed or bool(refusal))


if __name__ == "__main__":
    sys.exit(main())
