"""Fake (shape-only) and autograd registrations of the compiled ``torch.ops.simwarp`` ops.

Registered from Python, once, after the CPU extension (which defines the schemas) is
loaded, so the ops work under ``torch.compile`` and pass ``torch.library.opcheck``. The
backward formulas are those of docs/maths.md (§1.2 local std, §4 splatting; ``box_sum`` and
``correlate`` are linear, so each is the other's adjoint).

Every kernel returns new contiguous tensors whatever its inputs' layout, so every fake
allocates with ``new_empty`` (contiguous), never ``torch.empty_like`` (which keeps a
channels_last or transposed input's strides and fails opcheck with "Stride mismatch").
"""

from __future__ import annotations

import math

import torch

from .._autograd import first_order_backward

_registered = False


def _window_shape(shape, window, full: bool) -> list[int]:
    """Trailing ``len(window)`` sizes grown by ``k - 1`` (full) or shrunk by it (valid)."""
    sizes = list(shape)
    first = len(sizes) - len(window)
    for a, k in enumerate(window):
        sizes[first + a] += (k - 1) if full else -(k - 1)
    return sizes


def register_fakes_and_autograd() -> None:
    """Register the fake and autograd implementations of every op (idempotent)."""
    global _registered
    if _registered:
        return

    @torch.library.register_fake("simwarp::box_sum")
    def _box_sum_fake(x, window, full=False):
        return x.new_empty(_window_shape(x.shape, window, full))

    def _box_sum_setup(ctx, inputs, output):
        _, ctx.window, ctx.full = inputs

    def _box_sum_backward(ctx, grad):
        # A box is its own flip, so the adjoint of the valid sum is the full sum and back.
        return torch.ops.simwarp.box_sum(grad, ctx.window, not ctx.full), None, None

    torch.library.register_autograd(
        "simwarp::box_sum", _box_sum_backward, setup_context=_box_sum_setup
    )

    @torch.library.register_fake("simwarp::correlate")
    def _correlate_fake(x, taps, sizes, transpose=False):
        return x.new_empty(_window_shape(x.shape, sizes, transpose))

    def _correlate_setup(ctx, inputs, output):
        _, ctx.taps, ctx.sizes, ctx.transpose = inputs

    def _correlate_backward(ctx, grad):
        # The valid correlation and its transpose are each other's adjoints.
        out = torch.ops.simwarp.correlate(grad.contiguous(), ctx.taps, ctx.sizes, not ctx.transpose)
        return out, None, None, None

    torch.library.register_autograd(
        "simwarp::correlate", _correlate_backward, setup_context=_correlate_setup
    )

    @torch.library.register_fake("simwarp::moments5")
    def _moments5_fake(centered, taps, sizes):
        shape = _window_shape(centered.shape, sizes, False)
        shape[0] = 5
        return centered.new_empty(shape)

    @torch.library.register_fake("simwarp::splat_fwd")
    def _splat_fwd_fake(image, displacement, normalize, eps):
        n, _, *spatial = image.shape
        return image.new_empty(image.shape), image.new_empty(n, 1, *spatial)

    @torch.library.register_fake("simwarp::splat_bwd")
    def _splat_bwd_fake(v_out, v_den, image, displacement, out, den, normalize, eps):
        return image.new_empty(image.shape), displacement.new_empty(displacement.shape)

    def _splat_setup(ctx, inputs, output):
        image, displacement, ctx.normalize, ctx.eps = inputs
        out, den = output
        ctx.save_for_backward(image, displacement, out, den)

    # The nonlinear ops' backward kernels have no derivative of their own: as their pure
    # torch twins, they refuse create_graph=True rather than give a silent zero.
    @first_order_backward("splat")
    def _splat_backward(ctx, v_out, v_den):
        image, displacement, out, den = ctx.saved_tensors
        grad_image, grad_disp = torch.ops.simwarp.splat_bwd(
            v_out, v_den, image, displacement, out, den, ctx.normalize, ctx.eps
        )
        return grad_image, grad_disp, None, None

    torch.library.register_autograd(
        "simwarp::splat_fwd", _splat_backward, setup_context=_splat_setup
    )

    @torch.library.register_fake("simwarp::parzen_fwd")
    def _parzen_fwd_fake(a, b, weight, bins, normalize, value_range):
        m = a.shape[0]
        return a.new_empty(m), a.new_empty(m, bins, bins), a.new_empty(m, 4)

    @torch.library.register_fake("simwarp::parzen_bwd")
    def _parzen_bwd_fake(grad_score, score, grad_joint, a, b, weight, frame, bins):
        return a.new_empty(a.shape), b.new_empty(b.shape)

    def _parzen_setup(ctx, inputs, output):
        a, b, weight, ctx.bins, _, _ = inputs
        score, grad_joint, frame = output
        ctx.save_for_backward(a, b, weight, score, grad_joint, frame)

    @first_order_backward("mutual_information")
    def _parzen_backward(ctx, grad_score, _grad_joint, _grad_frame):
        # ∂score/∂joint and the frame are returned for this backward only: not part of
        # the public result, their incoming gradients are ignored
        a, b, weight, score, grad_joint, frame = ctx.saved_tensors
        if grad_score is None:
            return None, None, None, None, None, None
        grad_a, grad_b = torch.ops.simwarp.parzen_bwd(
            grad_score.contiguous(), score, grad_joint, a, b, weight, frame, ctx.bins
        )
        return grad_a, grad_b, None, None, None, None

    torch.library.register_autograd(
        "simwarp::parzen_fwd", _parzen_backward, setup_context=_parzen_setup
    )

    @torch.library.register_fake("simwarp::squaring_fwd")
    def _squaring_fwd_fake(v, scale, steps, keep):
        return v.new_empty(v.shape), v.new_empty((steps if keep else 0, *v.shape))

    @torch.library.register_fake("simwarp::squaring_bwd")
    def _squaring_bwd_fake(grad, saved, scale, base):
        return grad.new_empty(grad.shape)

    @torch.library.register_fake("simwarp::local_std_fwd")
    def _local_std_fwd_fake(xp, window, eps, normalize, flat_factor):
        shape = _window_shape(xp.shape, window, False)
        return xp.new_empty(shape), xp.new_empty(shape), xp.new_empty(shape, dtype=torch.bool)

    @torch.library.register_fake("simwarp::local_std_bwd")
    def _local_std_bwd_fake(grad, out, s1, flat, xp, window, normalize):
        return xp.new_empty(xp.shape)

    def _local_std_setup(ctx, inputs, output):
        xp, window, _, normalize, _ = inputs
        out, s1, flat = output
        ctx.save_for_backward(xp, out, s1, flat)
        ctx.window, ctx.normalize = window, normalize

    @first_order_backward("local_std")
    def _local_std_backward(ctx, grad_out, grad_s1, grad_flat):
        # S1 and the flat mask are returned only to be saved for this backward; they are
        # not part of the public result, so their incoming gradients are ignored.
        xp, out, s1, flat = ctx.saved_tensors
        if grad_out is None:
            return None, None, None, None, None
        grad_xp = torch.ops.simwarp.local_std_bwd(
            grad_out.contiguous(), out, s1, flat, xp, ctx.window, ctx.normalize
        )
        return grad_xp, None, None, None, None

    torch.library.register_autograd(
        "simwarp::local_std_fwd", _local_std_backward, setup_context=_local_std_setup
    )

    @torch.library.register_fake("simwarp::local_std_2d_fwd")
    def _local_std_2d_fwd_fake(x, window, padding, eps, normalize, flat_factor):
        shape = list(x.shape) if padding != "valid" else _window_shape(x.shape, window, False)
        return x.new_empty(shape), x.new_empty(shape), x.new_empty(shape, dtype=torch.bool)

    @torch.library.register_fake("simwarp::local_std_2d_bwd")
    def _local_std_2d_bwd_fake(grad, out, s1, flat, x, window, padding, normalize):
        return x.new_empty(x.shape)

    def _local_std_2d_setup(ctx, inputs, output):
        x, window, padding, _, normalize, _ = inputs
        out, s1, flat = output
        ctx.save_for_backward(x, out, s1, flat)
        ctx.window, ctx.padding, ctx.normalize = window, padding, normalize

    @first_order_backward("local_std")
    def _local_std_2d_backward(ctx, grad_out, grad_s1, grad_flat):
        # As local_std_fwd: S1 and the flat mask are saved state, not results.
        x, out, s1, flat = ctx.saved_tensors
        if grad_out is None:
            return None, None, None, None, None, None
        grad_x = torch.ops.simwarp.local_std_2d_bwd(
            grad_out.contiguous(), out, s1, flat, x, ctx.window, ctx.padding, ctx.normalize
        )
        return grad_x, None, None, None, None, None

    torch.library.register_autograd(
        "simwarp::local_std_2d_fwd", _local_std_2d_backward, setup_context=_local_std_2d_setup
    )
    _registered = True


