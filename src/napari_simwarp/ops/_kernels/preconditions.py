"""The argument checks of ``csrc/checks.h``, run in Python before every compiled call.

The C++ bindings refuse a bad argument with ``TORCH_CHECK``, which raises a
``RuntimeError`` in Python where the C++ exception crosses back cleanly. On one GPU
machine (issue 23: its own g++, Python 3.12) it did not: every refusal ended the process
with SIGSEGV. A user's napari window must not die because a window was too large, so
:mod:`.calls` runs these checks first and no call from Python reaches a C++ refusal.

Each function mirrors the check of the same name in ``checks.h``, with the same message
(``tests/csrc/test_preconditions.py`` walks every refusal of ``tests/csrc/test_checks.py``
through both). They raise ``TypeError`` for a dtype and ``ValueError`` otherwise. The
public operators check their arguments in the user's words before they get here
(:mod:`.._validation`); these are the last line, for the library's own calls.

Only Python-level metadata is read (shapes, dtypes, devices): no aten op, no host sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_FLOATING = (torch.float32, torch.float64)
_TYPE_NAMES = {
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
}


def _type_name(dtype: torch.dtype) -> str:
    """The dtype as c10 prints it (``Float``, ``Int``), as the C++ messages do."""
    return _TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _sizes(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def floating(op: str, name: str, t: torch.Tensor) -> None:
    """The kernels are instantiated for float32 and float64 only."""
    if t.dtype not in _FLOATING:
        raise TypeError(f"{op}: {name} must be float32 or float64, got {_type_name(t.dtype)}")


def like_first(op: str, args: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    """Every tensor on the first one's device and of its dtype (``None``: absent)."""
    first_name, first = args[0]
    for name, t in args:
        if t is None:
            continue
        if t.device != first.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first_name} is on {first.device}")
        if t.dtype != first.dtype:
            raise ValueError(
                f"{op}: {name} is {_type_name(t.dtype)} but {first_name} is "
                f"{_type_name(first.dtype)}"
            )


def shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} must have shape {_sizes(expected)}, got {_sizes(t.shape)}")


def window(op: str, x: torch.Tensor, sizes: Sequence[int], pads: bool, reserved: int = 0) -> None:
    """A window over the trailing ``len(sizes)`` axes of ``x``, its first ``reserved``
    axes left alone: sizes at least 1 and, unless the op pads, no longer than their axis."""
    d = len(sizes)
    if d > x.dim() - reserved:
        raise ValueError(
            f"{op}: a window of {d} axes needs at least {d + reserved} dimensions, got {x.dim()}"
        )
    for a, k in enumerate(sizes):
        if k < 1:
            raise ValueError(f"{op}: window sizes must be at least 1, got {_sizes(sizes)}")
        if not pads and k > x.shape[x.dim() - d + a]:
            raise ValueError(
                f"{op}: window larger than the axis (window {_sizes(sizes)}, shape "
                f"{_sizes(x.shape)})"
            )


def some_window(op: str, sizes: Sequence[int]) -> None:
    if len(sizes) == 0:
        raise ValueError(f"{op}: the window must cover at least one axis")


def taps(op: str, values: Sequence[float], sizes: Sequence[int]) -> None:
    total = sum(int(k) for k in sizes)
    if total != len(values):
        raise ValueError(f"{op}: taps must hold sum(sizes) = {total} values, got {len(values)}")


# ---- per op: what its binding checks first --------------------------------------------


def box_sum(x: torch.Tensor, sizes: Sequence[int], full: bool) -> None:
    floating("box_sum", "x", x)
    window("box_sum", x, sizes, pads=full)


def correlate(x: torch.Tensor, values: Sequence[float], sizes: Sequence[int], transpose) -> None:
    floating("correlate", "x", x)
    taps("correlate", values, sizes)
    window("correlate", x, sizes, pads=transpose)


def moments5(centered: torch.Tensor, values: Sequence[float], sizes: Sequence[int]) -> None:
    floating("moments5", "centered", centered)
    if centered.dim() < 1 or centered.shape[0] != 2:
        raise ValueError(
            f"moments5: centered must stack [a, b] on dim 0, got shape {_sizes(centered.shape)}"
        )
    some_window("moments5", sizes)
    taps("moments5", values, sizes)
    window("moments5", centered, sizes, pads=False, reserved=1)


def local_std_fwd(xp: torch.Tensor, sizes: Sequence[int]) -> None:
    floating("local_std_fwd", "xp", xp)
    some_window("local_std_fwd", sizes)
    window("local_std_fwd", xp, sizes, pads=False)


