"""The run plan: the user's options checked once and resolved one way for every entry point.

``register``, ``register_stack``, the command line and the Register widget each turn what
the user chose into a :class:`RunOptions`; from it come the metric and optimizer that run,
the pre-blur, the pyramid's levels and iterations, the schedule and the models
(:func:`build_model`). What a pair needs besides (its images, pyramids and masks) is a
:class:`~._prepared.PreparedPairs`.

    options = RunOptions.make(model="deformable")       # every option checked here
    options.metric, options.solver()                    # "lncc", "adam"
    options.level_count((512, 512)), options.pre_blur   # 5, 0.6
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops._validation import check_choice
from . import _options
from ._names import LINEAR_MODELS, METRICS, MODELS, default_metric

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
#: the dense control grid's default spacing, in the fixed image's finest pixels
CONTROL_SPACING = 8.0
#: iterations per pass of register_stack's translation route (phase correlation, then
#: Gauss–Newton), when none are given
TRANSLATION_ROUTE_ITERATIONS = 10


@dataclass(frozen=True)
class RunOptions:
    """The options of one registration run, checked (:meth:`make` builds one).

    ``metric`` is resolved (the model's default when none was given); ``optimizer`` is the
    user's choice ("auto" included), :meth:`solver` the one that runs. ``window`` and
    ``grid_spacing`` are physical lengths (the units of the fixed image's spacing).
    """

    model: str = "affine"
    metric: str = "ncc"
    levels: str | int = "auto"
    iterations: int | list | None = None
    lr: float | None = None
    tol: float = 1e-4
    window: float | None = None
    grid_spacing: float | None = None
    regularization: float | None = None
    steps: int = 7
    report_every: int = 5
    optimizer: str = "auto"
    full_resolution: bool | None = None

    @classmethod
    def make(
        cls,
        model="affine",
        metric=None,
        *,
        levels="auto",
        iterations=None,
        lr=None,
        tol=1e-4,
        window=None,
        grid_spacing=None,
        regularization=None,
        steps=7,
        report_every=5,
        optimizer="auto",
        full_resolution=None,
    ) -> RunOptions:
        """Every option checked, before any work: each bad value names its argument and
        says what was expected."""
        from .optimize import OPTIMIZERS, resolve_optimizer

        check_choice(model, "model", MODELS)
        window = _options.window(window)  # its own error first (a zero or NaN window)
        metric = default_metric(model, metric, window)
        check_choice(metric, "metric", METRICS)
        check_choice(optimizer, "optimizer", OPTIMIZERS)
        resolve_optimizer(optimizer, model, metric)  # refuses gauss-newton where it can't run
        if full_resolution is not None and not isinstance(full_resolution, (bool, np.bool_)):
            raise TypeError(f"full_resolution must be None, True or False, got {full_resolution!r}")
        return cls(
            model=model,
            metric=metric,
            levels=_options.levels(levels),
            iterations=_options.iterations(iterations),
            lr=_options.optional_positive(lr, "lr"),
            tol=_options.non_negative(tol, "tol"),
            window=window,
            grid_spacing=_options.optional_positive(grid_spacing, "grid_spacing"),
            regularization=_options.optional_non_negative(regularization, "regularization"),
            steps=_options.steps(steps),
            report_every=_options.report_every(report_every),
            optimizer=optimizer,
            full_resolution=None if full_resolution is None else bool(full_resolution),
        )

    @classmethod
    def from_arguments(cls, arguments: dict) -> RunOptions:
        """:meth:`make` from an entry point's arguments (its ``locals()``: the options
        among them are taken by name, the rest left)."""
        return cls.make(**{k: arguments[k] for k in cls.__dataclass_fields__ if k in arguments})

    def kwargs(self, *, stack: bool = False) -> dict:
        """The options as keyword arguments of :func:`~.pair.register` (``stack``: of
        :func:`~.stack.register_stack`, which takes no ``optimizer``: its routes choose)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        optimizer = out.pop("optimizer") if stack else "auto"
        if optimizer != "auto":
            raise ValueError(f"register_stack chooses its optimizer; got optimizer={optimizer!r}")
        return out

    @property
    def dense(self) -> bool:
        """A displacement-field model (deformable, diffeomorphic)."""
        return self.model not in LINEAR_MODELS

    @property
    def pre_blur(self) -> float:
        """σ of the pre-blur of both images, in the fixed image's finest pixels."""
        if self.dense:
            return PRE_BLUR_DEFORMABLE if self.model == "deformable" else PRE_BLUR
        return PRE_BLUR_MI if self.metric == "mi" else PRE_BLUR

    def blur_sigmas(self, spacing) -> list[float]:
        """The pre-blur's σ per axis in pixels of a grid of ``spacing``, measured in the
        finest of those pixels (fewer pixels along coarse axes)."""
        unit = min(spacing)
        return [self.pre_blur * unit / s for s in spacing]

    def solver(self, landmark_term: bool = False) -> str:
        """The optimizer that runs: "gauss-newton", "adam" or "lbfgs". With a landmark term
        ("auto" only) Adam: the term is no part of Gauss–Newton's least squares."""
        from .optimize import resolve_optimizer

        if landmark_term:
            if self.optimizer == "gauss-newton":
                raise ValueError(
                    "optimizer='gauss-newton' does not take the landmark term: use "
                    "landmark_weight=0 (the landmarks then only place the start) or "
                    "optimizer='adam'"
                )
            if self.optimizer == "auto":
                return "adam"
        return resolve_optimizer(self.optimizer, self.model, self.metric)

    def level_count(self, shape, spacing=None) -> int:
        """The pyramid's levels for images of ``shape`` (pixel size ``spacing``)."""
        from .pyramid import auto_levels

        return auto_levels(shape, spacing=spacing) if self.levels == "auto" else self.levels

    def iterations_per_level(self, shape, levels: int, solver: str | None = None) -> list[int]:
        """The most iterations of each level, coarse → fine (0: a level skipped)."""
        from .optimize import level_iterations

        solver = self.solver() if solver is None else solver
        return level_iterations(
            self.iterations, self.model, shape, levels, self.full_resolution, solver, self.metric
        )

    def optimized_levels(self, shape, spacing=None) -> int:
        """How many levels a run on ``shape`` optimizes (a skipped finest level not counted)."""
        its = self.iterations_per_level(shape, self.level_count(shape, spacing))
        return max(1, sum(1 for n in its if n > 0))

    def schedule(self, shape, levels: int, unit: float = 1.0, solver: str | None = None):
        """The :class:`~.optimize.Schedule` of a run on ``shape`` with ``levels`` levels;
        ``unit`` (the fixed image's finest pixel size) turns the physical window into the
        pixels the loss counts in."""
        from .optimize import make_schedule

        solver = self.solver() if solver is None else solver
        its = self.iterations_per_level(shape, levels, solver)
        return make_schedule(
            self.model,
            self.lr,
            its,
            self.tol,
            self.regularization,
            self.report_every,
            self.metric,
            self.window,
            solver,
            unit,
        )

    def control_spacing(self, unit: float = 1.0) -> float:
        """The dense control grid's spacing in the fixed image's finest pixels."""
        return CONTROL_SPACING if self.grid_spacing is None else self.grid_spacing / unit


def build_model(
    options: RunOptions,
    batch: int,
    *,
    shape,
    fixed_grid,
    moving_grid=None,
    moving_shape=None,
    device="cpu",
    init=None,
    resampled: bool = False,
):
    """The model of a run over ``batch`` pairs: a :class:`~.models.LinearModel` or a
    :class:`~.models.DenseModel`, started from ``init`` (already checked: pixel matrices
    ``(N or 1, D+1, D+1)`` for linear models, displacements ``(N or 1, D, *S)`` in fixed
    pixels for dense ones).

    ``moving_shape`` (default: ``shape``) is the moving image's; ``resampled``: a dense
    run whose moving image was resampled onto the fixed grid, which the model composes
    back into its transforms.
    """
    from .models import DenseModel, LinearModel

    moving_grid = fixed_grid if moving_grid is None else moving_grid
    moving_shape = tuple(shape) if moving_shape is None else tuple(moving_shape)
    if not options.dense:
        return LinearModel(
            options.model,
            tuple(shape),
            moving_shape,
            batch,
            init=init,
            device=device,
            fixed_grid=fixed_grid,
            moving_grid=moving_grid,
        )
    return DenseModel(
        options.model,
        tuple(shape),
        batch,
        grid_spacing=options.control_spacing(min(fixed_grid.spacing)),
        steps=options.steps,
        init=init,
        device=device,
        spacing=fixed_grid.spacing,
        fixed_grid=fixed_grid,
        moving_grid=moving_grid,
        moving_shape=moving_shape if resampled else None,
    )
