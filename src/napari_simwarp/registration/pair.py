"""``register``: align one moving image to one fixed image (docs/maths.md §6).

    result = register(fixed, moving, model="affine", metric="lncc")
    result.transform.matrix     # fixed → moving, what scipy.ndimage.affine_transform takes
    result.warped               # moving resampled onto the fixed grid (NumPy)

The same run as a generator, for live display and cancellation::

    run = register_iter(fixed, moving)
    for progress in run:        # Progress(level, iteration, loss, transform)
        ...                     # run.send(True) stops within one iteration
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .._devices import resolve_device
from ..ops import warp, warp_affine
from ..ops._validation import check_choice
from . import _inputs, _options
from ._driver import drive
from ._names import LINEAR_MODELS, METRICS, MODELS
from .drift import phase_correlation
from .models import DenseModel, LinearModel
from .optimize import RunResult, level_iterations, level_loss, make_schedule, optimize
from .pyramid import auto_levels, build_pyramid, gaussian_blur, level_shapes
from .quality import assess, masked_zncc
from .transforms import Transform


@dataclass(kw_only=True)
class RegistrationResult(RunResult):
    """What :func:`register` returns.

    transform : the best transform found (``.matrix`` for linear models)
    warped : ``moving`` resampled onto the fixed grid, NumPy, shape of ``fixed``; float64
        when ``moving`` is float64 (values beyond float32's range survive), else float32
    metric, levels : the similarity metric and the pyramid levels used
    (and the fields of :class:`~.optimize.RunResult`)
    """

    transform: Transform
    warped: np.ndarray
    metric: str = ""
    levels: int = 0


def _prepare_mask(mask, shape, device):
    if mask is None:
        return None
    m = mask.detach() if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
    if tuple(m.shape) != tuple(shape):
        raise ValueError(
            f"mask must have the fixed image's shape {tuple(shape)}, got {tuple(m.shape)}"
        )
    if m.is_complex() or not (
        m.is_floating_point() or m.dtype == torch.bool or not m.dtype.is_complex
    ):
        raise TypeError(f"mask must hold real numbers or booleans, got {m.dtype}")
    if m.is_floating_point() and not bool(torch.isfinite(m).all()):
        raise ValueError(
            "mask contains NaN or infinite values; expected non-zero where the "
            "fixed image should be matched and 0 elsewhere"
        )
    # "Non-zero where the fixed image should be matched", whatever the dtype: a float mask
    # of 0.3 (a PNG read as grey levels) must select, not silently fall under a threshold.
    m = (m != 0).to(torch.float32)
    if float(m.sum()) <= 0:
        raise ValueError("mask selects no pixel (it is 0 everywhere)")
    return m.to(device)[None, None]


def prepare_pair(fixed, moving, model, metric, mask, levels, device, smooth=1.0):
    """Validate, normalize and build pyramids; returns a dict of what a run needs."""
    check_choice(model, "model", MODELS)
    check_choice(metric, "metric", METRICS)
    f = _inputs.to_tensor(fixed, "fixed")
    m = _inputs.to_tensor(moving, "moving")
    if f.dim() != m.dim():
        raise ValueError(
            f"fixed and moving must have the same dimensionality, got "
            f"{f.dim()}-D {tuple(f.shape)} and {m.dim()}-D {tuple(m.shape)}"
        )
    if model not in LINEAR_MODELS and f.shape != m.shape:
        raise ValueError(
            f"model {model!r} needs fixed and moving of the same shape, got "
            f"{tuple(f.shape)} and {tuple(m.shape)}"
        )
    dev = resolve_device(device)
    _inputs.check_memory(
        1,
        f.shape,
        metric,
        model not in LINEAR_MODELS,
        dev,
        advice="crop or downsample the images, choose metric='mse' or 'ncc', or another device",
    )
    fn = _inputs.normalize(f.to(dev), "fixed")[None, None]
    mn = _inputs.normalize(m.to(dev), "moving")[None, None]
    shape = tuple(f.shape)
    if levels == "auto":
        levels = auto_levels(shape)
    fshapes = level_shapes(shape, levels)
    mshapes = level_shapes(tuple(m.shape), levels)
    wmask = _prepare_mask(mask, shape, dev)
    weights = (
        [None] * levels
        if wmask is None
        else [(w > 0.5).to(torch.float32) for w in build_pyramid(wmask, fshapes)]
    )
    # A light blur of both images takes pixel noise off the gradient and makes bilinear
    # interpolation (exact only for piecewise-linear images) far less biased.
    fn, mn = gaussian_blur(fn, smooth), gaussian_blur(mn, smooth)
    return dict(
        fixed=build_pyramid(fn, fshapes),
        moving=build_pyramid(mn, mshapes),
        weights=weights,
        moving_raw=m.to(dev),
        shape=shape,
        moving_shape=tuple(m.shape),
        device=dev,
        levels=levels,
    )


def make_model(model, shape, moving_shape, batch, device, init, grid_spacing, steps):
    """The model of a run, started from ``init`` (checked: a finite matrix for linear models,
    a finite displacement of the fixed image's shape, or a Transform, for dense ones)."""
    if model in LINEAR_MODELS:
        return LinearModel(
            model,
            shape,
            moving_shape,
            batch,
            init=_options.init_matrix(init, len(shape)),
            device=device,
        )
    return DenseModel(
        model,
        shape,
        batch,
        grid_spacing=grid_spacing,
        steps=steps,
        init=_options.init_field(init, shape),
        device=device,
    )


def initial_shift_matrix(prep, model, metric, schedule):
    """A translation guess from phase correlation, kept only if it beats the identity.

    Gradient descent from the identity can lock onto a wrong local minimum when the shift
    is a sizeable part of the image; the phase-correlation peak finds large shifts
    outright, also between images of different shapes (a crop and its whole). Computed on
    the finest pyramid level at most 256 pixels a side (cheap), and checked against the
    identity on the coarsest level with the run's own metric.
    """
    level = next(
        i
        for i in reversed(range(len(prep["fixed"])))
        if max(prep["fixed"][i].shape[2:]) <= 256 or i == 0
    )
    f, m = prep["fixed"][level], prep["moving"][level]
    scale = torch.tensor(
        [n / s for n, s in zip(prep["shape"], f.shape[2:])], dtype=f.dtype, device=f.device
    )
    shift = (-phase_correlation(f, m)[0] * scale).double().cpu()
    d = len(prep["shape"])
    guess = torch.eye(d + 1, dtype=torch.float64)
    guess[:d, d] = shift
    coarse_f, coarse_m = prep["fixed"][0], prep["moving"][0]
    loss_fn = level_loss(schedule, tuple(coarse_f.shape[2:]))
    losses = []
    for mat in (None, guess):
        mdl = LinearModel(
            model, prep["shape"], prep["moving_shape"], 1, init=mat, device=prep["device"]
        )
        with torch.no_grad():
            warped, valid = mdl.warp(coarse_m, tuple(coarse_f.shape[2:]))
            w = valid if prep["weights"][0] is None else valid * prep["weights"][0]
            losses.append(float(loss_fn(coarse_f, warped, w)))
    return guess.numpy() if losses[1] < losses[0] else None


def warp_moving(model, moving_raw: torch.Tensor, shape) -> torch.Tensor:
    """The original (un-normalized) moving images ``(N, 1, *S)`` on the fixed grid."""
    with torch.no_grad():
        if isinstance(model, LinearModel):
            mat = model.matrix().to(moving_raw.dtype)
            return warp_affine(moving_raw, mat, output_shape=tuple(shape), padding="grid-constant")
        d = model.displacement(tuple(shape))
        src = moving_raw.expand(d.shape[0], *moving_raw.shape[1:])
        return warp(src, d, padding="grid-constant")


def register_iter(
    fixed,
    moving,
    *,
    model="affine",
    metric="lncc",
    mask=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=8.0,
    regularization=None,
    steps=7,
    init=None,
    device="auto",
    report_every=5,
    optimizer="auto",
    full_resolution=None,
):
    """Generator form of :func:`register`: yields :class:`~.optimize.Progress` snapshots.

    Send a true value (``gen.send(True)``) to stop within one iteration; the generator then
    returns (``StopIteration.value``) the :class:`RegistrationResult` with the best
    transform so far. Closing it (``gen.close()``) also ends the run; the last snapshot's
    ``transform`` is then the best so far.
    """
    start = time.perf_counter()
    levels = _options.levels(levels)
    grid_spacing = _options.positive(grid_spacing, "grid_spacing")
    steps = _options.steps(steps)
    prep = prepare_pair(fixed, moving, model, metric, mask, levels, device)
    iterations = level_iterations(iterations, model, prep["shape"], prep["levels"], full_resolution)
    schedule = make_schedule(
        model, lr, iterations, tol, regularization, report_every, metric, window, optimizer
    )
    mdl = make_model(
        model, prep["shape"], prep["moving_shape"], 1, prep["device"], init, grid_spacing, steps
    )
    if init is None and model in LINEAR_MODELS:
        guess = initial_shift_matrix(prep, model, metric, schedule)
        if guess is not None:
            mdl = make_model(
                model,
                prep["shape"],
                prep["moving_shape"],
                1,
                prep["device"],
                guess,
                grid_spacing,
                steps,
            )
    history: list[float] = []
    loop = optimize(mdl, prep["fixed"], prep["moving"], prep["weights"], schedule, history)
    # ``yield from`` passes each Progress out and each ``send`` (the stop signal) back in.
    stopped = (yield from loop)[0]
    warped = warp_moving(mdl, prep["moving_raw"][None, None], prep["shape"])
    similarity, initial, overlap = _similarities(prep, model, mdl)
    return RegistrationResult(
        transform=mdl.transforms()[0],
        warped=warped[0, 0].cpu().numpy(),
        loss_history=history,
        stopped=stopped,
        model=model,
        metric=metric,
        levels=prep["levels"],
        device=str(prep["device"]),
        similarity=similarity,
        initial_similarity=initial,
        overlap=overlap,
        warnings=assess(similarity, initial, overlap, dense=model not in LINEAR_MODELS),
        seconds=time.perf_counter() - start,
    )


def _similarities(prep, model, mdl) -> tuple[float, float, float]:
    """Final and initial ZNCC of the normalized images over their overlap, and the overlap
    (fraction of the fixed image covered), at the finest level."""
    fixed, moving = prep["fixed"][-1], prep["moving"][-1]
    shape = tuple(fixed.shape[2:])
    if model in LINEAR_MODELS:
        start = LinearModel(model, prep["shape"], prep["moving_shape"], 1, device=fixed.device)
    else:
        start = DenseModel(model, prep["shape"], 1, device=fixed.device)
        start.set_level(shape)
    with torch.no_grad():
        warped, valid = mdl.warp(moving, shape)
        initial_warped, initial_valid = start.warp(moving, shape)
        weight = prep["weights"][-1]
        if weight is not None:
            valid, initial_valid = valid * weight, initial_valid * weight
        final = float(masked_zncc(fixed, warped, valid)[0])
        initial = float(masked_zncc(fixed, initial_warped, initial_valid)[0])
        overlap = float(valid.mean() / (weight.mean() if weight is not None else 1.0))
    return final, initial, overlap


def register(
    fixed,
    moving,
    *,
    model="affine",
    metric="lncc",
    mask=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=8.0,
    regularization=None,
    steps=7,
    init=None,
    device="auto",
    callback=None,
    report_every=5,
    optimizer="auto",
    full_resolution=None,
) -> RegistrationResult:
    """Find the transform that makes ``moving`` look like ``fixed``.

    Parameters
    ----------
    fixed, moving : array-like or torch.Tensor, shape ``(H, W)`` or ``(D, H, W)``
        Any numeric dtype and range (each is rescaled to its 0.5–99.5 percentiles).
        Linear models accept different shapes; dense models need equal shapes.
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
    metric : {"lncc", "ncc", "ssim", "mse"}
    mask : array, shape of ``fixed``, optional
        Non-zero where the fixed image should be matched.
    levels : "auto" or int
        Pyramid levels (auto: halve until the smallest side would drop below 32 px, 16 in 3-D).
    iterations : int or list of int, optional
        Most iterations per level (default 100 for linear, 60 for dense models).
    lr : float, optional
        Initial step in pixels of each level (default 0.5); halved on plateaus.
    tol : float
        Relative loss improvement under which an iteration counts as no progress.
    window : int, optional
        Window of "lncc" (default 9) or "ssim" (default 11).
    grid_spacing : float
        Dense models: control-grid spacing in level pixels (larger is smoother).
    regularization : float, optional
        Dense models: weight of the diffusion regularizer (default 0.05).
    steps : int
        Diffeomorphic: scaling-and-squaring steps.
    init : Transform or array, optional
        Starting transform (a matrix for linear models, a displacement for dense ones).
    device : "auto", "cpu", "cuda", "mps" or a torch.device
    full_resolution : bool, optional
        Optimize on the full-resolution level too. Default (None): only for images up to
        256² (2-D) or 64³ (3-D) pixels; larger ones stop at half resolution, several
        times faster for a loss of a few hundredths of a pixel.
    optimizer : {"auto", "adam", "lbfgs"}
        auto: Adam (L-BFGS stalls on the kinks bilinear interpolation puts in the loss).
    callback : callable(Progress) -> bool, optional
        Called every ``report_every`` iterations with level, iteration, loss and the best
        transform so far; returning True stops the run within one iteration.

    Returns
    -------
    RegistrationResult
        ``.transform``, ``.warped`` (NumPy, fixed's shape), ``.loss_history``.
    """
    run = register_iter(
        fixed,
        moving,
        model=model,
        metric=metric,
        mask=mask,
        levels=levels,
        iterations=iterations,
        lr=lr,
        tol=tol,
        window=window,
        grid_spacing=grid_spacing,
        regularization=regularization,
        steps=steps,
        init=init,
        device=device,
        report_every=report_every,
        optimizer=optimizer,
        full_resolution=full_resolution,
    )
    return drive(run, callback)
