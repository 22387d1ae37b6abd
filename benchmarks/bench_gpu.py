"""The CUDA kernels on a GPU: each against the bytes it must move, each op against the
pure torch path and its peers.

    python benchmarks/bench_gpu.py            # on a GPU: measure, rewrite the GPU section of
                                              # docs/benchmarks.md (scripts/gpu_check.sh)
    python benchmarks/bench_gpu.py --smoke    # tiny sizes on any device: the code paths run
    python benchmarks/bench_gpu.py --splice gpu-check/summary.md
                                              # a GPU check's tables into docs/benchmarks.md
    python benchmarks/run.py gpu              # within the whole benchmark run

Per kernel (one torch.ops.simwarp call): the bytes its passes read and write
(:data:`KERNELS`, from the design in csrc/cuda/), the time that traffic takes at the
device's measured copy bandwidth (the prediction), and the time measured with CUDA events.
Per op (forward+backward through autograd, the issue's targets): ours compiled and pure
torch; the read-once/write-once floor of the op; and the peers on the same GPU:
pytorch-msssim, kornia, MONAI, and fused-ssim / fussim and fused-lncc where installed.
Without a GPU the section holds the predictions at an H100's nominal bandwidth, marked
not yet measured.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Report, with_backend  # noqa: E402

SECTION = "Compiled kernels on the GPU (against the bytes they move)"
#: an H100 SXM's HBM3 bandwidth (bytes/s), for predictions made without a GPU
NOMINAL_BANDWIDTH = 3.35e12
DOCS = HERE.parent / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Kernel:
    """One compiled call and the traffic its passes make (csrc/cuda/)."""

    name: str
    #: maps (of the call's output size, in its dtype) read and written by all its passes
    maps_moved: float
    #: maps its arguments and results alone fill: the read-once/write-once floor
    maps_floor: float
    #: bytes of one map
    map_bytes: int
    #: the call, given a device (inputs are made once, outside the timing)
    make: Callable[[torch.device], Callable[[], object]]

    def predicted(self, bandwidth: float) -> float:
        return self.maps_moved * self.map_bytes / bandwidth

    def floor(self, bandwidth: float) -> float:
        return self.maps_floor * self.map_bytes / bandwidth


def _kernels(size: int) -> list[Kernel]:
    """The kernel calls at ``size``² float32 (windows 15 and 11, the ops' defaults)."""
    ops = torch.ops.simwarp
    f32 = size * size * 4
    k, g = 15, 11
    taps = [1.0 / g] * (2 * g)

    def local_std_fwd(device):
        xp = torch.randn(1, 1, size + k - 1, size + k - 1, device=device)
        return lambda: ops.local_std_fwd(xp, [k, k], 0.0, True, 2.3e-13)

    def local_std_bwd(device):
        xp = torch.randn(1, 1, size + k - 1, size + k - 1, device=device)
        out, s1, flat = ops.local_std_fwd(xp, [k, k], 0.0, True, 2.3e-13)
        grad = torch.randn_like(out)
        return lambda: ops.local_std_bwd(grad, out, s1, flat, xp, [k, k], True)

    def box_full(device):
        x = torch.randn(1, 1, size, size, device=device)
        return lambda: ops.box_sum(x, [k, k], True)

    def moments(device):
        centered = torch.randn(2, 1, 1, size + g - 1, size + g - 1, device=device)
        return lambda: ops.moments5(centered, taps, [g, g])

    def correlate_t(device):
        y = torch.randn(5, 1, 1, size, size, device=device)
        return lambda: ops.correlate(y, taps, [g, g], True)

    def splat(device):
        image = torch.rand(1, 1, size, size, device=device)
        disp = torch.randn(1, 2, size, size, device=device)
        return lambda: ops.splat_fwd(image, disp, True, 1e-6)

    def splat_bwd(device):
        image = torch.rand(1, 1, size, size, device=device)
        disp = torch.randn(1, 2, size, size, device=device)
        out, den = ops.splat_fwd(image, disp, True, 1e-6)
        v = torch.randn_like(out)
        return lambda: ops.splat_bwd(v, None, image, disp, out, den, True, 1e-6)

    gauss = [float(w) for w in torch.signal.windows.gaussian(g, std=1.5)]
    gauss = [w / sum(gauss) for w in gauss] * 2

    def std_fused_fwd(device):
        x = torch.randn(1, 1, size, size, device=device) + 1000.0
        lib, shift = fused_library(device), x.mean((-2, -1)).reshape(-1)
        return lambda: lib.local_std_fused_fwd(x, shift, [k, k], "reflect", 0.0, True, 2.3e-13)

    def std_fused_bwd(device):
        x = torch.randn(1, 1, size, size, device=device) + 1000.0
        lib, shift = fused_library(device), x.mean((-2, -1)).reshape(-1)
        out, s1, flat = lib.local_std_fused_fwd(x, shift, [k, k], "reflect", 0.0, True, 2.3e-13)
        grad = torch.randn_like(out)
        return lambda: lib.local_std_fused_bwd(
            grad, out, s1, flat, x, shift, [k, k], "reflect", True
        )

    def fused_library(device):
        """The fused SSIM's ops: CUDA's, or elsewhere (--smoke) the host shim's build of
        the same kernels (built on first use)."""
        if device.type == "cuda":
            return ops
        from napari_simwarp.ops._kernels import _build

        _build.build("host_shim")
        return torch.ops.simwarp_host_shim

    def ssim_fwd(device):
        a, b = torch.rand(2, 1, 1, size, size, device=device)
        lib = fused_library(device)
        return lambda: lib.ssim_fwd(a, b, gauss, [g, g], 1e-4, 9e-4, True)

    def ssim_bwd(device):
        a, b = torch.rand(2, 1, 1, size, size, device=device)
        lib = fused_library(device)
        _, partials, shifts = lib.ssim_fwd(a, b, gauss, [g, g], 1e-4, 9e-4, True)
        grad = torch.randn_like(a)
        return lambda: lib.ssim_bwd(grad, a, b, partials, shifts, gauss, [g, g])

    # the fused local NCC (w9 box): 2-D at size², 3-D at 160³ (24³ in --smoke runs)
    side = 160 if size >= 1024 else 24
    box9 = [1.0] * 9

    def ncc_inputs(device, volume):
        shape = (1, 1, side, side, side) if volume else (1, 1, size, size)
        a = torch.rand(shape, device=device) * 100.0 + 1000.0
        b = 0.7 * a + torch.rand(shape, device=device) * 30.0
        sizes = [9, 9, 9] if volume else [9, 9]
        return fused_library(device), a, b, box9 * len(sizes), sizes, 1.0 / 9 ** len(sizes)

    def ncc_fwd(volume):
        def make(device):
            lib, a, b, taps, sizes, inv = ncc_inputs(device, volume)
            return lambda: lib.local_ncc_fwd(a, b, taps, sizes, inv, 7.6e-6, True)

        return make

    def ncc_bwd(volume):
        def make(device):
            lib, a, b, taps, sizes, inv = ncc_inputs(device, volume)
            _, partials, shifts = lib.local_ncc_fwd(a, b, taps, sizes, inv, 7.6e-6, True)
            one = torch.full((1,), 1.0 / a.numel(), device=device)
            return lambda: lib.local_ncc_bwd(one, a, b, partials, shifts, taps, sizes)

        return make

    # maps moved, per pass (window_pass.h, local_std.cu, moments5.cu, correlate.cu, splat.cu,
    # ssim.cu, local_ncc.cu):
    return [
        # last axis: read x, write S1, S2 as hi/lo pairs (4); first axis: read 4, write out,
        # s1 and the 1-byte flat mask.
        Kernel("local_std_fwd 2D w15", 1 + 4 + 4 + 2.25, 1 + 2.25, f32, local_std_fwd),
        # last axis: read grad, out, s1, flat, write 2 partial sums; first axis: read 2 and
        # x, write dx.
        Kernel("local_std_bwd 2D w15", 3.25 + 2 + 2 + 2, 3.25 + 2, f32, local_std_bwd),
        Kernel("box_sum full 2D w15", 4, 2, f32, box_full),
        # last axis: read a, b, write 5 maps; first axis: read 5, write 5.
        Kernel("moments5 2D w11", 2 + 5 + 5 + 5, 2 + 5, f32, moments),
        Kernel("correlate transpose, 5 maps, 2D w11", 4 * 5, 2 * 5, f32, correlate_t),
        # scatter: read image and 2 displacement maps, zero and add into out and den (2,
        # atomics in L2), normalize: read 2, write 1.
        Kernel("splat_fwd 2D, 1 channel", 3 + 2 + 2 + 3, 3 + 2, f32, splat),
        # prepare: read v, out, den, write scaled, slope0; gather: read image, 2 disp,
        # scaled and slope0 at the corners (cached), write 3 gradients.
        Kernel("splat_bwd 2D, 1 channel", 3 + 2 + 5 + 3, 6 + 3, f32, splat_bwd),
        # fused SSIM (one kernel each; the tiles' halos re-read through L1/L2, not DRAM):
        # forward reads a, b, writes the map and 4 partial maps (and 2 floats per 16² tile);
        # backward reads the upstream gradient, a, b and the 4 partials, writes 2 gradients.
        Kernel("ssim_fwd fused 2D w11", 2 + 5, 2 + 5, f32, ssim_fwd),
        Kernel("ssim_bwd fused 2D w11", 7 + 2, 7 + 2, f32, ssim_bwd),
        # fused local std (padding and centring on load): forward reads x, writes out, s1
        # and the 1-byte flat mask; backward reads grad, out, s1, flat and x, writes dx.
        # The operator adds one read of x for its mean (a torch reduction).
        Kernel("local_std_fused_fwd 2D w15", 1 + 2.25, 1 + 2.25, f32, std_fused_fwd),
        Kernel("local_std_fused_bwd 2D w15", 4.25 + 1, 4.25 + 1, f32, std_fused_bwd),
        # fused local NCC (one kernel each; halos and the forward's second read of its input
        # box, after the tile's mean, through L1/L2): forward reads a, b, writes the map and
        # 5 partial maps; backward ("mean": one upstream value) reads a, b and the 5
        # partials, writes 2 gradients.
        Kernel("local_ncc_fwd fused 2D w9", 2 + 6, 2 + 6, f32, ncc_fwd(False)),
        Kernel("local_ncc_bwd fused 2D w9, mean", 7 + 2, 7 + 2, f32, ncc_bwd(False)),
        Kernel(f"local_ncc_fwd fused 3D {side}³ w9", 2 + 6, 2 + 6, side**3 * 4, ncc_fwd(True)),
        Kernel(
            f"local_ncc_bwd fused 3D {side}³ w9, mean", 7 + 2, 7 + 2, side**3 * 4, ncc_bwd(True)
        ),
    ]


def _gpu_seconds(fn: Callable[[], object], repeat: int = 20, warmup: int = 3) -> float:
    """Median time of ``fn()`` on the current CUDA stream, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _cpu_seconds(fn: Callable[[], object], repeat: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def seconds(fn: Callable[[], object], device: torch.device) -> float:
    return _gpu_seconds(fn) if device.type == "cuda" else _cpu_seconds(fn)


def copy_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read plus write)."""
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * n_bytes / seconds(lambda: dst.copy_(src), device)


def kernel_table(kernels: list[Kernel], bandwidth: float, device: torch.device | None) -> str:
    """Markdown: each kernel's traffic, prediction, floor and (with a device) its time."""
    lines = [
        "| kernel | maps moved | predicted (µs) | floor (µs) | measured (µs) | measured / "
        "predicted |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kernel in kernels:
        predicted, floor = kernel.predicted(bandwidth), kernel.floor(bandwidth)
        if device is None:
            measured, ratio = "not yet measured", ""
        else:
            t = seconds(kernel.make(device), device)
            measured, ratio = f"{t * 1e6:.0f}", f"{t / predicted:.2f}"
        lines.append(
            f"| {kernel.name} | {kernel.maps_moved:g} | {predicted * 1e6:.0f} | "
            f"{floor * 1e6:.0f} | {measured} | {ratio} |"
        )
    return "\n".join(lines)


def targets_note(kernels: list[Kernel], bandwidth: float, size: int) -> str:
    """What the predictions say of the issue's targets, before any measurement."""
    t = {k.name: k.predicted(bandwidth) for k in kernels}
    map_s = kernels[0].map_bytes / bandwidth
    local_std = t["local_std_fused_fwd 2D w15"] + t["local_std_fused_bwd 2D w15"]
    side = 160 if size >= 1024 else 24
    fwd3 = f"local_ncc_fwd fused 3D {side}³ w9"
    bwd3 = f"local_ncc_bwd fused 3D {side}³ w9, mean"
    return (
        f"Targets. local_std forward+backward at {size}² (2-D float32 on CUDA: the fused "
        f"kernels, padding and centring on load): its two kernels are predicted at "
        f"{local_std * 1e6:.0f} µs, {local_std / (4 * map_s):.1f}× the "
        f"read-once/write-once floor of the op ({4 * map_s * 1e6:.0f} µs: x and the upstream "
        "gradient read, the map and the image gradient written; the target is 3×), before the "
        "operator's mean of the image and its non-finite check (about 2 more maps, "
        "ops/local_std.py). Reaching 3× needs the forward to write only its map (S1 and the "
        "flat mask recomputed by the backward). SSIM and local NCC on CUDA run their "
        "moments in float32, each output tile centered on its own mean (ops/_tiles.py: the "
        "tiles' inputs, halos included, are one more copy of both images, about 1.6× their "
        "size in 2D and 2× in 3D; windows at risk of cancellation are redone two-pass in "
        "float32), and "
        "their per-pixel metric as torch element-wise passes (ops/_moments.py): moments5 "
        "and the adjoint correlation alone move 37 maps. 2-D SSIM on CUDA now runs the fused "
        "kernels instead (csrc/cuda/ssim.cu: 7 maps forward, 9 backward, predicted "
        f"{(t['ssim_fwd fused 2D w11'] + t['ssim_bwd fused 2D w11']) * 1e6:.0f} µs at "
        f"{size}²); local NCC on CUDA likewise (csrc/cuda/local_ncc.cu, 2-D and 3-D: 8 maps "
        "forward, 9 backward with a mean, predicted "
        f"{(t[fwd3] + t[bwd3]) * 1e6:.0f} µs at {side}³ w9; the issue's target is 1.0 ms)."
    )


# ---- the ops, forward+backward, against torch and peers -----------------------------------


def _fwd_bwd(fn: Callable, *inputs: torch.Tensor, grads: int | None = None):
    """One forward and backward of ``fn`` on leaf copies of ``inputs`` (the first ``grads``
    of them require grad), the output summed unless it is a scalar."""
    n = len(inputs) if grads is None else grads
    leaves = [x.detach().clone().requires_grad_(i < n) for i, x in enumerate(inputs)]

    def run():
        for leaf in leaves:
            leaf.grad = None
        out = fn(*leaves)
        (out if out.dim() == 0 else out.sum()).backward()

    return run


def _peer_ssim() -> dict[str, tuple[Callable, int]]:
    """SSIM peers that import here: name -> (fn(a, b) -> scalar or map, inputs with grad)."""
    peers = {}
    try:
        import pytorch_msssim

        peers["pytorch-msssim ssim"] = (lambda a, b: pytorch_msssim.ssim(a, b, data_range=1.0), 2)
    except ImportError:
        pass
    try:
        import kornia

        peers["kornia metrics.ssim"] = (lambda a, b: kornia.metrics.ssim(a, b, 11), 2)
    except ImportError:
        pass
    try:
        from monai.losses import SSIMLoss

        loss = SSIMLoss(spatial_dims=2, data_range=1.0)
        peers["MONAI SSIMLoss"] = (loss, 2)
    except ImportError:
        pass
    for module in ("fussim", "fused_ssim"):
        try:
            fused = __import__(module).fused_ssim
        except (ImportError, AttributeError):
            continue
        # Gradients to the first image only: what these kernels give.
        peers[f"{module}.fused_ssim"] = (lambda a, b, f=fused: f(a, b, padding="same"), 1)
    return peers


def _peer_lncc() -> dict[str, tuple[Callable, int]]:
    peers = {}
    try:
        from monai.losses import LocalNormalizedCrossCorrelationLoss

        loss = LocalNormalizedCrossCorrelationLoss(spatial_dims=3, kernel_size=9)
        peers["MONAI LocalNormalizedCrossCorrelationLoss"] = (loss, 2)
    except ImportError:
        pass
    try:
        import fused_lncc

        for name in ("lncc_loss", "fused_lncc", "lncc", "LNCCLoss", "FusedLNCC"):
            fn = getattr(fused_lncc, name, None)
            if fn is not None:
                fn = fn(kernel_size=9) if isinstance(fn, type) else fn
                peers[f"fused_lncc.{name}"] = (fn, 2)
                break
    except ImportError:
        pass
    return peers


def uniform_pair(shape, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 pair ``shape`` of uniform noise in [0, 1], the second correlated with the
    first: the GPU benchmark's main cases (no window the float32 kernels redo)."""
    a = torch.rand(shape, generator=generator, device=device)
    b = (0.7 * a + 0.3 * torch.rand(shape, generator=generator, device=device)).clamp(0, 1)
    return a, b


def fluorescence(shape, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 pair ``(N, C, *S)`` like fluorescence images: cells up to ~3000 counts over
    a camera offset of 100 on a dark background, noise growing with the signal; the second
    image a dimmer, noisier view of the first.

    A dim window beside a bright one in the same tile is where the float32 moment kernels
    redo windows two-pass from the images (ops/_moments.py, cuda/ssim.cu,
    cuda/local_ncc.cu); uniform noise never gets there, so its timings leave that cost out.
    """
    import torch.nn.functional as F

    lead, spatial = tuple(shape[:2]), tuple(shape[2:])
    coarse = torch.rand(
        (*lead, *[max(2, side // 24) for side in spatial]), generator=generator, device=device
    )
    mode = "bilinear" if len(spatial) == 2 else "trilinear"
    field = F.interpolate(coarse, size=spatial, mode=mode, align_corners=False)
    cells = 3000.0 * ((field - 0.6) / 0.4).clamp(0, 1).sqrt()
    noise = torch.randn(shape, generator=generator, device=device)
    a = 100.0 + cells + noise * (2.0 + 0.02 * cells)
    noise = torch.randn(shape, generator=generator, device=device)
    b = 100.0 + 0.8 * cells + noise * (3.0 + 0.03 * cells)
    return a, b


def op_cases(device: torch.device, smoke: bool):
    """(title, floor in maps of the input's size, our op, peers, inputs) per target."""
    from napari_simwarp import ops

    gen = torch.Generator(device=device).manual_seed(0)

    def images(*shape):
        return uniform_pair(shape, gen, device)

    def ssim(a, b):
        return ops.ssim(a, b, window=11, reduction="mean")

    def lncc(a, b):
        return ops.local_ncc(a, b, window=9, reduction="mean")

    n = 64 if smoke else 4096
    ssim_shape = (2, 1, 48, 64) if smoke else (5, 1, 1080, 1920)
    # fussim's and fused-ssim's own benchmark shape (three channels, portrait)
    rgb_shape = (1, 3, 64, 48) if smoke else (1, 3, 1920, 1080)
    lncc_side = 24 if smoke else 160
    # fluorescence-like pairs: one frame and a smaller volume (their redone windows may cost
    # several times the uniform pairs' time; the check's bench step has 190 s in all)
    frame_shape = (1, 1, 48, 64) if smoke else (1, 1, 1080, 1920)
    volume_side = 24 if smoke else 96
    return [
        # read x and the upstream gradient, write the map and the image gradient
        (
            f"local_std {n}² w15",
            4,
            lambda x: ops.local_std(x, window=15),
            {},
            images(1, 1, n, n)[:1],
        ),
        # read a and b, write the two image gradients (a scalar loss)
        (f"ssim {ssim_shape} w11, mean", 4, ssim, _peer_ssim(), images(*ssim_shape)),
        (f"ssim {rgb_shape} w11, mean", 4, ssim, _peer_ssim(), images(*rgb_shape)),
        (
            f"local_ncc {lncc_side}³ w9, mean",
            4,
            lncc,
            _peer_lncc(),
            images(1, 1, lncc_side, lncc_side, lncc_side),
        ),
        # the same shapes as fluorescence images: the cost of the windows redone two-pass
        (
            f"ssim {frame_shape} w11, mean, fluorescence-like",
            4,
            ssim,
            {},
            fluorescence(frame_shape, gen, device),
        ),
        (
            f"local_ncc {volume_side}³ w9, mean, fluorescence-like",
            4,
            lncc,
            {},
            fluorescence((1, 1, volume_side, volume_side, volume_side), gen, device),
        ),
    ]


def op_table(device: torch.device, bandwidth: float, smoke: bool) -> str:
    lines = [
        "| op | implementation | forward+backward (ms) | / floor | / ours compiled |",
        "|---|---|---:|---:|---:|",
    ]
    for title, floor_maps, op, peers, inputs in op_cases(device, smoke):
        floor = floor_maps * inputs[0].numel() * 4 / bandwidth
        rows = [
            ("simwarp compiled", with_backend("compiled", _fwd_bwd(op, *inputs))),
            ("simwarp pure torch", with_backend("torch", _fwd_bwd(op, *inputs))),
        ]
        rows += [(name, _fwd_bwd(fn, *inputs, grads=g)) for name, (fn, g) in peers.items()]
        ours = None
        for name, fn in rows:
            try:
                t = seconds(fn, device)
            except Exception as exc:  # a peer that fails here is reported, not fatal
                lines.append(f"| {title} | {name} | failed: {type(exc).__name__} | | |")
                continue
            ours = t if ours is None else ours
            lines.append(f"| {title} | {name} | {t * 1e3:.3f} | {t / floor:.1f} | {t / ours:.2f} |")
    return "\n".join(lines)


def run(report: Report, smoke: bool = False) -> None:
    """The GPU section: measured on CUDA, predicted only elsewhere (``smoke``: tiny, any
    device, for checking that the code runs)."""
    from napari_simwarp.ops import _kernels as backend

    cuda = torch.cuda.is_available() and backend.ensure_loaded() and backend.state()["cuda"]
    size = 64 if smoke else 4096
    if not cuda and not smoke:
        report.note(
            SECTION,
            "Not yet measured: no CUDA device in this run "
            f"({backend.state().get('cuda_error') or 'torch has no CUDA'}). Predictions at an "
            f"H100 SXM's nominal {NOMINAL_BANDWIDTH / 1e12:.2f} TB/s, {size}² float32 (a map "
            f"is {size * size * 4 / 1e6:.0f} MB); `bash scripts/gpu_check.sh` measures them "
            "and rewrites this section.",
        )
        report.note(SECTION, kernel_table(_kernels(size), NOMINAL_BANDWIDTH, None))
        report.note(SECTION, targets_note(_kernels(size), NOMINAL_BANDWIDTH, size))
        return
    device = torch.device("cuda" if cuda else "cpu")
    backend.ensure_loaded()
    bandwidth = copy_bandwidth(device, n_bytes=1 << 20 if smoke else 1 << 30)
    name = torch.cuda.get_device_name() if cuda else "CPU (smoke run)"
    report.note(
        SECTION,
        f"{datetime.date.today().isoformat()}, {name}, torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}); measured copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + "
        f"write), at which one {size}² float32 map costs {size * size * 4 / bandwidth * 1e6:.1f} "
        "µs. Predictions: the maps each kernel's passes move, at that bandwidth.",
    )
    report.note(SECTION, kernel_table(_kernels(size), bandwidth, device))
    report.note(SECTION, op_table(device, bandwidth, smoke))


def splice(markdown: str, path: pathlib.Path = DOCS) -> list[str]:
    """Put every ``## `` section of ``markdown`` into ``path``: a section whose heading
    (up to a colon) is there replaces it, to the next ``## ``; a new one is appended. Every
    other section stays as it was. Returns the headings spliced."""
    text = path.read_text().splitlines()
    sections, current = [], None
    for line in markdown.rstrip("\n").splitlines():
        if line.startswith("## "):
            current = [line]
            sections.append(current)
        elif current is not None:
            current.append(line)
    for section in sections:
        key = section[0].split(":")[0]
        start = next((i for i, line in enumerate(text) if line.split(":")[0] == key), None)
        if start is None:
            text += ["", *section]
            continue
        end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
        body = section[:-1] if section[-1] == "" else section
        text = [*text[:start], *body, "", *text[end:]]
    path.write_text("\n".join(text).rstrip("\n") + "\n")
    return [section[0] for section in sections]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device, no docs")
    parser.add_argument("--out", default=str(DOCS), help="the benchmarks page to update")
    parser.add_argument(
        "--markdown", help="write the section here instead of updating the benchmarks page"
    )
    parser.add_argument(
        "--splice",
        metavar="SUMMARY",
        help="measure nothing: put the sections of a GPU check's summary.md into --out",
    )
    args = parser.parse_args(argv)
    if args.splice:
        for heading in splice(pathlib.Path(args.splice).read_text(), pathlib.Path(args.out)):
            print(f"{args.out}: {heading}")
        return 0
    report = Report()
    run(report, smoke=args.smoke)
    markdown = report.markdown(SECTION)
    print(markdown)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(markdown)
    elif not args.smoke:
        splice(markdown, pathlib.Path(args.out))
        print(f"updated {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