_fused_registered: set[str] = set()


def register_fused_ssim_fakes(namespace: str) -> None:
    """Fakes of the CUDA-only fused SSIM ops ``<namespace>::ssim_fwd`` / ``ssim_bwd``
    ("simwarp" once the CUDA build is loaded, "simwarp_host_shim" for the host shim's
    build), idempotent. Their autograd is ``ops.ssim._FusedSSIM``'s."""
    if namespace in _fused_registered:
        return
    tile = 16  # csrc/cuda/ssim.h kSsimTile

    @torch.library.register_fake(f"{namespace}::ssim_fwd")
    def _ssim_fwd_fake(a, b, taps, sizes, c1, c2, need_partials):
        if not need_partials:
            return a.new_empty(a.shape), a.new_empty((0,)), a.new_empty((0,))
        H, W = a.shape[-2], a.shape[-1]
        images = a.numel() // (H * W)
        shifts = (2, images, (H + tile - 1) // tile, (W + tile - 1) // tile)
        return a.new_empty(a.shape), a.new_empty((4, *a.shape)), a.new_empty(shifts)

    @torch.library.register_fake(f"{namespace}::ssim_bwd")
    def _ssim_bwd_fake(grad, a, b, partials, shifts, taps, sizes):
        return a.new_empty(a.shape), a.new_empty(a.shape)

    _fused_registered.add(namespace)


def register_fused_local_std_fakes(namespace: str) -> None:
    """Fakes of the CUDA-only ``<namespace>::local_std_fused_fwd`` / ``_bwd`` (as
    :func:`register_fused_ssim_fakes`); their autograd is ``ops.local_std``'s."""
    key = f"{namespace}/local_std"
    if key in _fused_registered:
        return

    @torch.library.register_fake(f"{namespace}::local_std_fused_fwd")
    def _fwd_fake(x, shift, window, padding, eps, normalize, flat_factor):
        return x.new_empty(x.shape), x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.bool)

    @torch.library.register_fake(f"{namespace}::local_std_fused_bwd")
    def _bwd_fake(grad, out, s1, flat, x, shift, window, padding, normalize):
        return x.new_empty(x.shape)

    _fused_registered.add(key)


