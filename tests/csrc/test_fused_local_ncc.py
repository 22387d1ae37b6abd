"""The fused local NCC kernels (csrc/cuda/local_ncc.cu) through the host shim, and on the
GPU where there is one: map and both gradients against the moment engine's float64 pure
torch path and an independent SciPy reference, on offset microscopy-like data, batched,
2-D and 3-D, box and Gaussian, sizes no multiple of the tiles, step edges (the two-pass
redo), the NaN rule, refusals and the ops' registration (opcheck). See test_host_shim.py
for how the shim runs the kernels' blocks, threads and barriers on the CPU."""

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
from tests.ops.test_local_ncc import _scipy_local_ncc

ncc_module = importlib.import_module("napari_simwarp.ops.local_ncc")
SIDES = ["host_shim"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=SIDES)
def fused(request):
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


def _fused_with_gradients(fused, a, b, window, reduction, upstream):
    """The fused map (or mean) and both gradients under ``upstream``, as float64 CPU
    tensors."""
    library, device = fused
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device).requires_grad_()
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device).requires_grad_()
    out = ncc_module.fused_local_ncc(a32, b32, window, reduction, library)
    assert out.dtype == torch.float32 and out.device == device
    loss = out if reduction == "mean" else (out * upstream.to(device, torch.float32)).sum()
    loss.backward()
    return [t.detach().cpu().double() for t in (out, a32.grad, b32.grad)]


def _float64_with_gradients(a, b, window, reduction, upstream):
    """The moment engine's pure torch path in float64 (the reference of the float32 paths)."""
    a64 = torch.as_tensor(a, dtype=torch.float64).requires_grad_()
    b64 = torch.as_tensor(b, dtype=torch.float64).requires_grad_()
    metric = ncc_module._LocalNCCMetric()
    out = _MomentMap.apply(a64, b64, window, metric, reduction, _reference, None)
    (out if reduction == "mean" else (out * upstream).sum()).backward()
    return [t.detach() for t in (out, a64.grad, b64.grad)]


def _microscopy_pair(rng, shape):
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
FUSED_CASES = [
    ((1, 1, 37, 45), "gaussian", (9, 9)),
    ((2, 3, 40, 33), "box", (7, 11)),
    ((1, 2, 11, 70), "gaussian", (11, 5)),
    ((1, 1, 5, 9), "box", (5, 9)),
    ((2, 1, 1, 23), "box", (1, 7)),
    ((1, 1, 11, 20, 18), "box", (5, 5, 5)),
    ((2, 1, 9, 17, 19), "gaussian", (3, 5, 7)),
    ((1, 2, 5, 7, 33), "box", (5, 7, 3)),
]


def _window(kind, sizes):
    sigmas = tuple(max(k - 1, 1) / 6.0 for k in sizes) if kind == "gaussian" else None
    return make_window(kind, sizes, sigmas)


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("shape,kind,sizes", FUSED_CASES)
def test_fused_local_ncc_matches_float64_on_offset_data(fused, shape, kind, sizes, reduction):
    """Map and both gradients against the float64 pure torch path, within the float32
    guarantees of tests/ops/test_local_ncc.py (TestFloat32Path: 1e-4 on the map, 1e-4 of the
    largest gradient), on microscopy-like data (offset 1000, background, blobs, noise); the
    map also against SciPy."""
    rng = np.random.default_rng(7)
    a, b = _microscopy_pair(rng, shape)
    window = _window(kind, sizes)
    upstream = torch.as_tensor(rng.standard_normal(shape))
    ours = _fused_with_gradients(fused, a, b, window, reduction, upstream)
    expected = _float64_with_gradients(a, b, window, reduction, upstream)
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
def test_fused_local_ncc_redoes_step_edges(fused, shape):
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
    window = _window("box", (5,) * (len(shape) - 2))
    upstream = torch.as_tensor(rng.standard_normal(shape))
    ours = _fused_with_gradients(fused, a, b, window, "none", upstream)
    expected = _float64_with_gradients(a, b, window, "none", upstream)
    assert (ours[0] - expected[0]).abs().max() <= 1e-4
    np.testing.assert_allclose(
        ours[0][0, 0].numpy(), _scipy_local_ncc(a[0, 0], b[0, 0], 5, "box"), rtol=0, atol=1e-4
    )
    for got, want in zip(ours[1:], expected[1:]):
        assert (got - want).abs().max() <= 3e-4 * want.abs().max()


def test_fused_local_ncc_flat_windows_give_zero(fused):
    """Constant regions (exactly flat windows, and a constant image) give ρ = 0 and zero
    gradients there, as the pure torch path."""
    library, device = fused
    a = torch.full((1, 1, 20, 40, 3), 1000.0)[..., 0]
    a[..., 20:] += torch.randn(1, 1, 20, 20, generator=torch.Generator().manual_seed(0))
    b = a * 2 + 5
    a32, b32 = a.to(device).requires_grad_(), b.to(device).requires_grad_()
    out = ncc_module.fused_local_ncc(a32, b32, _window("box", (5, 5)), "none", library)
    out.sum().backward()
    assert torch.equal(out[..., :17].cpu(), torch.zeros(1, 1, 20, 17))
    assert (out[..., 23:].cpu() - 1).abs().max() <= 1e-5
    assert torch.isfinite(a32.grad).all() and torch.equal(
        a32.grad[..., :15].cpu(), torch.zeros(1, 1, 20, 15)
    )


def test_fused_local_ncc_nan_where_a_window_sees_one(fused):
    rng = np.random.default_rng(11)
    a, b = _microscopy_pair(rng, (1, 1, 9, 20, 17))
    a[0, 0, 2, 3, 15] = np.nan
    b[0, 0, 7, 18, 2] = np.inf
    window = _window("gaussian", (3, 5, 5))
    library, device = fused
    a32 = torch.as_tensor(a, dtype=torch.float32, device=device)
    b32 = torch.as_tensor(b, dtype=torch.float32, device=device)
    out = ncc_module.fused_local_ncc(a32, b32, window, "none", library).cpu()
    metric = ncc_module._LocalNCCMetric()
    expected = moment_map(torch.as_tensor(a), torch.as_tensor(b), window, metric, "none")
    assert torch.equal(out.isnan(), expected.isnan())
    assert out.isnan().any() and not out.isnan().all()
    finite = ~expected.isnan()
    assert (out.double()[finite] - expected[finite]).abs().max() <= 1e-4


def test_fused_local_ncc_ops_refuse_what_they_cannot_run(fused):
    library, device = fused
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
def test_fused_local_ncc_opcheck(fused, sizes):
    library, device = fused
    lib = library if library is not None else torch.ops.simwarp
    rng = np.random.default_rng(2)
    shape = (2, 1, 20, 18) if len(sizes) == 2 else (1, 2, 9, 10, 11)
    a, b = (
        torch.as_tensor(v, dtype=torch.float32, device=device) for v in _microscopy_pair(rng, shape)
    )
    window = _window("gaussian", sizes)
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
        a, b = _microscopy_pair(rng, shape)
        seen.clear()
        out = local_ncc(
            torch.as_tensor(a, dtype=torch.float32, device="cuda"),
            torch.as_tensor(b, dtype=torch.float32, device="cuda"),
            window=window,
        )
        assert bool(seen) == fused_expected
        expected = local_ncc(torch.as_tensor(a), torch.as_tensor(b), window=window)
        assert (out.cpu().double() - expected).abs().max() <= 1e-4
