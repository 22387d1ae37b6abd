"""The layout of csrc/ and the CUDA sources, checked on machines without a GPU.

Every op of csrc/schemas.h is registered once per dispatch key, in a file of its own named
after it (cpu/<name>.cpp, cuda/<name>.cpp, <name> the op's name less _fwd / _bwd), and
both bindings run the same argument checks (checks.h). The .cu files include no torch
header, compile with nvcc alone for sm_80 and sm_90, and every cuda/*.cpp binding parses
against torch and the CUDA runtime headers (the CPU build never compiles it; the host-shim
build compiles it against the shim, tests/csrc/test_host_shim.py).

The compiler checks are skipped where nvcc is missing, unless SIMWARP_REQUIRE_NVCC=1 (CI
sets it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from napari_simwarp.ops._kernels._build import csrc_root

CSRC = csrc_root()
CU_FILES = sorted((CSRC / "cuda").glob("*.cu"))
CUDA_BINDINGS = sorted((CSRC / "cuda").glob("*.cpp"))

#: ops with no CUDA implementation, and why; CUDA tensors take the pure torch path.
CPU_ONLY = {
    # The fused 2D local std pads and centers inside its CPU loops (band-wise running sums);
    # on CUDA the caller pads and centers, then runs local_std_fwd / local_std_bwd.
    "local_std_2d_fwd": "padding and centering fused into the CPU loops",
    "local_std_2d_bwd": "padding and centering fused into the CPU loops",
}


#: ops with a CUDA implementation only, and why: their schemas are defined beside their
#: binding (SIMWARP_CUDA_ONLY_SCHEMAS, cuda/binding.h), never in the CPU library.
CUDA_ONLY = {
    # The fused 2-D SSIM; the CPU runs ssim through moments5 and correlate in float64.
    "ssim_fwd": "fused SSIM forward, float32 on GPUs",
    "ssim_bwd": "fused SSIM backward, float32 on GPUs",
    # The fused 2-D local std of CUDA; the CPU has its own (local_std_2d_*, CPU only).
    "local_std_fused_fwd": "fused 2-D local std forward, float32 on GPUs",
    "local_std_fused_bwd": "fused 2-D local std backward, float32 on GPUs",
    # The fused local NCC (2-D and 3-D); the CPU runs local_ncc through moments5 and the
    # window's adjoint in float64.
    "local_ncc_fwd": "fused local NCC forward, float32 on GPUs",
    "local_ncc_bwd": "fused local NCC backward, float32 on GPUs",
}


def _code(path: Path) -> str:
    """The file's text without // comments (they mention op names too)."""
    return re.sub(r"//[^\n]*", "", path.read_text())


