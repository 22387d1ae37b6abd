"""torch.library.opcheck of every compiled op on every input layout it may meet.

opcheck runs each op eagerly, on fake tensors (the fakes of ops/_kernels/_registrations.py)
and through AOT dispatch, and compares what comes back: shapes, dtypes and strides. The
kernels return contiguous tensors whatever the input's layout, so a fake that copied the
input's strides (``torch.empty_like`` on a transposed or channels_last input) fails here
with "Stride mismatch". Each op runs on contiguous inputs, a transposed view (dense but not
contiguous), a sliced view (not dense) and channels_last (channels_last_3d for 5D), in
float32 and float64. Differentiable ops get inputs that require grad, so their autograd
registration is checked too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.compiled import require_compiled
from tests.csrc.test_cuda_sources import CUDA_ONLY

LAYOUTS = ("contiguous", "transposed", "sliced", "channels_last")
DTYPES = (torch.float32, torch.float64)


@pytest.fixture(scope="module")
def compiled():
    return require_compiled()


def as_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t``'s values, same shape, in the given memory layout."""
    if layout == "contiguous":
        return t.contiguous()
    if layout in ("transposed", "channels_last") and t.dim() < 2:
        return t.contiguous()  # a vector has one layout (a case's other tensors vary)
    if layout == "channels_last" and t.dim() < 4:
        layout = "transposed"  # (M, P) tensors (parzen): the other dense permutation
    if layout == "transposed":  # a dense permutation: empty_like would copy its strides
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":  # every other column of a wider tensor: neither dense nor contiguous
        wide = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])
        wide[..., ::2] = t
        return wide[..., ::2]
    assert layout == "channels_last"
    memory_format = {4: torch.channels_last, 5: torch.channels_last_3d}[t.dim()]
    return t.contiguous(memory_format=memory_format)


class Inputs:
    """Random tensors of one dtype and layout; ``grad=True`` makes leaves that require grad."""

    def __init__(self, dtype: torch.dtype, layout: str, seed: int = 0):
        self.dtype, self.layout = dtype, layout
        self.rng = np.random.default_rng(seed)

    def __call__(
        self, *shape: int, scale: float = 1.0, offset: float = 0.0, grad: bool = False
    ) -> torch.Tensor:
        values = self.rng.standard_normal(shape) * scale + offset
        return self.place(torch.from_numpy(values).to(self.dtype), grad)

    def place(self, t: torch.Tensor, grad: bool = False) -> torch.Tensor:
        t = as_layout(t.detach(), self.layout)
        return t.requires_grad_() if grad else t

    def taps(self, sizes) -> list[float]:
        return self.rng.standard_normal(sum(sizes)).tolist()


def _box_sum(make, full):
    return (make(2, 3, 9, 10, grad=True), [3, 4], full)


def _correlate(make, transpose):
    return (make(2, 3, 9, 10, grad=True), make.taps([3, 4]), [3, 4], transpose)


def _moments5(make, shape, sizes):
    return (make(*shape), make.taps(sizes), sizes)


def _local_std_fwd(make, shape, window, normalize=True):
    return (make(*shape, scale=3.0, offset=10.0, grad=True), window, 1e-2, normalize, 1e-14)


def _local_std_bwd(make, shape, window, normalize=True):
    # The saved tensors come from the forward on contiguous data, then take the layout.
    xp = make(*shape, scale=3.0, offset=10.0)
    out, s1, flat = torch.ops.simwarp.local_std_fwd(xp.contiguous(), window, 1e-2, normalize, 1e-14)
    grad = make(*out.shape)
    return (grad, make.place(out), make.place(s1), make.place(flat), xp, window, normalize)


def _parzen_fwd(make):
    return (make(2, 50, grad=True), make(2, 50, grad=True), make(2, 50).abs(), 8, True, [])


def _parzen_bwd(make):
    a, b, w = make(2, 50), make(2, 50), make(2, 50).abs()
    score, g, frame = torch.ops.simwarp.parzen_fwd(
        a.contiguous(), b.contiguous(), w.contiguous(), 8, True, []
    )
    return (make(2), make.place(score), make.place(g), a, b, w, make.place(frame), 8)


def _squaring_fwd(make, shape, keep):
    # no autograd is registered on the op (ops/_kernels/calls.py wraps the pair in a
    # Function), so no input requires grad
    return (make(2, len(shape), *shape, scale=0.8), [0.7, 1.3, 0.9][: len(shape)], 3, keep)


def _squaring_bwd(make, shape):
    u = make(2, len(shape), *shape, scale=0.8)
    scale = [0.7, 1.3, 0.9][: len(shape)]
    _, saved = torch.ops.simwarp.squaring_fwd(u.contiguous(), scale, 3, True)
    # channels_last has no 6-D format: a 3-D saved stack stays contiguous there
    keep = make.layout == "channels_last" and saved.dim() > 5
    base = make(2, len(shape), *shape)
    return (make(2, len(shape), *shape), saved if keep else make.place(saved), scale, base)


def _local_std_2d_fwd(make, padding):
    return (
        make(2, 3, 9, 10, scale=3.0, offset=10.0, grad=True),
        [3, 5],
        padding,
        1e-2,
        True,
        1e-14,
    )


