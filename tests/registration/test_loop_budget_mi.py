"""A dense Adam iteration with metric "mi", counted as tests/registration/test_loop_budget.py
counts the others (issue 24): the loss's Parzen histogram, its entropies' closed-form
gradient and the NaN rule with no host read, one compiled op each way where the kernels
run (simwarp::parzen_fwd / parzen_bwd; on CUDA each launches its kernels inside: a memset
and three kernels forward, one backward), else the pure torch path
(ops/mutual_information.py: _JointHistogram, _Score)."""

from __future__ import annotations

import pytest

from napari_simwarp.ops import _kernels
from napari_simwarp.registration.models import DenseModel
from tests.registration.test_loop_budget import (
    _pair,
    adam_per_iteration,
    gpu_policy,  # noqa: F401 (a fixture)
)


@pytest.mark.usefixtures("gpu_policy")
def test_a_dense_adam_iteration_with_mi_holds_the_budget():
    """(Before issue 24's work on "mi": 291 launches and 2.1 syncs per iteration: the NaN
    check read two sums back per call, and autograd ran through the entropies; then 136
    on the torch path, 24 with the compiled op.)"""
    fixed, moving = _pair((64, 64))

    def make():
        return DenseModel("deformable", (64, 64), 1)

    launches, syncs, wide, counter = adam_per_iteration(make, fixed, moving, "mi")
    compiled = _kernels.use_compiled("mutual_information", fixed)
    assert launches <= (25 if compiled else 137), dict(counter.ops)
    assert syncs <= 0.1, dict(counter.sync_ops)
    assert wide == 0, dict(counter.float64_ops)
