"""Input checks shared by every operator.

Each check names the argument it is checking and says what was expected, so that a user
who passes the wrong thing learns which argument to fix. Nothing here modifies its input.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from ._numerics import compute_dtype


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
    """Normalize a window size to one odd positive int per spatial axis.

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


def check_positive(value, name: str) -> float:
    """A finite, strictly positive real number, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    value = float(value)
    if not (value > 0.0 and value < float("inf")):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def check_sigma(sigma, ndim: int, name: str = "sigma") -> tuple[float, ...]:
    """One positive standard deviation per spatial axis, from a number or a sequence."""
    if isinstance(sigma, Sequence) and not isinstance(sigma, str):
        if len(sigma) != ndim:
            raise ValueError(
                f"{name} must have one value per spatial axis ({ndim}), got {len(sigma)}: {sigma!r}"
            )
        return tuple(check_positive(s, name) for s in sigma)
    return (check_positive(sigma, name),) * ndim


def check_bool(value, name: str) -> bool:
    """Raise a TypeError unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_nonnegative(value, name: str) -> float:
    """A real number ``>= 0`` (not a bool), as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def check_pair(a, b, name_a: str = "a", name_b: str = "b") -> tuple[torch.dtype, torch.dtype]:
    """Validate two images of one shape and device.

    Returns ``(out_dtype, compute_dtype)``: the promoted input dtype the result is
    returned in, and the dtype the maths runs in (float32 for half types).
    """
    check_image(a, name_a)
    check_image(b, name_b)
    check_same_shape(a, b, name_a, name_b)
    check_same_device(a, b, name_a, name_b)
    out_dtype = torch.promote_types(a.dtype, b.dtype)
    return out_dtype, compute_dtype(out_dtype)


def check_kernel_like(
    kernel: torch.Tensor, x: torch.Tensor, name: str, x_name: str, *, fits: bool = True
) -> None:
    """Check a kernel/template ``(N or 1, C or 1, *K)`` for images ``x`` ``(N, C, *S)``.

    Its batch and channel counts must be 1 (broadcast) or match ``x``'s; with ``fits``,
    ``K <= S`` on every spatial axis.
    """
    for axis, label in ((0, "N"), (1, "C")):
        if kernel.shape[axis] not in (1, x.shape[axis]):
            raise ValueError(
                f"{name}'s {label} ({kernel.shape[axis]}) must be 1 or match {x_name}'s "
                f"({x.shape[axis]}); {name} shape {tuple(kernel.shape)}, {x_name} shape "
                f"{tuple(x.shape)}"
            )
    if fits and any(k > n for k, n in zip(kernel.shape[2:], x.shape[2:])):
        raise ValueError(
            f"{name} spatial shape {tuple(kernel.shape[2:])} is larger than {x_name}'s "
            f"{tuple(x.shape[2:])}"
        )


def check_batches(n_first: int, n_second: int, name_first: str, name_second: str) -> None:
    """Raise unless two batch sizes match or one of them is 1 (and is broadcast)."""
    if n_first != n_second and 1 not in (n_first, n_second):
        raise ValueError(
            f"{name_second}'s batch size ({n_second}) must be 1 or match {name_first}'s ({n_first})"
        )


def check_displacement(
    displacement,
    spatial_shape: Sequence[int],
    *,
    name: str = "displacement",
    like: torch.Tensor | None = None,
    like_name: str = "image",
    batch: int | None = None,
    finite: bool = True,
) -> torch.Tensor:
    """Check a displacement field ``(N, D, *S)`` for images of spatial shape ``S``.

    Parameters
    ----------
    displacement : object
        The value to check: a floating tensor with ``D = len(S)`` channels, one
        displacement component per spatial axis (array-axis order).
    spatial_shape : sequence of int
        The expected ``S``.
    name : str
        The argument's name, used in error messages.
    like : Tensor, optional
        A tensor it must share a device with (named ``like_name`` in messages).
    batch : int, optional
        When given, the field's batch must be 1 or ``batch``.
    finite : bool
        Refuse NaN and infinite displacements (a non-finite sample position has no
        meaning, and ``grid_sample``'s backward crashes the process on one).

    Returns
    -------
    Tensor: ``displacement`` itself.
    """
    d = len(spatial_shape)
    check_image(displacement, name)
    if displacement.dim() != d + 2:
        raise ValueError(
            f"{name} must be (N, {d}, *S) with {d} spatial axes like the {like_name}, got "
            f"shape {tuple(displacement.shape)}"
        )
    if displacement.shape[1] != d:
        raise ValueError(
            f"{name} must have {d} channels (one displacement component per spatial axis, "
            f"array-axis order), got {displacement.shape[1]} in shape "
            f"{tuple(displacement.shape)}"
        )
    if tuple(displacement.shape[2:]) != tuple(spatial_shape):
        raise ValueError(
            f"{name}'s spatial shape {tuple(displacement.shape[2:])} must match the "
            f"{like_name}'s {tuple(spatial_shape)}"
        )
    if batch is not None and displacement.shape[0] not in (1, batch):
        raise ValueError(
            f"{name}'s batch size ({displacement.shape[0]}) must be 1 or match the "
            f"{like_name}'s ({batch})"
        )
    if like is not None:
        check_same_device(like, displacement, like_name, name)
    if (
        finite
        and not bool(torch.isfinite(displacement.detach().sum()))
        and not bool(torch.isfinite(displacement.detach()).all())
    ):
        raise ValueError(
            f"{name} contains NaN or infinite values; every displacement must be finite"
        )
    return displacement


def check_field(field, name: str) -> torch.Tensor:
    """Check a displacement field ``(N, D, *S)`` on its own grid (``D = len(S)``, 2 or 3)."""
    check_image(field, name)
    return check_displacement(field, tuple(field.shape[2:]), name=name, like_name="field")


def check_matrix(matrix, image: torch.Tensor, name: str = "matrix") -> torch.Tensor:
    """An affine for ``image`` ``(N, C, *S)``: ``(M, D + 1, D + 1)`` or ``(M, D, D + 1)``.

    Accepts a tensor, a NumPy array or nested lists, unbatched or batched; returns it
    batched (``(1, ...)`` when unbatched), on ``image``'s device. Must be finite, and a
    homogeneous last row must be ``(0, ..., 0, 1)``.
    """
    if not isinstance(matrix, torch.Tensor):
        if isinstance(matrix, (np.ndarray, list, tuple)):
            array = np.asarray(matrix)
            if array.dtype.kind not in "fiu" or array.dtype == bool:
                raise TypeError(f"{name} must be real and numeric, got dtype {array.dtype}")
            matrix = torch.as_tensor(array.astype(np.float64), device=image.device)
        else:
            raise TypeError(f"{name} must be a torch.Tensor, got {type(matrix).__name__}")
    check_image(matrix, name, ndim=(2, 3))
    check_same_device(image, matrix, "image", name)
    d = image.dim() - 2
    rows, cols = matrix.shape[-2:]
    if cols != d + 1 or rows not in (d, d + 1):
        raise ValueError(
            f"{name} must be ({d + 1}, {d + 1}) homogeneous (or ({d}, {d + 1})), optionally "
            f"batched, for a {d}D image; got shape {tuple(matrix.shape)}"
        )
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    batched = matrix if matrix.dim() == 3 else matrix.unsqueeze(0)
    if rows == d + 1:
        last = batched[:, d].detach().to(torch.float64)
        expected = torch.zeros_like(last)
        expected[:, d] = 1.0
        if not torch.allclose(last, expected, atol=1e-6, rtol=0.0):
            raise ValueError(
                f"{name}'s last row must be (0, ..., 0, 1) (an affine, not a projective "
                f"transform), got {last.tolist()}"
            )
    return batched
