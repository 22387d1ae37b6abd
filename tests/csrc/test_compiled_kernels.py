"""The compiled CPU kernels against independent references (SciPy, NumPy, float64).

The CPU build runs the very per-element functions the CUDA kernels call
(csrc/include/simwarp/*.h), so these tests cover the CUDA maths on machines without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from scipy import ndimage as ndi

from tests.compiled import require_compiled


@pytest.fixture(scope="module")
def compiled():
    return require_compiled()


def _box_reference(x: np.ndarray, window) -> np.ndarray:
    """Valid window sums by explicit summation over sliding windows (float64)."""
    axes = tuple(range(-len(window), 0))
    return sliding_window_view(x, window, axis=axes).sum(axis=tuple(range(-len(window), 0)))


@pytest.mark.parametrize(
    "shape,window",
    [
        ((2, 3, 17, 23), (5, 7)),
        ((1, 1, 1, 1), (1, 1)),
        ((1, 2, 13, 11), (13, 1)),
        ((1, 1, 9, 10, 11), (3, 5, 7)),
        ((2, 1, 31, 29), (29, 3)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_box_sum_valid_and_full(compiled, shape, window, dtype, rng):
    x = rng.standard_normal(shape)
    out = compiled.box_sum(torch.from_numpy(x).to(dtype), window)
    ref = _box_reference(x, window)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=tol, atol=tol * np.abs(ref).max())
    pads = [(0, 0)] * (len(shape) - len(window)) + [(k - 1, k - 1) for k in window]
    full = compiled.box_sum(torch.from_numpy(x).to(dtype), window, full=True)
    np.testing.assert_allclose(
        full.double().numpy(),
        _box_reference(np.pad(x, pads), window),
        rtol=tol,
        atol=tol * np.abs(ref).max(),
    )


def test_box_sum_float32_keeps_accuracy_on_long_offset_lines(compiled, rng):
    # A float32 running sum would drift along a 4096-long line with a 1000 offset; the
    # kernels accumulate in double.
    x = (1000.0 + 5.0 * rng.standard_normal((1, 1, 4, 4096))).astype(np.float32)
    out = compiled.box_sum(torch.from_numpy(x), (1, 15)).double().numpy()
    ref = _box_reference(x.astype(np.float64), (1, 15))
    assert np.abs(out / ref - 1).max() < 1e-6


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize(
    "shape,window", [((1, 2, 40, 37), (5, 7)), ((1, 1, 12, 13, 14), (3, 5, 3))]
)
def test_local_std_matches_scipy(compiled, shape, window, normalized, rng):
    x = rng.standard_normal(shape) * 3 + 10
    pads = [(0, 0), (0, 0)] + [(k // 2, k // 2) for k in window]
    xp = np.pad(x, pads, mode="symmetric")  # SciPy's "reflect"
    out = compiled.local_std_valid(torch.from_numpy(xp), window, 1e-3, normalized).numpy()
    n = np.prod(window)
    m1 = ndi.uniform_filter(x, (1, 1, *window), mode="reflect")
    m2 = ndi.uniform_filter(x * x, (1, 1, *window), mode="reflect")
    var = np.maximum(m2 - m1 * m1, 0)
    ref = np.sqrt(var) if normalized else np.sqrt(var * n + 1e-3)
    np.testing.assert_allclose(out, ref, rtol=1e-9)


def test_local_std_flat_regions_are_finite_with_zero_gradient(compiled):
    xp = torch.ones(1, 1, 12, 12, dtype=torch.float64, requires_grad=True)
    out = compiled.local_std_valid(xp, (3, 3), 0.0, True)
    out.sum().backward()
    assert torch.all(out == 0) and torch.all(xp.grad == 0)


@pytest.mark.parametrize("normalized", [True, False])
def test_gradcheck(compiled, normalized, rng):
    x = torch.from_numpy(rng.standard_normal((1, 2, 9, 8))).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: compiled.local_std_valid(t, (3, 5), 1e-2, normalized), (x,)
    )
    x3 = torch.from_numpy(rng.standard_normal((1, 1, 6, 7, 5))).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: compiled.local_std_valid(t, (3, 3, 3), 1e-2, normalized), (x3,)
    )
    assert torch.autograd.gradcheck(lambda t: compiled.box_sum(t, (3, 5)), (x,))
    assert torch.autograd.gradcheck(lambda t: compiled.box_sum(t, (3, 5), True), (x,))


def test_noncontiguous_and_bitwise_repeatable(compiled, rng):
    x = torch.from_numpy(rng.standard_normal((1, 1, 64, 48)).astype(np.float32))
    xt = x.transpose(-1, -2)
    a = compiled.local_std_valid(xt, (5, 5), 0.0, True)
    b = compiled.local_std_valid(xt.contiguous(), (5, 5), 0.0, True)
    c = compiled.local_std_valid(xt.contiguous(), (5, 5), 0.0, True)
    assert torch.equal(a, b) and torch.equal(b, c)


def test_compiles_under_torch_compile(compiled, rng):
    x = torch.from_numpy(rng.standard_normal((1, 1, 16, 16)))
    fn = torch.compile(
        lambda t: compiled.local_std_valid(t, (3, 3), 0.0, True) * 2, backend="eager"
    )
    torch.testing.assert_close(fn(x), 2 * compiled.local_std_valid(x, (3, 3), 0.0, True))


@pytest.mark.parametrize(
    "shape,sizes",
    [((2, 3, 30, 41), (5, 4)), ((1, 1, 9, 10, 11), (3, 1, 5)), ((1, 1, 7, 7), (7, 7))],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_correlate_matches_scipy(compiled, shape, sizes, dtype, rng):
    x = rng.standard_normal(shape)
    taps = [rng.standard_normal(k) for k in sizes]
    out = compiled.correlate(torch.from_numpy(x).to(dtype), [t.tolist() for t in taps])
    kernel = taps[0]
    for t in taps[1:]:
        kernel = np.multiply.outer(kernel, t)
    full = ndi.correlate(
        x, kernel[None, None], mode="constant", origin=[0, 0] + [-(k // 2) for k in sizes]
    )
    # origin shifts SciPy's centered window to start at i: the valid part is the prefix.
    ref = full[(..., *[slice(0, n - k + 1) for n, k in zip(shape[2:], sizes)])]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_correlate_transpose_is_the_adjoint(compiled, rng):
    x = torch.from_numpy(rng.standard_normal((1, 2, 19, 23)))
    taps = [rng.standard_normal(5).tolist(), rng.standard_normal(4).tolist()]  # not symmetric
    y = torch.from_numpy(rng.standard_normal((1, 2, 15, 20)))
    lhs = (compiled.correlate(x, taps) * y).sum()
    rhs = (x * compiled.correlate(y, taps, transpose=True)).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-12)
    xr = x[..., :8, :9].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: compiled.correlate(t, taps), (xr,))
    assert torch.autograd.gradcheck(lambda t: compiled.correlate(t, taps, True), (xr,))
    torch.library.opcheck(
        torch.ops.simwarp.correlate.default, (x, [v for t in taps for v in t], [5, 4], False)
    )


# --- local_std_2d: padding and centering inside the kernel ------------------------------

SCIPY_MODES = {
    "reflect": "reflect",
    "mirror": "mirror",
    "constant": "constant",
    "nearest": "nearest",
}
NUMPY_PAD = {"reflect": "symmetric", "mirror": "reflect", "constant": "constant", "nearest": "edge"}


def _padded_std64(x: torch.Tensor, window, padding: str) -> torch.Tensor:
    """Float64 autograd reference: NumPy-convention padding by index, explicit window sums."""
    (kh, kw) = window
    h, w = x.shape[-2:]

    def source(n, k):
        i = np.arange(-(k // 2), n + k - 1 - k // 2)
        if padding == "reflect":
            i = np.remainder(i, 2 * n)
            return np.where(i >= n, 2 * n - 1 - i, i), None
        if padding == "mirror":
            if n == 1:
                return np.zeros_like(i), None
            i = np.remainder(i, 2 * n - 2)
            return np.where(i >= n, 2 * n - 2 - i, i), None
        if padding == "nearest":
            return np.clip(i, 0, n - 1), None
        return np.clip(i, 0, n - 1), (i >= 0) & (i < n)

    rows, row_mask = source(h, kh)
    cols, col_mask = source(w, kw)
    xp = x.index_select(-2, torch.from_numpy(rows)).index_select(-1, torch.from_numpy(cols))
    if padding == "constant":
        mask = torch.from_numpy(row_mask[:, None] & col_mask[None, :]).to(x.dtype)
        xp = xp * mask
    windows = xp.unfold(-2, kh, 1).unfold(-2, kw, 1)  # (..., H, W, kh, kw)
    m1 = windows.mean((-1, -2))
    m2 = (windows * windows).mean((-1, -2))
    variance = m2 - m1 * m1
    positive = variance > 0  # flat windows: 0 and no gradient, as the op defines them
    return torch.where(positive, torch.where(positive, variance, 1.0).sqrt(), 0.0)


@pytest.mark.parametrize("padding", ["reflect", "mirror", "constant", "nearest"])
@pytest.mark.parametrize(
    "shape,window",
    [
        ((1, 1, 1, 1), (1, 1)),
        ((2, 3, 17, 23), (5, 7)),
        ((1, 1, 13, 31), (13, 3)),
        ((1, 1, 3, 29), (7, 5)),  # window taller than the image: pads longer than the axis
        ((1, 2, 37, 2), (3, 9)),
    ],
)
def test_local_std_2d_matches_scipy_and_float64_gradients(compiled, shape, window, padding, rng):
    x = rng.standard_normal(shape) * 3 + 50
    ref = ndi.uniform_filter(x, (1, 1, *window), mode=SCIPY_MODES[padding])
    ref2 = ndi.uniform_filter(x * x, (1, 1, *window), mode=SCIPY_MODES[padding])
    ref = np.sqrt(np.maximum(ref2 - ref * ref, 0))
    upstream = torch.from_numpy(rng.standard_normal(shape))
    x64 = torch.from_numpy(x).requires_grad_()
    (g_ref,) = torch.autograd.grad(_padded_std64(x64, window, padding), x64, upstream)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        xt = torch.from_numpy(x).to(dtype).requires_grad_()
        out = compiled.local_std_2d(xt, window, padding, 0.0, True)
        np.testing.assert_allclose(
            out.detach().double().numpy(), ref, rtol=tol, atol=tol * ref.max()
        )
        (grad,) = torch.autograd.grad(out, xt, upstream.to(dtype))
        scale = g_ref.abs().max().item()
        assert (grad.double() - g_ref).abs().max().item() <= 10 * tol * scale


@pytest.mark.parametrize("padding", ["reflect", "mirror", "constant", "nearest", "valid"])
@pytest.mark.parametrize("normalized", [True, False])
def test_local_std_2d_gradcheck_and_opcheck(compiled, padding, normalized, rng):
    for shape, window in (((1, 2, 9, 8), (3, 5)), ((1, 1, 4, 6), (5, 3))):
        if padding == "valid" and window[0] > shape[2]:
            continue
        x = torch.from_numpy(rng.standard_normal(shape)).requires_grad_()
        assert torch.autograd.gradcheck(
            lambda t, window=window: compiled.local_std_2d(t, window, padding, 1e-2, normalized),
            (x,),
        )
        torch.library.opcheck(
            torch.ops.simwarp.local_std_2d_fwd.default,
            (x, list(window), padding, 1e-2, normalized, 1e-14),
        )


def test_local_std_2d_bitwise_on_any_thread_count(compiled, rng):
    # 300 rows: three bands and a fold of border rows, on 1 thread and on several.
    x = torch.from_numpy((rng.standard_normal((2, 1, 300, 70)) + 1000).astype(np.float32))
    upstream = torch.from_numpy(rng.standard_normal(x.shape).astype(np.float32))
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(threads, 3)):
            torch.set_num_threads(n)
            xt = x.clone().requires_grad_()
            out = compiled.local_std_2d(xt, (15, 9), "reflect", 0.0, True)
            results.append((out, *torch.autograd.grad(out, xt, upstream)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_local_std_2d_rejects_bad_arguments(compiled):
    x = torch.zeros(1, 1, 5, 5)
    with pytest.raises(RuntimeError, match="padding must be"):
        torch.ops.simwarp.local_std_2d_fwd(x, [3, 3], "wrap", 0.0, True, 1e-14)
    with pytest.raises(RuntimeError, match="window larger"):
        torch.ops.simwarp.local_std_2d_fwd(x, [7, 3], "valid", 0.0, True, 1e-14)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        torch.ops.simwarp.local_std_2d_fwd(x.int(), [3, 3], "reflect", 0.0, True, 1e-14)
