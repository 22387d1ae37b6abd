"""The pure torch window passes (ops/_reference/window_sums.py) against plain references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from napari_simwarp.ops._reference import window_sums as _filters
from napari_simwarp.ops._reference.window_sums import BOX_SUM_METHODS, box_sum_valid
from napari_simwarp.ops._windows import make_window


def _reference_box_sum(x: torch.Tensor, window) -> torch.Tensor:
    """Valid box sums by convolution with ones, in float64 (independent of the code)."""
    d = len(window)
    conv = F.conv2d if d == 2 else F.conv3d
    lead = x.shape[:-d]
    flat = x.double().reshape(-1, 1, *x.shape[-d:])
    out = conv(flat, torch.ones(1, 1, *window, dtype=torch.float64, device=x.device))
    return out.reshape(*lead, *out.shape[2:])


class TestBoxSumValid:
    @pytest.mark.parametrize("method", [*BOX_SUM_METHODS, "auto"])
    @pytest.mark.parametrize("window", [(1, 1), (3, 5), (15, 8), (33, 1), (1, 16), (40, 37)])
    def test_matches_convolution_2d(self, device, method, window):
        x = torch.randn(2, 3, 40, 37, dtype=torch.float64, device=device)
        out = box_sum_valid(x, window, method)
        torch.testing.assert_close(out, _reference_box_sum(x, window), rtol=0, atol=1e-10)

    @pytest.mark.parametrize("method", [*BOX_SUM_METHODS, "auto"])
    @pytest.mark.parametrize("window", [(3, 5, 7), (20, 1, 4), (2, 9, 33)])
    def test_matches_convolution_3d(self, device, method, window):
        x = torch.randn(1, 2, 20, 21, 40, dtype=torch.float64, device=device)
        out = box_sum_valid(x, window, method)
        torch.testing.assert_close(out, _reference_box_sum(x, window), rtol=0, atol=1e-10)

    @pytest.mark.parametrize("k", [2, 3, 7, 8, 40])
    def test_prefix_route_long_axis(self, device, k):
        # Regression: the block sums were read after being overwritten in place.
        x = torch.randn(3, 500, dtype=torch.float64, device=device)
        out = _filters._box_sum1d_prefix(x, k, 1)
        torch.testing.assert_close(out, x.unfold(1, k, 1).sum(-1), rtol=0, atol=1e-10)

    def test_prefix_float32_accuracy_with_offset(self, device):
        # Restarted prefix sums keep float32 accuracy far from zero on a long axis.
        x = 1000.0 + torch.rand(1, 1, 4, 8192, dtype=torch.float64, device=device)
        out = box_sum_valid(x.float(), (1, 101), "prefix").double()
        ref = _reference_box_sum(x, (1, 101))
        assert ((out - ref).abs() / ref).max() < 1e-6

    @pytest.mark.parametrize("method", ["tree", "prefix"])
    def test_chunked_equals_whole(self, device, method, monkeypatch):
        x = torch.randn(2, 1, 64, 50, dtype=torch.float64, device=device)
        whole = box_sum_valid(x, (9, 5), method)
        monkeypatch.setattr(_filters, "CHUNK_BYTES", 512)  # a few rows per chunk
        torch.testing.assert_close(box_sum_valid(x, (9, 5), method), whole, rtol=0, atol=1e-12)

    def test_returns_new_tensor(self, device):
        x = torch.randn(1, 1, 8, 8, device=device)
        out = box_sum_valid(x, (1, 1))
        assert out.data_ptr() != x.data_ptr()
        torch.testing.assert_close(out, x)

    def test_noncontiguous(self, device):
        x = torch.randn(1, 2, 30, 40, dtype=torch.float64, device=device)
        xt = x.transpose(-1, -2)
        torch.testing.assert_close(
            box_sum_valid(xt, (5, 3)), box_sum_valid(xt.contiguous(), (5, 3)), rtol=0, atol=1e-12
        )

    def test_autograd(self, device):
        x = torch.randn(1, 1, 9, 8, dtype=torch.float64, device=device, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: box_sum_valid(t, (3, 4)), (x,))

    def test_exception(self, device):
        x = torch.randn(1, 1, 8, 8, device=device)
        with pytest.raises(ValueError, match="method"):
            box_sum_valid(x, (3, 3), "bogus")
        with pytest.raises(ValueError, match="window"):
            box_sum_valid(x, (9, 3))


def _windows():
    return [
        make_window("box", (5, 3)),
        make_window("box", (19, 21)),  # prefix-sum route for the adjoint
        make_window("gaussian", (7, 5), (1.2, 0.8)),
        make_window("gaussian", (3, 5, 1), (0.7, 1.0, 1.0)),
    ]


@pytest.mark.parametrize(
    "window", _windows(), ids=lambda w: f"{'box' if w.is_box else 'gauss'}{w.sizes}"
)
def test_window_passes_and_their_adjoints(device, window):
    """<W x, y> == <x, Wᵀ y> (dot-product test) in float64, for box_sum and correlate."""
    gen = torch.Generator().manual_seed(1)
    d = len(window.sizes)
    padded = [23, 25, 9][:d]
    x = torch.rand(2, 1, *padded, generator=gen, dtype=torch.float64).to(device)
    if window.is_box:
        wx = _filters.box_sum(x, window.sizes)
    else:
        wx = _filters.correlate(x, window.taps)
    y = torch.rand(wx.shape, generator=gen, dtype=torch.float64).to(device)
    if window.is_box:
        wty = _filters.box_sum(y, window.sizes, full=True)
    else:
        wty = _filters.correlate(y, window.taps, transpose=True)
    torch.testing.assert_close((wx * y).sum(), (x * wty).sum())
