"""The argument checks of csrc/checks.h and its rule for zero-size inputs.

The CPU and the CUDA bindings run the same checks (test_cuda_sources checks that each calls
checks::<op>), so these run on every side the kernels are built for: the CPU kernels, the
CUDA bindings built as host code (the host shim, on every run), and the CUDA kernels on a
machine with a GPU.
"""

from __future__ import annotations

import pytest
import torch

from tests.compiled import require_compiled
from tests.csrc.conftest import require_host_shim

#: the CPU-only ops (local_std_2d_*) are checked here alone
CPU_OPS = torch.ops.simwarp

#: the sides under test: (name, library namespace, device)
SIDES = [("cpu", "simwarp", "cpu"), ("host_shim", "simwarp_host_shim", "cpu")]
if torch.cuda.is_available():
    SIDES.append(("cuda", "simwarp", "cuda"))


class Side:
    """One side's ops (``.ops``) and a maker of random tensors on its device (``side(*shape)``)."""

    def __init__(self, library: str, device: str):
        self.ops = getattr(torch.ops, library)
        self.device = torch.device(device)

    def __call__(self, *shape, dtype=torch.float64) -> torch.Tensor:
        return torch.rand(*shape, dtype=dtype, device=self.device)


@pytest.fixture(params=SIDES, ids=[s[0] for s in SIDES])
def on(request):
    """The side under test, once its kernels are loaded."""
    name, library, device = request.param
    require_compiled()
    if name == "host_shim":
        require_host_shim()
    if name == "cuda":
        from napari_simwarp.ops import _kernels

        if not _kernels.state()["cuda"]:
            pytest.skip(f"CUDA kernels not built: {_kernels.state()['cuda_error']}")
    return Side(library, device)


# ---- zero-size inputs: correctly shaped zeros, no kernel ---------------------------------


def _zeros(result, shape, dtype=None):
    assert tuple(result.shape) == shape and not result.any()
    assert result.is_contiguous() and (dtype is None or result.dtype == dtype)


def test_empty_window_sums(on):
    _zeros(on.ops.box_sum(on(0, 3, 9, 10), [3, 4]), (0, 3, 7, 7))
    # Full mode over an empty axis: the sums over nothing, k − 1 of them.
    _zeros(on.ops.box_sum(on(1, 1, 0, 5), [3, 1], True), (1, 1, 2, 5))
    _zeros(on.ops.correlate(on(0, 2, 6, 7), [1.0] * 5, [3, 2]), (0, 2, 4, 6))
    _zeros(on.ops.correlate(on(1, 1, 0, 5), [1.0] * 5, [3, 2], True), (1, 1, 2, 6))
    _zeros(on.ops.moments5(on(2, 0, 8, 9), [1.0] * 6, [3, 3]), (5, 0, 6, 7))


def test_empty_local_std(on):
    x = on(0, 1, 8, 9)
    out, s1, flat = on.ops.local_std_fwd(x, [3, 3], 0.0, True, 1e-14)
    for t, dtype in ((out, x.dtype), (s1, x.dtype), (flat, torch.bool)):
        _zeros(t, (0, 1, 6, 7), dtype)
    _zeros(on.ops.local_std_bwd(out, out, s1, flat, x, [3, 3], True), (0, 1, 8, 9))


def test_empty_local_std_2d():  # CPU only
    require_compiled()
    for shape, padding, out_shape in (
        ((1, 1, 0, 5), "reflect", (1, 1, 0, 5)),
        ((0, 1, 5, 5), "valid", (0, 1, 3, 3)),
    ):
        x = torch.rand(shape, dtype=torch.float64)
        out, s1, flat = CPU_OPS.local_std_2d_fwd(x, [3, 3], padding, 0.0, True, 1e-14)
        _zeros(out, out_shape)
        _zeros(CPU_OPS.local_std_2d_bwd(out, out, s1, flat, x, [3, 3], padding, True), shape)


def test_empty_splat(on):
    image, disp = on(0, 3, 4, 5), on(0, 2, 4, 5)
    out, den = on.ops.splat_fwd(image, disp, True, 1e-6)
    _zeros(out, (0, 3, 4, 5))
    _zeros(den, (0, 1, 4, 5))
    grad_image, grad_disp = on.ops.splat_bwd(out, den, image, disp, out, den, True, 1e-6)
    _zeros(grad_image, (0, 3, 4, 5))
    _zeros(grad_disp, (0, 2, 4, 5))


def test_splat_of_no_channel_still_weighs(on):
    # den depends on the displacement alone: an image of no channel has it too.
    disp = on(1, 2, 4, 5) * 2 - 1
    out, den = on.ops.splat_fwd(on(1, 0, 4, 5), disp, True, 1e-6)
    _, den_one = on.ops.splat_fwd(on(1, 1, 4, 5), disp, True, 1e-6)
    assert out.shape == (1, 0, 4, 5)
    torch.testing.assert_close(den, den_one)


# ---- refused arguments: the same message on every device --------------------------------


def _raises(match, fn, *args):
    with pytest.raises(RuntimeError, match=match):
        fn(*args)


def test_refuses_non_float(on):
    x = on(1, 2, 8, 9).to(torch.int32)
    for op, name, args in (
        (on.ops.box_sum, "x", (x, [3, 3])),
        (on.ops.correlate, "x", (x, [1.0] * 6, [3, 3])),
        (on.ops.moments5, "centered", (x.expand(2, 2, 8, 9), [1.0] * 6, [3, 3])),
        (on.ops.local_std_fwd, "xp", (x, [3, 3], 0.0, True, 1e-14)),
        (on.ops.splat_fwd, "image", (x, x, True, 1e-6)),
    ):
        _raises(f"{name} must be float32 or float64, got Int", op, *args)
    _raises("float32 or float64", on.ops.box_sum, x.half(), [3, 3])  # no half kernels


