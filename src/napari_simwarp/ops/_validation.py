"""Input checks shared by every operator.

Each check names the argument it is checking and says what was expected, so that a user
who passes the wrong thing learns which argument to fix. Nothing here modifies its input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: dtypes that are computed in float32 and cast back on return.
LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_image(x, name: str, *, ndim: Sequence[int] = (4, 5)) -> torch.Tensor:
    """Check that ``x`` is a non-empty floating tensor shaped ``(N, C, *S)``.

    Parameters
    ----------
    x : object
        The value to check.
    name : str
        The argument's name, used in error messages.
    ndim : sequence of int
        Accepted numbers of dimensions (4: ``(N, C, H, W)``, 5: ``(N, C, D, H, W)``).

    Returns
    -------
    torch.Tensor
        ``x`` itself (never a copy).
    """
    if not isinstance(x, torch.Tensor):
        hint = " (use torch.from_numpy or torch.as_tensor)" if hasattr(x, "__array__") else ""
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}{hint}")
    if x.dtype == torch.bool or not (x.is_floating_point() or x.is_complex()):
        raise TypeError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or "
            f"float64), got {x.dtype}; convert it with {name}.float()"
        )
    if x.is_complex():
        raise TypeError(f"{name} must be real, got complex dtype {x.dtype}")
    if x.dim() not in ndim:
        shapes = {4: "(N, C, H, W)", 5: "(N, C, D, H, W)", 3: "(N, C, L)"}
        expected = " or ".join(shapes.get(d, f"{d}-D") for d in ndim)
        raise ValueError(f"{name} must be {expected}, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    return x


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an operator computes in: float32 for half types, else ``dtype``."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def to_compute(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its compute dtype (a cast only for float16/bfloat16)."""
    return x.to(compute_dtype(x.dtype))


def check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise a ValueError unless ``a`` and ``b`` have the same shape."""
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}"
        )


def check_same_device(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise a ValueError unless ``a`` and ``b`` live on the same device."""
    if a.device != b.device:
        raise ValueError(
            f"{name_a} and {name_b} must be on the same device, got {a.device} and {b.device}"
        )


def check_window(
    window, spatial_shape: Sequence[int], name: str = "window", *, allow_larger: bool = False
) -> tuple[int, ...]:
    """Normalise a window size to one odd positive int per spatial axis.

    Parameters
    ----------
    window : int or sequence of int
        One size for every axis, or one per spatial axis (array-axis order).
    spatial_shape : sequence of int
        The image's spatial shape ``S``; the window must fit in it unless
        ``allow_larger``.
    name : str
        The argument's name, used in error messages.

    Returns
    -------
    tuple of int
        ``len(spatial_shape)`` odd positive sizes.
    """
    d = len(spatial_shape)
    if isinstance(window, Sequence) and not isinstance(window, str):
        sizes = tuple(window)
    elif hasattr(window, "__index__") and not isinstance(window, bool):
        sizes = (window,) * d
    else:
        raise TypeError(f"{name} must be an int or a tuple of {d} ints, got {window!r}")
    if len(sizes) != d:
        raise ValueError(
            f"{name} must have one size per spatial axis ({d}), got {len(sizes)}: {window!r}"
        )
    if any(isinstance(s, bool) or not hasattr(s, "__index__") for s in sizes):
        raise TypeError(f"{name} sizes must be ints, got {window!r}")
    sizes = tuple(int(s) for s in sizes)
    if any(s <= 0 or s % 2 == 0 for s in sizes):
        raise ValueError(f"{name} must be odd and positive on every axis, got {window!r}")
    if not allow_larger and any(s > n for s, n in zip(sizes, spatial_shape)):
        raise ValueError(
            f"{name} {sizes} is larger than the image's spatial shape {tuple(spatial_shape)}"
        )
    return sizes


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    """Raise a ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value
