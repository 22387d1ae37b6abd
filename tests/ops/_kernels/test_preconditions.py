"""The Python mirror of csrc/checks.h (ops/_kernels/preconditions.py), and the proof that
no call from Python reaches a C++ refusal (issue 23).

Every refusal of tests/csrc/test_checks.py is walked here three ways: the C++ binding
refuses it (RuntimeError); the mirror refuses it with the same message (TypeError or
ValueError), so the two cannot drift apart; and the wrapper the operators call
(ops/_kernels/calls.py) refuses it with no compiled op called at all.
"""

from __future__ import annotations

import types

import pytest
import torch

from napari_simwarp.ops._kernels import preconditions
from tests.compiled import require_compiled


def _x(*shape, dtype=torch.float64):
    return torch.rand(*shape, dtype=dtype)


X = _x(1, 2, 8, 9)
INT = X.to(torch.int32)
IMAGE, DISP = _x(2, 3, 4, 5), _x(2, 2, 4, 5)
SMALL = _x(1, 1, 5, 5)
STD_2D = (0.0, True, 1e-14)  # eps, normalize, flat factor

#: (what, the C++ op and its arguments, the mirror's call, the message both give)
REFUSALS = [
    ("box_sum int", ("box_sum", (INT, [3, 3])), lambda: preconditions.box_sum(INT, [3, 3], False),
     "x must be float32 or float64, got Int"),
    ("box_sum half", ("box_sum", (X.half(), [3, 3])),
     lambda: preconditions.box_sum(X.half(), [3, 3], False), "float32 or float64, got Half"),
    ("correlate int", ("correlate", (INT, [1.0] * 6, [3, 3])),
     lambda: preconditions.correlate(INT, [1.0] * 6, [3, 3], False),
     "x must be float32 or float64, got Int"),
    ("moments5 int", ("moments5", (INT.expand(2, 2, 8, 9), [1.0] * 6, [3, 3])),
     lambda: preconditions.moments5(INT.expand(2, 2, 8, 9), [1.0] * 6, [3, 3]),
     "centered must be float32 or float64, got Int"),
    ("local_std int", ("local_std_fwd", (INT, [3, 3], 0.0, True, 1e-14)),
     lambda: preconditions.local_std_fwd(INT, [3, 3]), "xp must be float32 or float64, got Int"),
    ("splat int", ("splat_fwd", (INT, INT, True, 1e-6)),
     lambda: preconditions.splat_fwd(INT, INT), "image must be float32 or float64, got Int"),
    ("box_sum window 0", ("box_sum", (X, [0, 3])), lambda: preconditions.box_sum(X, [0, 3], False),
     r"window sizes must be at least 1, got \[0, 3\]"),
    ("box_sum window 9", ("box_sum", (X, [9, 3])), lambda: preconditions.box_sum(X, [9, 3], False),
     r"window larger than the axis \(window \[9, 3\], shape \[1, 2, 8, 9\]\)"),
    ("box_sum 5 axes", ("box_sum", (X, [1] * 5)), lambda: preconditions.box_sum(X, [1] * 5, False),
     "a window of 5 axes needs at least 5 dimensions, got 4"),
    ("local_std window 0", ("local_std_fwd", (X, [0, 3], 0.0, True, 1e-14)),
     lambda: preconditions.local_std_fwd(X, [0, 3]), "window sizes must be at least 1"),
    ("local_std window 9", ("local_std_fwd", (X, [9, 3], 0.0, True, 1e-14)),
     lambda: preconditions.local_std_fwd(X, [9, 3]), "window larger than the axis"),
    ("local_std 5 axes", ("local_std_fwd", (X, [1] * 5, 0.0, True, 1e-14)),
     lambda: preconditions.local_std_fwd(X, [1] * 5), "a window of 5 axes needs at least 5"),
    ("local_std no axis", ("local_std_fwd", (X, [], 0.0, True, 1e-14)),
     lambda: preconditions.local_std_fwd(X, []), "window must cover at least one axis"),
    ("correlate too large", ("correlate", (X, [1.0] * 12, [9, 3])),
     lambda: preconditions.correlate(X, [1.0] * 12, [9, 3], False), "window larger than the axis"),
    ("correlate taps", ("correlate", (_x(2, 2, 8, 9), [1.0] * 5, [3, 3])),
     lambda: preconditions.correlate(X, [1.0] * 5, [3, 3], False),
     r"taps must hold sum\(sizes\) = 6 values, got 5"),
    ("moments5 taps", ("moments5", (_x(2, 2, 8, 9), [1.0] * 7, [3, 3])),
     lambda: preconditions.moments5(_x(2, 2, 8, 9), [1.0] * 7, [3, 3]),
     r"taps must hold sum\(sizes\) = 6 values, got 7"),
    ("moments5 stack", ("moments5", (_x(3, 2, 8, 9), [1.0] * 6, [3, 3])),
     lambda: preconditions.moments5(_x(3, 2, 8, 9), [1.0] * 6, [3, 3]), r"stack \[a, b\] on dim 0"),
    ("moments5 no axis", ("moments5", (_x(2, 2, 8, 9), [], [])),
     lambda: preconditions.moments5(_x(2, 2, 8, 9), [], []), "window must cover at least one axis"),
    ("moments5 pair axis", ("moments5", (_x(2, 8, 9), [1.0] * 9, [3, 3, 3])),
     lambda: preconditions.moments5(_x(2, 8, 9), [1.0] * 9, [3, 3, 3]),
     "a window of 3 axes needs at least 4 dimensions"),
    ("splat 3-D image", ("splat_fwd", (IMAGE[0], DISP[0], True, 1e-6)),
     lambda: preconditions.splat_fwd(IMAGE[0], DISP[0]),
     r"image must be \(N, C, H, W\) or \(N, C, D, H, W\)"),
    ("splat channels", ("splat_fwd", (IMAGE, _x(2, 3, 4, 5), True, 1e-6)),
     lambda: preconditions.splat_fwd(IMAGE, _x(2, 3, 4, 5)),
     r"displacement must have shape \[2, 2, 4, 5\], got \[2, 3, 4, 5\]"),
    ("splat batch", ("splat_fwd", (IMAGE, DISP[:1], True, 1e-6)),
     lambda: preconditions.splat_fwd(IMAGE, DISP[:1]),
     r"displacement must have shape \[2, 2, 4, 5\], got \[1, 2, 4, 5\]"),
    ("splat size", ("splat_fwd", (IMAGE, DISP[..., :4], True, 1e-6)),
     lambda: preconditions.splat_fwd(IMAGE, DISP[..., :4]),
     r"displacement must have shape \[2, 2, 4, 5\], got \[2, 2, 4, 4\]"),
    ("splat dtypes", ("splat_fwd", (IMAGE, DISP.float(), True, 1e-6)),
     lambda: preconditions.splat_fwd(IMAGE, DISP.float()),
     "displacement is Float but image is Double"),
    ("local_std_2d too large", ("local_std_2d_fwd", (SMALL, [7, 3], "valid", *STD_2D)),
     lambda: preconditions.local_std_2d_fwd(SMALL, [7, 3], valid=True), "window larger"),
    ("local_std_2d 3 axes", ("local_std_2d_fwd", (SMALL, [3, 3, 3], "reflect", *STD_2D)),
     lambda: preconditions.local_std_2d_fwd(SMALL, [3, 3, 3], valid=False),
     r"window \(kh, kw\)"),
]  # fmt: skip


