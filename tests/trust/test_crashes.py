"""Class "crashes": non-finite displacements, rates and transforms never reach a kernel.

Each case runs in its own interpreter: were one to crash the process (torch's
``grid_sample`` backward does on a NaN grid), it would fail this test, not kill the suite.
Every case must end with a clear ValueError (or, for splatting, a documented finite
result), never a signal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CASES = {
    "warp backward, NaN displacement": """
        x = torch.rand(1, 1, 40, 40, requires_grad=True)
        d = torch.zeros(1, 2, 40, 40); d[0, 0, 5, 5] = float("nan"); d.requires_grad_()
        ops.warp(x, d).sum().backward()
    """,
    "warp 3D, infinite displacement, every padding": """
        x = torch.rand(1, 1, 8, 9, 10, requires_grad=True)
        d = torch.zeros(1, 3, 8, 9, 10); d[0, 2, 1, 1, 1] = float("inf"); d.requires_grad_()
        for padding in ("nearest", "mirror", "reflect", "grid-constant"):
            try:
                ops.warp(x, d, padding=padding).sum().backward()
            except ValueError:
                continue
            raise SystemExit("no error for " + padding)
        raise ValueError("all refused")
    """,
    "similarity_gradient, NaN displacement": """
        x = torch.rand(1, 1, 32, 32)
        d = torch.zeros(1, 2, 32, 32); d[0, 1, 3, 3] = float("nan")
        ops.similarity_gradient(x, x, d)
    """,
    "compose / invert / integrate_velocity, NaN field": """
        d = torch.zeros(1, 2, 16, 16); d[0, 0, 2, 2] = float("nan")
        for f in (lambda: ops.compose(d, d), lambda: ops.invert(d),
                  lambda: ops.integrate_velocity(d)):
            try:
                f()
            except ValueError:
                continue
            raise SystemExit("no error")
        raise ValueError("all refused")
    """,
    "register, lr=inf": """
        f = np.random.default_rng(0).random((48, 48))
        napari_simwarp.register(f, f, model="deformable", lr=float("inf"))
    """,
    "register, NaN init": """
        f = np.random.default_rng(0).random((48, 48))
        init = np.full((2, 48, 48), np.nan)
        napari_simwarp.register(f, f, model="deformable", init=init)
    """,
    "register_stack, NaN-filled frame": """
        s = np.random.default_rng(0).random((3, 48, 48)); s[1, 4, 4] = np.nan
        napari_simwarp.register_stack(s)
    """,
}

PRELUDE = """
import numpy as np, torch, napari_simwarp
from napari_simwarp import ops
try:
{body}
except ValueError as exc:
    print("VALUE_ERROR", exc)
"""


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_non_finite_values_give_a_clear_error_not_a_crash(case, backend):
    body = textwrap.indent(textwrap.dedent(CASES[case]).strip(), "    ")
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE.format(body=body)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "SIMWARP_BACKEND": backend},
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "VALUE_ERROR" in result.stdout, result.stdout + result.stderr[-2000:]


def test_splat_of_non_finite_displacements_is_finite_and_documented():
    code = """
import json, torch
from napari_simwarp import ops
x = torch.rand(1, 1, 16, 16, requires_grad=True)
d = torch.zeros(1, 2, 16, 16); d[0, 0, 3, 3] = float("nan"); d[0, 1, 4, 4] = float("inf")
d.requires_grad_()
out, w = ops.splat(x, d, return_weights=True)
gx, gd = torch.autograd.grad(out.sum() + w.sum(), (x, d))
print(json.dumps([bool(torch.isfinite(t).all()) for t in (out, w, gx, gd)]))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [True] * 4


def test_the_cli_exits_2_with_one_line_not_a_signal(tmp_path):
    import numpy as np

    f = np.random.default_rng(0).random((48, 48)).astype(np.float32)
    np.save(tmp_path / "f.npy", f)
    np.save(tmp_path / "m.npy", f)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "napari_simwarp._cli",
            "register",
            str(tmp_path / "f.npy"),
            str(tmp_path / "m.npy"),
            "-o",
            str(tmp_path / "o.npy"),
            "--model",
            "deformable",
            "--lr",
            "inf",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "lr" in lines[0]
