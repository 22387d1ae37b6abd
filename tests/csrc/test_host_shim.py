"""The CUDA kernels and bindings against the CPU kernels: built as host code (the host shim)
on every run, and on the GPU where there is one.

csrc/host_shim/cuda_runtime.h runs every block and every thread of a launch in turn, with
atomics as plain adds: one legal CUDA schedule, exact for kernels without shared memory,
barriers or warp intrinsics. Kernels that share memory and meet at __syncthreads() (the
fused SSIM and local std, cuda/ssim.cu, cuda/local_std_fused.cu) are launched
cooperatively: the threads of a block run as fibers that switch at each barrier, none
passing it before all have reached it, with the block's dynamic shared memory NaN-filled
at its start (the barrier tests below prove both). So the CUDA side's indexing, chunking,
borders, tap blocks, pass order, barriers and per-element maths run on every CI run, op by
op against the CPU kernels (themselves held to SciPy and float64 in
test_compiled_kernels.py), over sizes, borders, dtypes and 1D/2D/3D windows; float32
results are also held to the CPU's float64 ones; the fused kernels (SSIM, local std,
local NCC), which have no CPU twin, are held to scikit-image or SciPy and to the float64
pure torch path. With a GPU the same tests run the real kernels ("cuda" side;
scripts/gpu_check.sh runs them under compute-sanitizer too, and racecheck on the fused
ones).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from napari_simwarp.ops._kernels import _reference, calls
from napari_simwarp.ops._moments import _MomentMap, moment_map
from napari_simwarp.ops._windows import make_window
from tests import images
from tests.csrc.conftest import require_host_shim
from tests.ops.ssim_reference import skimage_ssim_map
from tests.ops.test_local_ncc import _scipy_local_ncc

#: the module (napari_simwarp.ops.ssim is also the name of the function it exports)
ssim_module = importlib.import_module("napari_simwarp.ops.ssim")
ncc_module = importlib.import_module("napari_simwarp.ops.local_ncc")

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


# ---- the shim's barrier ---------------------------------------------------------------


def _block_sums(x: np.ndarray, threads: int) -> np.ndarray:
    padded = np.zeros(-(-x.size // threads) * threads)
    padded[: x.size] = x
    return padded.reshape(-1, threads).sum(1)


@pytest.mark.parametrize("threads", [64, 256])
def test_the_cooperative_launch_enforces_the_barrier(host_shim, threads):
    """A tree reduction in shared memory: right with the barrier, NaN without it (thread 0
    reads its partners' slots before they write them: the shim's NaN fill), so the right
    sums come from the barrier holding every thread, not from the order threads run in."""
    x = np.random.default_rng(0).standard_normal(1000)
    with_barrier = host_shim.barrier_probe(torch.from_numpy(x), threads, 1).numpy()
    np.testing.assert_allclose(with_barrier, _block_sums(x, threads), rtol=1e-12, atol=1e-12)
    without = host_shim.barrier_probe(torch.from_numpy(x), threads, 0).numpy()
    assert np.isnan(without).all(), without
    # A static __shared__ array (one per OS thread, shared by the block's fibers) works too.
    static = host_shim.barrier_probe(torch.from_numpy(x), threads, 4).numpy()
    np.testing.assert_allclose(static, _block_sums(x, threads), rtol=1e-12, atol=1e-12)


def test_a_barrier_the_shim_cannot_honour_fails_the_launch(host_shim):
    x = torch.ones(512, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="launch failure"):  # only some threads meet it
        host_shim.barrier_probe(x, 256, 2)
    with pytest.raises(RuntimeError, match="launch failure"):  # under the plain launch()
        host_shim.barrier_probe(x, 256, 3)
    torch.testing.assert_close(
        host_shim.barrier_probe(x, 256, 1), torch.full((2,), 256.0, dtype=torch.float64)
    )


# ---- the fused SSIM (cuda/ssim.cu) -------------------------------------------------------


@pytest.fixture(params=SIDES)
def fused(request):
    """(library, device) of the fused SSIM ops: the host shim's on CPU tensors, or the CUDA
    build's on the GPU."""
    if request.param == "host_shim":
        require_host_shim()
        from napari_simwarp.ops._kernels._registrations import register_fused_ssim_fakes

        register_fused_ssim_fakes("simwarp_host_shim")
        return torch.ops.simwarp_host_shim, torch.device("cpu")
    _require_cuda_kernels()
    return None, torch.device("cuda")


def _constants(data_range: float) -> tuple[float, float]:
    return (0.01 * data_range) ** 2, (0.03 * data_range) ** 2


def _fused_with_gradients(fused, a, b, window, data_range, reduction, upstream):
    """The fused map (or mean) and both gradients under ``upstream``, on the side's device,
    as float64 CPU tensors."""
    library, device = fused
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device).requires_grad_()
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device).requires_grad_()
    out = ssim_module.fused_ssim(a32, b32, window, *_constants(data_range), reduction, library)
    assert out.dtype == torch.float32 and out.device == device
    loss = out if reduction == "mean" else (out * upstream.to(device, torch.float32)).sum()
    loss.backward()
    return [t.detach().cpu().double() for t in (out, a32.grad, b32.grad)]


