"""The moment engine's two precisions on the CPU: float64 sums (the CPU's path) against
float32 sums with per-tile centring (the GPU's path, ops/_tiles.py), same data.

    OMP_NUM_THREADS=1 python benchmarks/bench_moment_precision.py   # prints the table
    python benchmarks/run.py moment_precision                       # within a whole run

On the CPU float64 costs what float32 does per operation, so this measures the price of
the tiled layout (halo copies, the risky-tile check, the untiling) rather than the gain a
GPU gets (float64 at 1/64 of the float32 rate on most consumer cards). The note gives the
largest difference of the float32 map from the float64 one.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Report, forward_backward, with_backend  # noqa: E402

SECTION = "SSIM and local NCC: float64 sums against float32 per-tile-centred sums (CPU)"


@contextlib.contextmanager
def float32_moments(enabled: bool):
    """The engine's float32 path on the CPU too (as on CUDA) while ``enabled``."""
    from napari_simwarp.ops import _numerics

    saved = _numerics.FLOAT32_MOMENT_DEVICE_TYPES
    if enabled:
        _numerics.FLOAT32_MOMENT_DEVICE_TYPES = saved | {"cpu"}
    try:
        yield
    finally:
        _numerics.FLOAT32_MOMENT_DEVICE_TYPES = saved


def microscopy(shape, generator) -> torch.Tensor:
    """``(1, 1, *shape)`` float32: offset 1000, a smooth background of 150, blobs of 400
    (σ 3 px, one per 64² pixels), noise 5."""
    grids = torch.meshgrid(*[torch.linspace(-1, 1, n) for n in shape], indexing="ij")
    smooth = 150 * (0.5 + 0.5 * torch.sin(2 * grids[0] + 1) * torch.cos(1.5 * grids[-1]))
    points = (torch.rand(shape, generator=generator) < 1 / 64**2).double()
    taps = torch.exp(-0.5 * (torch.arange(-9, 10, dtype=torch.float64) / 3) ** 2)
    blobs = points[None, None]
    for axis in range(len(shape)):
        view = [1] * len(shape)
        view[axis] = taps.numel()
        pad = [0, 0] * len(shape)
        pad[2 * (len(shape) - 1 - axis)] = pad[2 * (len(shape) - 1 - axis) + 1] = 9
        conv = (torch.nn.functional.conv2d, torch.nn.functional.conv3d)[len(shape) - 2]
        blobs = conv(torch.nn.functional.pad(blobs, pad), taps.reshape(1, 1, *view))
    blobs = 400 * blobs[0, 0] / blobs.max().clamp_min(1e-12)
    noise = 5 * torch.randn(shape, generator=generator)
    return (1000 + smooth + blobs + noise)[None, None].float()


def _ssim(a, b, reduction="none"):
    from napari_simwarp import ops

    return ops.ssim(a, b, data_range=2000.0, reduction=reduction)


def _local_ncc(a, b, reduction="none"):
    from napari_simwarp import ops

    return ops.local_ncc(a, b, window=9, reduction=reduction)


def _cases(smoke: bool):
    """(title, spatial shape, the metric) per case; timed with reduction="mean"."""
    n2, n3 = (96, 24) if smoke else (2048, 128)
    return [
        (f"ssim {n2}² w11", (n2, n2), _ssim),
        (f"local_ncc {n2}² w9 box", (n2, n2), _local_ncc),
        (f"local_ncc {n3}³ w9 box", (n3, n3, n3), _local_ncc),
    ]


def _in(tiled: bool, backend: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` as a call run on ``backend``, the float32 path on or off."""

    def call():
        with float32_moments(tiled):
            return with_backend(backend, functools.partial(fn, *args, **kwargs))()

    return call


def run(report: Report, smoke: bool = False) -> None:
    gen = torch.Generator().manual_seed(0)
    for title, shape, metric in _cases(smoke):
        a, b = microscopy(shape, gen), microscopy(shape, gen)
        reference = _in(False, "compiled", metric, a, b)().double()
        loss = functools.partial(metric, reduction="mean")
        for backend in ("compiled", "torch"):
            group = f"{title}, mean ({backend})"
            for tiled in (False, True):
                name = "float32, per-tile centring" if tiled else "float64"
                note = ""
                if tiled:
                    got = _in(True, backend, metric, a, b)()
                    note = f"map within {(got.double() - reference).abs().max():.1e} of float64"
                forward = _in(tiled, backend, loss, a, b)
                both = _in(tiled, backend, forward_backward(loss, a, b))
                report.measure(group, name, "forward", forward, ours=not tiled, note=note)
                report.measure(group, name, "forward+backward", both, ours=not tiled)


def main() -> int:
    report = Report()
    run(report, smoke="--smoke" in sys.argv)
    print(report.markdown(SECTION))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