def test_refuses_bad_windows(on):
    x = on(1, 2, 8, 9)
    for op, extra in ((on.ops.box_sum, ()), (on.ops.local_std_fwd, (0.0, True, 1e-14))):
        _raises("window sizes must be at least 1", op, x, [0, 3], *extra)
        _raises("window larger than the axis", op, x, [9, 3], *extra)
        _raises("a window of 5 axes needs at least 5 dimensions", op, x, [1] * 5, *extra)
    on.ops.box_sum(x, [9, 3], True)  # full mode pads: any size
    _raises("window larger than the axis", on.ops.correlate, x, [1.0] * 12, [9, 3])
    on.ops.correlate(x, [1.0] * 12, [9, 3], True)
    _raises("window must cover at least one axis", on.ops.local_std_fwd, x, [], 0.0, True, 1e-14)


def test_refuses_bad_taps(on):
    x = on(2, 2, 8, 9)
    _raises(
        r"taps must hold sum\(sizes\) = 6 values, got 5", on.ops.correlate, x, [1.0] * 5, [3, 3]
    )
    _raises(r"taps must hold sum\(sizes\) = 6 values, got 7", on.ops.moments5, x, [1.0] * 7, [3, 3])


def test_refuses_bad_moments5_stacks(on):
    _raises(r"stack \[a, b\] on dim 0", on.ops.moments5, on(3, 2, 8, 9), [1.0] * 6, [3, 3])
    _raises("window must cover at least one axis", on.ops.moments5, on(2, 2, 8, 9), [], [])
    # dim 0 is the pair, never a window axis
    _raises(
        "a window of 3 axes needs at least 4 dimensions",
        on.ops.moments5,
        on(2, 8, 9),
        [1.0] * 9,
        [3, 3, 3],
    )


def test_refuses_mismatched_local_std_backward(on):
    x = on(1, 2, 8, 9)
    out, s1, flat = on.ops.local_std_fwd(x, [3, 3], 0.0, True, 1e-14)
    _raises(
        r"grad must have shape \[1, 2, 6, 7\], got \[1, 2, 6, 6\]",
        on.ops.local_std_bwd,
        out[..., :6],
        out,
        s1,
        flat,
        x,
        [3, 3],
        True,
    )
    _raises("flat must be bool", on.ops.local_std_bwd, out, out, s1, out, x, [3, 3], True)
    _raises(
        "out is Float but x is Double",
        on.ops.local_std_bwd,
        out,
        out.float(),
        s1,
        flat,
        x,
        [3, 3],
        True,
    )


def test_refuses_bad_splat_shapes(on):
    image, disp = on(2, 3, 4, 5), on(2, 2, 4, 5)
    _raises(
        r"image must be \(N, C, H, W\) or \(N, C, D, H, W\)",
        on.ops.splat_fwd,
        image[0],
        disp[0],
        True,
        1e-6,
    )
    _raises(
        r"displacement must have shape \[2, 2, 4, 5\], got \[2, 3, 4, 5\]",
        on.ops.splat_fwd,
        image,
        on(2, 3, 4, 5),
        True,
        1e-6,
    )
    _raises(
        r"displacement must have shape \[2, 2, 4, 5\], got \[1, 2, 4, 5\]",
        on.ops.splat_fwd,
        image,
        disp[:1],
        True,
        1e-6,
    )
    _raises(
        r"displacement must have shape \[2, 2, 4, 5\], got \[2, 2, 4, 4\]",
        on.ops.splat_fwd,
        image,
        disp[..., :4],
        True,
        1e-6,
    )
    _raises(
        "displacement is Float but image is Double",
        on.ops.splat_fwd,
        image,
        disp.float(),
        True,
        1e-6,
    )
    out, den = on.ops.splat_fwd(image, disp, True, 1e-6)
    _raises(
        r"den must have shape \[2, 1, 4, 5\]",
        on.ops.splat_bwd,
        out,
        den,
        image,
        disp,
        out,
        out,
        True,
        1e-6,
    )
    _raises(
        r"v_den must have shape \[2, 1, 4, 5\]",
        on.ops.splat_bwd,
        out,
        out,
        image,
        disp,
        out,
        den,
        True,
        1e-6,
    )
    on.ops.splat_bwd(None, None, image, disp, out, den, True, 1e-6)  # no incoming gradient at all


def test_refuses_bad_local_std_2d_arguments():
    require_compiled()
    x = torch.zeros(1, 1, 5, 5)
    _raises("padding must be", CPU_OPS.local_std_2d_fwd, x, [3, 3], "wrap", 0.0, True, 1e-14)
    _raises("window larger", CPU_OPS.local_std_2d_fwd, x, [7, 3], "valid", 0.0, True, 1e-14)
    CPU_OPS.local_std_2d_fwd(x, [7, 3], "reflect", 0.0, True, 1e-14)  # padded: any size
    _raises(
        r"window \(kh, kw\)", CPU_OPS.local_std_2d_fwd, x, [3, 3, 3], "reflect", 0.0, True, 1e-14
    )
    out, s1, flat = CPU_OPS.local_std_2d_fwd(x, [3, 3], "reflect", 0.0, True, 1e-14)
    _raises(
        r"grad must have shape \[1, 1, 5, 5\]",
        CPU_OPS.local_std_2d_bwd,
        out[..., :3, :3],
        out,
        s1,
        flat,
        x,
        [3, 3],
        "reflect",
        True,
    )