def _skimage_ssim_map(a, b, data_range):
    """scikit-image's SSIM map of ``a[0, 0]`` and ``b[0, 0]`` with the fused kernels'
    window (Gaussian, sigma 1.5, 11 taps); skips the test where scikit-image is not
    installed (scripts/ci_cuda_build.sh's venv)."""
    pytest.importorskip("skimage.metrics")
    return skimage_ssim_map(a[0, 0], b[0, 0], data_range)


def _float64_with_gradients(a, b, window, data_range, reduction, upstream):
    """The moment engine's pure torch path in float64 (the reference of the float32 paths)."""
    a64 = torch.as_tensor(a, dtype=torch.float64).requires_grad_()
    b64 = torch.as_tensor(b, dtype=torch.float64).requires_grad_()
    metric = ssim_module._SSIMMetric(*_constants(data_range))
    out = _MomentMap.apply(a64, b64, window, metric, reduction, _reference, None)
    (out if reduction == "mean" else (out * upstream).sum()).backward()
    return [t.detach() for t in (out, a64.grad, b64.grad)]


def _microscopy_pair(rng, shape):
    """Offset camera-like images (tests/images.py), held as float32 values."""
    lead, spatial = shape[:-2], shape[-2:]
    pairs = [images.microscopy(rng, spatial) for _ in range(2 * int(np.prod(lead)))]
    stack = np.stack(pairs).astype(np.float32).astype(np.float64)
    return stack[0::2].reshape(shape), stack[1::2].reshape(shape)


#: (N, C, H, W), window, sigma: sizes that are no multiple of the 16² tiles, batches and
#: channels, per-axis windows, a window as long as its axis (both mirrors in one tile),
#: one row.
FUSED_CASES = [
    ((1, 1, 37, 45), 11, 1.5),
    ((2, 3, 40, 33), (7, 11), (1.0, 2.0)),
    ((1, 2, 11, 70), 11, 1.5),
    ((1, 1, 5, 9), (5, 9), (1.0, 3.0)),
    ((2, 1, 1, 23), (1, 7), (1.0, 1.5)),
]


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("shape,size,sigma", FUSED_CASES)
def test_fused_ssim_matches_float64_on_offset_data(fused, shape, size, sigma, reduction):
    """Map and both gradients against the float64 pure torch path, within the float32
    guarantees of tests/ops/test_ssim.py (TestFloat32Path: 1e-4 on the map, 1e-4 of the
    largest gradient), on microscopy-like data (offset 1000, background, blobs, noise)."""
    rng = np.random.default_rng(7)
    a, b = _microscopy_pair(rng, shape)
    window = make_window("gaussian", *[(v, v) if np.isscalar(v) else v for v in (size, sigma)])
    upstream = torch.as_tensor(rng.standard_normal(shape))
    ours = _fused_with_gradients(fused, a, b, window, 50.0, reduction, upstream)
    expected = _float64_with_gradients(a, b, window, 50.0, reduction, upstream)
    assert ours[0].shape == expected[0].shape
    assert (ours[0] - expected[0]).abs().max() <= 1e-4
    for got, want in zip(ours[1:], expected[1:]):
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_fused_ssim_matches_skimage_and_the_float32_torch_path(fused, monkeypatch):
    """The map against scikit-image (float64, the same float32 values) and against the pure
    torch float32 path of the GPU's policy (tiles centred, risky windows redone two-pass).
    Skipped where scikit-image is not installed (scripts/ci_cuda_build.sh's venv)."""
    from napari_simwarp.ops import _numerics

    rng = np.random.default_rng(3)
    a, b = _microscopy_pair(rng, (1, 1, 150, 140))
    window = make_window("gaussian", (11, 11), (1.5, 1.5))
    data_range = float(max(a.max(), b.max()) - min(a.min(), b.min()))
    ours = _fused_with_gradients(fused, a, b, window, data_range, "mean", None)
    full = _skimage_ssim_map(a, b, data_range)
    library, device = fused
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device)
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device)
    c1, c2 = _constants(data_range)
    out = ssim_module.fused_ssim(a32, b32, window, c1, c2, "none", library).cpu().double()
    np.testing.assert_allclose(out[0, 0].numpy(), full, rtol=0, atol=1e-4)
    assert abs(ours[0].item() - full.mean()) <= 1e-5
    types = _numerics.FLOAT32_MOMENT_DEVICE_TYPES | {"cpu"}
    monkeypatch.setattr(_numerics, "FLOAT32_MOMENT_DEVICE_TYPES", types)
    monkeypatch.setenv("SIMWARP_BACKEND", "torch")
    torch_path = ssim_module.ssim(a32.cpu(), b32.cpu(), data_range=data_range)
    np.testing.assert_allclose(out.numpy(), torch_path.double().numpy(), rtol=0, atol=1e-4)