def local_ncc_shift_shape(shape, sizes) -> tuple[int, ...]:
    """The fused local NCC's tile shifts ``(2, images, tiles_z, tiles_y, tiles_x)`` for
    images of ``shape`` ``(..., [D,] H, W)`` and a window of ``sizes`` (csrc/cuda/local_ncc.h:
    tiles of 8 x 16 x 16, 1 x 16 x 16 for 2-D images)."""
    W, H = shape[-1], shape[-2]
    D = shape[-3] if len(sizes) == 3 else 1
    kz = sizes[0] if len(sizes) == 3 else 1
    tz = 1 if D == 1 and kz == 1 else 8
    images = math.prod(shape) // (D * H * W) if D * H * W else 0
    return (2, images, -(-D // tz), -(-H // 16), -(-W // 16))


def register_fused_local_ncc_fakes(namespace: str) -> None:
    """Fakes of the CUDA-only ``<namespace>::local_ncc_fwd`` / ``_bwd`` (as
    :func:`register_fused_ssim_fakes`); their autograd is ``ops.local_ncc``'s."""
    key = f"{namespace}/local_ncc"
    if key in _fused_registered:
        return

    @torch.library.register_fake(f"{namespace}::local_ncc_fwd")
    def _fwd_fake(a, b, taps, sizes, inv_total, flat_factor, need_partials):
        if not need_partials:
            return a.new_empty(a.shape), a.new_empty((0,)), a.new_empty((0,))
        shifts = local_ncc_shift_shape(tuple(a.shape), tuple(sizes))
        return a.new_empty(a.shape), a.new_empty((5, *a.shape)), a.new_empty(shifts)

    @torch.library.register_fake(f"{namespace}::local_ncc_bwd")
    def _bwd_fake(grad, a, b, partials, shifts, taps, sizes):
        return a.new_empty(a.shape), a.new_empty(a.shape)

    _fused_registered.add(key)
