"""The kernel loader (ops/_kernels/__init__.py): environment override, one clear warning
and a torch fallback, nothing built on import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from napari_simwarp.ops import _kernels


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=600
    )


def test_requested_backend_validates(monkeypatch):
    monkeypatch.setenv("SIMWARP_BACKEND", "gpu-please")
    with pytest.raises(ValueError, match="SIMWARP_BACKEND must be one of"):
        _kernels.requested_backend()


def test_torch_backend_never_builds(monkeypatch):
    monkeypatch.setenv("SIMWARP_BACKEND", "torch")
    assert not _kernels.use_compiled("local_std", torch.zeros(1))


def test_mps_and_other_devices_use_torch():
    # A meta tensor stands in for any device the kernels are not built for.
    assert not _kernels.use_compiled("local_std", torch.empty(1, device="meta"))


def test_no_compiler_falls_back_with_one_warning(tmp_path):
    code = (
        "import warnings, json\n"
        "warnings.simplefilter('always')\n"
        "from napari_simwarp.ops import _kernels\n"
        "import torch\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    a = _kernels.use_compiled('local_std', torch.zeros(1))\n"
        "    b = _kernels.use_compiled('local_std', torch.zeros(1))\n"
        "print(json.dumps([a, b, [str(x.message) for x in w]]))\n"
    )
    result = _run(
        code, CXX="no-such-compiler-xyz", SIMWARP_CACHE_DIR=str(tmp_path), SIMWARP_BACKEND="auto"
    )
    assert result.returncode == 0, result.stderr
    used_a, used_b, messages = json.loads(result.stdout.strip().splitlines()[-1])
    assert not used_a and not used_b
    assert len(messages) == 1 and "no C++ compiler found" in messages[0]


def test_forced_compiled_without_compiler_raises(tmp_path):
    code = (
        "from napari_simwarp.ops import _kernels\n"
        "import torch\n"
        "_kernels.use_compiled('local_std', torch.zeros(1))\n"
    )
    result = _run(
        code,
        CXX="no-such-compiler-xyz",
        SIMWARP_CACHE_DIR=str(tmp_path),
        SIMWARP_BACKEND="compiled",
    )
    assert result.returncode != 0
    assert "SIMWARP_BACKEND=compiled, but the kernels could not be built" in result.stderr


def test_import_builds_nothing(tmp_path):
    result = _run(
        "import napari_simwarp.ops; import os; print(os.listdir(os.environ['SIMWARP_CACHE_DIR']))",
        SIMWARP_CACHE_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_auto_keeps_splat_on_torch_for_cpu(monkeypatch):
    # The CPU splat kernel measured slower than torch's scatter: "auto" must not pick it,
    # "compiled" must (where the kernels exist).
    monkeypatch.setenv("SIMWARP_BACKEND", "auto")
    assert not _kernels.use_compiled("splat", torch.zeros(1))
