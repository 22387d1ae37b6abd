"""Compiled kernels against the pure torch path and the peers, in one run (issue: kernels).

At 2048² (window 15 for local std, 11 for SSIM, 9 for local NCC): each op forward and
forward+backward with SIMWARP_BACKEND=torch and =compiled, beside SciPy (local std,
float64), pytorch-msssim (SSIM) and MONAI (local NCC loss).
"""

from __future__ import annotations

import numpy as np
import torch

from _harness import forward_backward, with_backend

SECTION = "Compiled kernels (CPU) against pure torch and peers"
SIZE = 2048


def run(report) -> None:
    from napari_simwarp import ops
    from napari_simwarp.ops import _kernels

    if not _kernels.ensure_loaded():
        report.note(SECTION, f"Compiled kernels unavailable here: {_kernels.state()['error']}")
        return
    rng = np.random.default_rng(0)
    base = rng.random((SIZE, SIZE)).astype(np.float32)
    a = torch.from_numpy(base)[None, None]
    b = torch.from_numpy(
        np.clip(base + 0.05 * rng.standard_normal(base.shape), 0, 1).astype(np.float32)
    )[None, None]
    report.note(
        SECTION,
        f"{SIZE}² float32, one image, {torch.get_num_threads()} torch threads. "
        "Ratios in each table are relative to the compiled row.",
    )

    group = f"local_std {SIZE}² w15"
    for phase, fn in [
        ("forward", lambda: ops.local_std(a, window=15)),
        ("forward+backward", forward_backward(lambda x: ops.local_std(x, window=15).sum(), a)),
    ]:
        report.measure(group, "simwarp compiled", phase, with_backend("compiled", fn), ours=True)
        report.measure(group, "simwarp pure torch", phase, with_backend("torch", fn))
    from scipy import ndimage as ndi

    x64 = base.astype(np.float64)

    def scipy_std():
        m1 = ndi.uniform_filter(x64, 15)
        m2 = ndi.uniform_filter(x64 * x64, 15)
        return np.sqrt(np.maximum(m2 - m1 * m1, 0))

    report.measure(group, "SciPy uniform_filter (float64)", "forward", scipy_std)

    group = f"ssim {SIZE}² w11"
    for phase, fn in [
        ("forward", lambda: ops.ssim(a, b)),
        ("forward+backward", forward_backward(lambda x, y: 1 - ops.ssim(x, y), a, b)),
    ]:
        report.measure(group, "simwarp compiled", phase, with_backend("compiled", fn), ours=True)
        report.measure(group, "simwarp pure torch", phase, with_backend("torch", fn))
    try:
        from pytorch_msssim import ssim as ms_ssim

        report.measure(
            group,
            "pytorch-msssim",
            "forward+backward",
            forward_backward(lambda x, y: 1 - ms_ssim(x, y, data_range=1.0), a, b),
            repeat=3,
        )
    except ImportError:
        report.note(SECTION, "pytorch-msssim not installed")

    group = f"local_ncc {SIZE}² w9"
    for phase, fn in [
        ("forward", lambda: ops.local_ncc(a, b, window=9)),
        (
            "forward+backward",
            forward_backward(
                lambda x, y: 1 - ops.local_ncc(x, y, window=9, reduction="mean"), a, b
            ),
        ),
    ]:
        report.measure(group, "simwarp compiled", phase, with_backend("compiled", fn), ours=True)
        report.measure(group, "simwarp pure torch", phase, with_backend("torch", fn))
    try:
        from monai.losses import LocalNormalizedCrossCorrelationLoss

        loss = LocalNormalizedCrossCorrelationLoss(
            spatial_dims=2, kernel_size=9, kernel_type="rectangular"
        )
        report.measure(
            group,
            "MONAI LocalNormalizedCrossCorrelationLoss",
            "forward+backward",
            forward_backward(lambda x, y: loss(x, y), a, b),
            repeat=3,
        )
    except ImportError:
        report.note(SECTION, "MONAI not installed")

    group = f"splat {SIZE}²"
    d = torch.from_numpy(rng.uniform(-2, 2, (1, 2, SIZE, SIZE)).astype(np.float32))
    for phase, fn in [
        ("forward", lambda: ops.splat(a, d)),
        ("forward+backward", forward_backward(lambda x, y: ops.splat(x, y).sum(), a, d)),
    ]:
        report.measure(group, "simwarp compiled", phase, with_backend("compiled", fn), ours=True)
        report.measure(group, "simwarp pure torch", phase, with_backend("torch", fn))
    report.measure(
        group,
        "warp (yardstick)",
        "forward+backward",
        forward_backward(lambda x, y: ops.warp(x, y).sum(), a, d),
    )
