"""The kernel loader (ops/_kernels/__init__.py): environment override, one clear warning
and a torch fallback, nothing built on import."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from napari_simwarp.ops import _kernels
from tests.compiled import require_compiled


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


# ---- the self-check: on CUDA, "auto" runs an op's kernels only after they passed it ------
#
# No GPU here: the CPU is made a self-checked device type, and the check itself is mocked,
# so what is tested is the routing and the report, the same code CUDA tensors take.


def _failing_check(failed_op: str, calls: list):
    """A check_device that fails ``failed_op`` (as a launch error would) and counts calls."""
    from napari_simwarp.ops._kernels import self_check

    def check_device(device):
        calls.append(str(device))
        return {
            op: self_check.Check(False, math.nan, 1e-4, f"{op} failed to run: RuntimeError: boom")
            if op == failed_op
            else self_check.Check(True, 1e-7, 1e-4)
            for op in self_check.PRIMITIVES
        }

    return check_device


@pytest.fixture
def checked_cpu(monkeypatch):
    """The CPU treated as a self-checked device type, with no check run yet."""
    require_compiled()
    monkeypatch.setattr(_kernels, "SELF_CHECKED_DEVICE_TYPES", {"cpu", "cuda"})
    monkeypatch.setattr(_kernels, "_checks", {})
    return monkeypatch


def test_auto_sends_an_op_that_failed_its_self_check_to_torch(checked_cpu):
    from napari_simwarp import backend_info, ops
    from napari_simwarp.ops import _reference
    from napari_simwarp.ops._kernels import calls

    runs = []
    checked_cpu.setattr(_kernels.self_check, "check_device", _failing_check("local_std", runs))
    checked_cpu.setenv("SIMWARP_BACKEND", "auto")
    x = torch.rand(1, 1, 24, 25, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ops.local_std(x, window=5)
        again = ops.local_std(x, window=5)
    assert runs == ["cpu"]  # once per device
    (warning,) = [w for w in caught if "self-check" in str(w.message)]
    assert "the compiled kernels of local_std failed their self-check on cpu" in str(
        warning.message
    )
    assert "local_std failed to run: RuntimeError: boom" in str(warning.message)
    assert _kernels.implementation("local_std", x) is _reference
    assert _kernels.implementation("ssim", x) is calls  # the others passed
    checked_cpu.setenv("SIMWARP_BACKEND", "torch")
    torch_path = ops.local_std(x, window=5)
    assert torch.equal(out, torch_path) and torch.equal(again, torch_path)
    checked_cpu.setenv("SIMWARP_BACKEND", "auto")
    info = backend_info()
    assert info["ops"]["local_std"]["cpu"] == (
        "torch",
        "self-check failed on cpu: local_std failed to run: RuntimeError: boom",
    )
    backend, why = info["ops"]["ssim"]["cpu"]
    assert backend == "compiled" and why.startswith("self-check passed on cpu")
    assert info["self_check"]["cpu"]["local_std"]["passed"] is False
    assert info["self_check"]["cpu"]["ssim"]["error"] == 1e-7


def test_backend_info_without_build_runs_no_self_check(checked_cpu):
    from napari_simwarp import backend_info

    runs = []
    checked_cpu.setattr(_kernels.self_check, "check_device", _failing_check("splat", runs))
    checked_cpu.setenv("SIMWARP_BACKEND", "auto")
    info = backend_info(build=False)
    assert runs == [] and info["self_check"] == {}
    assert info["ops"]["local_std"]["cpu"] == ("pending", "self-check on first use on cpu")


def test_compiled_backend_runs_the_kernels_without_a_self_check(checked_cpu):
    runs = []
    checked_cpu.setattr(_kernels.self_check, "check_device", _failing_check("local_std", runs))
    checked_cpu.setenv("SIMWARP_BACKEND", "compiled")
    assert _kernels.use_compiled("local_std", torch.zeros(1))
    assert runs == []


def test_deterministic_algorithms_send_atomic_kernels_to_torch(monkeypatch):
    # splat's CUDA kernel scatters with atomics; "auto" gives it to torch (whose scatter
    # torch makes deterministic) under use_deterministic_algorithms, "compiled" runs it
    # (and the kernel raises torch's alert: test_host_shim.py). The CPU stands in here.
    require_compiled()
    monkeypatch.setattr(_kernels, "NONDETERMINISTIC", {"local_std": {"cpu"}})
    x = torch.zeros(1)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        monkeypatch.setenv("SIMWARP_BACKEND", "auto")
        assert not _kernels.use_compiled("local_std", x)
        assert _kernels.report([])["ops"]["local_std"]["cpu"] == (
            "torch",
            "torch.use_deterministic_algorithms(True): the kernel uses atomic additions",
        )
        monkeypatch.setenv("SIMWARP_BACKEND", "compiled")
        assert _kernels.use_compiled("local_std", x)
    finally:
        torch.use_deterministic_algorithms(before)
    monkeypatch.setenv("SIMWARP_BACKEND", "auto")
    assert _kernels.use_compiled("local_std", x)


def test_splat_on_cuda_is_refused_under_deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert _kernels._deterministic_refusal("splat", {"cuda"}) is not None
        assert _kernels._deterministic_refusal("splat", {"cpu"}) is None  # serial scatter
        assert _kernels._deterministic_refusal("local_std", {"cuda"}) is None
    finally:
        torch.use_deterministic_algorithms(before)
    assert _kernels._deterministic_refusal("splat", {"cuda"}) is None


# ---- a CUDA build that fails never costs the CPU kernels -----------------------------------


def test_a_failed_cuda_build_keeps_the_cpu_kernels(monkeypatch):
    require_compiled()
    from napari_simwarp.ops._kernels import _build

    real_build = _build.build

    def build(kind, verbose=False):
        if kind == "cuda":
            raise RuntimeError("Error building extension 'simwarp_ops_cuda'\nnvcc fatal: boom")
        return real_build(kind, verbose)

    monkeypatch.setattr(_build, "cuda_build_possible", lambda: (True, "faked"))
    monkeypatch.setattr(_build, "build", build)
    monkeypatch.setattr(_kernels, "_state", {**_kernels.state(), "tried": False, "cpu": False})
    monkeypatch.setenv("SIMWARP_BACKEND", "auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _kernels.ensure_loaded()
    state = _kernels.state()
    assert state["cpu"] and not state["cuda"] and state["error"] is None
    assert state["cuda_error"] == "RuntimeError: nvcc fatal: boom"
    # Besides: another process's build of the CPU kernels (xdist workers in a fresh
    # clone) may make this one wait, which it says; nothing else may warn.
    others = [w for w in caught if "another process is building" not in str(w.message)]
    (warning,) = others
    assert "the CUDA kernels failed to build (RuntimeError: nvcc fatal: boom)" in str(
        warning.message
    )
    x = torch.rand(1, 1, 9, 9)
    assert _kernels.use_compiled("local_std", x)  # the CPU kernels run
    assert torch.ops.simwarp.box_sum(x, [3, 3]).shape == (1, 1, 7, 7)
    info = _kernels.report(["local_std"])
    assert info["ops"]["local_std"]["cuda"] == ("torch", "RuntimeError: nvcc fatal: boom")
    assert info["ops"]["local_std"]["cpu"][0] == "compiled"


def test_torch_until_loaded_neither_builds_nor_waits_then_lets_the_kernels_run(monkeypatch):
    # The widgets' "pure torch while the kernels build" (issue 13): an operator called
    # while the build runs in another thread takes the torch path instead of waiting.
    monkeypatch.setenv(_kernels.ENV_BACKEND, "compiled")
    monkeypatch.setitem(_kernels._state, "tried", False)
    monkeypatch.setitem(_kernels._state, "cpu", False)
    calls = []
    monkeypatch.setattr(_kernels, "ensure_loaded", lambda *a: calls.append(a) or False)
    monkeypatch.setattr(_kernels, "_torch_until_loaded", threading.Event())
    x = torch.zeros(1, 1, 4, 4)
    assert not _kernels.torch_until_loaded()
    assert not _kernels.use_compiled("local_std", x) and len(calls) == 1  # asked to build
    assert _kernels.torch_until_loaded(True)
    assert not _kernels.use_compiled("local_std", x) and len(calls) == 1  # did not ask
    # loaded meanwhile: the kernels run (compiled backend, no self-check)
    monkeypatch.setitem(_kernels._state, "tried", True)
    monkeypatch.setattr(_kernels, "ensure_loaded", lambda *a: True)
    assert _kernels.use_compiled("local_std", x)
    assert not _kernels.torch_until_loaded(False)
