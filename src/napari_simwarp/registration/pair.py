"""``register``: align one moving image to one fixed image, or a batch of pairs at once
(docs/maths.md §6).

    result = register(fixed, moving, model="affine")   # metric: "ncc" (the default)
    result.transform.matrix     # fixed → moving, what scipy.ndimage.affine_transform takes
    result.warped               # moving resampled onto the fixed grid (NumPy)

    results = register([f0, f1, f2], [m0, m1, m2])     # three pairs, one run, three results

The same run as a generator, for live display and cancellation::

    run = register_iter(fixed, moving)
    for progress in run:        # Progress(level, iteration, loss, transform)
        ...                     # run.send(True) stops within one iteration

The options become one :class:`~.plan.RunOptions`, the images one
:class:`~._prepared.PreparedPairs` (:mod:`._prepared`), the start comes from
:mod:`._pair_start` and the loop from :func:`~.optimize.optimize`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..ops import warp_affine
from ..ops._sampling import sample_displaced
from . import _landmark_term
from ._driver import drive
from ._pair_start import model_for, searched_starts
from ._prepared import PreparedPairs, prepare_pairs
from .models import LinearModel
from .optimize import RunResult, optimize
from .plan import PRE_BLUR, PRE_BLUR_DEFORMABLE, PRE_BLUR_MI, RunOptions  # noqa: F401 (their home)
from .quality import emit, lowest_jacobian, masked_nmi, masked_zncc, measure_for, problems
from .transforms import Transform


@dataclass(kw_only=True)
class RegistrationResult(RunResult):
    """What :func:`register` returns (for a batch, one per pair).

    transform : the best transform found (``.matrix`` for linear models)
    warped : ``moving`` resampled onto the fixed grid, NumPy, shape of ``fixed``; float64
        when ``moving`` is float64 (values beyond float32's range survive), else float32
    metric, levels : the similarity metric and the pyramid levels used
    (and the fields of :class:`~.optimize.RunResult`; in a batch, ``loss_history`` is the
    pair's own loss at every iteration of the batch, ``stopped`` and ``seconds`` the
    batch's)
    """

    transform: Transform
    warped: np.ndarray
    metric: str = ""
    levels: int = 0


def _as_batch(x, name: str) -> list | None:
    """The images of a batch given as a list or tuple of arrays, else None (one image; a
    nested list of numbers is one image too)."""
    if not isinstance(x, (list, tuple)):
        return None
    if len(x) == 0:
        raise ValueError(f"{name} is an empty sequence; expected an image or a list of images")
    if all(getattr(item, "ndim", 0) >= 2 for item in x):
        return list(x)
    return None


def _per_pair(value, count: int, name: str) -> list:
    """One ``value`` for every pair, or a list/tuple of ``count`` (checked)."""
    if (
        isinstance(value, (list, tuple))
        and len(value)
        and (
            value[0] is None or getattr(value[0], "ndim", 0) >= 1 or isinstance(value[0], Transform)
        )
    ):
        if len(value) != count:
            raise ValueError(
                f"{name} holds {len(value)} entries for {count} pairs; expected {count}"
            )
        return list(value)
    return [value]


def _batch_inputs(fixed, moving, mask, init, landmarks):
    """``(fixed list, moving list, masks, inits, batched)``: a single pair as lists of one."""
    fixed_list, moving_list = _as_batch(fixed, "fixed"), _as_batch(moving, "moving")
    batched = fixed_list is not None or moving_list is not None
    if not batched:
        return [fixed], [moving], (None if mask is None else [mask]), [init], False
    fixed_list = fixed_list or [fixed]
    moving_list = moving_list or [moving]
    n_f, n_m = len(fixed_list), len(moving_list)
    if n_f != n_m and 1 not in (n_f, n_m):
        raise ValueError(
            f"fixed has {n_f} images and moving {n_m}; a batch pairs them one to one (equal "
            "counts) or one image with every image of the other side"
        )
    count = max(n_f, n_m)
    if landmarks is not None:
        raise ValueError(
            "landmarks apply to one pair of images; register the pairs with landmarks one at "
            "a time (a batch takes none)"
        )
    masks = None if mask is None else _per_pair(mask, count, "mask")
    inits = _per_pair(init, count, "init")
    return fixed_list, moving_list, masks, inits, True


def warp_moving(model, moving_raw: torch.Tensor, shape) -> torch.Tensor:
    """The original (un-normalized) moving images ``(N or 1, 1, *S_m)`` on the fixed grid,
    ``(N, 1, *S)`` for the model's ``N`` pairs."""
    with torch.no_grad():
        if isinstance(model, LinearModel):
            matrices = model.matrix()
            src = moving_raw.expand(matrices.shape[0], *moving_raw.shape[1:])
            # float64 matrix: the sampling grid is built in float64 (warp_affine promotes)
            return warp_affine(src, matrices, output_shape=tuple(shape), padding="grid-constant")
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
    """Generator form of :func:`register`: yields :class:`~.optimize.Progress` snapshots
    (``transforms``: one per pair).

    Send a true value (``gen.send(True)``) to stop within one iteration; the generator then
    returns (``StopIteration.value``) the :class:`RegistrationResult` (a list of them for
    a batch) with the best transforms so far. Closing it (``gen.close()``) also ends the
    run; the last snapshot's ``transform`` is then the best so far.
    """
    started = time.perf_counter()
    options = RunOptions.from_arguments(locals())  # the options among the arguments
    fixed_list, moving_list, masks, inits, batched = _batch_inputs(
        fixed, moving, mask, init, landmarks
    )
    grids = (fixed_spacing, fixed_origin, moving_spacing, moving_origin)
    prep = prepare_pairs(fixed_list, moving_list, options, masks, device, grids, batched=batched)
    results = yield from run_pairs(
        prep, options, inits, landmarks, landmark_weight, started=started
    )
    return results if batched else results[0]


def run_pairs(prep: PreparedPairs, options: RunOptions, inits, landmarks=None,
              landmark_weight=0.0, *, started=None):  # fmt: skip
    """The run over ``prep``'s pairs (a generator of Progress returning one
    :class:`RegistrationResult` per pair). ``inits``: the user's starts, one for every
    pair or one per pair."""
    started = time.perf_counter() if started is None else started
    ndim = len(prep.shape)
    pairs = _landmark_term.check(landmarks, landmark_weight, options.model, ndim, inits[0])
    solver = options.solver(landmark_term=pairs is not None and pairs[2] > 0)
    schedule = options.schedule(prep.shape, prep.levels, min(prep.fixed_grid.spacing), solver)
    starts = list(inits)
    if pairs is not None and inits[0] is None:
        # The landmarks place the pair: no shift guess, whatever the distance.
        starts = [
            _landmark_term.initial_transform(
                pairs[0], pairs[1], options.model, prep.fixed_grid, prep.moving_grid, prep.shape
            )
        ]
    mdl = model_for(prep, options, starts)
    if pairs is None and not options.dense:
        # The pairs given no start: rotations up to 30° and shifts up to a quarter of the
        # image (search.py).
        unset = [s is None for s in (starts * prep.count if len(starts) == 1 else starts)]
        guesses = searched_starts(prep, options, mdl, schedule, unset)
        if guesses is not None:
            mdl = model_for(prep, options, guesses)
    penalty = None
    if pairs is not None and pairs[2] > 0:
        penalty = _landmark_term.penalty(
            mdl, pairs[0], pairs[1], pairs[2], prep.fixed_grid, prep.moving_grid, prep.shape
        )
    history: list[float] = []
    pair_history: list[list[float]] = []  # per iteration, each pair's loss
    loop = optimize(
        mdl,
        prep.fixed,
        prep.moving,
        prep.weights,
        schedule,
        history,
        spacing=prep.fixed_grid.spacing,
        penalty=penalty,
        pair_history=pair_history if prep.count > 1 else None,
    )
    # ``yield from`` passes each Progress out and each ``send`` (the stop signal) back in.
    stopped = (yield from loop)[0]
    warped = warp_moving(mdl, prep.moving_raw, prep.shape).cpu().numpy()
    measure = measure_for(options.metric)
    similarity, initial, overlap = _similarities(prep, options, mdl, measure, starts)
    transforms = mdl.transforms()
    seconds = time.perf_counter() - started
    results = []
    for i, transform in enumerate(transforms):
        folding = lowest_jacobian(transform.to_displacement(prep.shape)) if options.dense else None
        results.append(
            RegistrationResult(
                transform=transform,
                warped=warped[i, 0] if prep.count == 1 else warped[i, 0].copy(),  # its own
                loss_history=_own_history(history, pair_history, i),
                stopped=stopped,
                model=options.model,
                metric=options.metric,
                levels=prep.levels,
                device=str(prep.device),
                similarity=similarity[i],
                initial_similarity=initial[i],
                similarity_measure=measure,
                overlap=overlap[i],
                warnings=_assessed(
                    i, prep.count, similarity, initial, overlap, options, measure, folding
                ),
                seconds=seconds,
            )
        )
    return results


def _assessed(i, count, similarity, initial, overlap, options, measure, folding) -> list[str]:
    """Pair ``i``'s warnings, emitted; in a batch each names its pair."""
    found = problems(similarity[i], initial[i], overlap[i], options.dense, measure, folding)
    return emit([f"pair {i}: {m}" if count > 1 else m for m in found.values()])


def _own_history(history: list, pair_history: list, i: int) -> list[float]:
    """Pair ``i``'s loss at every iteration of the run (one pair: the run's history). In a
    batch, a pair that ended a level before the others keeps its last loss there."""
    return [row[i] for row in pair_history] if pair_history else list(history)


def _similarities(prep: PreparedPairs, options: RunOptions, mdl, measure: str, starts):
    """Per pair: final and initial similarity (``measure``: "zncc" or "nmi") of the
    normalized images over their overlap, and the overlap (fraction of the fixed image
    covered), at the finest level, as three lists. "Initial" is at the run's given start
    (``init`` or the landmarks' fit; None: the identity), so that a dense run started from
    a good linear transform is not judged by the unaligned pair."""
    similarity = masked_nmi if measure == "nmi" else masked_zncc
    fixed, moving = prep.fixed[-1], prep.moving[-1]
    shape = tuple(fixed.shape[2:])
    start = model_for(prep, options, starts)
    start.set_level(shape)
    with torch.no_grad():
        warped, valid = mdl.warp(moving, shape)
        initial_warped, initial_valid = start.warp(moving, shape)
        weight = prep.weights[-1]
        if weight is not None:
            valid, initial_valid = valid * weight, initial_valid * weight
        final = similarity(fixed, warped, valid).reshape(-1)
        initial = similarity(fixed, initial_warped, initial_valid).reshape(-1)
        covered = valid.flatten(1).mean(1)
        if weight is not None:
            covered = covered / weight.flatten(1).mean(1)
    n = prep.count
    return (
        [float(v) for v in final.expand(n).cpu()],
        [float(v) for v in initial.expand(n).cpu()],
        [float(v) for v in covered.expand(n).cpu()],
    )


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
) -> RegistrationResult | list[RegistrationResult]:
    """Find the transform that makes ``moving`` look like ``fixed``.

    Parameters
    ----------
    fixed, moving : array-like or torch.Tensor, shape ``(H, W)`` or ``(D, H, W)``
        Any numeric dtype and range (each is rescaled to its 0.5–99.5 percentiles).
        They may differ in shape, pixel size and origin. A list (or tuple) of images
        registers a batch of pairs in one run: ``N`` fixed and ``N`` moving images of one
        shape each (pairs ``(fixed[i], moving[i])``), or one image on one side for every
        image of the other (a template against many samples). Each pair has its own
        result and converges on its own; a ``(N, H, W)`` array is one 3-D image: pass
        ``list(array)`` for ``N`` pairs.
    model : {"translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic"}
    metric : {"ncc", "lncc", "ssim", "mse", "mi"}, optional
        Default (None): "ncc" (global normalized cross-correlation) for the linear models,
        "lncc" (local NCC) for the dense ones; ``result.metric`` says which ran. "ncc" on
        the deformable model (it then takes ``regularization`` 0.5 and 150 iterations)
        is 2 to 3 % more accurate on pairs that share their intensities exactly, but under
        an illumination that varies by ±5 to ±30 % across the image it folds the field
        (1.5 to 75 px off) where "lncc" stays within 0.08 px (docs/benchmarks.md, issue 16).
    mask : array, shape of ``fixed``, optional
        Non-zero where the fixed image should be matched (a batch: one for every pair, or
        a list of one per pair).
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
        Starting transform (a matrix for linear models, a displacement for dense ones); a
        batch takes one for every pair or a list of one per pair (None entries: none).
    landmarks : (fixed_points, moving_points), optional
        Point pairs, each an ``(n, D)`` array in its image's physical coordinates, array
        order (napari's world coordinates of Points on layers placed by the images'
        spacing and origin; pixel coordinates with the default spacing 1 and origin 0),
        as :func:`~.landmarks.fit_landmarks` with grids reads them. Without ``init``, the
        run starts from their least-squares fit of ``model`` (dense models: the affine
        fit) instead of the automatic shift guess: this places pairs too far apart (or
        too rotated) for the pyramid. At least 1 pair (translation), D (rigid,
        similarity) or D + 1 not on one line/plane (affine and dense models). One pair of
        images only: a batch takes no landmarks.
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
    RegistrationResult, or a list of them (one per pair) for a batch
        ``.transform`` (carrying both grids: ``.matrix`` in pixels, fixed → moving;
        ``.physical_matrix`` in physical units), ``.warped`` (NumPy, fixed's shape: the
        moving image resampled onto the fixed grid), ``.loss_history``.
    """
    # every other argument of the signature, passed on by name (one list of options: the
    # signature's)
    arguments = {k: v for k, v in locals().items() if k not in ("fixed", "moving", "callback")}
    run = register_iter(fixed, moving, **arguments)
    return drive(run, callback)
