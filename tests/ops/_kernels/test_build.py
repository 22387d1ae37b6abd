"""Build directories, compiler flags and the CUDA toolkit checks of the kernels
(ops/_kernels/_build.py)."""

from __future__ import annotations

import pathlib

import pytest
import torch

from napari_simwarp.ops._kernels import _build
from tests.compiled import require_compiled


def test_build_cache_is_keyed_by_cpu_and_flags(monkeypatch, tmp_path):
    # A home directory shared by machines with different CPUs must never load a build
    # made for another instruction set (-march=native).
    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path))
    files = _build.sources("cpu")
    monkeypatch.setattr(_build, "cpu_fingerprint", lambda: "x86_64 flags: sse2 avx2")
    avx2 = _build.build_directory("cpu", files, ["-O3", "-march=native"])
    assert avx2 == _build.build_directory("cpu", files, ["-O3", "-march=native"])
    monkeypatch.setattr(_build, "cpu_fingerprint", lambda: "x86_64 flags: sse2 avx2 avx512f")
    assert _build.build_directory("cpu", files, ["-O3", "-march=native"]) != avx2
    assert _build.build_directory("cpu", files, ["-O3"]) != avx2


def test_native_flags_only_on_linux_x86_64(monkeypatch):
    monkeypatch.setattr(_build.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(_build.platform, "machine", lambda: "arm64")
    assert "-march=native" not in _build.host_cflags()
    monkeypatch.setattr(_build.platform, "system", lambda: "Linux")
    monkeypatch.setattr(_build.platform, "machine", lambda: "x86_64")
    assert "-march=native" in _build.host_cflags()


def test_build_cache_is_keyed_by_the_source_location(monkeypatch, tmp_path):
    # Two checkouts with the same sources must not share a build directory: torch's ninja
    # file names the sources by absolute path, so they would rebuild it in turn (and could
    # replace a library another process has loaded).
    import shutil

    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path / "cache"))
    here = _build.csrc_root()
    copy = tmp_path / "other-checkout" / "csrc"
    shutil.copytree(here, copy)
    flags = ["-O3"]
    ours = _build.build_directory("cpu", _build.sources("cpu"), flags)
    assert ours == _build.build_directory("cpu", _build.sources("cpu"), flags)
    monkeypatch.setattr(_build, "csrc_root", lambda: copy)
    theirs = _build.build_directory("cpu", _build.sources("cpu"), flags)
    assert [f.read_bytes() for f in _build.sources("cpu")] == [
        (here / f.relative_to(copy)).read_bytes() for f in _build.sources("cpu")
    ]
    assert theirs != ours


# ---- the CUDA build: refused before any compiler runs when it cannot work ------------------


def _toolkit(root, release: str | None = "13.0", header: bool = True):
    """A fake CUDA toolkit: bin/nvcc printing ``release``, and the runtime header."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    version = f"Cuda compilation tools, release {release}, V{release}.88" if release else "?"
    nvcc.write_text(f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{version}'\n")
    nvcc.chmod(0o755)
    if header:
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime_api.h").write_text("")
    return root


@pytest.fixture
def cuda_torch(monkeypatch):
    """A torch that reports CUDA 12.8 and a GPU, with CUDA_HOME set by the test."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")

    def use(home):
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", None if home is None else str(home))

    return use


def test_nvcc_that_does_not_match_torch_is_refused_with_the_way_out(cuda_torch, tmp_path):
    cuda_torch(_toolkit(tmp_path / "cuda-13.0", "13.0"))
    possible, why = _build.cuda_build_possible()
    assert not possible
    assert why == (
        "nvcc 13.0 does not match torch's CUDA 12.8: install a CUDA 12.x toolkit (e.g. "
        "NVIDIA's pip packages nvidia-cuda-nvcc) and point CUDA_HOME at it"
    )
    cuda_torch(_toolkit(tmp_path / "cuda-12.6", "12.6"))
    assert _build.cuda_build_possible() == (True, "torch CUDA 12.8, nvcc 12.6")


def test_cuda_home_must_be_a_toolkit(cuda_torch, tmp_path):
    # On these machines torch derives CUDA_HOME from the folder of an nvcc link, which
    # has bin/nvcc but no headers.
    home = _toolkit(tmp_path / "link", "12.8", header=False)
    cuda_torch(home)
    assert _build.cuda_build_possible() == (
        False,
        f"CUDA_HOME={home} is not a CUDA toolkit (no include/cuda_runtime_api.h); set "
        "CUDA_HOME to the toolkit's own folder",
    )
    cuda_torch(None)
    assert _build.cuda_build_possible() == (
        False,
        "nvcc was not found (set CUDA_HOME to the CUDA toolkit)",
    )
    cuda_torch(_toolkit(tmp_path / "broken", release=None))
    assert _build.cuda_build_possible() == (
        False,
        f"{tmp_path / 'broken'}/bin/nvcc --version did not run",
    )