def test_fused_ssim_redoes_step_edges(fused):
    """A step of 2000 counts across a tile, noise 0.5, data_range 50: windows on either side
    hold a sum of squares about the tile's mean ~10^6 times their variance plus C2/2, which
    float32 cannot difference (without the kernel's two-pass redo of those windows the map
    is off by 0.06). Map within 1e-4 of float64; gradients within 2e-4 of the largest (the
    unfused float32 path: 1.3e-4 here, from the tile centring of the backward both share)."""
    rng = np.random.default_rng(5)
    a = np.full((1, 1, 48, 48), 1000.0)
    a[..., 20:] = 3000.0
    a = (a + rng.standard_normal(a.shape) * 0.5).astype(np.float32).astype(np.float64)
    b = (a + rng.standard_normal(a.shape) * 0.5).astype(np.float32).astype(np.float64)
    window = make_window("gaussian", (11, 11), (1.5, 1.5))
    upstream = torch.ones(a.shape, dtype=torch.float64)
    ours = _fused_with_gradients(fused, a, b, window, 50.0, "none", upstream)
    expected = _float64_with_gradients(a, b, window, 50.0, "none", upstream)
    assert (ours[0] - expected[0]).abs().max() <= 1e-4
    for got, want in zip(ours[1:], expected[1:]):
        assert (got - want).abs().max() <= 2e-4 * want.abs().max()


def test_fused_ssim_dim_region_beside_a_bright_one(fused, monkeypatch):
    """A dim stripe (10 to 50, noise 0.7, 11 columns: one window wide) in a 60000 field,
    data_range 1 so that C1 and C2 hide nothing: its tiles' means are ~35000, so the tile
    centred values a − m round to 2^-8, far coarser than the dim data's 2^-19 to 2^-18;
    the dim windows are risky (sum of squares about m ~10^7 times the variance) and must be
    redone from the images themselves, not from the centred tile (from which the map was
    off by 1.8e-4, the pure torch float32 path by 2.3e-5). Map within 1e-4 of float64 and
    of scikit-image, and no worse than twice the torch float32 path's error; gradients no
    worse than the torch float32 path's (~1e-2 of the largest here: both take the backward
    about the tiles' shifts)."""
    from napari_simwarp.ops import _numerics

    rng = np.random.default_rng(13)
    shape = (48, 48)
    rows = np.arange(shape[0])[:, None] * np.ones((1, shape[1]))
    a = np.full(shape, 60000.0) + rng.standard_normal(shape) * 5
    dim = 10 + 40 * rows / (shape[0] - 1) + rng.standard_normal(shape) * 0.7
    a[:, 16:27] = dim[:, 16:27]
    b = a + rng.standard_normal(shape) * 0.5
    a = a.astype(np.float32).astype(np.float64)[None, None]
    b = b.astype(np.float32).astype(np.float64)[None, None]
    window = make_window("gaussian", (11, 11), (1.5, 1.5))
    upstream = torch.as_tensor(rng.standard_normal(a.shape))
    ours = _fused_with_gradients(fused, a, b, window, 1.0, "none", upstream)
    expected = _float64_with_gradients(a, b, window, 1.0, "none", upstream)
    full = _skimage_ssim_map(a, b, 1.0)
    types = _numerics.FLOAT32_MOMENT_DEVICE_TYPES | {"cpu"}
    monkeypatch.setattr(_numerics, "FLOAT32_MOMENT_DEVICE_TYPES", types)
    monkeypatch.setenv("SIMWARP_BACKEND", "torch")
    a32 = torch.tensor(a, dtype=torch.float32, requires_grad=True)
    b32 = torch.tensor(b, dtype=torch.float32, requires_grad=True)
    torch_path = ssim_module.ssim(a32, b32, data_range=1.0)
    (torch_path.double() * upstream).sum().backward()
    torch_error = (torch_path.detach().double() - expected[0]).abs().max().item()
    error = (ours[0] - expected[0]).abs().max().item()
    assert error <= 1e-4 and error <= 2 * torch_error + 1e-6, (error, torch_error)
    np.testing.assert_allclose(ours[0][0, 0].numpy(), full, rtol=0, atol=1e-4)
    for got, torch_grad, want in zip(ours[1:], (a32.grad, b32.grad), expected[1:]):
        torch_grad_error = (torch_grad.double() - want).abs().max()
        assert (got - want).abs().max() <= 1.5 * torch_grad_error