def _blocks(text: str, head: str) -> list[str]:
    """The bodies of every ``head { ... }`` block in text (braces balanced)."""
    bodies = []
    for match in re.finditer(re.escape(head) + r"\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                bodies.append(text[start:i])
                break
    return bodies


#: the head of the registration blocks of each dispatch key (the CUDA bindings' macro is
#: TORCH_LIBRARY_IMPL(simwarp, CUDA, m), or the host shim's library, cuda/binding.h)
REGISTRATION = {
    "CPU": "TORCH_LIBRARY_IMPL(simwarp, CPU, m)",
    "CUDA": "SIMWARP_CUDA_LIBRARY_IMPL(m)",
}


def defined_ops() -> list[str]:
    """The op names of schemas.h's define_ops(m)."""
    (body,) = _blocks(_code(CSRC / "schemas.h"), "inline void define_ops(torch::Library& m)")
    return re.findall(r'm\.def\(\s*"(\w+)\(', body)


def registrations(key: str, files: list[Path]) -> dict[str, list[str]]:
    """op -> the files whose registration blocks for ``key`` implement it."""
    found: dict[str, list[str]] = {}
    for path in files:
        for body in _blocks(_code(path), REGISTRATION[key]):
            for op in re.findall(r'm\.impl\(\s*"(\w+)"', body):
                found.setdefault(op, []).append(path.name)
    return found


def cuda_only_ops() -> list[str]:
    """The op names the CUDA bindings define themselves (SIMWARP_CUDA_ONLY_SCHEMAS)."""
    ops = []
    for path in CUDA_BINDINGS:
        for body in _blocks(_code(path), "SIMWARP_CUDA_ONLY_SCHEMAS(m)"):
            ops += re.findall(r'm\.def\(\s*"(\w+)\(', body)
    return ops


def file_stem(op: str) -> str:
    return re.sub(r"_(fwd|bwd)$", "", op)


def test_schemas_define_ops_once_for_both_libraries():
    ops = defined_ops()
    assert ops and len(ops) == len(set(ops)) == _code(CSRC / "schemas.h").count("m.def("), ops
    assert set(CPU_ONLY) <= set(ops), "CPU_ONLY names an op that schemas.h does not define"
    for path, library in (
        (CSRC / "ops.cpp", "simwarp"),
        (CSRC / "host_shim" / "library.cpp", "simwarp_host_shim"),
    ):
        (body,) = _blocks(_code(path), f"TORCH_LIBRARY({library}, m)")
        assert body.strip() == "simwarp::define_ops(m);", f"{path.name}: {body!r}"
    binding = _code(CSRC / "cuda" / "binding.h")
    assert "TORCH_LIBRARY_IMPL(simwarp, CUDA, m)" in binding
    assert "TORCH_LIBRARY_IMPL(simwarp_host_shim, CPU, m)" in binding


@pytest.mark.parametrize("key,folder", [("CPU", "cpu"), ("CUDA", "cuda")])
def test_every_op_is_registered_once_in_its_own_file(key, folder):
    found = registrations(key, sorted((CSRC / folder).glob("*.cpp")))
    expected = [op for op in defined_ops() if key == "CPU" or op not in CPU_ONLY]
    if key == "CUDA":
        expected += cuda_only_ops()
    assert set(found) == set(expected), (
        f"{key} registrations {sorted(found)} differ from the ops of ops.cpp {sorted(expected)}"
        + ("" if key == "CPU" else f" (less the CPU-only {sorted(CPU_ONLY)})")
    )
    for op in expected:
        assert found[op] == [f"{file_stem(op)}.cpp"], f"{key} {op} registered in {found[op]}"


@pytest.mark.parametrize("folder", ["cpu", "cuda"])
def test_bindings_run_the_shared_checks(folder):
    """Each binding calls checks::<op> from checks.h, the same function on both sides."""
    checks = _code(CSRC / "checks.h")
    for op in defined_ops() + (cuda_only_ops() if folder == "cuda" else []):
        if folder == "cuda" and op in CPU_ONLY:
            continue
        assert re.search(rf"inline void {op}\(", checks), f"checks.h has no checks::{op}"
        binding = _code(CSRC / folder / f"{file_stem(op)}.cpp")
        assert f"checks::{op}(" in binding, (
            f"{folder}/{file_stem(op)}.cpp does not call checks::{op}"
        )


def test_cuda_only_ops_are_defined_beside_their_binding_only():
    assert sorted(cuda_only_ops()) == sorted(CUDA_ONLY)
    assert not set(CUDA_ONLY) & set(defined_ops()), "a CUDA-only op in the CPU library"
    for path in sorted((CSRC / "cpu").glob("*.cpp")) + [CSRC / "ops.cpp"]:
        assert "SIMWARP_CUDA_ONLY_SCHEMAS" not in _code(path), path.name


def test_every_cuda_op_has_kernels_launchers_and_a_binding():
    stems = {file_stem(op) for op in defined_ops() + cuda_only_ops() if op not in CPU_ONLY}
    for stem in stems:
        for suffix in (".cu", ".h", ".cpp"):
            assert (CSRC / "cuda" / f"{stem}{suffix}").is_file(), f"cuda/{stem}{suffix} missing"
        header = f'#include "{stem}.h"'
        assert header in (CSRC / "cuda" / f"{stem}.cu").read_text(), (
            f"cuda/{stem}.cu lacks {header}"
        )


def _local_includes(path: Path, seen: set[Path]) -> set[Path]:
    """path and every csrc header it includes with quotes, recursively."""
    seen.add(path)
    for name in re.findall(r'#include\s+"([^"]+)"', path.read_text()):
        for folder in (path.parent, CSRC / "include", CSRC):
            header = (folder / name).resolve()
            if header.is_file():
                if header not in seen:
                    _local_includes(header, seen)
                break
        else:
            pytest.fail(f"{path.name} includes {name}, found nowhere under csrc")
    return seen


@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: p.name)
def test_cuda_sources_include_no_torch_header(source):
    """Device code sees raw pointers and a stream only, so nvcc compiles it alone."""
    for path in _local_includes(source, set()):
        torch_headers = re.findall(
            r"#include\s+[<\"]((?:torch|ATen|c10)/[^>\"]+)", path.read_text()
        )
        assert not torch_headers, f"{source.name} reaches {torch_headers} through {path.name}"


def _require(*tools: str) -> list[str]:
    found = [shutil.which(t) for t in tools]
    if None in found:
        missing = [t for t, f in zip(tools, found) if f is None]
        if os.environ.get("SIMWARP_REQUIRE_NVCC") == "1":
            pytest.fail(f"{', '.join(missing)} not found but SIMWARP_REQUIRE_NVCC=1")
        pytest.skip(f"{', '.join(missing)} not found")
    return found


@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: p.name)
def test_compiles_with_nvcc_alone(source, tmp_path):
    (nvcc,) = _require("nvcc")
    cmd = [
        nvcc,
        "-c",
        "-std=c++17",
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-I",
        str(CSRC / "include"),
        str(source),
        "-o",
        str(tmp_path / (source.stem + ".o")),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("source", CUDA_BINDINGS, ids=lambda p: p.name)
def test_cuda_binding_is_valid_cpp(source, tmp_path):
    """A CUDA binding (torch + CUDA runtime headers) parses, where a CUDA toolkit exists.

    The CPU build never compiles it, so without this a typo would wait for a GPU machine.
    The CPU torch wheel lacks one generated header, which an empty stub stands in for.
    """
    nvcc, gxx = _require("nvcc", "g++")
    from torch.utils.cpp_extension import include_paths

    homes = [
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        "/usr/local/cuda",
        os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
    ]
    cuda_include = next(
        (
            os.path.join(h, "include")
            for h in homes
            if h and os.path.exists(os.path.join(h, "include", "cuda_runtime.h"))
        ),
        None,
    )
    if cuda_include is None:
        pytest.fail(f"nvcc at {nvcc} but no CUDA include directory with cuda_runtime.h")
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [
        gxx,
        "-std=c++20",  # torch's headers need it
        "-fsyntax-only",
        f"-I{tmp_path}",
        *[f"-I{p}" for p in include_paths()],
        f"-I{cuda_include}",
        f"-I{CSRC / 'include'}",
        f"-I{CSRC}",
        str(source),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
