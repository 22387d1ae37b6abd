"""Input checks and coercion: NumPy or torch in, float32 tensors in a robust range out.

Nothing here modifies its input: every path copies (or casts) before changing values.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from .._devices import available_memory
from ..io import budget as _budget
from ..io import lazy


def to_tensor(x, name: str, *, ndim=(2, 3), leading: int = 0) -> torch.Tensor:
    """``x`` (NumPy array, torch tensor or nested list) as a float tensor (same device).

    float64 stays float64 (values beyond float32's range are kept), everything else
    becomes float32. ``leading`` extra axes (a time axis for stacks) come before the 2 or
    3 spatial ones. Raises a clear error for empty, non-numeric, wrongly-shaped, NaN or
    Inf input. A dask or zarr ``x`` is read whole only after its float size was checked
    against the memory budget; multiscale data is refused (pick a level).
    """
    if lazy.is_lazy(x) or lazy.is_multiscale(x):
        x = _materialize(x, name)
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:
            raise TypeError(f"{name} must be an array-like, got {type(x).__name__}") from exc
        if arr.dtype == object or not (
            np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
        ):
            raise TypeError(f"{name} must hold numbers, got dtype {arr.dtype}")
        if np.iscomplexobj(arr):
            raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
        if not arr.dtype.isnative:  # big-endian files (some TIFF/NPY writers): torch needs native
            arr = arr.astype(arr.dtype.newbyteorder("="))
        with warnings.catch_warnings():
            # A read-only array (a memory map, a decoded Zarr chunk) is shared, not copied:
            # nothing writes into an input tensor (tests/trust), so torch's warning that
            # writing would be undefined is noise to the user.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_complex():
        raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")
    allowed = tuple(d + leading for d in ndim)
    if t.dim() not in allowed:
        what = " or ".join(f"{d}-D" for d in allowed)
        kind = "a (T, *S) stack of 2-D or 3-D frames" if leading else "a 2-D or 3-D image"
        raise ValueError(f"{name} must be {kind} ({what}), got shape {tuple(t.shape)}")
    # Integers and booleans hold no NaN or Inf (camera data: uint8/uint16), and every one
    # converts to a finite float32; only floating-point input needs the test.
    exact = not t.is_floating_point()
    t = t if t.dtype == torch.float64 else t.to(torch.float32)
    if not exact and not _all_finite(t):
        # The mask weighs the fixed image's pixels: it can leave out a fixed image's
        # replaced values, not a moving image's (they move with the transform).
        hint = (
            "; to leave those pixels out of the similarity, also give a mask that is 0 "
            "there (register's mask=, the CLI's --mask)"
            if "fixed" in name
            else ""
        )
        raise ValueError(
            f"{name} contains NaN or Inf values; replace them (e.g. numpy.nan_to_num){hint}"
        )
    return t


def _all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or Inf: one fast reduction (a finite sum proves every
    value finite), the elementwise test only when the sum is not finite (a NaN, an Inf,
    or finite values whose sum overflowed). The check ran on every stack frame read, twice
    per frame in ``register_stack``: ``isfinite(t).all()`` writes a mask of the frame
    first (docs/benchmarks.md, register_stack's figure)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_axes_for_model(model: str, shape, name: str) -> None:
    """Refuse a rigid, similarity or affine model on an image with an axis of one pixel
    (``shape``: its spatial shape): nothing measures a rotation, a scaling or a shear
    across that axis, nor a shift along it, so those parameters would be left to chance
    (a 1 × 96 line registered rigidly came back shifted 4.4 px off its own row). A
    translation (the axis' shift stays 0) and the dense models handle such images."""
    if model in ("rigid", "similarity", "affine") and 1 in tuple(shape):
        raise ValueError(
            f"model={model!r} needs at least 2 pixels along every axis of {name}, got shape "
            f"{tuple(shape)}: nothing measures a rotation or a shift across an axis of one "
            "pixel. Use model='translation', or drop the axis (a 2-D image for one plane)"
        )


#: the fewest pixels a rigid, similarity or affine fit may see along an axis of a pyramid
#: level (a 64² pair with levels=6 has a 2 × 2 coarsest level, where a rotation of 0.48
#: rad fitted as well as none and the finer levels never came back)
MIN_LEVEL_PIXELS = 4


def check_levels(model: str, shape, levels: int, spacing=None) -> None:
    """Refuse, for a rigid, similarity or affine model, ``levels`` that shrink an axis of
    the image ``shape`` (spatial) below :data:`MIN_LEVEL_PIXELS` at the coarsest level
    (axes already thinner than that are left out), saying how many levels fit."""
    from .pyramid import level_shapes

    if model not in ("rigid", "similarity", "affine"):
        return

    def too_small(n):
        coarsest = level_shapes(shape, n, spacing)[0]
        return any(c < MIN_LEVEL_PIXELS <= s for c, s in zip(coarsest, shape))

    if too_small(levels):
        fitting = max([n for n in range(1, levels) if not too_small(n)], default=1)
        raise ValueError(
            f"levels={levels} shrinks the image of shape {tuple(shape)} to "
            f"{level_shapes(shape, levels, spacing)[0]} pixels at the coarsest level, too few "
            f"to fit model={model!r} (at least {MIN_LEVEL_PIXELS} per axis); use levels <= "
            f"{fitting}, or levels='auto'"
        )


def _materialize(x, name: str) -> np.ndarray:
    """A dask or zarr array read into memory, after checks of its dtype, chunking and
    size against the memory budget (before anything is read)."""
    lazy.check_array(x, name)
    need = int(np.prod(x.shape)) * (8 if np.dtype(x.dtype) == np.float64 else 4)
    _budget.refuse(
        need,
        _budget.memory_budget(),
        what=f"{name} {tuple(x.shape)} as floats",
        advice="crop or downsample it (a pair is registered in memory)",
    )
    return lazy.read(x)


def robust_range(t: torch.Tensor, name: str, low: float = 0.5, high: float = 99.5):
    """``(lo, hi)`` percentiles of ``t`` (on a subsample of at most ~200k values).

    Raises a ValueError for a constant image: nothing in it can be aligned.
    """
    flat = t.reshape(-1)
    step = max(1, flat.numel() // 200_000)
    sample = flat[::step].detach().cpu().numpy().astype(np.float64)  # float64 on the host
    # NumPy's quantile (a partial sort, the same linear interpolation as torch.quantile's
    # default): torch.quantile sorts the whole sample, 15 ms against 1-2 ms at 512², paid
    # once per image by every run and by the widget's similarity-gradient display.
    lo, hi = (float(v) for v in np.quantile(sample, [low / 100, high / 100]))
    if not hi > lo:
        lo, hi = float(t.min()), float(t.max())
    if not hi > lo:
        raise ValueError(
            f"{name} is constant (every value is {lo:g}); there is nothing to align it by"
        )
    return lo, hi


def normalize(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` rescaled so its 0.5th and 99.5th percentiles are 0 and 1: a new float32 tensor
    (the rescaling runs in ``t``'s dtype, so float64 data beyond float32's range is fine)."""
    lo, hi = robust_range(t, name)
    return ((t - lo) / (hi - lo)).to(torch.float32)


#: float32 maps per pixel of one pair that a linear run holds at its peak: the peak resident
#: set of ``register(model="affine", levels=1, iterations=5)`` on a 1024² pair above the
#: level before it, on the CPU (``OMP_NUM_THREADS=1 python benchmarks/maps_per_pixel.py``,
#: 2026-11-23: mse 35.1, ncc 33.6, lncc 74.8, ssim 68.7, mi 90.6), rounded up. It holds
#: the images, warped image, sampling grid, the metric's maps and their gradients, and
#: also the run's other full-size work: the phase-correlation guess, the final warp (a
#: float64 grid) and the similarity report. "mi": the Parzen window's taps (4 bins per
#: pixel and image for the cubic B-spline: weights, bin indices and their gradients) and
#: the joint histogram's scatter. The loss's own maps were 12 to 48 before (an estimate
#: never measured): the whole run needs about 20 maps more.
MAPS_PER_PIXEL = {"mse": 36, "ncc": 36, "lncc": 76, "ssim": 70, "mi": 92}
#: maps a dense model adds (its field, the upsampled displacement and their gradients):
#: an estimate, not measured
DENSE_MAPS_PER_PIXEL = 12


def estimate_bytes(n_pairs: int, shape, metric: str, dense: bool) -> int:
    """An estimate of the peak memory of a run, in bytes (see :data:`MAPS_PER_PIXEL`)."""
    pixels = int(np.prod(shape))
    maps = MAPS_PER_PIXEL.get(metric, max(MAPS_PER_PIXEL.values())) + (
        DENSE_MAPS_PER_PIXEL if dense else 0
    )
    return int(n_pairs * pixels * 4 * maps * 4 / 3)  # the pyramid adds about a third


def check_memory(
    n_pairs: int, shape, metric: str, dense: bool, device: torch.device, *, advice: str
) -> None:
    """Raise a MemoryError with the figures when the run cannot fit on ``device``.

    ``advice`` says what the caller's user can change (only options that caller takes).
    """
    need = estimate_bytes(n_pairs, shape, metric, dense)
    free = available_memory(device)
    if free is not None and need > free:
        raise MemoryError(
            f"registering {n_pairs} pair(s) of shape {tuple(shape)} with metric {metric!r} "
            f"needs about {need / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB "
            f"is free; {advice}"
        )