def test_fused_ssim_nan_where_a_window_sees_one(fused):
    rng = np.random.default_rng(11)
    a, b = _microscopy_pair(rng, (1, 1, 40, 37))
    a[0, 0, 3, 30] = np.nan
    b[0, 0, 25, 2] = np.inf
    window = make_window("gaussian", (7, 7), (1.5, 1.5))
    library, device = fused
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device)
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device)
    out = ssim_module.fused_ssim(a32, b32, window, *_constants(50.0), "none", library).cpu()
    metric = ssim_module._SSIMMetric(*_constants(50.0))
    from napari_simwarp.ops._moments import moment_map

    expected = moment_map(torch.as_tensor(a), torch.as_tensor(b), window, metric, "none")
    assert torch.equal(out.isnan(), expected.isnan())
    assert out.isnan().any() and not out.isnan().all()
    finite = ~expected.isnan()
    assert (out.double()[finite] - expected[finite]).abs().max() <= 1e-4


def test_fused_ssim_ops_refuse_what_they_cannot_run(fused):
    library, device = fused
    x = torch.rand(1, 1, 40, 40, device=device)
    taps = [tuple(make_window("gaussian", (11, 11), (1.5, 1.5)).taps[0])] * 2
    with pytest.raises(TypeError, match="ssim_fwd: a must be float32, got Double"):
        calls.ssim_fwd(x.double(), x.double(), taps, 1e-4, 9e-4, True, library)
    wide = [tuple(make_window("gaussian", (33, 33), (5.0, 5.0)).taps[0])] * 2
    with pytest.raises(ValueError, match="window sizes must be odd and at most 31"):
        calls.ssim_fwd(x, x, wide, 1e-4, 9e-4, True, library)
    with pytest.raises(ValueError, match="ssim_fwd: b must have shape"):
        calls.ssim_fwd(x, x[..., :-1], taps, 1e-4, 9e-4, True, library)
    # ... and the binding itself refuses them too, with the same message.
    lib = library if library is not None else torch.ops.simwarp
    flat = [t for axis in wide for t in axis]
    with pytest.raises(RuntimeError, match="window sizes must be odd and at most 31"):
        lib.ssim_fwd(x, x, flat, [33, 33], 1e-4, 9e-4, True)


def test_fused_ssim_opcheck(fused):
    library, device = fused
    lib = library if library is not None else torch.ops.simwarp
    rng = np.random.default_rng(2)
    a, b = (
        torch.as_tensor(v, dtype=torch.float32, device=device)
        for v in _microscopy_pair(rng, (2, 1, 20, 18))
    )
    flat = list(make_window("gaussian", (5, 7), (1.0, 1.5)).taps[0]) + list(
        make_window("gaussian", (5, 7), (1.0, 1.5)).taps[1]
    )
    args = (a, b, flat, [5, 7], 0.25, 2.25)
    torch.library.opcheck(lib.ssim_fwd.default, (*args, True))
    torch.library.opcheck(lib.ssim_fwd.default, (*args, False))
    _, partials, shifts = lib.ssim_fwd(*args, True)
    grad = torch.randn(a.shape, device=device)
    torch.library.opcheck(lib.ssim_bwd.default, (grad, a, b, partials, shifts, flat, [5, 7]))
    one = torch.full((1,), 0.5, device=device)
    torch.library.opcheck(lib.ssim_bwd.default, (one, a, b, partials, shifts, flat, [5, 7]))


# ---- the fused 2-D local std (cuda/local_std_fused.cu) -----------------------------------


@pytest.fixture(params=SIDES)
def fused_std(request):
    """(library, device) of the fused local std ops, as :func:`fused`."""
    if request.param == "host_shim":
        require_host_shim()
        from napari_simwarp.ops._kernels._registrations import register_fused_local_std_fakes

        register_fused_local_std_fakes("simwarp_host_shim")
        return torch.ops.simwarp_host_shim, torch.device("cpu")
    _require_cuda_kernels()
    return None, torch.device("cuda")


def _offset_image_with_flats(shape, seed):
    """Offset noisy images (1000 + 5·U), each with an exactly constant 12 x 12 patch (flat
    windows, whatever the padding) and float32 values."""
    rng = np.random.default_rng(seed)
    x = rng.random(shape) * 5.0 + 1000.0
    x[..., 1:13, 2:14] = 1003.0
    return x.astype(np.float32).astype(np.float64)


