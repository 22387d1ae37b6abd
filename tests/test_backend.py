"""``backend_info`` (backend.py): every public operator reported, nothing built when asked
not to."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from napari_simwarp import ops
from napari_simwarp.backend import backend_info

#: the operators the README's table documents (napari_simwarp.ops)
DOCUMENTED_OPS = {
    "fft_cc",
    "local_std",
    "match_template",
    "ncc",
    "local_ncc",
    "ssim",
    "warp",
    "warp_affine",
    "splat",
    "compose",
    "invert",
    "integrate_velocity",
    "jacobian_determinant",
    "affine_to_displacement",
    "similarity_gradient",
}
#: the operators with compiled kernels (csrc/)
COMPILED = {"local_std", "local_ncc", "ssim", "splat", "mutual_information", "integrate_velocity"}


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )


def test_backend_info_lists_every_public_operator(monkeypatch):
    monkeypatch.setenv("SIMWARP_BACKEND", "torch")
    info = backend_info(build=False)
    functions = {
        name
        for name in ops.__all__
        if inspect.isfunction(getattr(ops, name)) and name != "loss_for"
    }
    assert functions >= DOCUMENTED_OPS
    assert set(info["ops"]) == functions
    for op, per_device in info["ops"].items():
        assert set(per_device) == {"cpu", "cuda"}
        assert all(backend == "torch" for backend, _ in per_device.values()), op
    assert info["requested"] == "torch"


def test_ops_without_kernels_report_torch():
    info = backend_info()
    for op in DOCUMENTED_OPS - COMPILED:
        assert info["ops"][op]["cpu"][0] == "torch", op
        assert "no compiled implementation" in info["ops"][op]["cpu"][1]
    assert set(info["ops"]) >= {"local_std", "ssim", "warp"}


def test_backend_info_without_build_reports_pending_and_builds_nothing(tmp_path):
    code = (
        "import json\n"
        "from napari_simwarp.backend import backend_info\n"
        "info = backend_info(build=False)\n"
        "print(json.dumps(info))\n"
    )
    result = _run(code, SIMWARP_CACHE_DIR=str(tmp_path), SIMWARP_BACKEND="auto")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["build"]["tried"] is False and info["build"]["loaded"] is False
    for op in COMPILED:
        assert info["ops"][op]["cpu"][0] == info["ops"][op]["cuda"][0] == "pending", op
    for op in DOCUMENTED_OPS - COMPILED:
        assert info["ops"][op]["cpu"][0] == "torch", op
    assert list(tmp_path.iterdir()) == []  # no build directory, no lock file


def test_backend_info_with_torch_requested_never_builds(tmp_path):
    code = (
        "import json\n"
        "from napari_simwarp.backend import backend_info\n"
        "info = backend_info()\n"
        "print(json.dumps([info['build']['tried'], info['ops']['local_std']['cpu']]))\n"
    )
    result = _run(code, SIMWARP_CACHE_DIR=str(tmp_path), SIMWARP_BACKEND="torch")
    assert result.returncode == 0, result.stderr
    _tried, local_std = json.loads(result.stdout.strip().splitlines()[-1])
    assert local_std == ["torch", "SIMWARP_BACKEND=torch"]
    assert list(tmp_path.iterdir()) == []
