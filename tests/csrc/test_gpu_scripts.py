"""scripts/gpu_check.sh and scripts/ci_cuda_build.sh where there is no GPU: they parse,
refuse or skip clearly, and find a toolkit by its nvcc's version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["gpu_check.sh", "ci_cuda_build.sh", "cuda_toolkit.sh"]


def _bash(*args, env=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
        **kwargs,
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_parses(script):
    result = _bash("-n", f"scripts/{script}")
    assert result.returncode == 0, result.stderr


def test_gpu_check_refuses_clearly_without_a_gpu(tmp_path):
    # This interpreter's torch has no usable GPU here (nor does any the script would try).
    result = _bash(
        "scripts/gpu_check.sh",
        env={
            "PYTHON": sys.executable,
            "PATH": "/usr/bin:/bin",
            "SIMWARP_GPU_CHECK_OUT": str(tmp_path / "out"),
        },
    )
    assert result.returncode == 2
    assert "gpu_check: no usable CUDA GPU here" in result.stderr
    assert "pytest tests/csrc/test_host_shim.py" in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


def _gpu_check_steps() -> list[tuple[str, int, int, str]]:
    """``(name, limit, reserve, log)`` of every ``step`` call in gpu_check.sh."""
    steps = []
    for line in (ROOT / "scripts" / "gpu_check.sh").read_text().splitlines():
        words = line.split()
        if len(words) > 5 and words[0] == "step" and words[1] != "NAME":
            steps.append((words[1], int(words[2]), int(words[3]), words[4]))
    return steps


def test_gpu_check_fits_the_gpu_machines_box():
    # The GPU machines are lent 15 minutes, their start included, and send back at most 8
    # files from one folder: the check must end within 8 minutes on its own and write a
    # summary and at most 7 logs.
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    budget = int(text.split("SIMWARP_GPU_CHECK_BUDGET:-")[1].split("}")[0])
    assert budget <= 480
    steps = _gpu_check_steps()
    assert [s[0] for s in steps] == [
        "build", "self_check", "refusals", "parity", "bench", "match_template", "register",
        "suite",
    ]  # fmt: skip
    logs = {s[3] for s in steps} | {"memcheck", "summary"}
    assert len(logs) <= 8
    # Each step keeps time for the ones after it: its reserve falls step by step, so a
    # slow step shortens the later ones' boxes instead of running past the deadline.
    reserves = [s[2] for s in steps]
    assert reserves == sorted(reserves, reverse=True) and reserves[-1] < 30


def _benchmark(name: str):
    """The module ``benchmarks/<name>.py``."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_splice_replaces_the_checks_sections_and_keeps_the_rest(tmp_path):
    bench_gpu = _benchmark("bench_gpu")
    page = tmp_path / "benchmarks.md"
    page.write_text(
        "# Benchmarks\n\n## CPU things\n\nkeep me\n\n"
        "## Compiled kernels on the GPU (against the bytes they move)\n\nnot yet measured\n\n"
        "## Later\n\nkeep me too\n"
    )
    summary = (
        "## GPU check: 2026-11-27, NVIDIA H200\n\n| step | result |\n\n"
        "## Compiled kernels on the GPU (against the bytes they move)\n\nmeasured\n"
    )
    spliced = bench_gpu.splice(summary, page)
    assert spliced == [
        "## GPU check: 2026-11-27, NVIDIA H200",
        "## Compiled kernels on the GPU (against the bytes they move)",
    ]
    text = page.read_text()
    assert "not yet measured" not in text and "measured" in text
    assert text.count("keep me") == 2 and text.index("## Later") < text.index("## GPU check")
    # A later check replaces the earlier one's section (same heading up to the colon).
    bench_gpu.splice("## GPU check: 2026-11-28, NVIDIA H100\n\nnewer\n", page)
    text = page.read_text()
    assert "H200" not in text and "newer" in text and text.count("## GPU check") == 1


def test_ci_cuda_build_skips_when_no_cuda_torch_installs(tmp_path):
    result = _bash(
        "scripts/ci_cuda_build.sh",
        env={
            "SIMWARP_CUDA_VENV": str(tmp_path / "venv"),
            "SIMWARP_CUDA_TORCH": "torch==0.0.1",
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": "",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "ci_cuda_build: SKIPPED: could not install torch==0.0.1" in result.stdout


def test_cuda_toolkit_is_found_by_its_nvcc_version(tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime_api.h").write_text("")
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 77.1, V77.1.5'\n")
    nvcc.chmod(0o755)
    found = _bash(
        "-c", "source scripts/cuda_toolkit.sh && cuda_toolkit 77", env={"CUDA_HOME": str(home)}
    )
    assert found.returncode == 0 and found.stdout.strip() == str(home)
    other = _bash(
        "-c", "source scripts/cuda_toolkit.sh && cuda_toolkit 78", env={"CUDA_HOME": str(home)}
    )
    assert other.returncode == 1 and other.stdout == ""
    (home / "include" / "cuda_runtime_api.h").unlink()  # an nvcc link's folder: no headers
    link = _bash(
        "-c", "source scripts/cuda_toolkit.sh && cuda_toolkit 77", env={"CUDA_HOME": str(home)}
    )
    assert link.returncode == 1


@pytest.mark.parametrize(
    ("op", "shape"),
    [("ssim", (2, 1, 96, 96)), ("local_ncc", (1, 1, 32, 32, 32))],
)
def test_the_fluorescence_cases_time_the_windows_redone_two_pass(op, shape):
    # bench_gpu's fluorescence-like pairs must reach the float32 kernels' two-pass redo
    # (dim windows beside bright ones) that its uniform pairs never reach: the GPU policy
    # forced on the CPU, the torch path's risky windows counted (benchmarks/redo_share.py).
    import torch

    from napari_simwarp import ops

    bench_gpu, redo_share = _benchmark("bench_gpu"), _benchmark("redo_share")
    gen = torch.Generator().manual_seed(0)
    a, b = bench_gpu.fluorescence(shape, gen, "cpu")
    assert a.dtype == torch.float32 and a.min() > 90 and a.max() < 4000
    with redo_share.redone_window_shares() as shares:
        getattr(ops, op)(a, b, window=9)
        assert shares and min(shares) > 0.1
        shares.clear()
        getattr(ops, op)(*bench_gpu.uniform_pair(shape, gen, "cpu"), window=9)
        assert shares and max(shares) == 0