#: (N, C, H, W), window: sizes that are no multiple of the 16² tiles, batches, windows as
#: long as their axis, one row; the flat patch is seen whole by windows up to 5 x 5 only.
FUSED_STD_CASES = [
    ((1, 1, 37, 45), (15, 15)),
    ((2, 3, 20, 33), (5, 9)),
    ((1, 2, 7, 9), (7, 9)),
    ((1, 1, 1, 20), (1, 5)),
    ((1, 1, 40, 40), (3, 3)),
]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("padding", ["reflect", "mirror", "nearest", "constant"])
@pytest.mark.parametrize("shape,window", FUSED_STD_CASES)
def test_fused_local_std_matches_float64_and_the_unfused_kernels(
    fused_std, shape, window, padding, normalize
):
    """Values and gradients against the float64 pure torch path (1e-5 of the largest; the
    unfused CUDA kernels' guarantee, test_local_std_float32_holds_offset_data), and the
    flat windows (0, or sqrt(eps) unnormalized, no gradient) exactly where the padded
    image is constant over the window. (The unfused kernels' running sums missed some of
    those beside a "constant" border, 6e-5 instead of 0, until they summed afresh the first
    window past the padding: test_local_std_flat_windows.py; the fused kernel sums each
    window afresh.)"""
    from napari_simwarp.ops._reference.local_std import center_and_pad
    from napari_simwarp.ops.local_std import fused_local_std

    library, device = fused_std
    lib = library if library is not None else torch.ops.simwarp
    x = _offset_image_with_flats(shape, seed=sum(shape))
    upstream = torch.as_tensor(np.random.default_rng(1).standard_normal(shape))
    x32 = torch.as_tensor(x, dtype=torch.float32, device=device).requires_grad_()
    out = fused_local_std(x32, window, padding, 1e-6, normalize, library=library)
    (out * upstream.to(device, torch.float32)).sum().backward()
    x64 = torch.as_tensor(x).requires_grad_()
    expected = _reference.local_std_2d(x64, window, padding, 1e-6, normalize)
    (expected * upstream).sum().backward()
    ours, grad = out.detach().cpu().double(), x32.grad.cpu().double()
    assert (ours - expected.detach()).abs().max() <= 1e-5 * expected.abs().max()
    assert (grad - x64.grad).abs().max() <= 1e-5 * x64.grad.abs().max()
    factor = calls.COMPENSATED_FLOAT32_FLAT_FACTOR
    x_in = x32.detach()
    shift = x_in.mean((-2, -1)).reshape(-1)
    _, _, flat = lib.local_std_fused_fwd(
        x_in, shift, list(window), padding, 1e-6, normalize, factor
    )
    xp = center_and_pad(torch.as_tensor(x), [(k // 2, k // 2) for k in window], padding)
    xp = xp.reshape(-1, 1, *xp.shape[-2:])
    spread = torch.nn.functional.max_pool2d(xp, window, stride=1) + torch.nn.functional.max_pool2d(
        -xp, window, stride=1
    )
    constant = (spread == 0).reshape(shape)
    assert torch.equal(flat.cpu(), constant)
    if max(window) <= 5 and shape[-2] > 12:
        assert constant.any()  # the case holds flat windows
        level = torch.tensor(0.0 if normalize else 1e-6**0.5, dtype=torch.float32).double()
        assert (ours[constant] == level).all()


def test_fused_local_std_refuses_what_it_cannot_run(fused_std):
    library, device = fused_std
    x = torch.rand(1, 1, 40, 40, device=device)
    shift = x.mean((-2, -1)).reshape(-1)
    args = (1e-6, True, 1e-13, library)
    with pytest.raises(TypeError, match="local_std_fused: x must be float32, got Double"):
        calls.local_std_fused_fwd(x.double(), shift.double(), [5, 5], "reflect", *args)
    with pytest.raises(ValueError, match="window sizes must be odd and at most 31"):
        calls.local_std_fused_fwd(x, shift, [33, 33], "reflect", *args)
    with pytest.raises(ValueError, match="padding must be reflect, mirror, nearest or constant"):
        calls.local_std_fused_fwd(x, shift, [5, 5], "valid", *args)
    with pytest.raises(ValueError, match="shift must have shape"):
        calls.local_std_fused_fwd(x, shift[:0], [5, 5], "reflect", *args)
    lib = library if library is not None else torch.ops.simwarp
    with pytest.raises(RuntimeError, match="window sizes must be odd and at most 31"):
        lib.local_std_fused_fwd(x, shift, [33, 33], "reflect", 1e-6, True, 1e-13)


def test_fused_local_std_opcheck(fused_std):
    library, device = fused_std
    lib = library if library is not None else torch.ops.simwarp
    x = torch.as_tensor(_offset_image_with_flats((2, 1, 20, 18), 4), dtype=torch.float32)
    x = x.to(device)
    shift = x.mean((-2, -1)).reshape(-1)
    for padding in ("reflect", "constant"):
        args = (x, shift, [5, 7], padding, 1e-6, True, 1e-13)
        torch.library.opcheck(lib.local_std_fused_fwd.default, args)
        out, s1, flat = lib.local_std_fused_fwd(*args)
        grad = torch.randn(x.shape, device=device)
        bwd = (grad, out, s1, flat, x, shift, [5, 7], padding, True)
        torch.library.opcheck(lib.local_std_fused_bwd.default, bwd)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the dispatch to CUDA needs a GPU")
def test_cuda_ssim_and_local_std_take_the_fused_kernels_where_they_apply():
    _require_cuda_kernels()
    from napari_simwarp.ops import local_std as local_std_op
    from napari_simwarp.ops import ssim as ssim_op

    std_module = importlib.import_module("napari_simwarp.ops.local_std")
    a, b = torch.rand(2, 1, 2, 40, 37, device="cuda")
    window = make_window("gaussian", (11, 11), (1.5, 1.5))
    assert ssim_module._fused_applies(a, b, window)
    assert ssim_module._fused_applies(a.half(), b.half(), window)
    assert not ssim_module._fused_applies(a.double(), b.double(), window)
    assert not ssim_module._fused_applies(a, b, make_window("gaussian", (33, 33), (5.0, 5.0)))
    volume = torch.rand(1, 1, 9, 10, 11, device="cuda")
    assert not ssim_module._fused_applies(volume, volume, make_window("gaussian", (3,) * 3, 1.0))
    torch.testing.assert_close(
        ssim_op(a, b, window=11),
        ssim_module.fused_ssim(a, b, window, 1e-4, 9e-4, "none"),
        rtol=0,
        atol=0,
    )
    calls_impl = calls
    assert std_module._fused_applies(a, (15, 15), calls_impl)
    assert not std_module._fused_applies(a.double(), (15, 15), calls_impl)
    assert not std_module._fused_applies(a, (33, 33), calls_impl)
    torch.testing.assert_close(
        local_std_op(a, window=15),
        std_module.fused_local_std(a, (15, 15), "reflect", 1e-12, True),
        rtol=0,
        atol=0,
    )


# ---- the fused local NCC (cuda/local_ncc.cu) ---------------------------------------------
# Map and both gradients against the moment engine's float64 pure torch path and SciPy, on
# offset microscopy-like data, batched, 2-D and 3-D, box and Gaussian, sizes no multiple of
# the tiles, step edges (the two-pass redo), flat windows, the NaN rule, refusals, opcheck.


@pytest.fixture(params=SIDES)
def fused_ncc(request):
    """(library, device) of the fused local NCC ops: the host shim's on CPU tensors, or the
    CUDA build's on the GPU."""
    if request.param == "host_shim":
        require_host_shim()
        from napari_simwarp.ops._kernels._registrations import register_fused_local_ncc_fakes

        register_fused_local_ncc_fakes("simwarp_host_shim")
        return torch.ops.simwarp_host_shim, torch.device("cpu")
    from napari_simwarp.ops import _kernels

    if not (_kernels.ensure_loaded() and _kernels.state()["cuda"]):
        pytest.fail(f"a GPU but no CUDA kernels: {_kernels.state()['cuda_error']}")
    return None, torch.device("cuda")


def _ncc_fused_with_gradients(fused_ncc, a, b, window, reduction, upstream):
    """The fused map (or mean) and both gradients under ``upstream``, as float64 CPU
    tensors."""
    library, device = fused_ncc
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device).requires_grad_()
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device).requires_grad_()
    out = ncc_module.fused_local_ncc(a32, b32, window, reduction, library)
    assert out.dtype == torch.float32 and out.device == device
    loss = out if reduction == "mean" else (out * upstream.to(device, torch.float32)).sum()
    loss.backward()
    return [t.detach().cpu().double() for t in (out, a32.grad, b32.grad)]


def _ncc_float64_with_gradients(a, b, window, reduction, upstream):
    """The moment engine's pure torch path in float64 (the reference of the float32 paths)."""
    a64 = torch.as_tensor(a, dtype=torch.float64).requires_grad_()
    b64 = torch.as_tensor(b, dtype=torch.float64).requires_grad_()
    metric = ncc_module._LocalNCCMetric()
    out = _MomentMap.apply(a64, b64, window, metric, reduction, _reference, None)
    (out if reduction == "mean" else (out * upstream).sum()).backward()
    return [t.detach() for t in (out, a64.grad, b64.grad)]


def _ncc_microscopy_pair(rng, shape):
    """Offset camera-like images or volumes (tests/images.py), held as float32 values; b is
    a noisy mix of a and another image, so that the NCC spans (-1, 1)."""
    lead, spatial = shape[:2], shape[2:]
    a = np.stack([images.microscopy(rng, spatial) for _ in range(int(np.prod(lead)))])
    other = np.stack([images.microscopy(rng, spatial) for _ in range(int(np.prod(lead)))])
    b = 0.6 * a + 0.4 * other
    as32 = lambda x: x.astype(np.float32).astype(np.float64).reshape(shape)
    return as32(a), as32(b)


#: (N, C, *S), window kind, sizes: sizes no multiple of the 16² (8 x 16² in 3-D) tiles,
#: batches and channels, per-axis windows, a window as long as its axis (both mirrors in
#: one tile), one row, a volume of depth below the tile's.
FUSED_NCC_CASES = [
    ((1, 1, 37, 45), "gaussian", (9, 9)),
    ((2, 3, 40, 33), "box", (7, 11)),
    ((1, 2, 11, 70), "gaussian", (11, 5)),
    ((1, 1, 5, 9), "box", (5, 9)),
    ((2, 1, 1, 23), "box", (1, 7)),
    ((1, 1, 11, 20, 18), "box", (5, 5, 5)),
    ((2, 1, 9, 17, 19), "gaussian", (3, 5, 7)),
    ((1, 2, 5, 7, 33), "box", (5, 7, 3)),
]


def _ncc_window(kind, sizes):
    sigmas = tuple(max(k - 1, 1) / 6.0 for k in sizes) if kind == "gaussian" else None
    return make_window(kind, sizes, sigmas)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("shape,kind,sizes", FUSED_NCC_CASES)
def test_fused_local_ncc_matches_float64_on_offset_data(fused_ncc, shape, kind, sizes, reduction):
    """Map and both gradients against the float64 pure torch path, within the float32
    guarantees of tests/ops/test_local_ncc.py (TestFloat32Path: 1e-4 on the map, 1e-4 of the
    largest gradient), on microscopy-like data (offset 1000, background, blobs, noise); the
    map also against SciPy."""
    rng = np.random.default_rng(7)
    a, b = _ncc_microscopy_pair(rng, shape)
    window = _ncc_window(kind, sizes)
    upstream = torch.as_tensor(rng.standard_normal(shape))
    ours = _ncc_fused_with_gradients(fused_ncc, a, b, window, reduction, upstream)
    expected = _ncc_float64_with_gradients(a, b, window, reduction, upstream)
    assert ours[0].shape == expected[0].shape
    assert (ours[0] - expected[0]).abs().max() <= 1e-4
    for got, want in zip(ours[1:], expected[1:]):
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    if reduction == "none" and len(set(sizes)) == 1:  # SciPy's filters take one size
        scipy = np.stack(
            [
                _scipy_local_ncc(x, y, sizes[0], kind)
                for x, y in zip(a.reshape(-1, *shape[2:]), b.reshape(-1, *shape[2:]))
            ]
        ).reshape(shape)
        np.testing.assert_allclose(ours[0].numpy(), scipy, rtol=0, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1, 48, 48), (1, 1, 12, 20, 24)])