@pytest.fixture
def kernels():
    """The CPU kernels, loaded before a test fakes a GPU."""
    return require_compiled()


def test_a_mismatched_toolkit_warns_and_keeps_the_cpu_kernels(
    kernels, cuda_torch, tmp_path, monkeypatch
):
    from napari_simwarp.ops import _kernels

    cuda_torch(_toolkit(tmp_path / "cuda-13.0", "13.0"))
    monkeypatch.setattr(_kernels, "_state", {**_kernels.state(), "tried": False, "cpu": False})
    monkeypatch.setenv("SIMWARP_BACKEND", "auto")
    with pytest.warns(RuntimeWarning) as caught:
        assert _kernels.ensure_loaded()
    (warning,) = caught
    assert str(warning.message).startswith(
        "napari-simwarp: CUDA kernels not built (nvcc 13.0 does not match torch's CUDA 12.8"
    )
    state = _kernels.state()
    assert state["cpu"] and not state["cuda"] and "does not match" in state["cuda_error"]


def test_cuda_cache_key_holds_compiler_architectures_and_gpus(monkeypatch, tmp_path):
    # A build made for one GPU, nvcc or TORCH_CUDA_ARCH_LIST, loaded elsewhere, fails with
    # "no kernel image": each of them makes its own build directory.
    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path))
    monkeypatch.setattr(_build, "nvcc_version", lambda home: "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    files, flags = _build.sources("cuda"), ["-O3"]
    h100 = _build.build_directory("cuda", files, flags)
    assert h100 == _build.build_directory("cuda", files, flags)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 6))
    assert _build.build_directory("cuda", files, flags) != h100
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert _build.build_directory("cuda", files, flags) != h100
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setattr(_build, "nvcc_version", lambda home: "13.1")
    assert _build.build_directory("cuda", files, flags) != h100


def test_host_shim_sources_are_the_cuda_sources_and_its_library(tmp_path):
    root = _build.csrc_root()
    cuda = _build.sources("cuda")
    assert [p for p in cuda if p.suffix == ".cu"] and all(p.parent == root / "cuda" for p in cuda)
    # The shim's library first (it defines the library), then its test ops, then the CUDA sources.
    shim = _build.sources("host_shim")
    assert shim[0] == root / "host_shim" / "library.cpp" and shim[-len(cuda) :] == cuda
    assert root / "host_shim" / "barrier_probe.cpp" in shim[1 : len(shim) - len(cuda)]
    with pytest.raises(ValueError, match="kind must be one of cpu, cuda, host_shim, got 'gpu'"):
        _build.sources("gpu")
    # The .cu files reach the host compiler through a wrapper that includes them, rewritten
    # only when its text changes (ninja compares timestamps).
    wrapper = _build._host_source(tmp_path, cuda[0])
    assert wrapper.suffix == ".cpp" and f'#include "{cuda[0]}"' in wrapper.read_text()
    stamp = wrapper.stat().st_mtime_ns
    assert _build._host_source(tmp_path, cuda[0]) == wrapper
    assert wrapper.stat().st_mtime_ns == stamp


def test_a_build_says_on_stderr_what_it_builds_and_when_it_ends(monkeypatch, tmp_path, capsys):
    # A command-line user waits minutes for a first build: one line when it starts (what,
    # why, how long, where it is cached, how to skip it), one when it ends; nothing when
    # the cache holds the build. The compiler is stood in for by a fake that writes the
    # library where cpp_extension would.
    from torch.utils import cpp_extension

    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path))
    loads = []

    def fake_load(name, build_directory, **kwargs):
        loads.append(name)
        (pathlib.Path(build_directory) / f"{name}{cpp_extension.LIB_EXT}").write_bytes(b"")

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    directory = _build.build("cpu")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and loads == ["simwarp_ops_cpu"]
    start, end = lines
    assert start.startswith("napari-simwarp: building the compiled CPU kernels")
    assert "about 1 to 3 minutes" in start and f"cached in {directory}" in start
    assert "SIMWARP_BACKEND=torch" in start and "napari-simwarp build-kernels" in start
    assert end.startswith("napari-simwarp: compiled CPU kernels built in ") and end.endswith(" s")
    assert _build.build("cpu") == directory  # cached: loaded, not built, and silent
    assert loads == ["simwarp_ops_cpu"] * 2 and capsys.readouterr().err == ""


def test_a_failed_build_says_it_ended(monkeypatch, tmp_path, capsys):
    from torch.utils import cpp_extension

    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path))

    def broken(**kwargs):
        raise RuntimeError("Error building extension 'simwarp_ops_cpu'")

    monkeypatch.setattr(cpp_extension, "load", broken)
    with pytest.raises(RuntimeError, match="Error building extension"):
        _build.build("cpu")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "the compiled CPU kernels build failed after" in lines[1]
