"""The compiled kernels on a GPU at 4096² against their memory-traffic floor (issue: kernels).

The floor of an op is the time to read each of its inputs and write each of its outputs
once at the device's measured copy bandwidth. local_std forward+backward reads the image
and the upstream gradient and writes the map and the image gradient (4 float32 arrays);
SSIM forward+backward (the map, then a map-shaped upstream gradient) reads two images and
the gradient and writes the map and two image gradients (6 arrays). Ratios to the floor
and to the pure torch path on the same GPU go into docs/benchmarks.md. Without CUDA the
module records that it was skipped.
"""

from __future__ import annotations

import torch

from _harness import time_call, with_backend

SECTION = "Compiled kernels on the GPU (4096², against the memory floor)"
SIZE = 4096


def _synchronised(fn, device: torch.device):
    def run():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return run


def copy_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read plus write)."""
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(_synchronised(lambda: dst.copy_(src), device), repeat=10)
    return 2 * n_bytes / seconds


def _forward_backward(op, *images):
    """One forward and backward of a map-valued ``op`` with a map-shaped upstream gradient."""
    leaves = [x.detach().clone().requires_grad_() for x in images]
    upstream = torch.randn_like(images[0])

    def run():
        for leaf in leaves:
            leaf.grad = None
        op(*leaves).backward(upstream)

    return run


def measure(report, device: torch.device, size: int) -> None:
    """Time local_std and ssim forward+backward on ``device`` at ``size``², both backends."""
    from napari_simwarp import ops

    bandwidth = copy_bandwidth(device)
    array_s = size * size * 4 / bandwidth  # one float32 map read or written once
    report.note(
        SECTION,
        f"{device}: copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write); "
        f"one {size}² float32 map costs {array_s * 1e3:.3f} ms at it.",
    )
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.rand((1, 1, size, size), generator=gen, device=device)
    b = (0.7 * a + 0.3 * torch.rand(a.shape, generator=gen, device=device)).clamp_(0, 1)
    cases = [
        (f"local_std {size}² w15", 4, lambda x: ops.local_std(x, window=15), (a,)),
        (f"ssim map {size}² w11", 6, lambda x, y: ops.ssim(x, y, reduction="none"), (a, b)),
    ]
    for group, arrays, op, images in cases:
        fn = _forward_backward(op, *images)
        ours = report.measure(
            group,
            "simwarp compiled",
            "forward+backward",
            _synchronised(with_backend("compiled", fn), device),
            ours=True,
            repeat=20,
            memory=False,
        )
        report.measure(
            group,
            "simwarp pure torch",
            "forward+backward",
            _synchronised(with_backend("torch", fn), device),
            repeat=20,
            memory=False,
        )
        floor = arrays * array_s
        report.note(
            SECTION,
            f"{group}: compiled forward+backward {ours.seconds * 1e3:.2f} ms, "
            f"{ours.seconds / floor:.2f}× its floor of {floor * 1e3:.2f} ms "
            f"({arrays} maps read or written once).",
        )


def run(report) -> None:
    from napari_simwarp.ops import _kernels as backend

    if not torch.cuda.is_available():
        report.note(SECTION, "No CUDA device in this run: skipped.")
        return
    if not backend.ensure_loaded() or not backend.state()["cuda"]:
        report.note(SECTION, f"CUDA kernels not built here: {backend.state()['error']}")
        return
    report.note(SECTION, f"GPU: {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}.")
    measure(report, torch.device("cuda"), SIZE)
