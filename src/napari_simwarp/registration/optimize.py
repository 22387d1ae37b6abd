"""The optimization loop: coarse to fine, one level solver per level (:mod:`.solvers`:
Adam with a plateau schedule per pair, L-BFGS, Gauss–Newton), best-so-far kept.

Written as a generator so the same loop serves a blocking call with a callback, a
napari ``thread_worker`` (which yields snapshots and cancels at a yield) and a script
that iterates. Each snapshot is a :class:`Progress`; sending a true value into the
generator (``gen.send(True)``) stops it within one iteration, and the generator then
returns the best parameters found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..ops._lncc_pair import PairLocalNCCLoss
from ..ops._mse_pair import PairMSELoss
from ..ops._ncc_pair import PairNCCLoss
from ..ops._validation import check_choice
from ..ops.losses import loss_for
from . import _options, gauss_newton
from ._names import LINEAR_MODELS
from .models import READ_EVERY, READ_EVERY_DEFAULT, read_every  # noqa: F401 (the policy's home)
from .progress import Progress  # noqa: F401 (its name here: every caller imports it from here)
from .pyramid import level_anisotropy


@dataclass
class Schedule:
    """The knobs of one run (all have defaults that suit ordinary microscopy data).

    lr : step size in pixels of the current level (Adam's step is about ``lr`` per
        iteration at first); halved whenever the loss stops improving.
    iterations : the most iterations per level (coarse → fine), one int or one per level.
    tol : relative loss improvement under which an iteration counts as "no progress".
    patience : iterations without progress before the step is halved.
    min_lr_factor : a level ends once its step has shrunk below ``lr · min_lr_factor``.
    refine_lr_factor : levels after the first start at ``lr · refine_lr_factor`` (they
        start from the coarser level's answer, so big first steps would only undo it).
    reg_weight : weight of the model's regularizer.
    optimizer : "adam", or "lbfgs" (quasi-Newton with a strong-Wolfe line search: for the
        few parameters of a linear model it converges in far fewer evaluations).
    report_every : a :class:`Progress` snapshot every this many iterations.
    metric, metric_options : the similarity loss (a name of ``ops.LOSSES``) and its
        options (``window``, ...).
    """

    lr: float = 0.5
    iterations: int | list[int] = 100
    tol: float = 1e-4
    patience: int = 5
    min_lr_factor: float = 1 / 16
    refine_lr_factor: float = 0.5
    reg_weight: float = 0.0
    report_every: int = 5
    optimizer: str = "adam"
    metric: str = "lncc"
    metric_options: dict = field(default_factory=dict)

    def iterations_at(self, level: int, levels: int) -> int:
        if isinstance(self.iterations, int):
            return self.iterations
        its = list(self.iterations)
        if len(its) != levels:
            raise ValueError(
                f"iterations must be an int or a list of {levels} ints (one per "
                f"level, coarse to fine), got {self.iterations!r}"
            )
        return int(its[level])


@dataclass(kw_only=True)
class RunResult:
    """What every registration run reports besides its transforms.

    loss_history : mean loss of every iteration (coarse levels first; all batches)
    stopped : True when a callback (or ``send``) ended the run early
    model, device : what ran, where
    seconds : wall time of the run
    similarity, initial_similarity : the similarity of the fixed and the warped moving
        image over the pixels they share, after and before registration (for a stack: the
        lowest over the frames; per frame in ``frame_similarity``)
    similarity_measure : what they measure: "zncc" (global ZNCC, in [-1, 1]) or, for
        ``metric="mi"``, "nmi" (normalized mutual information, in [1, 2]); see
        :mod:`~.quality`
    overlap : fraction of the fixed image the warped moving image covers (stack: lowest)
    warnings : why the result looks implausible, if it does (also emitted as
        :class:`~.quality.RegistrationWarning`)
    """

    loss_history: list = field(default_factory=list)
    stopped: bool = False
    model: str = ""
    device: str = "cpu"
    seconds: float = 0.0
    similarity: float = float("nan")
    initial_similarity: float = float("nan")
    similarity_measure: str = "zncc"
    overlap: float = float("nan")
    warnings: list = field(default_factory=list)


def optimize(
    model,
    fixed_levels,
    moving_levels,
    weight_levels,
    schedule: Schedule,
    history: list,
    spacing=None,
    penalty=None,
    *,
    pair_history: list | None = None,
):
    """Run ``model`` coarse → fine; yields :class:`Progress`, returns ``(stopped, best)``.

    Parameters
    ----------
    model : a model from :mod:`.models` (batched over ``N`` pairs)
    fixed_levels, moving_levels : lists of tensors ``(N or 1, C, *s)``, coarse → fine
    weight_levels : list of ``(N or 1, 1, *s)`` fixed-image masks, or ``None`` entries
    history : list the mean loss of every iteration is appended to (coarse levels first)
    spacing : the fixed image's pixel size per axis (default isotropic): sets the loss
        window's shape at each level (:func:`level_loss`)
    penalty : callable ``(level_shape) -> (N,)`` tensor, optional
        A further term of the loss at every level (the landmark constraint), differentiable
        with respect to the model's parameters
    pair_history : list, optional
        Receives, for every iteration (coarse levels first), the list of the ``N`` pairs'
        losses, read with the means of ``history`` (no further host read)

    Convergence is per pair: each pair has its own plateau schedule (Adam) or its own
    convergence test (Gauss–Newton); a pair that has converged stops moving while the
    others go on, and a level ends once every pair has.
    """
    from .solvers import SOLVERS, Level

    levels = len(fixed_levels)
    full_shape = tuple(fixed_levels[-1].shape[2:])
    stopped = False
    best = None
    solve = SOLVERS[schedule.optimizer]
    for index in range(levels):
        fixed, moving, weight = fixed_levels[index], moving_levels[index], weight_levels[index]
        shape = tuple(fixed.shape[2:])
        # One level pixel is this many full-resolution pixels, the unit of the parameters.
        pixel = max(f / s for f, s in zip(full_shape, shape))
        model.set_level(shape)
        anisotropy = None if spacing is None else level_anisotropy(spacing, full_shape, shape)
        loss_fn = level_loss(schedule, shape, anisotropy)
        prepare = getattr(loss_fn, "prepare_moving", None)
        if prepare is not None and schedule.optimizer != "gauss-newton":
            # a loss that does not depend on the moving image's offset and scale centers
            # and scales it once here, not at each iteration (ops/_lncc_pair.py)
            moving = prepare(moving)
        level = Level(
            model=model,
            fixed=fixed,
            moving=moving,
            weight=weight,
            shape=shape,
            loss_fn=loss_fn,
            schedule=schedule,
            history=history,
            pair_history=pair_history,
            penalty=penalty,
            index=index,
            count=levels,
            iterations=schedule.iterations_at(index, levels),
            lr0=schedule.lr * pixel * (1.0 if index == 0 else schedule.refine_lr_factor),
        )
        stopped, best = yield from solve(level)
        model.restore(best)
        if stopped:
            break
    return stopped, best


def level_loss(schedule: Schedule, shape, anisotropy=None):
    """The schedule's loss at a level of spatial ``shape``, one value per pair (``(N,)``).

    The window (of "lncc" and "ssim") is counted in pixels of the level's finest axes;
    along coarser axes of an anisotropic level (``anisotropy``: each axis's pixel size
    over the finest, :func:`~.pyramid.level_anisotropy`) it covers the same physical
    length, rounded to the nearest odd number of pixels (SSIM's Gaussian narrows with it).
    A window larger than a level shrinks to the level's largest odd size that fits.
    """
    options = dict(schedule.metric_options)
    if schedule.metric in ("lncc", "ssim"):
        window = options.get("window") or (9 if schedule.metric == "lncc" else 11)
        ratios = (1.0,) * len(shape) if anisotropy is None else [1.0 / r for r in anisotropy]
        sizes = []
        for n, ratio in zip(shape, ratios):
            fits = max(n if n % 2 else n - 1, 1)
            sizes.append(min(odd_round(window * ratio), fits))
        options["window"] = sizes[0] if len(set(sizes)) == 1 else tuple(sizes)
        if schedule.metric == "ssim" and any(r != 1.0 for r in ratios):
            sigma = options.get("sigma", 1.5)
            options["sigma"] = tuple(sigma * r for r in ratios)
    if schedule.metric == "lncc" and options.get("kernel", "box") == "box":
        # the loop's own form: the fixed level's half made once, no input checks read back
        # (ops/_lncc_pair.py); what loss_for's LocalNCCLoss gives, in a few launches
        loss_for(schedule.metric, reduction="none", **options)  # the options checked
        return PairLocalNCCLoss(window=options["window"], reduction="none")
    if schedule.metric in PAIR_LOSSES and schedule.optimizer != "gauss-newton":
        # the loop's own forms (ops/_ncc_pair.py, ops/_mse_pair.py): the general losses'
        # values in fewer launches (Gauss–Newton takes its residuals its own way)
        loss_for(schedule.metric, reduction="none", **options)  # the options checked
        return PAIR_LOSSES[schedule.metric](reduction="none")
    return loss_for(schedule.metric, reduction="none", **options)


#: metric → the loop's own loss of it (the fixed image's side made once, one autograd
#: Function); "lncc" has its own in :func:`level_loss`
PAIR_LOSSES = {"ncc": PairNCCLoss, "mse": PairMSELoss}


def odd_round(x: float) -> int:
    """The odd integer nearest to ``x`` (at least 1)."""
    return max(1, 2 * math.floor((x - 1) / 2 + 0.5) + 1)


#: the ``optimizer`` choices (docs: :func:`~.pair.register`)
OPTIMIZERS = ("auto", "gauss-newton", "adam", "lbfgs")

#: ``full_resolution=None``: the most pixels (2-D, 3-D) whose finest level is optimized,
#: for Adam (False) and Gauss–Newton (True)
FULL_RESOLUTION_LIMITS = {False: (256**2, 64**3), True: (512**2, 80**3)}

#: per-model defaults: (lr in level pixels, iterations per level, regularizer weight).
#: The dense weight 0.2 (was 0.05) lowered the end-point error on every 2-D case of
#: benchmarks/bench_quality.py and bench_register.py (smooth 256²: 0.085 → 0.072 px,
#: local σ 8 px: 0.100 → 0.094 px, 512²: 0.055 → 0.052 px) with a larger minimum Jacobian
#: determinant; 3-D 64³ ~3 px: 0.089 → 0.093 px (docs/benchmarks.md, issue 16).
#: Deformable 0.3 (with the lighter pre-blur of :data:`~.pair.PRE_BLUR_DEFORMABLE`): mean EPE over
#: four draws of each 2-D dense case of bench_quality, local σ 8 px: 0.0939 → 0.0884 px,
#: smooth: 0.0723 → 0.0677 px, lowest Jacobian determinant 0.733 → 0.737 (issue 16).
#: Deformable now a cubic B-spline with bending energy (models.DenseModel), with its default
#: metric local NCC: weight 4 and 60 iterations (weight 2 folded two of six shaded pairs;
#: 150 iterations changed no draw by more than 0.0005 px; docs/benchmarks.md, issue 16).
DEFAULTS = {
    "translation": dict(lr=0.5, iterations=100, reg_weight=0.0),
    "rigid": dict(lr=0.5, iterations=100, reg_weight=0.0),
    "similarity": dict(lr=0.5, iterations=100, reg_weight=0.0),
    "affine": dict(lr=0.5, iterations=100, reg_weight=0.0),
    "deformable": dict(lr=0.5, iterations=60, reg_weight=4.0),
    "diffeomorphic": dict(lr=0.5, iterations=60, reg_weight=0.2),
}
#: the defaults a metric other than the model's own moves: the B-spline field with global
#: NCC measured best with weight 0.5 and 150 iterations (weights 0.2 to 1 on three draws of
#: each 2-D dense case: 0.4 loses the smooth case, 0.55 the local one; a level of global
#: NCC can take more than 60 iterations)
METRIC_DEFAULTS = {("deformable", "ncc"): dict(iterations=150, reg_weight=0.5)}


def model_defaults(model: str, metric: str | None = None) -> dict:
    """``{"lr", "iterations", "reg_weight"}`` of ``model`` run with ``metric``."""
    return {**DEFAULTS[model], **METRIC_DEFAULTS.get((model, metric), {})}


def level_iterations(
    iterations, model, shape, levels, full_resolution, optimizer="adam", metric=None
):
    """Iterations per level (coarse → fine), with the finest level skipped when asked.

    ``full_resolution=None`` (auto) skips the finest level of images larger than
    :data:`FULL_RESOLUTION_LIMITS` pixels for ``optimizer`` (resolved, as
    :func:`resolve_optimizer` gives it): with Adam one iteration there costs as much as all
    coarser levels together, while the half-resolution answer is already within a few
    hundredths of a pixel for linear models and smooth fields (measured in
    benchmarks/bench_register.py); Gauss–Newton needs only a few steps there, and they
    take the error to a few thousandths of a pixel (docs/benchmarks.md, "Registration
    quality").
    """
    iterations = _options.iterations(iterations)
    if iterations is None:
        iterations = model_defaults(model, metric)["iterations"]
    if not isinstance(iterations, (int, np.integer)):
        its = [int(n) for n in iterations]
        if len(its) != levels:
            raise ValueError(
                f"iterations must be an int or a list of {levels} ints (one per "
                f"level, coarse to fine), got {iterations!r}"
            )
        return its
    its = [int(iterations)] * levels
    if full_resolution is None:
        limits = FULL_RESOLUTION_LIMITS[optimizer == "gauss-newton"]
        full_resolution = int(np.prod(shape)) <= limits[len(shape) == 3]
    if not full_resolution and levels > 1:
        its[-1] = 0
    return its


def resolve_optimizer(optimizer, model: str, metric: str) -> str:
    """The optimizer that runs: ``optimizer`` checked, "auto" resolved.

    auto: Gauss–Newton (:mod:`.gauss_newton`) for the linear models with a sum-of-squares
    metric ("ncc", "mse"): on every linear case of the quality suite at least as accurate
    as elastix's default maps in under half their time, and 2 to 6 times faster than Adam
    (docs/benchmarks.md, "Registration quality"); its Newton-type form for "mi" (on the
    multimodal cases 3 times faster than Adam and more accurate); Adam otherwise (L-BFGS
    stalls on the kinks bilinear interpolation puts in the loss).
    """
    check_choice(optimizer, "optimizer", OPTIMIZERS)
    newton_ok = model in LINEAR_MODELS and metric in gauss_newton.METRICS
    if optimizer == "gauss-newton" and not newton_ok:
        raise ValueError(
            f"optimizer='gauss-newton' needs a linear model ({', '.join(LINEAR_MODELS)}) and "
            f"metric 'ncc', 'mse' or 'mi', got model={model!r}, metric={metric!r}"
        )
    if optimizer == "auto":
        return "gauss-newton" if newton_ok else "adam"
    return optimizer


def make_schedule(
    model,
    lr,
    iterations,
    tol,
    regularization,
    report_every,
    metric,
    window,
    optimizer="auto",
    unit=1.0,
) -> Schedule:
    """The :class:`Schedule` of a run from the user's options (None: the model's default).

    Every option is checked here, before any work: a learning rate that is not a positive
    finite number, a negative regularization, a zero window... each names itself.
    ``window`` is in physical units; ``unit`` (the fixed image's finest pixel size) turns
    it into the pixels :func:`level_loss` counts in.
    """
    d = model_defaults(model, metric)
    optimizer = resolve_optimizer(optimizer, model, metric)
    lr = _options.optional_positive(lr, "lr")
    tol = _options.non_negative(tol, "tol")
    regularization = _options.optional_non_negative(regularization, "regularization")
    report_every = _options.report_every(report_every)
    window = _options.window(window)
    options = {"window": window / unit} if window is not None else {}
    return Schedule(
        lr=d["lr"] if lr is None else float(lr),
        iterations=d["iterations"] if iterations is None else iterations,
        tol=tol,
        reg_weight=d["reg_weight"] if regularization is None else float(regularization),
        report_every=report_every,
        optimizer=optimizer,
        metric=metric,
        metric_options=options,
    )
