"""``register``: align one moving image to one fixed image (docs/maths.md §6).

    result = register(fixed, moving, model="affine")   # metric: "ncc" (the default)
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
from ..ops import affine_to_displacement, warp_affine
from ..ops._sampling import affine_grid, grid_inside, grid_sample, level_matrix, sample_displaced
from ..ops._validation import check_choice
from . import _inputs, _landmark_term, _options, search
from ._driver import drive
from ._names import LINEAR_MODELS, METRICS, MODELS, default_metric
from .drift import phase_correlation
from .grid import Grid
from .models import DenseModel, LinearModel
from .optimize import RunResult, level_iterations, make_schedule, optimize, resolve_optimizer
from .pyramid import auto_levels, build_pyramid, gaussian_blur, level_shapes
from .quality import assess, lowest_jacobian, masked_nmi, masked_zncc, measure_for
from .transforms import AffineTransform, DisplacementTransform, Transform


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


#: σ of the pre-blur of both images, in the fixed image's finest pixels
PRE_BLUR = 1.0
#: ... for the linear models with metric "mi": a blur after a non-linear intensity map
#: smears the relation the joint histogram sees, and moves its optimum (bench_quality's
#: 2-D multimodal pair: 0.023 px off with σ 1, 0.008 px with ½, 0.006 px with ¼ or 0;
#: its 3-D pair: 0.032, 0.021, 0.027, 0.027 px; docs/benchmarks.md)
PRE_BLUR_MI = 0.5
#: ... for the deformable model: a lighter blur keeps the fine structure a local
#: deformation is read from. With the B-spline field, metric "ncc" and bending weight 0.5,
#: σ 0.6 gave the lowest end-point error on three draws of both 2-D dense cases of
#: benchmarks/bench_quality.py (σ 0.5, 0.6, 0.7, 0.8, 1.0 measured; issue 16); the default
#: metric "lncc" (weight 4) was measured with it too
PRE_BLUR_DEFORMABLE = 0.6


def _pre_blur(model: str, metric: str) -> float:
    if model == "deformable":
        return PRE_BLUR_DEFORMABLE
    return PRE_BLUR_MI if metric == "mi" and model in LINEAR_MODELS else PRE_BLUR


def prepare_pair(fixed, moving, model, metric, mask, levels, device, grids, smooth=None):
    """Validate, normalize and build pyramids; returns a dict of what a run needs.

    ``grids`` is ``(fixed_spacing, fixed_origin, moving_spacing, moving_origin)`` as the
    user gave them (checked here against the images' dimensionality). ``smooth``: the
    pre-blur's σ in the fixed image's finest pixels (default :data:`PRE_BLUR`;
    :data:`PRE_BLUR_MI` for a linear model with metric "mi", :data:`PRE_BLUR_DEFORMABLE`
    for the deformable model).

    The fixed image's pyramid follows its anisotropy (:func:`~.pyramid.shrink_factors`)
    and the moving image's is built to the same pixel sizes. A dense model needs both
    images on one grid: the moving image is first resampled onto the fixed grid through
    the grids alone (physical identity), and the pixels it does not cover are left out of
    the loss; the model composes that resampling back into its transforms.
    """
    check_choice(model, "model", MODELS)
    check_choice(metric, "metric", METRICS)
    f = _inputs.to_tensor(fixed, "fixed")
    m = _inputs.to_tensor(moving, "moving")
    if f.dim() != m.dim():
        raise ValueError(
            f"fixed and moving must have the same dimensionality, got "
            f"{f.dim()}-D {tuple(f.shape)} and {m.dim()}-D {tuple(m.shape)}"
        )
    _inputs.check_axes_for_model(model, f.shape, "fixed")
    _inputs.check_axes_for_model(model, m.shape, "moving")
    fixed_spacing, fixed_origin, moving_spacing, moving_origin = grids
    fixed_grid = Grid.make(f.dim(), fixed_spacing, fixed_origin, name="fixed")
    moving_grid = Grid.make(m.dim(), moving_spacing, moving_origin, name="moving")
    dev = resolve_device(device)
    dense = model not in LINEAR_MODELS
    _inputs.check_memory(
        1,
        f.shape,
        metric,
        dense,
        dev,
        advice="crop or downsample the images, choose metric='mse' or 'ncc', or another device",
    )
    shape, moving_shape = tuple(f.shape), tuple(m.shape)
    unit = min(fixed_grid.spacing)
    if smooth is None:
        smooth = _pre_blur(model, metric)
    if levels == "auto":
        levels = auto_levels(shape, spacing=fixed_grid.spacing)
    _inputs.check_levels(model, shape, levels, fixed_grid.spacing)
    wmask = _prepare_mask(mask, shape, dev)
    # A light blur of both images (σ: `smooth` fixed-image pixels) takes pixel
    # noise off the gradient and makes bilinear interpolation (exact only for
    # piecewise-linear images) far less biased.
    fn = gaussian_blur(
        _inputs.normalize(f.to(dev), "fixed")[None, None],
        [smooth * unit / s for s in fixed_grid.spacing],
    )
    mn = gaussian_blur(
        _inputs.normalize(m.to(dev), "moving")[None, None],
        [smooth * unit / s for s in moving_grid.spacing],
    )
    fshapes = level_shapes(shape, levels, fixed_grid.spacing)
    resampled = dense and (shape != moving_shape or fixed_grid != moving_grid)
    if resampled:
        onto_fixed = moving_grid.to_pixels() @ fixed_grid.to_physical()
        mn, covered = _onto_grid(mn, onto_fixed, shape)
        if float(covered.sum()) == 0:
            raise ValueError(
                "fixed and moving do not overlap in physical space (check fixed_origin, "
                "moving_origin and the spacings); a dense model needs them to overlap"
            )
        wmask = covered if wmask is None else wmask * covered
        mshapes = fshapes
    else:
        mshapes = level_shapes(moving_shape, levels, moving_grid.spacing, unit)
    weights = (
        [None] * levels
        if wmask is None
        else [(w > 0.5).to(torch.float32) for w in build_pyramid(wmask, fshapes)]
    )
    return dict(
        fixed=build_pyramid(fn, fshapes),
        moving=build_pyramid(mn, mshapes),
        weights=weights,
        moving_raw=m.to(dev),
        shape=shape,
        moving_shape=moving_shape,
        fixed_grid=fixed_grid,
        moving_grid=moving_grid,
        resampled=resampled,
        device=dev,
        levels=levels,
    )


def _onto_grid(image: torch.Tensor, matrix, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """``image`` ``(1, 1, *S)`` sampled at ``matrix`` (fixed → its pixels) over ``shape``,
    edge-repeated, and 1 where a sample fell inside it."""
    mat = torch.as_tensor(matrix, dtype=torch.float64, device=image.device)[None]
    grid = affine_grid(mat, image.shape[2:], shape)
    out = grid_sample(image, grid.to(image.dtype), "linear", "nearest")
    return out, grid_inside(grid, image.shape[2:]).to(torch.float32)


def make_model(prep, model, batch, init, grid_spacing, steps):
    """The model of a run, started from ``init`` (checked: a finite matrix or an
    AffineTransform for linear models; a finite displacement of the fixed image's shape
    or a Transform, for dense ones).

    ``grid_spacing`` is the dense control-grid spacing in physical units; None: 8 of the
    fixed image's finest pixels.
    """
    fixed_grid, moving_grid = prep["fixed_grid"], prep["moving_grid"]
    if model in LINEAR_MODELS:
        return LinearModel(
            model,
            prep["shape"],
            prep["moving_shape"],
            batch,
            init=_options.init_matrix(init, len(prep["shape"]), (fixed_grid, moving_grid)),
            device=prep["device"],
            fixed_grid=fixed_grid,
            moving_grid=moving_grid,
        )
    unit = min(fixed_grid.spacing)
    if prep["resampled"]:
        init = _init_onto_resampled(init, prep)
    return DenseModel(
        model,
        prep["shape"],
        batch,
        grid_spacing=8.0 if grid_spacing is None else grid_spacing / unit,
        steps=steps,
        init=_options.init_field(init, prep["shape"]),
        device=prep["device"],
        spacing=fixed_grid.spacing,
        fixed_grid=fixed_grid,
        moving_grid=moving_grid,
        moving_shape=prep["moving_shape"] if prep["resampled"] else None,
    )


def _init_onto_resampled(init, prep):
    """A dense run's ``init`` in the frame of its field when the moving image was resampled
    onto the fixed grid: the field maps fixed pixels into that copy, so positions in the
    moving image's own pixels (a linear init's matrix M, or ``x + d(x)`` of a field from a
    run on the same two grids) are carried there by G_f⁻¹ · G_m.

    Returns a displacement ``(D, *S)`` in fixed pixels, or ``init`` unchanged when it is
    already in that frame (an array, a field of the field of view, None).
    """
    fixed_grid, moving_grid, shape = prep["fixed_grid"], prep["moving_grid"], prep["shape"]
    onto_resampled = fixed_grid.to_pixels() @ moving_grid.to_physical()
    if isinstance(init, AffineTransform):
        pixels = _options.init_matrix(init, len(shape), (fixed_grid, moving_grid))
        frame = onto_resampled @ pixels
        return affine_to_displacement(torch.as_tensor(frame), shape)[0].float().numpy()
    if isinstance(init, DisplacementTransform) and init.moving_shape is not None:
        if init.moving_shape != tuple(prep["moving_shape"]) or init.shape != tuple(shape):
            raise ValueError(
                f"init maps a fixed image of shape {init.shape} into a moving image of shape "
                f"{init.moving_shape}; this pair has shapes {tuple(shape)} and "
                f"{tuple(prep['moving_shape'])}"
            )
        d = init.to_displacement(shape)
        axes = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
        positions = np.stack(axes) + d  # (D, *S) in the moving image's pixels
        linear, offset = onto_resampled[:-1, :-1], onto_resampled[:-1, -1]
        moved = np.tensordot(linear, positions, axes=1) + offset.reshape(-1, *[1] * len(shape))
        return (moved - np.stack(axes)).astype(np.float32)
    return init


def shift_guess(prep, mdl) -> np.ndarray:
    """The phase-correlation translation guess, a full-resolution pixel matrix: one of
    :func:`~.search.initial_guess`'s candidates. Gradient descent from the identity can
    lock onto a wrong local minimum when the shift is a sizeable part of the image; the
    phase-correlation peak finds large shifts outright, also between images of different
    extents (a crop and its whole).

    Computed on the finest pyramid level at most 256 pixels a side (cheap), with the
    moving level resampled to the fixed level's pixel size over its own extent.
    """
    level = next(
        i
        for i in reversed(range(len(prep["fixed"])))
        if max(prep["fixed"][i].shape[2:]) <= 256 or i == 0
    )
    f, m = prep["fixed"][level], prep["moving"][level]
    f_shape, m_shape = tuple(f.shape[2:]), tuple(m.shape[2:])
    start = mdl.init[:1]  # (1, D+1, D+1) full-resolution pixels, the grids' identity
    at_level = level_matrix(start, prep["moving_shape"], m_shape, prep["shape"], f_shape)[0]
    d = len(f_shape)
    # At the identity, fixed level pixel p sits on moving level pixel a·p + b (diagonal a
    # for two grids without rotation); R(r) = m(a·r) puts the moving level on the fixed
    # level's pixel size, where fixed(p) ≈ R(p + b/a).
    a = torch.diagonal(at_level[:d, :d]).clamp_min(1e-12)
    b = at_level[:d, d]
    r_shape = tuple(max(1, round(n / float(k))) for n, k in zip(m_shape, a))
    scale_r = torch.eye(d + 1, dtype=torch.float64, device=m.device)
    scale_r[:d, :d] = torch.diag(a)
    resampled, _ = _onto_grid(m, scale_r, r_shape)
    s = phase_correlation(f, resampled)[0].double()
    delta = -s - b / a  # fixed level pixels
    scale = torch.tensor([n / k for n, k in zip(prep["shape"], f_shape)], dtype=torch.float64)
    step = torch.eye(d + 1, dtype=torch.float64)
    step[:d, d] = delta.cpu() * scale
    return (start[0].cpu().double() @ step).numpy()


def warp_moving(model, moving_raw: torch.Tensor, shape) -> torch.Tensor:
    """The original (un-normalized) moving images ``(N, 1, *S)`` on the fixed grid."""
    with torch.no_grad():
        if isinstance(model, LinearModel):
            # float64 matrix: the sampling grid is built in float64 (warp_affine promotes)
            return warp_affine(
                moving_raw, model.matrix(), output_shape=tuple(shape), padding="grid-constant"
            )
        d = model.moving_displacement(tuple(shape))
        src = moving_raw.expand(d.shape[0], *moving_raw.shape[1:])
        return sample_displaced(src, d, padding="grid-constant")


def register_iter(
    fixed,
    moving,
    *,
    model="affine",
    metric=None,
    mask=None,
    fixed_spacing=None,
    fixed_origin=None,
    moving_spacing=None,
    moving_origin=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=None,
    regularization=None,
    steps=7,
    init=None,
    landmarks=None,
    landmark_weight=0.0,
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
    check_choice(model, "model", MODELS)
    window = _options.window(window)  # its own error first (a zero or NaN window)
    metric = default_metric(model, metric, window)
    levels = _options.levels(levels)
    grid_spacing = _options.optional_positive(grid_spacing, "grid_spacing")
    steps = _options.steps(steps)
    grids = (fixed_spacing, fixed_origin, moving_spacing, moving_origin)
    prep = prepare_pair(fixed, moving, model, metric, mask, levels, device, grids)
    pairs = _landmark_term.check(landmarks, landmark_weight, model, len(prep["shape"]), init)
    if pairs is not None and pairs[2] > 0 and optimizer == "auto":
        optimizer = "adam"  # the landmark term is no part of Gauss–Newton's least squares
    resolved = resolve_optimizer(optimizer, model, metric)
    if resolved == "gauss-newton" and pairs is not None and pairs[2] > 0:
        raise ValueError(
            "optimizer='gauss-newton' does not take the landmark term: use "
            "landmark_weight=0 (the landmarks then only place the start) or optimizer='adam'"
        )
    iterations = level_iterations(
        iterations, model, prep["shape"], prep["levels"], full_resolution, resolved, metric
    )
    unit = min(prep["fixed_grid"].spacing)
    schedule = make_schedule(
        model, lr, iterations, tol, regularization, report_every, metric, window, resolved, unit
    )
    fixed_grid, moving_grid = prep["fixed_grid"], prep["moving_grid"]
    start_from = init
    if pairs is not None and init is None:
        # The landmarks place the pair: no shift guess, whatever the distance.
        start_from = _landmark_term.initial_transform(
            pairs[0], pairs[1], model, fixed_grid, moving_grid, prep["shape"]
        )
    mdl = make_model(prep, model, 1, start_from, grid_spacing, steps)
    if init is None and pairs is None and model in LINEAR_MODELS:
        # Rotations up to 30° and shifts up to a quarter of the image: see search.py.
        guess = search.initial_guess(prep, mdl.init[0], schedule, model, shift_guess(prep, mdl))
        if guess is not None:
            mdl = make_model(prep, model, 1, guess, grid_spacing, steps)
    penalty = None
    if pairs is not None and pairs[2] > 0:
        penalty = _landmark_term.penalty(
            mdl, pairs[0], pairs[1], pairs[2], fixed_grid, moving_grid, prep["shape"]
        )
    history: list[float] = []
    loop = optimize(
        mdl,
        prep["fixed"],
        prep["moving"],
        prep["weights"],
        schedule,
        history,
        spacing=prep["fixed_grid"].spacing,
        penalty=penalty,
    )
    # ``yield from`` passes each Progress out and each ``send`` (the stop signal) back in.
    stopped = (yield from loop)[0]
    warped = warp_moving(mdl, prep["moving_raw"][None, None], prep["shape"])
    measure = measure_for(metric)
    similarity, initial, overlap = _similarities(prep, model, mdl, measure, start_from)
    transform = mdl.transforms()[0]
    dense = model not in LINEAR_MODELS
    folding = lowest_jacobian(transform.to_displacement(prep["shape"])) if dense else None
    return RegistrationResult(
        transform=transform,
        warped=warped[0, 0].cpu().numpy(),
        loss_history=history,
        stopped=stopped,
        model=model,
        metric=metric,
        levels=prep["levels"],
        device=str(prep["device"]),
        similarity=similarity,
        initial_similarity=initial,
        similarity_measure=measure,
        overlap=overlap,
        warnings=assess(similarity, initial, overlap, dense, measure, folding),
        seconds=time.perf_counter() - start,
    )


def _similarities(prep, model, mdl, measure: str, start=None) -> tuple[float, float, float]:
    """Final and initial similarity (``measure``: "zncc" or "nmi") of the normalized images
    over their overlap, and the overlap (fraction of the fixed image covered), at the
    finest level. "Initial" is at the run's given start (``init`` or the landmarks' fit;
    None: the identity), so that a dense run started from a good linear transform is not
    judged by the unaligned pair."""
    similarity = masked_nmi if measure == "nmi" else masked_zncc
    fixed, moving = prep["fixed"][-1], prep["moving"][-1]
    shape = tuple(fixed.shape[2:])
    start = make_model(prep, model, 1, start, None, 0)
    start.set_level(shape)
    with torch.no_grad():
        warped, valid = mdl.warp(moving, shape)
        initial_warped, initial_valid = start.warp(moving, shape)
        weight = prep["weights"][-1]
        if weight is not None:
            valid, initial_valid = valid * weight, initial_valid * weight
        final = float(similarity(fixed, warped, valid)[0])
        initial = float(similarity(fixed, initial_warped, initial_valid)[0])
        overlap = float(valid.mean() / (weight.mean() if weight is not None else 1.0))
    return final, initial, overlap


def register(
    fixed,
    moving,
    *,
    model="affine",
    metric=None,
    mask=None,
    fixed_spacing=None,
    fixed_origin=None,
    moving_spacing=None,
    moving_origin=None,
    levels="auto",
    iterations=None,
    lr=None,
    tol=1e-4,
    window=None,
    grid_spacing=None,
    regularization=None,
    steps=7,
    init=None,
    landmarks=None,
    landmark_weight=0.0,
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
        They may differ in shape, pixel size and origin.
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
    metric : {"ncc", "lncc", "ssim", "mse", "mi"}, optional
        Default (None): "ncc" (global normalized cross-correlation) for the linear models,
        "lncc" (local NCC) for the dense ones; ``result.metric`` says which ran. "ncc" on
        the deformable model (it then takes ``regularization`` 0.5 and 150 iterations)
        is 2 to 3 % more accurate on pairs that share their intensities exactly, but under
        an illumination that varies by ±5 to ±30 % across the image it folds the field
        (1.5 to 75 px off) where "lncc" stays within 0.08 px (docs/benchmarks.md, issue 16).
    mask : array, shape of ``fixed``, optional
        Non-zero where the fixed image should be matched.
    fixed_spacing, moving_spacing : float or sequence of float, optional
        Pixel size per axis, array order (napari's layer ``scale``); default 1. The
        transform is found in physical space: rigid and similarity stay rigid for the
        sample however anisotropic the voxels, and two images of different pixel sizes
        are compared where they are in space.
    fixed_origin, moving_origin : float or sequence of float, optional
        Physical position of pixel 0 per axis (napari's layer ``translate``); default 0.
    levels : "auto" or int
        Pyramid levels (auto: halve until the smallest shrunk side would drop below 32 px,
        16 in 3-D). An anisotropic volume's finest axes are halved first, until its
        voxels are near-isotropic (as ANTs and elastix do).
    iterations : int or list of int, optional
        Most iterations per level (default 100 for linear, 60 for dense models; 150 for
        the deformable one with metric "ncc").
    lr : float, optional
        Initial step in pixels of each level (default 0.5); halved on plateaus. Adam and
        L-BFGS only: Gauss–Newton sizes its own steps.
    tol : float
        Relative loss improvement under which an iteration counts as no progress (Adam
        and L-BFGS; a Gauss–Newton level ends once a step moves no corner by 10⁻³ level
        pixels, docs/maths.md §6.4).
    window : float, optional
        Window of "lncc" (default 9 pixels) or "ssim" (default 11), in physical units (the
        units of the spacings; pixels by default) at full resolution; each pyramid level
        keeps it in level pixels along its finest axes, and each axis rounds it to the
        nearest odd number of pixels.
    grid_spacing : float, optional
        Dense models: control-grid spacing in physical units at full resolution (default
        8 of the fixed image's finest pixels; larger is smoother), refined with the levels
        as the window is. The deformable field is a cubic B-spline on that grid (as
        elastix's), the diffeomorphic velocity is interpolated linearly.
    regularization : float, optional
        Dense models: weight of the regularizer, chosen by benchmarks/bench_quality.py.
        Deformable: the bending energy of the B-spline field, in the pixels of each
        pyramid level (default 4 with "lncc", 0.5 with "ncc", each measured best with its
        metric); diffeomorphic: the diffusion
        energy (default 0.2). Both in physical units, so every axis is smoothed alike.
    steps : int
        Diffeomorphic: scaling-and-squaring steps.
    init : Transform or array, optional
        Starting transform (a matrix for linear models, a displacement for dense ones).
    landmarks : (fixed_points, moving_points), optional
        Point pairs, each an ``(n, D)`` array in its image's physical coordinates, array
        order (napari's world coordinates of Points on layers placed by the images'
        spacing and origin; pixel coordinates with the default spacing 1 and origin 0),
        as :func:`~.landmarks.fit_landmarks` with grids reads them. Without ``init``, the
        run starts from their least-squares fit of ``model`` (dense models: the affine
        fit) instead of the automatic shift guess: this places pairs too far apart (or
        too rotated) for the pyramid. At least 1 pair (translation), D (rigid,
        similarity) or D + 1 not on one line/plane (affine and dense models).
    landmark_weight : float
        > 0 keeps the landmarks as a soft constraint at every level: ``landmark_weight ·
        mean |T(x_i) − y_i|²`` (physical distance, in the fixed image's finest pixel size)
        is added to the loss (and to the reported loss). With ``init`` *and* landmarks,
        ``init`` starts the run and the landmarks only constrain it, which needs
        ``landmark_weight > 0``.
    device : "auto", "cpu", "cuda", "mps" or a torch.device
    full_resolution : bool, optional
        Optimize on the full-resolution level too. Default (None): with Gauss–Newton for
        images up to 512² (2-D) or 80³ (3-D) pixels, with Adam up to 256² or 64³; larger
        ones stop at half resolution, several times faster for a loss of a few hundredths
        of a pixel.
    optimizer : {"auto", "gauss-newton", "adam", "lbfgs"}
        auto: Gauss–Newton (Levenberg–Marquardt steps, a few per level) for the linear
        models with metric "ncc", "mse" or "mi" (for "mi" the system comes from the
        derivatives of the Parzen joint histogram, docs/maths.md §6.4) and no landmark
        term; Adam otherwise (L-BFGS stalls on the kinks bilinear interpolation puts in
        the loss). "gauss-newton" with
        another model or metric, or with ``landmark_weight > 0``, is refused.
    callback : callable(Progress) -> bool, optional
        Called every ``report_every`` iterations with level, iteration, loss and the best
        transform so far; returning True stops the run within one iteration.

    Returns
    -------
    RegistrationResult
        ``.transform`` (carrying both grids: ``.matrix`` in pixels, fixed → moving;
        ``.physical_matrix`` in physical units), ``.warped`` (NumPy, fixed's shape: the
        moving image resampled onto the fixed grid), ``.loss_history``.
    """
    run = register_iter(
        fixed,
        moving,
        model=model,
        metric=metric,
        mask=mask,
        fixed_spacing=fixed_spacing,
        fixed_origin=fixed_origin,
        moving_spacing=moving_spacing,
        moving_origin=moving_origin,
        levels=levels,
        iterations=iterations,
        lr=lr,
        tol=tol,
        window=window,
        grid_spacing=grid_spacing,
        regularization=regularization,
        steps=steps,
        init=init,
        landmarks=landmarks,
        landmark_weight=landmark_weight,
        device=device,
        report_every=report_every,
        optimizer=optimizer,
        full_resolution=full_resolution,
    )
    return drive(run, callback)
