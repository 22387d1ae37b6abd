"""The refusals of tests/csrc/test_checks.py, walked through the public API (issue 23).

A C++ refusal that fails to cross back into Python kills the process (seen on one GPU
machine: SIGSEGV). So every public operator, loss and registration path must refuse a bad
argument itself, in the user's words, before any compiled call; and what it accepts must
never hand the kernels an argument they refuse. Each case runs on the compiled backend
with every compiled call recorded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp import ops, register, register_stack
from napari_simwarp.ops._kernels import preconditions
from tests.compiled import require_compiled

#: the functions of ops/_kernels/calls.py and the check each binding runs first
_CHECKS = {
    "box_sum": lambda x, window, full=False: preconditions.box_sum(x, list(window), full),
    "correlate": lambda x, taps, transpose=False: preconditions.correlate(
        x, [t for axis in taps for t in axis], [len(axis) for axis in taps], transpose
    ),
    "moments5": lambda c, taps: preconditions.moments5(
        c, [t for axis in taps for t in axis], [len(axis) for axis in taps]
    ),
    "splat_fwd": lambda image, displacement, *_: preconditions.splat_fwd(image, displacement),
    "local_std_valid": lambda xp, window, *_: preconditions.local_std_fwd(xp, list(window)),
    "local_std_2d": lambda x, window, padding, *_: preconditions.local_std_2d_fwd(
        x, list(window), valid=padding == "valid"
    ),
}


@pytest.fixture
def compiled_calls(monkeypatch):
    """The compiled backend, with every call into the kernels recorded as (name, refusal):
    ``refusal`` is the binding's message for an argument it would refuse, else None."""
    calls = require_compiled()
    monkeypatch.setenv("SIMWARP_BACKEND", "compiled")
    record = []
    for name, check in _CHECKS.items():
        real = getattr(calls, name)

        def spy(*args, _real=real, _check=check, _name=name, **kwargs):
            try:
                _check(*args, **kwargs)
                refusal = None
            except (TypeError, ValueError) as exc:
                refusal = str(exc)
            record.append((_name, refusal))
            return _real(*args, **kwargs)

        monkeypatch.setattr(calls, name, spy)
    return record