def local_std_2d_fwd(x: torch.Tensor, sizes: Sequence[int], valid: bool) -> None:
    floating("local_std_2d", "x", x)
    if x.dim() < 2 or len(sizes) != 2:
        raise ValueError("local_std_2d: x must be (..., H, W), window (kh, kw)")
    window("local_std_2d", x, sizes, pads=not valid)


def splat_fwd(image: torch.Tensor, displacement: torch.Tensor) -> None:
    floating("splat", "image", image)
    like_first("splat", [("image", image), ("displacement", displacement)])
    d = image.dim() - 2
    if d not in (2, 3):
        raise ValueError(
            f"splat: image must be (N, C, H, W) or (N, C, D, H, W), got shape {_sizes(image.shape)}"
        )
    shape("splat", "displacement", displacement, (image.shape[0], d, *image.shape[2:]))


def ssim_fwd(
    a: torch.Tensor, b: torch.Tensor, values: Sequence[float], sizes: Sequence[int], max_taps: int
) -> None:
    """The fused 2-D SSIM (CUDA only): float32 ``a``, ``b`` of one shape ``(..., H, W)``."""
    if a.dtype != torch.float32:
        raise TypeError(f"ssim_fwd: a must be float32, got {_type_name(a.dtype)}")
    like_first("ssim_fwd", [("a", a), ("b", b)])
    shape("ssim_fwd", "b", b, a.shape)
    if len(sizes) != 2 or a.dim() < 2:
        raise ValueError(
            "ssim_fwd: a 2-D window over (..., H, W), got window "
            f"{_sizes(sizes)} for shape {_sizes(a.shape)}"
        )
    taps("ssim_fwd", values, sizes)
    window("ssim_fwd", a, sizes, pads=False)
    if any(k % 2 != 1 or k > max_taps for k in sizes):
        raise ValueError(
            f"ssim_fwd: window sizes must be odd and at most {max_taps}, got {_sizes(sizes)}"
        )


