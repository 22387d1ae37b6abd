"""A process's first registration pays no import it does not need (issue 27: a first run's
latency counts, from a script, the CLI and the widgets alike).

The first ``torch.optim`` optimizer of a process imports ``torch._dynamo`` (1-2 s of
Python holding the GIL, 2.06 s of a first small deformable run's 2.26 s under cProfile);
the engine's solvers make none on the CPU (solvers/adam.py's FusedAdam, Gauss–Newton).
Run in a fresh process, where nothing has imported it yet."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

RUN = """
import sys
import numpy as np
from napari_simwarp.registration import register, register_stack
assert "torch._dynamo" not in sys.modules, "imported with the engine"
rng = np.random.default_rng(0)
fixed = rng.random((48, 48)).astype(np.float32)
moving = np.roll(fixed, 1, axis=0)
register(fixed, moving, model={model!r}, device="cpu", iterations=3)
assert "torch._dynamo" not in sys.modules, "imported by the run"
"""


@pytest.mark.parametrize("model", ["deformable", "diffeomorphic", "affine", "rigid"])
def test_a_first_run_does_not_import_torch_dynamo(model):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(model=model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