@pytest.mark.parametrize("what, compiled, mirror, match", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_the_mirror_refuses_what_the_binding_refuses_with_its_message(
    what, compiled, mirror, match
):
    with pytest.raises((TypeError, ValueError), match=match):
        mirror()
    require_compiled()
    op, args = compiled
    with pytest.raises(RuntimeError, match=match):
        getattr(torch.ops.simwarp, op)(*args)


@pytest.mark.parametrize(
    "call",
    [
        lambda: preconditions.box_sum(X, [9, 3], True),  # full mode pads: any size
        lambda: preconditions.correlate(X, [1.0] * 12, [9, 3], True),
        lambda: preconditions.local_std_2d_fwd(_x(1, 1, 5, 5), [7, 3], valid=False),
        lambda: preconditions.splat_fwd(IMAGE, DISP),
        lambda: preconditions.moments5(_x(2, 1, 2, 8, 9), [1.0] * 6, [3, 3]),
    ],
)
def test_the_mirror_accepts_what_the_binding_accepts(call):
    call()


class _NoCompiledOps:
    """Stands in for the torch module inside calls.py: anything but ``torch.ops`` is the
    real torch; any compiled op called fails the test."""

    def __getattr__(self, name):
        if name != "ops":
            return getattr(torch, name)

        def refuse(op):
            def call(*args, **kwargs):
                pytest.fail(f"torch.ops.simwarp.{op} was called with a refused argument")

            return call

        simwarp = type("Ops", (), {"__getattr__": lambda self, op: refuse(op)})()
        return types.SimpleNamespace(simwarp=simwarp)


@pytest.fixture
def calls(monkeypatch):
    """calls.py with its compiled ops replaced by a failure."""
    from napari_simwarp.ops._kernels import calls

    monkeypatch.setattr(calls, "torch", _NoCompiledOps())
    return calls


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: c.box_sum(INT, [3, 3]), "float32 or float64, got Int"),
        (lambda c: c.box_sum(X, [0, 3]), "window sizes must be at least 1"),
        (lambda c: c.box_sum(X, [9, 3]), "window larger than the axis"),
        (lambda c: c.box_sum(X, [1] * 5), "a window of 5 axes"),
        (lambda c: c.correlate(X, [[1.0] * 9, [1.0] * 3]), "window larger than the axis"),
        (lambda c: c.moments5(_x(3, 2, 8, 9), [[1.0] * 3] * 2), r"stack \[a, b\]"),
        (lambda c: c.moments5(_x(2, 2, 8, 9), []), "at least one axis"),
        (lambda c: c.local_std_valid(X, [9, 3], 0.0, True), "window larger than the axis"),
        (lambda c: c.local_std_valid(X, [], 0.0, True), "at least one axis"),
        (lambda c: c.local_std_valid(INT, [3, 3], 0.0, True), "got Int"),
        (lambda c: c.local_std_2d(X, [3, 3], "wrap", 0.0, True), "padding must be"),
        (lambda c: c.local_std_2d(X, [9, 3], "valid", 0.0, True), "window larger"),
        (lambda c: c.splat_fwd(IMAGE, DISP.float(), True, 1e-6), "Float but image is Double"),
        (lambda c: c.splat_fwd(IMAGE, DISP[:1], True, 1e-6), "displacement must have shape"),
    ],
)
def test_the_calls_the_operators_make_refuse_before_any_compiled_op(calls, call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call(calls)