def _local_std_2d_bwd(make, padding):
    x = make(2, 3, 9, 10, scale=3.0, offset=10.0)
    out, s1, flat = torch.ops.simwarp.local_std_2d_fwd(
        x.contiguous(), [3, 5], padding, 1e-2, True, 1e-14
    )
    return (
        make(*out.shape),
        make.place(out),
        make.place(s1),
        make.place(flat),
        x,
        [3, 5],
        padding,
        True,
    )


def _splat_fwd(make, spatial, normalize):
    n, d = 2, len(spatial)
    return (
        make(n, 3, *spatial, grad=True),
        make(n, d, *spatial, scale=1.5, grad=True),
        normalize,
        1e-6,
    )


def _splat_bwd(make, spatial, normalize, with_v_den):
    n, d = 2, len(spatial)
    image, disp = make(n, 3, *spatial), make(n, d, *spatial, scale=1.5)
    out, den = torch.ops.simwarp.splat_fwd(image.contiguous(), disp.contiguous(), normalize, 1e-6)
    v_den = make(*den.shape) if with_v_den else None
    return (make(*out.shape), v_den, image, disp, make.place(out), make.place(den), normalize, 1e-6)


#: (test id, op name, a function of an Inputs maker giving the op's arguments)
CASES = [
    ("box_sum-valid", "box_sum", lambda m: _box_sum(m, False)),
    ("box_sum-full", "box_sum", lambda m: _box_sum(m, True)),
    ("correlate-valid", "correlate", lambda m: _correlate(m, False)),
    ("correlate-transpose", "correlate", lambda m: _correlate(m, True)),
    ("moments5-2d", "moments5", lambda m: _moments5(m, (2, 3, 12, 13), [3, 5])),  # fused route
    ("moments5-3d", "moments5", lambda m: _moments5(m, (2, 2, 7, 8, 9), [3, 2, 3])),
    ("local_std_fwd-2d", "local_std_fwd", lambda m: _local_std_fwd(m, (2, 3, 11, 12), [3, 5])),
    (
        "local_std_fwd-3d",
        "local_std_fwd",
        lambda m: _local_std_fwd(m, (1, 2, 7, 8, 9), [3, 2, 3], normalize=False),
    ),
    ("local_std_bwd-2d", "local_std_bwd", lambda m: _local_std_bwd(m, (2, 3, 11, 12), [3, 5])),
    (
        "local_std_bwd-3d",
        "local_std_bwd",
        lambda m: _local_std_bwd(m, (1, 2, 7, 8, 9), [3, 2, 3], normalize=False),
    ),
    ("local_std_2d_fwd-reflect", "local_std_2d_fwd", lambda m: _local_std_2d_fwd(m, "reflect")),
    ("local_std_2d_fwd-valid", "local_std_2d_fwd", lambda m: _local_std_2d_fwd(m, "valid")),
    ("local_std_2d_bwd-reflect", "local_std_2d_bwd", lambda m: _local_std_2d_bwd(m, "reflect")),
    ("local_std_2d_bwd-valid", "local_std_2d_bwd", lambda m: _local_std_2d_bwd(m, "valid")),
    ("splat_fwd-2d", "splat_fwd", lambda m: _splat_fwd(m, (9, 10), True)),
    ("splat_fwd-3d-plain", "splat_fwd", lambda m: _splat_fwd(m, (5, 6, 7), False)),
    ("splat_bwd-2d", "splat_bwd", lambda m: _splat_bwd(m, (9, 10), True, True)),
    ("splat_bwd-3d-plain-no-v_den", "splat_bwd", lambda m: _splat_bwd(m, (5, 6, 7), False, False)),
    ("parzen_fwd", "parzen_fwd", _parzen_fwd),
    ("parzen_bwd", "parzen_bwd", _parzen_bwd),
    ("squaring_fwd-2d-keep", "squaring_fwd", lambda m: _squaring_fwd(m, (9, 10), True)),
    ("squaring_fwd-3d", "squaring_fwd", lambda m: _squaring_fwd(m, (5, 6, 7), False)),
    ("squaring_bwd-2d", "squaring_bwd", lambda m: _squaring_bwd(m, (9, 10))),
    ("squaring_bwd-3d", "squaring_bwd", lambda m: _squaring_bwd(m, (5, 6, 7))),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op,make_args", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_opcheck(compiled, op, make_args, layout, dtype):
    args = make_args(Inputs(dtype, layout))
    assert any(isinstance(a, torch.Tensor) and not a.is_contiguous() for a in args) == (
        layout != "contiguous"
    ), "the inputs must have the layout under test"
    torch.library.opcheck(getattr(torch.ops.simwarp, op).default, args)


def test_every_op_is_checked(compiled):
    """A new op in csrc/ops.cpp needs a case here. The CUDA-only ops (defined by the CUDA
    build where it is loaded) are opchecked by tests/csrc/test_host_shim.py."""
    schemas = {
        s.name.removeprefix("simwarp::")
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("simwarp::")
    }
    assert schemas - set(CUDA_ONLY) == {op for _, op, _ in CASES}
