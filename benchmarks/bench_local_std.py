"""local_std and match_template against SciPy / scikit-image (float64, CPU)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage as ndi

from _harness import forward_backward

SECTION = "Local standard deviation and ZNCC template matching"


def _microscopy(rng, shape) -> np.ndarray:
    """Offset 1000, noise 5, a smooth background: the data the numerics are built for."""
    grids = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    smooth = 150.0 * (0.5 + 0.5 * np.sin(2.0 * grids[0] + 1.0) * np.cos(1.5 * grids[-1]))
    return 1000.0 + smooth + rng.normal(0.0, 5.0, shape)


def _scipy_local_std(x: np.ndarray, window: int) -> np.ndarray:
    m1 = ndi.uniform_filter(x, window)
    m2 = ndi.uniform_filter(x * x, window)
    return np.sqrt(np.maximum(m2 - m1 * m1, 0.0))


def _bench_local_std(report, rng, shape, window):
    from napari_simwarp.ops import local_std

    group = f"local_std {'x'.join(map(str, shape))} w{window}"
    x = _microscopy(rng, shape)
    xt = torch.from_numpy(x).float()[None, None]
    report.measure(
        group,
        "simwarp local_std (float32)",
        "forward",
        lambda: local_std(xt, window=window),
        ours=True,
    )
    report.measure(
        group, "scipy uniform_filter (float64)", "forward", lambda: _scipy_local_std(x, window)
    )
    xg = xt.clone().requires_grad_()
    report.measure(
        group,
        "simwarp local_std (float32)",
        "forward+backward",
        forward_backward(lambda t: local_std(t, window=window), xg),
        ours=True,
    )


def _bench_match_template(report, rng, size, tsize):
    from skimage.feature import match_template as sk_match_template

    from napari_simwarp.ops import match_template

    group = f"match_template {size}² template {tsize}²"
    image = _microscopy(rng, (size, size))
    template = image[size // 3 : size // 3 + tsize, size // 2 : size // 2 + tsize].copy()
    it = torch.from_numpy(image).float()[None, None]
    tt = torch.from_numpy(template).float()[None, None]
    report.measure(
        group,
        "simwarp match_template (float32)",
        "forward",
        lambda: match_template(it, tt),
        ours=True,
    )
    it64, tt64 = it.double(), tt.double()
    report.measure(
        group, "simwarp match_template (float64)", "forward", lambda: match_template(it64, tt64)
    )
    report.measure(
        group,
        "skimage match_template (float64)",
        "forward",
        lambda: sk_match_template(image, template),
        repeat=3,
    )
    ig, tg = it.clone().requires_grad_(), tt.clone().requires_grad_()
    report.measure(
        group,
        "simwarp match_template (float32)",
        "forward+backward",
        forward_backward(match_template, ig, tg),
        ours=True,
        repeat=3,
    )


def run(report) -> None:
    rng = np.random.default_rng(0)
    report.note(
        SECTION,
        "Microscopy-like data (offset 1000, noise σ 5, smooth background); "
        "ours in float32 (window sums accumulated in float64), peers in float64.",
    )
    for shape, window in (((1024, 1024), 15), ((2048, 2048), 15), ((128, 128, 128), 7)):
        _bench_local_std(report, rng, shape, window)
    for size in (1024, 2048):
        _bench_match_template(report, rng, size, 64)
