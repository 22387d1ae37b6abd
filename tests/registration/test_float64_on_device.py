"""No float64 image on the device in a registration (issue 24): every run, with the GPU's
dtype policy forced on the CPU.

GPUs run float64 at 1/32 to 1/64 of the float32 rate (consumer cards), MPS not at all.
A dispatch mode records every op that returns a float64 tensor larger than the small
matrices (the ``(N, D+1, D+1)`` pixel matrices, candidate rotations, shift guesses: at
most a few hundred numbers, kept in float64 on the host, where origins far from zero need
it). Larger float64 tensors are allowed only in the host-side code named in
:data:`HOST_SIDE`, each for its reason; anything else is a float64 image a GPU would
compute in float64, and fails here.

The inputs are float32: a float64 input is read into float64 tensors on the host (and
rescaled there), which a run on the CPU cannot tell from the device; its returned warp is
float64 by design.
"""

from __future__ import annotations

import traceback

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from napari_simwarp.registration import register, register_stack
from tests.registration.cases import affine_pair, centered_affine
from tests.registration.test_loop_budget import gpu_policy  # noqa: F401 (a fixture)

#: the largest float64 tensor counted as a small host-side matrix
SMALL = 1024
#: (file, function) of the host-side code that builds larger float64 tensors on purpose
HOST_SIDE = {
    # the cubic B-spline's weight tables: worked out once per (grid, size) on the CPU
    # (MPS has no float64), cached, and handed to the device in its dtype
    ("models.py", "_bspline_weights"),
    ("models.py", "bspline_weights"),
    # a dense level's least-squares refit of the finer control grid, on the CPU (small)
    ("models.py", "set_level"),
    ("models.py", "apply_per_axis"),
}


class _Float64Images(TorchDispatchMode):
    """Where (file, function, line) each float64 result above :data:`SMALL` elements came
    from, outside :data:`HOST_SIDE`."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        wide = [
            t
            for t in flat
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() > SMALL
        ]
        if wide:
            ours = [f for f in traceback.extract_stack() if "napari_simwarp" in f.filename]
            frame = ours[-1] if ours else None
            where = ("?", "?") if frame is None else (frame.filename.split("/")[-1], frame.name)
            if where not in HOST_SIDE:
                line = "" if frame is None else f":{frame.lineno} {frame.line}"
                self.found.append(f"{func} {tuple(wide[0].shape)} at {where[0]}{line}")
        return out


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(0)
    m = centered_affine(np.eye(2), (3.0, -2.0), (64, 64))
    fixed, moving = affine_pair(rng, (64, 64), m)
    return fixed.astype(np.float32), moving.astype(np.float32)


RUNS = {
    "affine": lambda f, m: register(f, m, model="affine"),
    "rigid, mi": lambda f, m: register(f, m, model="rigid", metric="mi", iterations=5),
    "affine, mi": lambda f, m: register(f, m, model="affine", metric="mi"),
    "affine, adam": lambda f, m: register(f, m, model="affine", optimizer="adam", iterations=5),
    "deformable": lambda f, m: register(f, m, model="deformable", iterations=5),
    "diffeomorphic": lambda f, m: register(f, m, model="diffeomorphic", iterations=5),
    "two grids, dense": lambda f, m: register(
        f, m[:48], model="deformable", moving_spacing=(1.2, 1.0), iterations=5
    ),
    "a batch": lambda f, m: register([f, m], [m, f], model="similarity"),
    "stack, translation": lambda f, m: register_stack(np.stack([f, m, f])),
    "stack, rigid, mean": lambda f, m: register_stack(
        np.stack([f, m, f]), model="rigid", reference="mean"
    ),
    "stack, deformable": lambda f, m: register_stack(
        np.stack([f, m]), model="deformable", iterations=5
    ),
}


@pytest.mark.usefixtures("gpu_policy")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("run", list(RUNS.values()), ids=list(RUNS))
def test_no_float64_image_is_made_in_a_registration(pair, run):
    counter = _Float64Images()
    with counter:
        run(*pair)
    assert counter.found == []
