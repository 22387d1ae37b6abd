"""Helpers for tests of the compiled kernels: build once, skip or fail clearly without them.

Where the kernels cannot be built the compiled tests are skipped, unless
SIMWARP_REQUIRE_COMPILED=1 (CI sets it): then they fail, because CI must test that path.
"""

from __future__ import annotations

import os

import pytest


def require_compiled():
    """Build/load the kernels or skip (fail under SIMWARP_REQUIRE_COMPILED=1)."""
    from napari_simwarp.ops import _kernels

    if os.environ.get(_kernels.ENV_BACKEND, "auto") == "torch":
        pytest.skip("SIMWARP_BACKEND=torch")
    if not _kernels.ensure_loaded():
        message = f"compiled kernels unavailable: {_kernels.state()['error']}"
        if os.environ.get("SIMWARP_REQUIRE_COMPILED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from napari_simwarp.ops._kernels import calls

    return calls