def test_fused_local_ncc_redoes_step_edges(fused_ncc, shape):
    """A step of 2000 counts on an offset of 1000 across the tiles, noise 0.5: windows on
    either side hold a sum of squares about the tile's mean ~10^6 times their variance,
    which float32 cannot difference (the one-pass float32 NCC there is off by up to 1,
    ops/_moments.py's test with FLOAT32_RISK off). Map within 1e-4 of SciPy and the float64
    path. Gradients within 3e-4 of the largest: the backward combines maps about the tiles'
    shifts, which cancel beside the step (measured: b's gradient 2.1e-4 in 2-D and 2.0e-4
    in 3-D; the unfused float32 path 1.6e-4 and 0.7e-4 on the same data; a's 0.9e-4)."""
    rng = np.random.default_rng(5)
    a = np.full(shape, 1000.0)
    a[..., 9:] = 3000.0
    a = (a + rng.standard_normal(shape) * 0.5).astype(np.float32).astype(np.float64)
    b = (0.5 * a + rng.standard_normal(shape) * 0.5).astype(np.float32).astype(np.float64)
    window = _ncc_window("box", (5,) * (len(shape) - 2))
    upstream = torch.as_tensor(rng.standard_normal(shape))
    ours = _ncc_fused_with_gradients(fused_ncc, a, b, window, "none", upstream)
    expected = _ncc_float64_with_gradients(a, b, window, "none", upstream)
    assert (ours[0] - expected[0]).abs().max() <= 1e-4
    np.testing.assert_allclose(
        ours[0][0, 0].numpy(), _scipy_local_ncc(a[0, 0], b[0, 0], 5, "box"), rtol=0, atol=1e-4
    )
    for got, want in zip(ours[1:], expected[1:]):
        assert (got - want).abs().max() <= 3e-4 * want.abs().max()


