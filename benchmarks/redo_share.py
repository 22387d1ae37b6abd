"""The GPU's float32 moment path on fluorescence-like data, measured on the CPU (a proxy).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/redo_share.py [SIDE]

On GPUs the moment engine sums in float32 about a shift per tile and redoes two-pass, from
the images, the windows where that would cancel (ops/_moments.py; the fused kernels
cuda/ssim.cu and cuda/local_ncc.cu do the same). Uniform noise, which the GPU benchmark's
main cases use, has no such window; fluorescence images (bright cells beside a dark
background in one tile) have many. For SSIM (w11) and local NCC (w9) on a ``SIDE`` x
2·``SIDE`` frame (default 540), this prints the share of windows redone and the time of
forward + backward with the GPU's policy forced on the CPU (pure torch path), for
:func:`bench_gpu.fluorescence` against uniform pairs: what the redo costs, before a GPU
measures it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu import fluorescence, uniform_pair


@contextlib.contextmanager
def redone_window_shares():
    """The GPU's float32 moment policy forced on the CPU (pure torch path), and a list
    that gets, at each call of the moment engine, the share of its windows redone
    two-pass; all restored on exit."""
    from napari_simwarp.ops import _moments, _numerics

    policy, check = _numerics.FLOAT32_MOMENT_DEVICE_TYPES, _moments._risky_windows
    backend = os.environ.get("SIMWARP_BACKEND")
    shares: list[float] = []

    def counted(*args, **kwargs):
        risky = check(*args, **kwargs)
        shares.append(risky.float().mean().item())
        return risky

    _numerics.FLOAT32_MOMENT_DEVICE_TYPES = policy | {"cpu"}
    _moments._risky_windows = counted
    os.environ["SIMWARP_BACKEND"] = "torch"
    try:
        yield shares
    finally:
        _numerics.FLOAT32_MOMENT_DEVICE_TYPES, _moments._risky_windows = policy, check
        if backend is None:
            os.environ.pop("SIMWARP_BACKEND", None)
        else:
            os.environ["SIMWARP_BACKEND"] = backend


def main(side: int = 540) -> None:
    from napari_simwarp import ops

    gen = torch.Generator().manual_seed(0)
    shape = (1, 1, side, 2 * side)
    pairs = {
        "uniform": uniform_pair(shape, gen, "cpu"),
        "fluorescence": fluorescence(shape, gen, "cpu"),
    }
    print(f"| op, {side}×{2 * side} | data | windows redone | forward+backward (ms) |")
    print("|---|---|---:|---:|")
    with redone_window_shares() as shares:
        for name, op in (("ssim w11", ops.ssim), ("local_ncc w9", ops.local_ncc)):
            window = 11 if name.startswith("ssim") else 9
            for data, (a, b) in pairs.items():
                a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
                times = []
                for _ in range(4):  # the first one warms up
                    a.grad = b.grad = None
                    shares.clear()
                    start = time.perf_counter()
                    op(a, b, window=window, reduction="mean").backward()
                    times.append(time.perf_counter() - start)
                share = max(shares, default=float("nan"))
                print(f"| {name} | {data} | {share:.0%} | {min(times[1:]) * 1e3:.0f} |")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:2]))