def ssim_bwd(grad, a, b, partials, shifts, values, sizes, max_taps: int, tile: int) -> None:
    """Its backward: grad one value or ``a``'s shape, partials ``(4, *a.shape)``, shifts
    ``(2, images, tiles along H, tiles along W)``."""
    ssim_fwd(a, b, values, sizes, max_taps)
    like_first("ssim_bwd", [("a", a), ("grad", grad), ("partials", partials), ("shifts", shifts)])
    if grad.numel() != 1 and tuple(grad.shape) != tuple(a.shape):
        raise ValueError(
            f"ssim_bwd: grad must hold one value or have shape {_sizes(a.shape)}, "
            f"got {_sizes(grad.shape)}"
        )
    shape("ssim_bwd", "partials", partials, (4, *a.shape))
    H, W = a.shape[-2:]
    images = a.numel() // (H * W) if H * W else 0
    shape("ssim_bwd", "shifts", shifts, (2, images, -(-H // tile), -(-W // tile)))


def local_ncc_fwd(
    a: torch.Tensor, b: torch.Tensor, values: Sequence[float], sizes: Sequence[int], max_taps: int
) -> None:
    """The fused local NCC (CUDA only): float32 ``a``, ``b`` of one shape ``(..., [D,] H, W)``,
    a 2-D or 3-D window."""
    op = "local_ncc_fwd"
    if a.dtype != torch.float32:
        raise TypeError(f"{op}: a must be float32, got {_type_name(a.dtype)}")
    like_first(op, [("a", a), ("b", b)])
    shape(op, "b", b, a.shape)
    if len(sizes) not in (2, 3) or a.dim() < len(sizes):
        raise ValueError(
            f"{op}: a 2-D or 3-D window over (..., [D,] H, W), got window "
            f"{_sizes(sizes)} for shape {_sizes(a.shape)}"
        )
    taps(op, values, sizes)
    window(op, a, sizes, pads=False)
    if any(k % 2 != 1 or k > max_taps for k in sizes):
        raise ValueError(
            f"{op}: window sizes must be odd and at most {max_taps}, got {_sizes(sizes)}"
        )


def local_ncc_bwd(grad, a, b, partials, shifts, values, sizes, max_taps: int, tiles) -> None:
    """Its backward: grad one value or ``a``'s shape, partials ``(5, *a.shape)``, shifts
    ``tiles`` (``_registrations.local_ncc_shift_shape``)."""
    op = "local_ncc_bwd"
    local_ncc_fwd(a, b, values, sizes, max_taps)
    like_first(op, [("a", a), ("grad", grad), ("partials", partials), ("shifts", shifts)])
    if grad.numel() != 1 and tuple(grad.shape) != tuple(a.shape):
        raise ValueError(
            f"{op}: grad must hold one value or have shape {_sizes(a.shape)}, "
            f"got {_sizes(grad.shape)}"
        )
    shape(op, "partials", partials, (5, *a.shape))
    shape(op, "shifts", shifts, tuple(tiles))


def local_std_fused_fwd(x, shift, sizes: Sequence[int], padding: str, max_window: int) -> None:
    """The fused 2-D local std (CUDA only): float32 ``x (..., H, W)``, ``shift (images,)``."""
    op = "local_std_fused"
    if x.dtype != torch.float32:
        raise TypeError(f"{op}: x must be float32, got {_type_name(x.dtype)}")
    like_first(op, [("x", x), ("shift", shift)])
    if x.dim() < 2 or len(sizes) != 2:
        raise ValueError(f"{op}: x must be (..., H, W), window (kh, kw)")
    window(op, x, sizes, pads=False)
    if any(k % 2 != 1 or k > max_window for k in sizes):
        raise ValueError(
            f"{op}: window sizes must be odd and at most {max_window}, got {_sizes(sizes)}"
        )
    if padding not in ("reflect", "mirror", "nearest", "constant"):
        raise ValueError(
            f"{op}: padding must be reflect, mirror, nearest or constant, got {padding}"
        )
    plane = x.shape[-1] * x.shape[-2]
    shape(op, "shift", shift, (x.numel() // plane if plane else 0,))


def local_std_fused_bwd(grad, out, s1, flat, x, shift, sizes, padding, max_window) -> None:
    local_std_fused_fwd(x, shift, sizes, padding, max_window)
    op = "local_std_fused"
    like_first(op, [("x", x), ("grad", grad), ("out", out), ("s1", s1)])
    if flat.device != x.device:
        raise ValueError(f"{op}: flat is on {flat.device} but x is on {x.device}")
    if flat.dtype != torch.bool:
        raise TypeError(f"{op}: flat must be bool, got {_type_name(flat.dtype)}")
    for name, t in (("grad", grad), ("out", out), ("s1", s1), ("flat", flat)):
        shape(op, name, t, x.shape)


#: the most bins simwarp::parzen_fwd takes (csrc/checks.h)
PARZEN_MAX_BINS = 1024


def parzen(a: torch.Tensor, b: torch.Tensor, weight, bins: int) -> None:
    """The mutual information's Parzen histogram: ``a``, ``b`` (and ``weight``) ``(M, P)``
    of one dtype and device, at least 4 bins (csrc/checks.h)."""
    floating("parzen", "a", a)
    like_first("parzen", [("a", a), ("b", b)] + ([] if weight is None else [("weight", weight)]))
    if a.dim() != 2:
        raise ValueError(f"parzen: a must be (M, P), got shape {_sizes(a.shape)}")
    shape("parzen", "b", b, a.shape)
    if weight is not None:
        shape("parzen", "weight", weight, a.shape)
    if not 4 <= bins <= PARZEN_MAX_BINS:
        raise ValueError(f"parzen: bins must be between 4 and {PARZEN_MAX_BINS}, got {bins}")


#: the most squarings simwarp::squaring_fwd takes (csrc/checks.h, integrate_velocity.MAX_STEPS)
SQUARING_MAX_STEPS = 30


def squaring(u: torch.Tensor, steps: int, scale=None) -> None:
    """Scaling and squaring: ``u`` ``(N, 2, H, W)`` or ``(N, 3, D, H, W)``, float32 or
    float64, ``scale`` None or one factor per component, ``0 <= steps <= 30``
    (csrc/checks.h)."""
    floating("squaring", "u", u)
    if u.dim() not in (4, 5) or u.shape[1] != u.dim() - 2:
        raise ValueError(
            f"squaring: u must be (N, 2, H, W) or (N, 3, D, H, W), got shape {_sizes(u.shape)}"
        )
    if scale is not None and len(scale) != u.shape[1]:
        raise ValueError(
            f"squaring: scale must hold one factor per component ({u.shape[1]}), got {len(scale)}"
        )
    if not 0 <= steps <= SQUARING_MAX_STEPS:
        raise ValueError(f"squaring: steps must be between 0 and {SQUARING_MAX_STEPS}, got {steps}")
