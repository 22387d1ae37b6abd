"""The CUDA kernels and bindings against the CPU kernels: built as host code (the host shim)
on every run, and on the GPU where there is one.

csrc/host_shim/cuda_runtime.h runs every block and every thread of a launch in turn, with
atomics as plain adds: one legal CUDA schedule, exact for kernels without shared memory,
barriers or warp intrinsics (the kernels use none, and the shim defines none). So the CUDA
side's indexing, chunking, borders, tap blocks, pass order and per-element maths run on
every CI run, op by op against the CPU kernels (themselves held to SciPy and float64 in
test_compiled_kernels.py), over sizes, borders, dtypes and 1D/2D/3D windows; float32
results are also held to the CPU's float64 ones. With a GPU the same tests run the real
kernels ("cuda" side; scripts/gpu_check.sh runs them under compute-sanitizer too).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._kernels import calls
from tests.csrc.conftest import require_host_shim

CPU = torch.ops.simwarp
SIDES = ["host_shim"] + (["cuda"] if torch.cuda.is_available() else [])


class Side:
    """The CUDA implementation of every op on CPU tensors: the host shim's ops, or the CUDA
    kernels with the arguments moved to the GPU and the results back."""

    def __init__(self, name: str):
        self.name = name
        library = torch.ops.simwarp_host_shim if name == "host_shim" else torch.ops.simwarp
        self.library, self.device = library, torch.device("cpu" if name == "host_shim" else name)

    def __getattr__(self, op: str):
        fn = getattr(self.library, op)

        def call(*args):
            out = fn(*[a.to(self.device) if isinstance(a, torch.Tensor) else a for a in args])
            return tuple(o.cpu() for o in out) if isinstance(out, (tuple, list)) else out.cpu()

        return call


@pytest.fixture(params=SIDES)
def side(request) -> Side:
    require_host_shim() if request.param == "host_shim" else _require_cuda_kernels()
    return Side(request.param)


def _require_cuda_kernels():
    from napari_simwarp.ops import _kernels

    if not (_kernels.ensure_loaded() and _kernels.state()["cuda"]):
        pytest.fail(f"a GPU but no CUDA kernels: {_kernels.state()['cuda_error']}")


DTYPES = (torch.float32, torch.float64)
#: largest difference, relative to the CPU result's largest magnitude, between the two
#: sides: they sum the same terms in other orders (and in other precisions: the CUDA side
#: compensates in the data's type where the CPU accumulates in double).
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def assert_close(ours: torch.Tensor, cpu: torch.Tensor, dtype: torch.dtype) -> None:
    assert ours.shape == cpu.shape and ours.dtype == cpu.dtype
    assert ours.is_contiguous()
    if cpu.dtype == torch.bool:
        assert torch.equal(ours, cpu)
        return
    scale = cpu.abs().max().item() if cpu.numel() else 0.0
    diff = (ours.double() - cpu.double()).abs().max().item() if cpu.numel() else 0.0
    assert diff <= TOLERANCE[dtype] * max(scale, 1e-300), (diff, scale)


def assert_matches_cpu(ours, op: str, *args) -> None:
    """``ours`` against the CPU kernel's result on the same arguments and, for float32
    data, against the CPU's float64 result on them too."""
    dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
    outs = ours if isinstance(ours, (tuple, list)) else (ours,)
    cpu = getattr(CPU, op)(*args)
    for a, b in zip(outs, cpu if isinstance(cpu, (tuple, list)) else (cpu,)):
        assert_close(a, b, dtype)
    if dtype == torch.float32:
        wide = [
            a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
        ]
        exact = getattr(CPU, op)(*wide)
        for a, b in zip(outs, exact if isinstance(exact, (tuple, list)) else (exact,)):
            assert_close(a.double() if a.is_floating_point() else a, b, torch.float32)


def _random(shape, dtype, seed=0, scale=1.0, offset=0.0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal(shape) * scale + offset).to(dtype)


def _taps(sizes, seed=1) -> list[float]:
    return np.random.default_rng(seed).standard_normal(sum(sizes)).tolist()


