"""A registration run as a stream of display snapshots, for the "Register" widget.

:class:`RegistrationRun` wraps :func:`napari_simwarp.register_iter` (pairs, 2-D or 3-D)
and :func:`napari_simwarp.register_stack_iter` (time-lapse drift correction)
and turns their progress into what napari layers show: the warped moving image, the loss
curve, the displacement field and the similarity-gradient field as subsampled
``(n, 2, D)`` Vectors data. :meth:`RegistrationRun.snapshots` is a generator, so a
napari ``thread_worker`` can drive it (one yield per snapshot: progress bar and
cancellation at each) and :meth:`RegistrationRun.stop` ends it within one iteration.
No Qt, no napari.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..registration._driver import relay
from ._arrays import as_float_array
from .curves import (
    Curve,
    FrameShifts,
    frame_similarity_curve,
    shift_curve,
    similarity_curve,
)
from .vectors import auto_spacing, field_to_vectors, grid_positions, normalized_scale

MODES = ("pair", "stack")
REFERENCES = ("first", "mean", "previous")

#: result layer names, formatted with the moving layer's name
WARPED_LAYER = "{moving} registered"
DISPLACEMENT_LAYER = "displacement"
GRADIENT_LAYER = "similarity gradient"


@dataclass
class RunSettings:
    """What the widget's controls hold.

    mode : "pair" (fixed + moving, 2-D or 3-D) or "stack" (a ``(T, *S)`` moving stack
        aligned to a reference frame; the fixed layer is not used)
    metric : "auto" (the engine's default for the model: "ncc" for linear models,
        "lncc" for dense ones) or a name of ``registration.METRICS``
    levels : 0 or "auto" for automatic, else the number of pyramid levels
    iterations : per level; None for the engine's default
    vector_spacing : pixels between displayed arrows; None: about 20 per axis
    show_gradient : also compute the similarity-gradient field (pairs only)
    landmark_weight : weight of the landmarks' soft constraint (0: they only start the run)
    min_interval : seconds between two snapshots' heavy display data (warped image,
        fields); snapshots in between carry only the loss
    vectors_interval : seconds between two snapshots' fields (displacement and similarity
        gradient arrows, costlier to compute and to draw than the warped image); None: as
        ``min_interval``
    yield_interval : least seconds between two snapshots yielded without display data
        (those in between are merged into the next): each crosses to the GUI thread
    live_after : seconds from the run's start before its first snapshot (the final one
        excepted) and before any display data is computed: a run shorter than that
        shows its result only. A live display of a run that ends within a moment shows
        nothing a user can follow, and costs it: with software OpenGL each display took
        the worker 0.05-0.1 s on 2 cores, a third of a 0.3 s affine run (issue 27)
    """

    mode: str = "pair"
    model: str = "affine"
    metric: str = "auto"
    levels: int | str = "auto"
    iterations: int | None = None
    device: str = "auto"
    reference: str = "first"
    report_every: int = 5
    vector_spacing: int | None = None
    show_gradient: bool = True
    landmark_weight: float = 0.0
    min_interval: float = 0.0
    vectors_interval: float | None = None
    yield_interval: float = 0.0
    live_after: float = 0.0


@dataclass
class Snapshot:
    """One display update. Array fields are None when not refreshed in this snapshot."""

    step: int
    level: int
    levels: int
    iteration: int
    loss: float
    losses: list = field(default_factory=list)
    #: pyramid level of each entry of ``losses`` (0: coarsest), for one colour per level
    loss_levels: list = field(default_factory=list)
    #: what the plot shows: the loss per snapshot (pairs), per frame (drift; the frames'
    #: similarity once done), see :mod:`.curves`
    curve: Curve | None = None
    warped: np.ndarray | None = None
    displacement: np.ndarray | None = None
    gradient: np.ndarray | None = None
    final: bool = False
    stopped: bool = False
    #: drift runs: the last frame of the batch being aligned (1-based) and the frames in
    #: all; the pass (1-based) and the passes (a "mean" reference aligns twice)
    frame: int | None = None
    frames: int | None = None
    frame_pass: int = 1
    passes: int = 1
    #: pair runs: the pyramid level in napari's numbering (0: full resolution)
    pyramid_level: int | None = None
    #: the similarity shown (e.g. "ZNCC 0.953"), when this snapshot measured it
    similarity: str = ""

    def merged_into(self, older: Snapshot | None) -> Snapshot:
        """This snapshot, its missing arrays taken from ``older`` (a snapshot not shown):
        a display that skips snapshots still shows the newest of each array."""
        if older is None:
            return self
        return replace(
            self,
            **{
                name: getattr(older, name)
                for name in ("warped", "displacement", "gradient")
                if getattr(self, name) is None
            },
        )

    def describe(self) -> str:
        """The status line: drift runs count frames; pairs name the pyramid level as
        napari does (0: full resolution) and give the similarity when measured."""
        state = "stopped" if self.stopped else "done" if self.final else "running"
        if self.frames is not None:
            done = self.frames if self.final else self.frame
            passes = f" (pass {self.frame_pass}/{self.passes})" if self.passes > 1 else ""
            return f"{state}: frame {done}/{self.frames}{passes}"
        level = self.pyramid_level if self.pyramid_level is not None else self.level
        where = "full resolution" if level == 0 else f"{level} above full resolution"
        text = f"{state}: level {level} ({where}), iteration {self.iteration}"
        return f"{text}, {self.similarity}" if self.similarity else text


class RegistrationRun:
    """One registration, driven by :meth:`snapshots`; ``result`` once it has finished.

    ``fixed_grid`` and ``moving_grid`` (:class:`~napari_simwarp.registration.grid.Grid`,
    from the layers' scale and translate; None: unit) place the two images in space; the
    displayed displacement is then physical, in fixed pixels. In stack mode
    ``moving_grid`` (the stack layer's, time axis left out) is the frames' grid, passed
    to ``register_stack`` as ``spacing`` and ``origin``.
    ``landmarks`` (pairs only): ``(fixed_points, moving_points)`` in world (physical)
    coordinates, :func:`points_to_world`; they start the run (and constrain it with
    ``settings.landmark_weight > 0``).
    """

    def __init__(
        self,
        fixed,
        moving,
        settings: RunSettings | None = None,
        fixed_grid=None,
        moving_grid=None,
        landmarks=None,
    ):
        from ..registration.plan import RunOptions

        self.settings = s = settings or RunSettings()
        self.fixed_grid, self.moving_grid = fixed_grid, moving_grid
        if s.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {s.mode!r}")
        # The engine's own checks and defaults, before anything is read ("auto": the
        # model's default metric; 0 levels: automatic).
        self.options = RunOptions.make(
            s.model,
            None if s.metric == "auto" else s.metric,
            levels="auto" if s.levels in ("auto", None, 0) else s.levels,
            iterations=s.iterations,
            report_every=max(1, int(s.report_every)),
        )
        from ..io.lazy import is_lazy

        # A dask/zarr time-lapse stays lazy: register_stack streams it, and the display is
        # a lazy stack too (napari reads only the plane it shows). Nothing is read here, on
        # the GUI thread.
        self.lazy = s.mode == "stack" and is_lazy(moving)
        self.moving = moving if self.lazy else np.asarray(moving)
        if s.mode == "pair":
            if fixed is None:
                raise ValueError("choose a fixed layer (or the time-lapse mode for a stack)")
            # A Plane (widgets_logic.planes) of a lazy or multiscale layer is read in the
            # worker (snapshots()), after the budget check below; arrays are checked now.
            self.fixed = fixed if _is_plane(fixed) else as_float_array(fixed, "fixed")
            self.moving = moving if _is_plane(moving) else as_float_array(moving, "moving")
            fixed_shape, moving_shape = tuple(self.fixed.shape), tuple(self.moving.shape)
            if len(fixed_shape) != len(moving_shape):
                raise ValueError(
                    f"fixed and moving must have the same dimensionality, got "
                    f"{fixed_shape} and {moving_shape}"
                )
            self.shape = fixed_shape
            self.landmarks = check_landmarks(landmarks, s, len(fixed_shape))
            self._refuse_beyond_budget(moving_shape)
        else:
            if landmarks is not None:
                raise ValueError("landmarks apply to pairs; the time-lapse mode takes none")
            self.landmarks = None
            shape = tuple(self.moving.shape)
            if len(shape) not in (3, 4) or shape[0] < 2:
                raise ValueError(
                    f"the time-lapse mode needs a (T, H, W) or (T, D, H, W) "
                    f"moving stack with T ≥ 2, got shape {shape}"
                )
            if not self.lazy:
                self.moving = self.moving.astype(np.float32, copy=False)
            self.fixed = None
            self.shape = self.moving.shape[1:]
        self.levels = self._levels()
        self.run_levels = self._optimized_levels()
        self.spacing = s.vector_spacing or auto_spacing(self.shape)
        self.result = None
        self.losses: list[float] = []
        self.loss_levels: list[int] = []
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._normalized = None
        #: drift correction: the stack frame the viewer is on, the one frame the live
        #: display warps (set from the GUI thread when the user moves the slider)
        self.focus = 0
        self._focus_shown = None  # (frame, its transform, the frame warped) last shown
        self._current: dict = {}
        self._frame_shifts = None  # drift runs: the live curve against the frame index
        self._step = 0
        #: pair runs: the similarity curve (iteration across levels, value, napari level)
        self.similarities: list[tuple[int, float, int]] = []
        self._iteration_base, self._last_report = 0, None  # (level, iteration) last seen
        self._measure = None  # "zncc" or "nmi": what the result reports
        self._similarity_inputs = None  # the images as the engine measures them
        self._pass, self._last_start = 0, None  # drift: the pass, the last batch's start
        self._last_heavy = self._last_vectors = -np.inf
        self._started = -np.inf  # when snapshots() began (perf_counter)

    # -- sizes ---------------------------------------------------------------------------
    def _refuse_beyond_budget(self, moving_shape) -> None:
        """A pair whose run would exceed the memory budget is refused before anything is
        read, with the figures and what to do."""
        from .._devices import resolve_device
        from ..io import budget
        from ..registration._inputs import estimate_bytes

        s, options = self.settings, self.options
        need = estimate_bytes(1, self.shape, options.metric, options.dense)
        need += 4 * (int(np.prod(self.shape)) + int(np.prod(moving_shape)))  # the images read
        budget.refuse(
            need,
            budget.memory_budget(None, resolve_device(s.device)),
            what=f"registering a pair of shape {self.shape} ({s.model}, metric {options.metric!r})",
            advice="pick a coarser level of a multiscale layer, or crop the layers",
        )

    def _levels(self) -> int:
        spacing = self.fixed_grid.spacing if self.fixed_grid is not None else None
        return self.options.level_count(self.shape, spacing)

    def _optimized_levels(self) -> int:
        """The pyramid levels a pair's run optimizes (what its status counts): all of
        them, but for a finest level the engine skips (above Adam's full-resolution size,
        :func:`~..registration.optimize.level_iterations`)."""
        if self.settings.mode != "pair":
            return self.levels
        spacing = self.fixed_grid.spacing if self.fixed_grid is not None else None
        return self.options.optimized_levels(self.shape, spacing)

    def _iterations(self) -> int:
        """The most iterations of a level (of a pass over the frames, in drift mode)."""
        from ..registration.plan import TRANSLATION_ROUTE_ITERATIONS

        s = self.settings
        if s.iterations is not None:
            return int(s.iterations)
        if s.mode == "stack" and s.model == "translation":
            return TRANSLATION_ROUTE_ITERATIONS
        return max(self.options.iterations_per_level(self.shape, self.levels))

    def expected_steps(self) -> int:
        """About how many snapshots a full run yields (for the progress bar's total)."""
        s = self.settings
        its = self._iterations()
        if s.mode == "stack":  # counted in frames (times the passes)
            return max(1, self.frame_total * self.passes)
        return max(1, self.run_levels * -(-its // max(1, s.report_every)))

    @property
    def frame_total(self) -> int:
        """Drift runs: the frames aligned (a "previous" reference aligns frames 1…T-1)."""
        total = int(self.moving.shape[0])
        return total - 1 if self.settings.reference == "previous" else total

    @property
    def passes(self) -> int:
        """Drift runs: how many times the frames are aligned (the translation route aligns
        them to a first estimate of a "mean" reference, then to the mean of those)."""
        s = self.settings
        return 2 if s.reference == "mean" and s.model == "translation" else 1

    def pyramid_level(self, level: int) -> int:
        """An engine level (0: coarsest) in napari's numbering (0: full resolution)."""
        return int(self.levels) - 1 - int(level)

    @property
    def shows_gradient(self) -> bool:
        """Whether the snapshots carry the similarity gradient: asked for, and a pair on
        one grid (the gradient is taken on the fixed image's pixels)."""
        s = self.settings
        return (
            s.mode == "pair"
            and s.show_gradient
            and tuple(self.moving.shape) == tuple(self.shape)
            and self.fixed_grid == self.moving_grid
        )

    # -- control ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the run to end within one iteration (the best result so far is kept)."""
        self._stop.set()

    def abort(self) -> None:
        """End the run at the engine's next progress report, with no result: the engine's
        generator is closed there (nothing is computed after it, nothing is kept), and
        :meth:`snapshots` yields no final snapshot. For a closing viewer or widget, whose
        run must end within a second, not finish its last level."""
        self._abort.set()
        self._stop.set()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _engine_kwargs(self) -> dict:
        """The run's options (its :class:`~..registration.plan.RunOptions`, with the
        levels counted here), grids and landmarks, as the engine takes them."""
        s = self.settings
        kw = replace(self.options, levels=self.levels).kwargs(stack=s.mode != "pair")
        kw["device"] = s.device
        if s.mode == "pair":
            for role, grid in (("fixed", self.fixed_grid), ("moving", self.moving_grid)):
                if grid is not None:
                    kw[f"{role}_spacing"], kw[f"{role}_origin"] = grid.spacing, grid.origin
            if self.landmarks is not None:
                kw["landmarks"] = self.landmarks
                kw["landmark_weight"] = float(s.landmark_weight)
        elif self.moving_grid is not None:
            kw["spacing"], kw["origin"] = self.moving_grid.spacing, self.moving_grid.origin
        return kw

    # -- snapshots -------------------------------------------------------------------------
    def snapshots(self):
        """Yield :class:`Snapshot` s; the last one has ``final=True`` (``self.result`` set),
        unless the run was :meth:`abort` ed."""
        from ..registration import register_iter, register_stack_iter

        if _is_plane(self.fixed):  # a lazy or multiscale layer's plane: read here, once
            self.fixed = self.fixed.read()
        if _is_plane(self.moving):
            self.moving = self.moving.read()
        # The first arrows come one interval into the run (its first snapshots show an
        # almost untouched field; a short run gets its arrows with the final snapshot).
        self._started = self._last_vectors = time.perf_counter()
        if self.settings.mode == "pair":
            run = register_iter(self.fixed, self.moving, **self._engine_kwargs())
            fill = self._fill_pair_progress
        else:
            self._current = {}
            self._frame_shifts = FrameShifts(self.moving.shape[0], len(self.shape))
            run = register_stack_iter(
                self.moving, reference=self.settings.reference, **self._engine_kwargs()
            )
            fill = self._fill_stack_progress
        res = yield from self._coalesced(
            relay(run, lambda p: self._snapshot(p, fill), self._stop.is_set)
        )
        if self.aborted:
            return
        self.result = res
        history = [float(v) for v in res.loss_history]
        last_level = self.loss_levels[-1] if self.loss_levels else 0
        snap = Snapshot(
            self._step + 1,
            self.run_levels - 1 if self.settings.mode == "pair" else 0,
            self.run_levels if self.settings.mode == "pair" else 1,
            0,
            history[-1] if history else float("nan"),
            # The curve of the snapshots (one point per snapshot, its level known), ending
            # on the final value; the engine's full history is in ``self.result``.
            [*self.losses, *history[-1:]],
            [*self.loss_levels, *([last_level] if history else [])],
            final=True,
            stopped=res.stopped,
        )
        if self.settings.mode == "pair":
            snap.pyramid_level = self.pyramid_level(last_level)
            self._fill_pair(snap, res.transform, warped=res.warped, final=True)
            self._final_similarity(res, last_level)
        else:
            snap.frame, snap.frames = self.frame_total, self.frame_total
            snap.frame_pass = snap.passes = self.passes
            snap.step = self.expected_steps()  # every frame of every pass
        snap.curve = self._curve(snap, res)
        if self.settings.mode != "pair":
            snap.warped = res.warped
            snap.displacement = self._stack_vectors(dict(enumerate(res.transforms)))
        yield snap

    def _coalesced(self, snapshots):
        """``snapshots`` passed on when one carries display data (warped image, arrows) or
        ``settings.yield_interval`` has passed since the last; the others are merged into
        the next (the losses are cumulative): each yield crosses to the GUI thread.
        Returns what ``snapshots`` returns."""
        interval, pending, last = self.settings.yield_interval, None, -np.inf
        try:
            while True:
                if self.aborted:  # the finally closes the engine's generator where it is
                    return None
                try:
                    snap = next(snapshots)
                except StopIteration as done:
                    return done.value
                if self.aborted:
                    return None
                pending = snap.merged_into(pending)
                now = time.perf_counter()
                if self._quiet(now):
                    continue
                heavy = any(
                    getattr(pending, name) is not None
                    for name in ("warped", "displacement", "gradient")
                )
                if heavy or now - last >= interval:
                    last, out, pending = now, pending, None
                    yield out
        finally:
            snapshots.close()

    def _quiet(self, now: float | None = None) -> bool:
        """Whether the run is still within its first ``settings.live_after`` seconds."""
        now = time.perf_counter() if now is None else now
        return now - self._started < self.settings.live_after

    def _heavy_due(self, final: bool) -> bool:
        now = time.perf_counter()
        if final or now - self._last_heavy >= self.settings.min_interval:
            self._last_heavy = now
            return True
        return False

    def _snapshot(self, progress, fill) -> Snapshot:
        """A display update from an engine's progress; ``fill`` adds the heavy data when due."""
        self.losses.append(float(progress.loss))
        self.loss_levels.append(int(progress.level))
        self._step += 1
        snap = Snapshot(
            self._step,
            int(progress.level),
            min(int(progress.levels), self.run_levels),
            int(progress.iteration),
            float(progress.loss),
            list(self.losses),
            list(self.loss_levels),
        )
        new_level = False
        if self._frame_shifts is not None:
            self._count_frames(snap, progress)
        else:
            snap.pyramid_level = self.pyramid_level(progress.level)
            new_level = self._last_report is None or self._last_report[0] != progress.level
            self._count_iterations(int(progress.level), int(progress.iteration))
        # Each level's first report is measured too (a level shorter than the interval
        # would have no point on the similarity curve), except within the quiet start:
        # the levels it spans have their curve's points at its ends only (before the
        # run and the result, from _final_similarity).
        if self._quiet():  # nothing is shown yet: no display data made
            if self._frame_shifts is not None:
                self._record_frames(progress)  # the live shift plot's frames, all of them
        elif self._heavy_due(new_level):
            fill(snap, progress)
        snap.curve = self._curve(snap)
        return snap

    def _count_iterations(self, level: int, iteration: int) -> None:
        """The iteration counted across levels (the similarity curve's x)."""
        last = self._last_report
        if last is not None and level != last[0]:
            self._iteration_base += last[1] + 1
        self._last_report = (level, iteration)

    def _count_frames(self, snap: Snapshot, progress) -> None:
        """A drift snapshot's progress in frames: the batch's last frame, the pass (a
        batch starting before the last one did starts the next pass), and the progress
        bar's step (frames of the passes done, plus the frames before this batch and the
        share of this batch's iterations done)."""
        start, stop = progress.frames.start, progress.frames.stop  # moving frames
        if self._last_start is not None and start < self._last_start:
            self._pass += 1
        self._last_start = start
        its = max(1, self._iterations())
        share = min(1.0, (int(progress.iteration) + 1) / its)
        n = self.frame_total
        snap.frame, snap.frames = min(stop, n), n
        snap.frame_pass, snap.passes = min(self._pass + 1, self.passes), self.passes
        snap.step = min(self._pass, self.passes - 1) * n + start + int((stop - start) * share)

    def _curve(self, snap: Snapshot, result=None) -> Curve:
        """The plot of ``snap``: see :mod:`.curves` (what a pair and a drift run plot)."""
        if self._frame_shifts is None:
            label = "ZNCC" if self._measure in (None, "zncc") else "normalized MI"
            x, y, lv = zip(*self.similarities) if self.similarities else ((), (), ())
            return similarity_curve(x, y, lv, label)
        if result is None:
            return self._frame_shifts.curve()
        sim = getattr(result, "frame_similarity", None)
        if all(hasattr(t, "translation") for t in result.transforms):
            return shift_curve(result.shifts, sim)
        return frame_similarity_curve(sim if sim is not None else [])

    def _similarity(self, transform, warped) -> float | None:
        """The similarity the result will report (ZNCC, or normalized MI for
        ``metric="mi"``) of ``warped`` with the fixed image, over the fixed pixels the
        moving image covers (the moving domain warped alike), for the curve. None where
        it cannot be measured."""
        import torch

        from ..registration.quality import masked_nmi, masked_zncc, measure_for

        metric = self.options.metric
        self._measure = measure = measure_for(metric)
        if self._similarity_inputs is None:
            self._similarity_inputs = self._prepared_for_similarity(metric)
        f, m, ones = self._similarity_inputs
        shape = self.shape
        moved = transform.apply(m, order=1, output_shape=shape).astype(np.float32, copy=False)
        covered = transform.apply(ones, order=1, output_shape=shape) > 0.999
        if not covered.any():
            return None
        w, v = (
            torch.from_numpy(np.ascontiguousarray(a, np.float32))[None, None]
            for a in (moved, covered)
        )
        score = (masked_zncc if measure == "zncc" else masked_nmi)(f, w, v)
        return float(score.reshape(-1)[0])

    def _prepared_for_similarity(self, metric: str):
        """The fixed image ``(1, 1, *S)``, the moving image ``S_m`` and a moving-sized
        array of ones, as the engine measures the result's similarity: each image scaled
        to its robust range and lightly blurred (the pre-blur of
        :func:`~..registration._prepared.prepare_pairs`, in the fixed image's pixels)."""
        import torch

        from ..registration._inputs import normalize
        from ..registration.pyramid import gaussian_blur

        smooth = self.options.pre_blur
        grids = (self.fixed_grid, self.moving_grid)
        spacings = [
            np.ones(len(self.shape)) if g is None else np.asarray(g.spacing, np.float64)
            for g in grids
        ]
        unit = float(min(spacings[0]))
        out = []
        for image, name, spacing in zip((self.fixed, self.moving), ("fixed", "moving"), spacings):
            t = normalize(torch.from_numpy(np.ascontiguousarray(image)), name)[None, None]
            out.append(gaussian_blur(t, [smooth * unit / float(sp) for sp in spacing]))
        moving = out[1][0, 0].numpy()
        return out[0], moving, np.ones(moving.shape, np.float32)

    def _final_similarity(self, result, engine_level: int) -> None:
        """The curve's first point (before the run) and last (the result), the values the
        result reports, so the curve and the final status agree."""
        from ..registration.quality import measure_for

        self._measure = measure_for(result.metric)
        level = self.pyramid_level(engine_level)
        # the level the run began on (every report's level is kept, quiet or not; the
        # first measured point may come from a later level, after the quiet start)
        first_level = self.pyramid_level(self.loss_levels[0]) if self.loss_levels else level
        end = self._iteration_base + (self._last_report[1] + 1 if self._last_report else 0)
        self.similarities = [
            (0, float(result.initial_similarity), first_level),
            *[p for p in self.similarities if 0 < p[0] < end],
            (end, float(result.similarity), level),
        ]

    def _fill_pair_progress(self, snap: Snapshot, progress) -> None:
        self._fill_pair(snap, progress.transform, warped=None)
        value = self._similarity(progress.transform, snap.warped)
        if value is not None:
            x = self._iteration_base + int(progress.iteration)
            self.similarities.append((x, value, self.pyramid_level(progress.level)))
            label = "ZNCC" if self._measure == "zncc" else "normalized MI"
            snap.similarity = f"{label} {value:.3f}"

    def _fill_stack_progress(self, snap: Snapshot, progress) -> None:
        self._record_frames(progress)
        self._fill_stack(snap, self._current)

    def _record_frames(self, progress) -> None:
        """Keep the transforms of a drift batch's frames (the live display's, the shift
        plot's)."""
        # With reference="previous", moving frame i is stack frame i + 1.
        offset = 1 if self.settings.reference == "previous" else 0
        frames = progress.frames
        for i, t in zip(range(frames.start, frames.stop), progress.transforms):
            self._current[i + offset] = t
        self._frame_shifts.update(self._current)

    def _vectors_due(self, final: bool) -> bool:
        interval = self.settings.vectors_interval
        interval = self.settings.min_interval if interval is None else interval
        now = time.perf_counter()
        if final or now - self._last_vectors >= interval:
            self._last_vectors = now
            return True
        return False

    def _fill_pair(self, snap: Snapshot, transform, warped, final: bool = False) -> None:
        shape = self.shape
        snap.warped = (
            warped
            if warped is not None
            else transform.apply(self.moving, order=1, output_shape=shape).astype(
                np.float32, copy=False
            )
        )
        if not self._vectors_due(final):
            return
        disp = transform.to_displacement(shape)
        snap.displacement = field_to_vectors(physical_displacement(transform, disp), self.spacing)
        if self.shows_gradient:
            snap.gradient = self._gradient_vectors(disp)

    def _gradient_vectors(self, disp: np.ndarray) -> np.ndarray:
        import torch

        from .._devices import resolve_device
        from ..ops import similarity_gradient
        from ..registration._inputs import normalize

        dev = resolve_device(self.settings.device)
        if self._normalized is None:
            # The images the optimizer sees: each scaled to its robust range.
            self._normalized = tuple(
                normalize(torch.from_numpy(a), name)[None, None].to(dev)
                for a, name in ((self.fixed, "fixed"), (self.moving, "moving"))
            )
        f, m = self._normalized
        d = torch.from_numpy(np.ascontiguousarray(disp))[None].to(dev)
        g = similarity_gradient(f, m, d, metric=self.options.metric)[0].cpu().numpy()
        # The gradient's units are loss per pixel; scale it so the longest arrow spans
        # 80 % of the grid spacing (its direction and relative size are what matter).
        sub = g[(slice(None),) + tuple(slice(None, None, self.spacing) for _ in self.shape)]
        return field_to_vectors(g, self.spacing, normalized_scale(sub, 0.8 * self.spacing))

    def _fill_stack(self, snap: Snapshot, current: dict) -> None:
        snap.warped = self._live_stack(current)
        snap.displacement = self._stack_vectors(current)

    def _live_stack(self, current: dict):
        """The stack as shown during the run, ``(T, *S)`` lazy: the frame the viewer is on
        (:attr:`focus`) warped by its current transform, warped again only when the frame
        or its transform changed; the other frames as they are (NumPy stacks) or blank
        (lazy ones: nothing is read for the display but the focused frame, here)."""
        t = min(max(int(self.focus), 0), int(self.moving.shape[0]) - 1)
        tr = current.get(t)
        shown = self._focus_shown
        if shown is None or shown[0] != t or shown[1] is not tr:
            frame = self._read_frame(t)
            image = frame if tr is None else self._warp_frame(t, tr, frame)
            shown = self._focus_shown = (t, tr, image)
        raw = None if self.lazy else self.moving
        return focus_stack(raw, int(self.moving.shape[0]), shown[0], shown[2])

    def _read_frame(self, t: int) -> np.ndarray:
        if not self.lazy:
            return self.moving[t]
        from ..io import lazy

        return as_float_array(lazy.read(self.moving, (t,)), "the frame")

    def _warp_frame(self, t: int, transform, frame: np.ndarray) -> np.ndarray:
        """Frame ``t`` ``S`` warped by its transform (the live display's only warp)."""
        return transform.apply(frame, order=1).astype(np.float32, copy=False)

    def _stack_vectors(self, transforms: dict) -> np.ndarray:
        """One set of arrows per frame ``(n, 2, 1 + D)`` (time first); linear transforms are
        evaluated at the arrows' positions only (no dense field per frame)."""
        parts = []
        positions = grid_positions(self.shape, self.spacing)
        if all(getattr(tr, "kind", None) == "translation" for tr in transforms.values()):
            # A translation moves every pixel alike: one arrow per frame, at its centre,
            # not a grid of identical ones (thousands over a movie, hiding it).
            positions = (np.asarray(self.shape, np.float64)[None] - 1) / 2
        for t, tr in sorted(transforms.items()):
            matrix = getattr(tr, "matrix", None)
            if matrix is not None:
                d = len(self.shape)
                m = np.asarray(matrix, np.float64)
                vec = (positions @ m[:d, :d].T + m[:d, d] - positions).astype(np.float32)
                v = np.stack([positions.astype(np.float32), vec], axis=1)
            else:
                v = field_to_vectors(tr.to_displacement(self.shape), self.spacing)
            pos = np.concatenate([np.full((len(v), 1), t, np.float32), v[:, 0]], axis=1)
            vec = np.concatenate([np.zeros((len(v), 1), np.float32), v[:, 1]], axis=1)
            parts.append(np.stack([pos, vec], axis=1))
        d = len(self.shape) + 1
        return np.concatenate(parts) if parts else np.zeros((0, 2, d), np.float32)

    # -- after the run -----------------------------------------------------------------------
    @property
    def transforms(self) -> list:
        """The result's transforms (one for a pair, one per frame for a stack)."""
        if self.result is None:
            return []
        return list(getattr(self.result, "transforms", None) or [self.result.transform])


def physical_displacement(transform, displacement: np.ndarray) -> np.ndarray:
    """A transform's displacement ``(D, *S)`` (fixed pixels → moving pixels) as the
    physical motion of each fixed pixel, counted in fixed pixels per axis:
    ``(G_m(x + d(x)) − G_f(x)) / spacing_f``. Equal to ``displacement`` when both images
    share one grid."""
    fixed_grid, moving_grid = transform.grids()
    if fixed_grid == moving_grid:
        return displacement
    d = displacement.shape[0]
    view = (-1,) + (1,) * d
    axes = np.meshgrid(
        *[np.arange(n, dtype=np.float64) for n in displacement.shape[1:]], indexing="ij"
    )
    x = np.stack(axes)
    moved = (x + displacement) * np.reshape(moving_grid.spacing, view) + np.reshape(
        moving_grid.origin, view
    )
    here = x * np.reshape(fixed_grid.spacing, view) + np.reshape(fixed_grid.origin, view)
    return ((moved - here) / np.reshape(fixed_grid.spacing, view)).astype(np.float32)


def points_to_world(layer, role: str) -> np.ndarray:
    """A napari Points layer's points in world (physical) coordinates, ``(n, D)`` float64:
    ``data · scale + translate``. A layer that napari also rotates, shears or transforms by
    its ``affine`` is refused (as image layers are, :func:`~.geometry.layer_grid`)."""
    from .geometry import layer_grid

    grid = layer_grid(layer, role)
    data = np.asarray(layer.data, dtype=np.float64).reshape(-1, grid.ndim)
    return data * np.asarray(grid.spacing) + np.asarray(grid.origin)


def landmarks_from_layers(fixed_layer, moving_layer):
    """``(fixed_points, moving_points)`` in world coordinates from two Points layers (or
    None when neither is given; one without the other is an error)."""
    if fixed_layer is None and moving_layer is None:
        return None
    if fixed_layer is None or moving_layer is None:
        raise ValueError(
            "landmarks need both a fixed points layer and a moving points layer (or neither)"
        )
    return (
        points_to_world(fixed_layer, "fixed points"),
        points_to_world(moving_layer, "moving points"),
    )


def check_landmarks(landmarks, settings: RunSettings, ndim: int):
    """Landmarks for a pair run, checked before it starts: None or two ``(n, ndim)`` arrays
    of one length (the engine checks the rest: enough pairs for the model, finite)."""
    if landmarks is None:
        if settings.landmark_weight:
            raise ValueError("a landmark weight needs fixed and moving points; choose both layers")
        return None
    fixed_points, moving_points = (np.asarray(p, dtype=np.float64) for p in landmarks)
    for points, role in ((fixed_points, "fixed"), (moving_points, "moving")):
        if points.ndim != 2 or points.shape[1] != ndim:
            raise ValueError(
                f"the {role} points must be {ndim}-D like the images, got points of shape "
                f"{points.shape}"
            )
    if len(fixed_points) != len(moving_points):
        raise ValueError(
            f"the fixed and moving points must come in pairs (point i of one layer matches "
            f"point i of the other): got {len(fixed_points)} fixed and {len(moving_points)} "
            "moving points"
        )
    return fixed_points, moving_points


def focus_stack(stack, total: int, t: int, frame: np.ndarray):
    """A ``(total, *S)`` float32 dask array, one frame per chunk: ``frame`` at ``t``, the
    other frames of ``stack`` (an in-memory float32 NumPy stack) or blank (``stack``
    None). Computing a frame copies nothing but that frame; each call makes a new array
    (a new name), so a viewer never shows an earlier call's frames from its cache."""
    import uuid

    import dask.array as da

    shape = tuple(frame.shape)

    def block(block_id):
        i = block_id[0]
        if i == t:
            return frame[None]
        if stack is not None:
            return stack[i : i + 1]
        return np.zeros((1, *shape), np.float32)

    return da.map_blocks(
        block,
        chunks=((1,) * int(total), *((n,) for n in shape)),
        dtype=np.float32,
        meta=np.empty((0,) * (1 + len(shape)), np.float32),
        name=f"simwarp-live-{uuid.uuid4().hex}",
    )


def _is_plane(x) -> bool:
    """Whether ``x`` is a :class:`~napari_simwarp.widgets_logic.planes.Plane` (read on
    demand) rather than an array."""
    return hasattr(x, "source") and hasattr(x, "read")