def test_fused_local_ncc_flat_windows_give_zero(fused_ncc):
    """Constant regions (exactly flat windows, and a constant image) give ρ = 0 and zero
    gradients there, as the pure torch path."""
    library, device = fused_ncc
    a = torch.full((1, 1, 20, 40, 3), 1000.0)[..., 0]
    a[..., 20:] += torch.randn(1, 1, 20, 20, generator=torch.Generator().manual_seed(0))
    b = a * 2 + 5
    a32, b32 = a.to(device).requires_grad_(), b.to(device).requires_grad_()
    out = ncc_module.fused_local_ncc(a32, b32, _ncc_window("box", (5, 5)), "none", library)
    out.sum().backward()
    assert torch.equal(out[..., :17].cpu(), torch.zeros(1, 1, 20, 17))
    assert (out[..., 23:].cpu() - 1).abs().max() <= 1e-5
    assert torch.isfinite(a32.grad).all() and torch.equal(
        a32.grad[..., :15].cpu(), torch.zeros(1, 1, 20, 15)
    )


def test_fused_local_ncc_nan_where_a_window_sees_one(fused_ncc):
    rng = np.random.default_rng(11)
    a, b = _ncc_microscopy_pair(rng, (1, 1, 9, 20, 17))
    a[0, 0, 2, 3, 15] = np.nan
    b[0, 0, 7, 18, 2] = np.inf
    window = _ncc_window("gaussian", (3, 5, 5))
    library, device = fused_ncc
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device)
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device)
    out = ncc_module.fused_local_ncc(a32, b32, window, "none", library).cpu()
    metric = ncc_module._LocalNCCMetric()
    expected = moment_map(torch.as_tensor(a), torch.as_tensor(b), window, metric, "none")
    assert torch.equal(out.isnan(), expected.isnan())
    assert out.isnan().any() and not out.isnan().all()
    finite = ~expected.isnan()
    assert (out.double()[finite] - expected[finite]).abs().max() <= 1e-4


