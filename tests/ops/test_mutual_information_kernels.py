"""The compiled mutual information (simwarp::parzen_fwd / parzen_bwd, csrc/cpu/parzen.cpp):
against an independent NumPy float64 Parzen histogram, float64 gradcheck, and the pure
torch path (ops/mutual_information.py, SIMWARP_BACKEND=torch) it replaces (issue 24)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops.mutual_information import _Parzen, parzen_score
from tests.compiled import require_compiled


@pytest.fixture(scope="module")
def calls():
    require_compiled()
    from napari_simwarp.ops import _kernels
    from napari_simwarp.ops._kernels import calls

    _kernels.build_all()
    return calls


class _TorchPath:
    """The torch twin of calls.parzen_mutual_information (ops/mutual_information.py)."""

    @staticmethod
    def parzen_mutual_information(a, b, w, bins, normalize, value_range):
        return parzen_score(a, b, w, _Parzen("bspline", bins, 1.0), normalize, value_range)


def _bspline3(t):
    """The cubic B-spline β³(t), piecewise (support |t| < 2)."""
    t = np.abs(t)
    return np.where(t < 1, 2 / 3 - t**2 + t**3 / 2, np.where(t < 2, (2 - t) ** 3 / 6, 0.0))


def _numpy_mi(a, b, w, bins, normalize, value_range=None):
    """Mattes' Parzen joint histogram (B-spline, both images, the range mapped onto bins
    [1, bins − 2]) and the (normalized) mutual information, per row, in float64."""
    out = []
    for m in range(a.shape[0]):
        x, y = a[m].astype(float), b[m].astype(float)
        wm = np.ones_like(x) if w is None else w[m].astype(float)
        valid = wm > 0
        xi = []
        for v in (x, y):
            lo, hi = (v[valid].min(), v[valid].max()) if value_range is None else value_range
            xi.append(1 + (bins - 3) * np.clip((v - lo) / (hi - lo), 0, 1))
        k = np.arange(bins)
        wa = _bspline3(xi[0][:, None] - k)  # (P, bins)
        wb = _bspline3(xi[1][:, None] - k)
        joint = (wa * wm[:, None]).T @ wb
        p = joint / joint.sum()
        pa, pb = p.sum(1), p.sum(0)

        def h(q):
            q = q[q > 0]
            return -(q * np.log(q)).sum()

        hab, ha, hb = h(p), h(pa), h(pb)
        out.append((ha + hb) / hab if normalize else ha + hb - hab)
    return np.array(out)


def _pair(rng, m=2, p=900, dtype=torch.float64):
    a = rng.random((m, p))
    b = np.sin(3 * a) + 0.2 * rng.random((m, p))  # a non-linear relation
    return torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("value_range", [None, (-0.5, 1.5)])
def test_matches_a_numpy_float64_parzen_histogram(calls, normalize, weighted, value_range):
    rng = np.random.default_rng(0)
    a, b = _pair(rng)
    w = torch.tensor(rng.random(a.shape) * (rng.random(a.shape) > 0.3)) if weighted else None
    got = calls.parzen_mutual_information(a, b, w, 24, normalize, value_range)
    ref = _numpy_mi(
        a.numpy(), b.numpy(), None if w is None else w.numpy(), 24, normalize, value_range
    )
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)
    got32 = calls.parzen_mutual_information(
        a.float(), b.float(), None if w is None else w.float(), 24, normalize, value_range
    )
    np.testing.assert_allclose(got32.numpy(), ref, atol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_in_float64(calls, normalize):
    rng = np.random.default_rng(1)
    a, b = _pair(rng, m=2, p=60)
    w = torch.tensor(rng.random(a.shape))
    a.requires_grad_(True)
    b.requires_grad_(True)
    # the frame is held fixed (value_range) so the finite differences see the same bins
    assert torch.autograd.gradcheck(
        lambda x, y: calls.parzen_mutual_information(x, y, w, 12, normalize, (-0.5, 1.5)),
        (a, b),
        eps=1e-6,
        atol=1e-6,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
def test_agrees_with_the_torch_path_values_and_gradients(calls, dtype, normalize):
    rng = np.random.default_rng(2)
    a, b = _pair(rng, m=3, p=4096, dtype=dtype)
    a[1, 7] = float("nan")  # row 1 scores NaN and passes no gradient
    w = torch.tensor(rng.random(a.shape), dtype=dtype)
    results = []
    for impl in (calls, _TorchPath):
        x, y = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
        score = impl.parzen_mutual_information(x, y, w, 32, normalize, None)
        torch.where(score.isnan(), 0.0, score).sum().backward()
        results.append((score.detach(), x.grad, y.grad))
    (s1, ga1, gb1), (s2, ga2, gb2) = results
    assert s1[1].isnan() and s2[1].isnan()
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(s1, s2, atol=tol, rtol=0, equal_nan=True)
    for g1, g2 in ((ga1, ga2), (gb1, gb2)):
        scale = g2.abs().max().item()
        assert (g1 - g2).abs().max().item() <= tol * 10 * scale
        assert g1[1].abs().max().item() == 0.0


def test_refuses_bad_arguments(calls):
    a = torch.zeros(2, 10)
    with pytest.raises(ValueError, match="bins must be between 4 and"):
        calls.parzen_mutual_information(a, a, None, 3, False, None)
    with pytest.raises(ValueError, match="b must have shape"):
        calls.parzen_mutual_information(a, torch.zeros(2, 9), None, 8, False, None)
    with pytest.raises(RuntimeError, match="bins must be between 4 and"):
        torch.ops.simwarp.parzen_fwd(a, a, None, 2000, False, [])
