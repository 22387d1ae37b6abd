"""SSIM and local NCC against pytorch-msssim, kornia and MONAI, forward and forward+backward.

Every implementation is timed on the same float32 inputs in the same process. Backward
timings differentiate a scalar loss with respect to both inputs. Differences in what is
computed, noted per group: pytorch-msssim uses valid convolution (no padding), kornia
pads by reflection ("mirror"), MONAI's loss is the mean *squared* NCC with zero padding;
ours pads with SciPy "reflect" and returns the signed NCC.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import torch

from _harness import forward_backward

SECTION = "SSIM and local NCC"

#: (label, shape, repeat for ours, repeat for peers): peers at the large sizes take
#: seconds per call on a small CPU, so they get one timed call after the warm-up.
CASES_2D = [("1024²", (1, 1, 1024, 1024), 5, 3), ("2048²", (1, 1, 2048, 2048), 3, 1)]
CASE_3D = ("128³", (1, 1, 128, 128, 128), 3, 1)


def _optional(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:  # a missing peer is skipped, not fatal
        return None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _inputs(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=gen)
    b = (0.7 * a + 0.3 * torch.rand(shape, generator=gen)).clamp_(0, 1)
    return a, b


def _measure_pair(report, group, impl, loss_fn, a, b, *, ours, repeat, note="", memory=True):
    """Forward (no grad) and forward+backward of one implementation."""

    def forward():
        with torch.no_grad():
            return loss_fn(a, b)

    report.measure(
        group, impl, "forward", forward, ours=ours, repeat=repeat, note=note, memory=memory
    )
    report.measure(
        group,
        impl,
        "forward+backward",
        forward_backward(loss_fn, a, b),
        ours=ours,
        repeat=repeat,
        note=note,
        memory=memory,
    )


def _ssim_peers(ndim: int):
    """``(name, loss_fn, note)`` for the SSIM peers that are installed."""
    peers = []
    msssim = _optional("pytorch_msssim")
    if msssim is not None:
        peers.append(
            (
                f"pytorch-msssim {_version('pytorch-msssim')} ssim",
                lambda x, y: msssim.ssim(x, y, data_range=1.0, size_average=True),
                "valid convolution (no border)",
            )
        )
    kornia = _optional("kornia")
    if kornia is not None:
        if ndim == 2:
            fn = lambda x, y: kornia.losses.ssim_loss(x, y, 11, max_val=1.0)  # noqa: E731
            name = "kornia.losses.ssim_loss"
        else:
            fn = lambda x, y: kornia.losses.ssim3d_loss(x, y, 11, max_val=1.0)  # noqa: E731
            name = "kornia.losses.ssim3d_loss"
        peers.append((f"{name} {_version('kornia')}", fn, "2-D/3-D conv with the full kernel"))
    return peers


def _run_ssim(report, label, shape, repeat_ours, repeat_peers):
    from napari_simwarp.ops import ssim

    ndim = len(shape) - 2
    a, b = _inputs(shape)
    group = f"ssim {label} float32"
    _measure_pair(
        report,
        group,
        "simwarp ssim",
        lambda x, y: ssim(x, y, data_range=1.0),
        a,
        b,
        ours=True,
        repeat=repeat_ours,
    )
    for name, fn, note in _ssim_peers(ndim):
        # kornia's 3-D SSIM (a full 11³ conv3d) takes tens of seconds per backward here:
        # skip its extra memory-measuring call to keep the module within minutes.
        memory = not (ndim == 3 and name.startswith("kornia"))
        _measure_pair(
            report, group, name, fn, a, b, ours=False, repeat=repeat_peers, note=note, memory=memory
        )


def _run_local_ncc(report, label, shape, repeat_ours, repeat_peers):
    from napari_simwarp.ops import local_ncc

    ndim = len(shape) - 2
    a, b = _inputs(shape, seed=1)
    group = f"local_ncc {label} w9 box float32"
    _measure_pair(
        report,
        group,
        "simwarp local_ncc",
        lambda x, y: local_ncc(x, y, window=9, reduction="mean"),
        a,
        b,
        ours=True,
        repeat=repeat_ours,
    )
    losses = _optional("monai.losses")
    if losses is not None:
        loss = losses.LocalNormalizedCrossCorrelationLoss(
            spatial_dims=ndim, kernel_size=9, kernel_type="rectangular"
        )
        _measure_pair(
            report,
            group,
            f"MONAI {_version('monai')} LocalNormalizedCrossCorrelationLoss",
            loss,
            a,
            b,
            ours=False,
            repeat=repeat_peers,
            note="mean squared NCC, zero padding",
        )


def run(report) -> None:
    report.note(
        SECTION,
        (
            "Scalar losses (mean over the map) on float32 inputs; forward+backward "
            "differentiates with respect to both images. Our ssim and local_ncc pad with "
            "SciPy 'reflect' and use the analytical one-extra-pass backward."
        ),
    )
    for label, shape, r_ours, r_peers in CASES_2D + [CASE_3D]:
        _run_ssim(report, label, shape, r_ours, r_peers)
    for label, shape, r_ours, r_peers in CASES_2D + [CASE_3D]:
        _run_local_ncc(report, label, shape, r_ours, r_peers)
