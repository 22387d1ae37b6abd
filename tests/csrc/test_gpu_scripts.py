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
            "SIMWARP_GPU_CHECK_LOGS": str(tmp_path),
        },
    )
    assert result.returncode == 2
    assert "gpu_check: no usable CUDA GPU here" in result.stderr
    assert "pytest tests/csrc/test_host_shim.py" in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


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
