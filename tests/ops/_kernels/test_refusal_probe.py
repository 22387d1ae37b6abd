"""The refusal probe (ops/_kernels/refusal_probe.py) and what "auto" does with its answer.

The crash it guards against (issue 23: every C++ refusal ended the process with SIGSEGV
on one GPU machine) cannot be made here, so the child is replaced by one that dies the
same way; the real child runs too, and must pass on this machine.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from napari_simwarp.ops import _kernels, _reference, local_std
from napari_simwarp.ops._kernels import refusal_probe
from tests.compiled import require_compiled

SEGFAULT = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"


def test_a_refused_call_raises_in_the_real_child_here():
    require_compiled()
    assert refusal_probe.run(("cpu",), "cpu") is None


@pytest.mark.parametrize(
    "child, why",
    [
        (SEGFAULT, "died with SIGSEGV"),
        ("import sys; sys.exit(3)", "the call it must refuse ran"),
        ("import sys; print('boom', file=sys.stderr); sys.exit(4)", "unexpected message"),
    ],
)
def test_a_failed_child_says_how_it_failed(child, why):
    failure = refusal_probe.run(("cpu",), "cpu", child=child)
    assert failure is not None and why in failure


def test_a_child_that_never_reaches_the_call_is_inconclusive_and_keeps_the_kernels(
    tmp_path, monkeypatch
):
    # e.g. a GPU in exclusive-process mode, or an import error: no evidence of a crash
    failure = refusal_probe.run(("cpu",), "cpu", child="raise ImportError('no such thing')")
    assert failure.startswith(refusal_probe.INCONCLUSIVE) and "no such thing" in failure
    _load_afresh_with_child("raise ImportError", tmp_path, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _kernels.ensure_loaded()
    assert _kernels.state()["refusal"] == {}
    assert _kernels.use_compiled("local_std", torch.rand(1, 1, 8, 8))
    assert not (tmp_path / "probe-cpu.ok").exists()  # not recorded as passed


def test_a_hung_child_is_a_failure(monkeypatch):
    monkeypatch.setattr(refusal_probe, "TIMEOUT", 0.5)
    failure = refusal_probe.run(("cpu",), "cpu", child="import time; time.sleep(30)")
    assert failure is not None and "hung" in failure


def test_a_passed_probe_is_remembered_per_interpreter(tmp_path, monkeypatch):
    ran = []
    real_run = refusal_probe.run

    def run(kinds, device, child=None):
        ran.append(device)
        return real_run(kinds, device, child="pass" if len(ran) == 1 else SEGFAULT)

    monkeypatch.setattr(refusal_probe, "run", run)
    assert refusal_probe.probe_once(("cpu",), "cpu", tmp_path) is None  # passes, recorded
    assert refusal_probe.marker(tmp_path, "cpu").read_text().strip() == sys.executable
    assert refusal_probe.probe_once(("cpu",), "cpu", tmp_path) is None and len(ran) == 1
    # Another interpreter (the same cache seen from another environment) probes again.
    refusal_probe.marker(tmp_path, "cpu").write_text("/some/other/python\n")
    assert "SIGSEGV" in refusal_probe.probe_once(("cpu",), "cpu", tmp_path)
    assert len(ran) == 2


def _load_afresh_with_child(child, tmp_path, monkeypatch):
    """The kernels about to be loaded afresh under "auto", with ``child`` as the probe's
    child and no record of an earlier probe."""
    require_compiled()
    real_run = refusal_probe.run
    monkeypatch.setattr(refusal_probe, "run", lambda k, d, **_: real_run(k, d, child=child))
    monkeypatch.setattr(refusal_probe, "marker", lambda d, t: tmp_path / f"probe-{t}.ok")
    monkeypatch.setattr(
        _kernels, "_state", {**_kernels.state(), "tried": False, "cpu": False, "refusal": {}}
    )
    monkeypatch.setenv(_kernels.ENV_BACKEND, "auto")


@pytest.fixture
def crashing_probe(tmp_path, monkeypatch):
    """Kernels loaded afresh under "auto", with a probe child that dies of SIGSEGV."""
    _load_afresh_with_child(SEGFAULT, tmp_path, monkeypatch)


def test_a_crashed_probe_sends_auto_to_torch_with_one_warning(crashing_probe, monkeypatch):
    x = torch.rand(1, 1, 20, 24, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _kernels.ensure_loaded()  # the CPU kernels load ...
        assert not _kernels.use_compiled("local_std", x)  # ... but "auto" does not use them
        got = local_std(x, window=5)
        local_std(x, window=5)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "not used on cpu" in messages[0] and "SIGSEGV" in messages[0]
    assert "died with SIGSEGV" in _kernels.state()["refusal"]["cpu"]
    backend, why = _kernels.report(["local_std"])["ops"]["local_std"]["cpu"]
    assert backend == "torch" and "SIGSEGV" in why
    # the pure torch path ran: exactly its result
    monkeypatch.setenv(_kernels.ENV_BACKEND, "torch")
    torch.testing.assert_close(got, local_std(x, window=5), rtol=0, atol=0)


def test_compiled_backend_does_not_probe(crashing_probe, monkeypatch):
    monkeypatch.setenv(_kernels.ENV_BACKEND, "compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _kernels.ensure_loaded()
    assert _kernels.state()["refusal"] == {}
    assert _kernels.use_compiled("local_std", torch.rand(1, 1, 8, 8))


def test_the_reference_module_is_what_auto_falls_back_to(crashing_probe):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _kernels.implementation("ssim", torch.rand(1, 1, 8, 8)) is _reference