def _t(*shape, dtype=torch.float64, seed=0):
    return torch.rand(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


X, Y = _t(1, 2, 8, 9), _t(1, 2, 8, 9, seed=1)
D = torch.zeros(1, 2, 8, 9, dtype=torch.float64)

#: (what, the public call, the error type, what its message must say)
REFUSED = [
    ("local_std int", lambda: ops.local_std(X.int(), window=3), TypeError, "x must be a floating"),
    ("local_std window 0", lambda: ops.local_std(X, window=0), ValueError, "window must be odd"),
    ("local_std window 9", lambda: ops.local_std(X, window=(9, 3)), ValueError, "window .* larger"),
    ("local_std valid 9", lambda: ops.local_std(X, window=(9, 3), padding="valid"), ValueError,
     "window .* larger"),
    ("local_std 5 axes", lambda: ops.local_std(X, window=(1,) * 5), ValueError,
     "window must have one size per spatial axis"),
    ("local_ncc int", lambda: ops.local_ncc(X.int(), Y, window=3), TypeError,
     "a must be a floating"),
    ("local_ncc window 0", lambda: ops.local_ncc(X, Y, window=0), ValueError, "window must be odd"),
    ("local_ncc window 9", lambda: ops.local_ncc(X, Y, window=(9, 3)), ValueError,
     "window .* larger"),
    ("local_ncc 5 axes", lambda: ops.local_ncc(X, Y, window=(1,) * 5), ValueError,
     "one size per spatial axis"),
    ("ssim int", lambda: ops.ssim(X, Y.int()), TypeError, "b must be a floating"),
    ("ssim window 0", lambda: ops.ssim(X, Y, window=0), ValueError, "window must be odd"),
    ("ssim window 9", lambda: ops.ssim(X, Y, window=(9, 3)), ValueError, "window .* larger"),
    ("ssim 5 axes", lambda: ops.ssim(X, Y, window=(1,) * 5), ValueError, "one size per spatial"),
    ("LocalNCCLoss window 0", lambda: ops.LocalNCCLoss(window=0)(X, Y), ValueError, "window"),
    ("SSIMLoss window 9", lambda: ops.SSIMLoss(window=(9, 3))(X, Y), ValueError, "window"),
    ("similarity_gradient window 0",
     lambda: ops.similarity_gradient(X, Y, D, metric="lncc", window=0), ValueError, "window"),
    ("splat int", lambda: ops.splat(X.int(), D), TypeError, "image must be a floating"),
    ("splat 3-D image", lambda: ops.splat(X[0], D[0]), ValueError, r"image must be \(N, C"),
    ("splat channels", lambda: ops.splat(X, _t(1, 3, 8, 9)), ValueError,
     "displacement must have 2 channels"),
    ("splat batch", lambda: ops.splat(_t(2, 2, 8, 9), _t(3, 2, 8, 9)), ValueError,
     "displacement's batch size"),
    ("splat size", lambda: ops.splat(X, D[..., :8]), ValueError, "displacement's spatial shape"),
    ("match_template int", lambda: ops.match_template(X.int(), X[..., :3, :3].int()), TypeError,
     "image must be a floating"),
    ("match_template larger", lambda: ops.match_template(X, _t(1, 2, 9, 3)), ValueError,
     "template spatial shape"),
    ("register window 0", lambda: register(X[0, 0].numpy(), Y[0, 0].numpy(), model="deformable",
     window=0), ValueError, "window"),
    ("register window axes", lambda: register(X[0, 0].numpy(), Y[0, 0].numpy(),
     model="deformable", window=(9, 9, 9)), TypeError, "window"),
]  # fmt: skip


@pytest.mark.parametrize("what, call, error, match", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_public_api_refuses_in_its_own_words_before_any_compiled_call(
    compiled_calls, what, call, error, match
):
    with pytest.raises(error, match=match) as caught:
        call()
    # the user's words, not a kernel's ("box_sum: ...")
    assert not str(caught.value).startswith(tuple(f"{op}:" for op in ("box_sum", "splat")))
    assert compiled_calls == []


def test_half_precision_reaches_the_kernels_as_float32(compiled_calls):
    # The kernels have no half instantiation (test_checks refuses Half): the operators
    # compute half and bfloat16 in float32.
    for dtype in (torch.float16, torch.bfloat16):
        x, y = X.to(dtype), Y.to(dtype)
        assert ops.local_std(x, window=3).dtype == dtype
        assert ops.ssim(x, y, window=3).dtype == dtype
        assert ops.local_ncc(x, y, window=3).dtype == dtype
    assert compiled_calls and all(refusal is None for _, refusal in compiled_calls)


# Accepted arguments at the edges of what the kernels take: windows as large as the image,
# images thinner than the window on some pyramid level, 3-D, the splat's broadcasting.
ACCEPTED = [
    ("local_std window = image", lambda: ops.local_std(X, window=(7, 9))),
    ("local_std every padding", lambda: [
        ops.local_std(X, window=7, padding=p) for p in ("reflect", "mirror", "nearest", "constant")
    ]),
    ("local_std 1-pixel axis", lambda: ops.local_std(_t(1, 1, 1, 9), window=(1, 9))),
    ("local_ncc 3-D",
     lambda: ops.local_ncc(_t(1, 1, 5, 6, 7), _t(1, 1, 5, 6, 7, seed=1), window=5)),
    ("ssim window = image", lambda: ops.ssim(_t(1, 1, 11, 11), _t(1, 1, 11, 11, seed=1))),
    ("gaussian local_ncc", lambda: ops.local_ncc(X, Y, window=7, kernel="gaussian", sigma=1.5)),
    ("splat broadcast", lambda: ops.splat(_t(2, 2, 8, 9), D)),
    ("deformable, window wider than coarse levels", lambda: register(
        _t(40, 40, dtype=torch.float32).numpy(), _t(40, 40, dtype=torch.float32, seed=2).numpy(),
        model="deformable", window=31, iterations=3)),
    ("ssim affine, window wider than coarse levels", lambda: register(
        _t(40, 40, dtype=torch.float32).numpy(), _t(40, 40, dtype=torch.float32, seed=2).numpy(),
        model="affine", metric="ssim", window=35, iterations=3)),
    ("stack, lncc window = frame", lambda: register_stack(
        np.stack([_t(24, 24, dtype=torch.float32, seed=s).numpy() for s in range(3)]),
        model="rigid", metric="lncc", window=23, iterations=3)),
]  # fmt: skip


# random images: the registrations warn that they found little similarity
@pytest.mark.filterwarnings("ignore::napari_simwarp.registration.quality.RegistrationWarning")
@pytest.mark.parametrize("what, call", ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_what_the_public_api_accepts_the_kernels_accept(compiled_calls, what, call):
    call()
    refused = [(name, why) for name, why in compiled_calls if why is not None]
    assert compiled_calls and not refused