def test_fused_local_ncc_ops_refuse_what_they_cannot_run(fused_ncc):
    library, device = fused_ncc
    x = torch.rand(1, 1, 40, 40, device=device)
    taps = [(1.0,) * 5] * 2
    with pytest.raises(TypeError, match="local_ncc_fwd: a must be float32, got Double"):
        calls.local_ncc_fwd(x.double(), x.double(), taps, 1 / 25, 1e-5, True, library)
    wide = [(1.0,) * 27] * 2
    with pytest.raises(ValueError, match="window sizes must be odd and at most 25"):
        calls.local_ncc_fwd(x, x, wide, 1 / 729, 1e-5, True, library)
    with pytest.raises(ValueError, match="local_ncc_fwd: b must have shape"):
        calls.local_ncc_fwd(x, x[..., :-1], taps, 1 / 25, 1e-5, True, library)
    # ... and the binding itself refuses them too, with the same message.
    lib = library if library is not None else torch.ops.simwarp
    with pytest.raises(RuntimeError, match="window sizes must be odd and at most 25"):
        lib.local_ncc_fwd(x, x, [1.0] * 54, [27, 27], 1 / 729, 1e-5, True)


@pytest.mark.parametrize("sizes", [(5, 7), (3, 5, 3)])
def test_fused_local_ncc_opcheck(fused_ncc, sizes):
    library, device = fused_ncc
    lib = library if library is not None else torch.ops.simwarp
    rng = np.random.default_rng(2)
    shape = (2, 1, 20, 18) if len(sizes) == 2 else (1, 2, 9, 10, 11)
    a, b = (
        torch.as_tensor(v, dtype=torch.float32, device=device)
        for v in _ncc_microscopy_pair(rng, shape)
    )
    window = _ncc_window("gaussian", sizes)
    flat = [t for axis in window.taps for t in axis]
    args = (a, b, flat, list(sizes), 1.0, 7.6e-6)
    torch.library.opcheck(lib.local_ncc_fwd.default, (*args, True))
    torch.library.opcheck(lib.local_ncc_fwd.default, (*args, False))
    _, partials, shifts = lib.local_ncc_fwd(*args, True)
    grad = torch.randn(a.shape, device=device)
    torch.library.opcheck(
        lib.local_ncc_bwd.default, (grad, a, b, partials, shifts, flat, list(sizes))
    )
    one = torch.full((1,), 0.5, device=device)
    torch.library.opcheck(
        lib.local_ncc_bwd.default, (one, a, b, partials, shifts, flat, list(sizes))
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_local_ncc_dispatches_to_the_fused_kernels_where_they_apply(monkeypatch):
    """On a GPU: float32 2-D and 3-D with windows <= 25 run the fused forward, float64 and
    wider windows the moment engine; results as the float64 path."""
    from napari_simwarp.ops import _kernels, local_ncc

    if not (_kernels.ensure_loaded() and _kernels.state()["cuda"]):
        pytest.fail(f"a GPU but no CUDA kernels: {_kernels.state()['cuda_error']}")
    seen = []
    original = ncc_module.fused_local_ncc
    monkeypatch.setattr(
        ncc_module, "fused_local_ncc", lambda *a, **k: seen.append(1) or original(*a, **k)
    )
    rng = np.random.default_rng(1)
    for shape, window, fused_expected in [
        ((1, 1, 40, 36), 9, True),
        ((1, 1, 20, 22, 24), 9, True),
        ((1, 1, 60, 60), 27, False),
    ]:
        a, b = _ncc_microscopy_pair(rng, shape)
        seen.clear()
        out = local_ncc(
            torch.as_tensor(a, dtype=torch.float32, device="cuda"),
            torch.as_tensor(b, dtype=torch.float32, device="cuda"),
            window=window,
        )
        assert bool(seen) == fused_expected
        expected = local_ncc(torch.as_tensor(a), torch.as_tensor(b), window=window)
        assert (out.cpu().double() - expected).abs().max() <= 1e-4
