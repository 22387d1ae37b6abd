"""The host-shim build of the CUDA sources, for the tests of this folder.

``host_shim`` builds csrc/cuda/ as host code (ops/_kernels/_build.py, kind "host_shim") and
returns its ops, ``torch.ops.simwarp_host_shim``: the CUDA bindings and kernels run on CPU
tensors, every block and thread in turn. Skipped where the compiled kernels are (failed
under SIMWARP_REQUIRE_COMPILED=1, as CI sets it).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.compiled import require_compiled


def require_host_shim():
    """Build/load the host-shim extension, or skip (fail under SIMWARP_REQUIRE_COMPILED=1)."""
    require_compiled()
    from napari_simwarp.ops._kernels import _build

    try:
        _build.build("host_shim")
    except Exception as exc:  # a compiler error is a test failure in CI, a skip elsewhere
        message = f"the host-shim build failed: {type(exc).__name__}: {exc}"
        if os.environ.get("SIMWARP_REQUIRE_COMPILED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return torch.ops.simwarp_host_shim


@pytest.fixture(scope="session")
def host_shim():
    return require_host_shim()