# Windows that cover: several chunks per line on the last axis (8 outputs per thread) and
# on inner axes (32), a window as long as its axis (one output), axes of one tap, 1D, 2D
# and 3D windows, lines of one element.
WINDOW_CASES = [
    ((2, 3, 17, 23), (5, 7)),
    ((1, 1, 1, 1), (1, 1)),
    ((1, 2, 13, 11), (13, 1)),
    ((2, 1, 31, 29), (29, 3)),
    ((1, 1, 9, 10, 11), (3, 5, 7)),
    ((1, 2, 70, 6), (11, 1)),
    ((3, 100), (9,)),
    ((2, 1, 5, 4, 37), (1, 1, 37)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,window", WINDOW_CASES)
def test_box_sum(side, shape, window, dtype):
    x = _random(shape, dtype)
    for full in (False, True):
        assert_matches_cpu(side.box_sum(x, list(window), full), "box_sum", x, list(window), full)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_box_sum_full_mode_wider_than_the_axis(side, dtype):
    x = _random((1, 2, 4, 5), dtype)
    assert_matches_cpu(side.box_sum(x, [9, 7], True), "box_sum", x, [9, 7], True)


def test_box_sum_float32_holds_long_offset_lines(side):
    # A plain float32 running sum drifts along a 4096-long line with an offset of 1000;
    # the kernels restart their sums every few outputs and compensate them.
    x = _random((1, 1, 3, 4096), torch.float32, scale=5.0, offset=1000.0)
    ours = side.box_sum(x, [1, 15], False).double()
    exact = CPU.box_sum(x.double(), [1, 15], False)
    assert ((ours - exact).abs() / exact.abs()).max().item() < 1e-7


CORRELATE_CASES = [
    *WINDOW_CASES,
    ((1, 2, 150, 7), (70, 3)),  # two blocks of taps (64 a launch)
    ((1, 1, 5, 200), (1, 130)),  # three
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,window", CORRELATE_CASES)
def test_correlate(side, shape, window, dtype):
    x, taps = _random(shape, dtype), _taps(window)
    for transpose in (False, True):
        args = (x, taps, list(window), transpose)
        assert_matches_cpu(side.correlate(*args), "correlate", *args)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,window",
    [
        ((2, 2, 3, 12, 13), (3, 5)),
        ((2, 1, 2, 7, 8, 9), (3, 2, 3)),
        ((2, 3, 40), (7,)),
        ((2, 1, 1, 9, 150), (3, 70)),
        ((2, 1, 1, 100, 3), (33, 1)),
    ],
)
def test_moments5(side, shape, window, dtype):
    centered, taps = _random(shape, dtype), _taps(window)
    for weights in (taps, [1.0] * len(taps)):
        args = (centered, weights, list(window))
        assert_matches_cpu(side.moments5(*args), "moments5", *args)


def _flat_factor(side, dtype) -> float:
    """Each side's flat rule: compensated float32 on the CUDA side, double on the CPU."""
    if side is CPU or dtype == torch.float64:
        return calls.KERNEL_FLAT_FACTOR
    return calls.COMPENSATED_FLOAT32_FLAT_FACTOR


def _local_std(side, xp, window, normalize, upstream):
    """(out, flat, ∂xp) of one side, its backward from its own forward."""
    out, s1, flat = side.local_std_fwd(
        xp, list(window), 1e-3, normalize, _flat_factor(side, xp.dtype)
    )
    return out, flat, side.local_std_bwd(upstream, out, s1, flat, xp, list(window), normalize)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,window", WINDOW_CASES)
def test_local_std(side, shape, window, dtype, normalize):
    xp = _random(shape, dtype, scale=3.0, offset=1.0)
    if len(shape) >= 2 and shape[-1] >= 4 and shape[-2] >= 4:
        xp[..., :4, :4] = 2.5  # a flat patch: flat on both sides
    upstream = _random(CPU.box_sum(xp, list(window), False).shape, dtype, seed=5)
    ours = _local_std(side, xp, window, normalize, upstream)
    for a, b in zip(ours, _local_std(CPU, xp, window, normalize, upstream)):
        assert_close(a, b, dtype)
    if dtype == torch.float32:  # and against float64
        exact = _local_std(CPU, xp.double(), window, normalize, upstream.double())
        for a, b in zip(ours, exact):
            assert_close(a.double() if a.is_floating_point() else a, b, dtype)


def test_local_std_float32_holds_offset_data(side):
    """The CUDA forward in float32, on uncentered data with an offset of 1000, a step of
    1000 and a flat band, within 1e-6 of float64 where a plain float32 V loses everything.
    """
    x = _random((1, 1, 64, 96), torch.float64, scale=5.0, offset=1000.0)
    x[..., 48:] += 1000.0
    x[..., 20:40, :] = 1234.5
    x32 = x.float()
    exact = x32.double()
    for window in ([15, 15], [7, 31]):
        out, s1, flat = side.local_std_fwd(
            x32, window, 0.0, True, calls.COMPENSATED_FLOAT32_FLAT_FACTOR
        )
        ref, ref_s1, ref_flat = CPU.local_std_fwd(
            exact, window, 0.0, True, calls.KERNEL_FLAT_FACTOR
        )
        assert torch.equal(flat, ref_flat) and ref_flat.any()
        relative = (out.double() - ref).abs() / ref.where(~ref_flat, 1.0)
        assert relative.max().item() < 1e-6
        # Without compensation the same sums in float32 are wrong by far more than 1e-4.
        k = torch.ones(1, 1, *window)
        s1_plain = torch.nn.functional.conv2d(x32, k)
        v_plain = torch.nn.functional.conv2d(x32 * x32, k) - s1_plain * s1_plain / k.numel()
        plain = (v_plain.clamp_min(0) / k.numel()).sqrt()
        assert ((plain.double() - ref).abs() / ref.where(~ref_flat, 1.0)).max().item() > 1e-2
        # The backward's combine (A + 2x·B) cancels linearly in the offset: 1e-4 of it.
        upstream = _random(ref.shape, torch.float64, seed=7)
        grad = side.local_std_bwd(upstream.float(), out, s1, flat, x32, window, True)
        grad_ref = CPU.local_std_bwd(upstream, ref, ref_s1, ref_flat, exact, window, True)
        assert (grad.double() - grad_ref).abs().max() <= 1e-4 * grad_ref.abs().max()


def _splat_inputs(spatial, dtype, kind, seed=3):
    n, d = 2, len(spatial)
    image = _random((n, 3, *spatial), dtype, seed=seed)
    disp = _random((n, d, *spatial), dtype, seed=seed + 1, scale=1.5)
    if kind == "collide":  # everything lands in a few pixels: many adds to one address
        grid = torch.stack(
            torch.meshgrid(*[torch.arange(s, dtype=dtype) for s in spatial], indexing="ij")
        )
        centre = torch.tensor([s / 2 + 0.3 for s in spatial], dtype=dtype).view(d, *[1] * d)
        disp = centre - grid + 0.4 * disp
    if kind == "outside":  # NaN, far off, and just past a border
        flat = disp.view(n, d, -1)
        flat[:, 0, 0] = float("nan")
        flat[:, -1, -1] = 1e6
        flat[:, 0, flat.shape[-1] // 2] = -1.5
    return image, disp


@pytest.mark.parametrize("kind", ["random", "collide", "outside"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spatial", [(9, 10), (5, 6, 7), (1, 1)])
def test_splat(side, spatial, dtype, normalize, kind):
    image, disp = _splat_inputs(spatial, dtype, kind)
    ours = side.splat_fwd(image, disp, normalize, 1e-6)
    cpu = CPU.splat_fwd(image, disp, normalize, 1e-6)
    for a, b in zip(ours, cpu):
        assert_close(a, b, dtype)
    v_out, v_den = _random(image.shape, dtype, seed=9), _random(cpu[1].shape, dtype, seed=10)
    for grads in ((v_out, v_den), (v_out, None), (None, v_den)):
        for a, b in zip(
            side.splat_bwd(*grads, image, disp, *ours, normalize, 1e-6),
            CPU.splat_bwd(*grads, image, disp, *cpu, normalize, 1e-6),
        ):
            assert_close(a, b, dtype)


def test_splat_forward_raises_the_nondeterminism_alert(side):
    # The CUDA binding's atomics are refused under deterministic algorithms; the backward
    # (gathers) and the CPU kernel (serial) are deterministic and run.
    image, disp = _splat_inputs((6, 7), torch.float32, "random")
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="splat_fwd on CUDA"):
            side.splat_fwd(image, disp, True, 1e-6)
        out, den = CPU.splat_fwd(image, disp, True, 1e-6)
        side.splat_bwd(out, den, image, disp, out, den, True, 1e-6)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
