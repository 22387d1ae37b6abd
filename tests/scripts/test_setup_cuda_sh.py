"""scripts/setup_cuda.sh's choice of torch's CUDA build from the driver (nvidia-smi stubbed
on a PATH of the test's own; SIMWARP_SETUP_DRY_RUN prints the commands instead)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _run(tmp_path, cuda_version=None, extras=()):
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in ("bash", "dirname", "sed", "head"):
        (folder / tool).symlink_to(shutil.which(tool))
    if cuda_version is not None:  # nvidia-smi's header, as the driver prints it
        smi = folder / "nvidia-smi"
        smi.write_text(
            f"#!{BASH}\necho '| NVIDIA-SMI 570.86.15  Driver Version: 570.86.15  "
            f"CUDA Version: {cuda_version}     |'\n"
        )
        smi.chmod(0o755)
    return subprocess.run(
        [BASH, str(ROOT / "scripts" / "setup_cuda.sh"), *extras],
        capture_output=True,
        text=True,
        env={"PATH": str(folder), "SIMWARP_SETUP_DRY_RUN": "1", "CUDA_HOME": str(tmp_path)},
        timeout=60,
    )


@pytest.mark.parametrize(
    "driver,variant",
    [("12.8", "cu128"), ("13.1", "cu130"), ("12.5", "cu124"), ("12.9", "cu129"), ("11.8", "cu118")],
)
def test_the_newest_cuda_build_the_driver_runs_is_installed(tmp_path, driver, variant):
    result = _run(tmp_path, driver, ["all"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"setup_cuda: the driver supports CUDA {driver}: torch==2.13.0 from "
        f"https://download.pytorch.org/whl/{variant}"
    )
    assert [line for line in lines if line.startswith("would run:")] == [
        "would run: .venv/bin/python -m pip install -q torch==2.13.0 --index-url "
        f"https://download.pytorch.org/whl/{variant}",
        "would run: bash scripts/setup.sh all",
        "would run: .venv/bin/napari-simwarp build-kernels",
        "would run: .venv/bin/napari-simwarp info",
    ]
    # the kernels are built with a toolkit of torch's CUDA major version where this
    # machine has one (/usr/local/cuda-*; CUDA_HOME is none), else it says what to do
    major = variant[2:-1]
    built = [line for line in lines if line.startswith("setup_cuda: building the kernels")]
    assert built or (f"no CUDA {major}.x toolkit" in result.stderr and "CUDA_HOME" in result.stderr)


def test_a_driver_older_than_every_build_is_refused(tmp_path):
    result = _run(tmp_path, "11.4")
    assert result.returncode == 2
    said = " ".join(result.stderr.split())
    assert "supports CUDA 11.4, older than every CUDA build of torch 2.13.0" in said
    assert said.endswith("update the NVIDIA driver") and result.stdout == ""


def test_without_a_driver_it_points_to_the_cpu_setup(tmp_path):
    result = _run(tmp_path, None, ["testing"])
    assert result.returncode == 2 and result.stdout == ""
    assert "nvidia-smi not found" in result.stderr
    assert "For the CPU: bash scripts/setup.sh testing" in result.stderr
