"""The optimization loop and its schedule (registration/optimize.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops import LocalNCCLoss, NCCLoss, SSIMLoss
from napari_simwarp.registration._driver import drive
from napari_simwarp.registration.models import LinearModel
from napari_simwarp.registration.optimize import (
    DEFAULTS,
    Progress,
    Schedule,
    level_iterations,
    level_loss,
    make_schedule,
    optimize,
)
from napari_simwarp.registration.pyramid import build_pyramid, level_shapes
from tests.images import random_smooth

# -- the schedule -----------------------------------------------------------------------


def test_iterations_at_takes_an_int_or_one_per_level():
    assert [Schedule(iterations=7).iterations_at(k, 3) for k in range(3)] == [7, 7, 7]
    assert [Schedule(iterations=[5, 3, 1]).iterations_at(k, 3) for k in range(3)] == [5, 3, 1]
    with pytest.raises(ValueError, match=r"iterations must be an int or a list of 3 ints"):
        Schedule(iterations=[5, 3]).iterations_at(0, 3)


@pytest.mark.parametrize("model", ["translation", "affine", "deformable", "diffeomorphic"])
def test_level_iterations_default_to_the_models(model):
    its = level_iterations(None, model, (64, 64), 3, None)
    assert its == [DEFAULTS[model]["iterations"]] * 3


@pytest.mark.parametrize(
    "shape,full_resolution,expected",
    [
        ((256, 256), None, [10, 10, 10]),  # 256² is not larger than 256²: kept
        ((257, 256), None, [10, 10, 0]),  # larger: the finest level is skipped
        ((64, 64, 64), None, [10, 10, 10]),
        ((65, 64, 64), None, [10, 10, 0]),
        ((1024, 1024), True, [10, 10, 10]),
        ((32, 32), False, [10, 10, 0]),
    ],
)
def test_level_iterations_full_resolution_rule(shape, full_resolution, expected):
    assert level_iterations(10, "affine", shape, 3, full_resolution) == expected


def test_level_iterations_never_skip_the_only_level_and_take_lists():
    assert level_iterations(10, "affine", (1024, 1024), 1, False) == [10]
    assert level_iterations(np.int64(4), "affine", (8, 8), 2, True) == [4, 4]
    assert level_iterations([3, 2, 1], "affine", (2048, 2048), 3, None) == [3, 2, 1]
    with pytest.raises(ValueError, match="a list of 3 ints"):
        level_iterations([3, 2], "affine", (64, 64), 3, None)


@pytest.mark.parametrize("model", sorted(DEFAULTS))
def test_make_schedule_defaults_per_model(model):
    s = make_schedule(model, None, None, 1e-4, None, 5, "lncc", None)
    assert (s.lr, s.iterations, s.reg_weight) == (
        DEFAULTS[model]["lr"],
        DEFAULTS[model]["iterations"],
        DEFAULTS[model]["reg_weight"],
    )
    # Dense fields need a smoothness prior; linear models have none to weigh.
    assert (s.reg_weight > 0) == (model in ("deformable", "diffeomorphic"))
    assert s.optimizer == "adam" and s.metric_options == {} and s.metric == "lncc"


def test_make_schedule_takes_the_users_values():
    s = make_schedule("deformable", 0.25, [4, 2], 1e-3, 0.0, 2, "ssim", 7, optimizer="lbfgs")
    assert (s.lr, s.iterations, s.tol, s.reg_weight, s.report_every) == (0.25, [4, 2], 1e-3, 0.0, 2)
    assert (s.optimizer, s.metric, s.metric_options) == ("lbfgs", "ssim", {"window": 7})


def test_make_schedule_rejects_an_unknown_optimizer():
    with pytest.raises(
        ValueError,
        match="optimizer must be one of 'auto', 'gauss-newton', 'adam', 'lbfgs', got 'sgd'",
    ):
        make_schedule("affine", None, None, 1e-4, None, 5, "lncc", None, optimizer="sgd")


@pytest.mark.parametrize(
    "metric,options,shape,window",
    [
        ("lncc", {}, (64, 64), 9),  # the default window, where it fits
        ("lncc", {}, (6, 20), (5, 9)),  # shrunk to the largest odd size that fits, per axis
        ("lncc", {}, (8, 8), 7),
        ("lncc", {"window": 15}, (10, 40), (9, 15)),
        ("lncc", {"window": 5}, (64, 64), 5),
        ("ssim", {}, (64, 64), 11),
        ("ssim", {}, (4, 9, 30), (3, 9, 11)),
    ],
)
def test_level_loss_shrinks_the_window_on_small_levels(metric, options, shape, window):
    loss = level_loss(Schedule(metric=metric, metric_options=options), shape)
    assert isinstance(loss, {"lncc": LocalNCCLoss, "ssim": SSIMLoss}[metric])
    assert loss.window == window and loss.reduction == "none"
    x = torch.rand(2, 1, *shape, dtype=torch.float64)
    assert loss(x, torch.rand_like(x)).shape == (2,)  # the window fits the level


@pytest.mark.parametrize(
    "anisotropy,window",
    [((1.0, 1.0, 1.0), 9), ((5.0, 1.0, 1.0), (1, 9, 9)), ((3.0, 1.0, 1.0), (3, 9, 9))],
)
def test_level_loss_window_covers_one_physical_length_on_anisotropic_levels(anisotropy, window):
    # 9 finest pixels along x and y; along a z whose voxels are 5x (3x) deeper, the same
    # length is 1.8 (3) voxels: rounded to the nearest odd count.
    loss = level_loss(Schedule(metric="lncc"), (40, 64, 64), anisotropy)
    assert loss.window == window


def test_level_loss_of_a_global_metric_has_no_window():
    loss = level_loss(Schedule(metric="ncc"), (4, 4))
    assert isinstance(loss, NCCLoss) and loss.reduction == "none"


# -- the loop ---------------------------------------------------------------------------


def _translation_case(rng, shift, shape=(48, 48), levels=2, metric="ncc", **schedule):
    """A translation model and pyramids with ``fixed(x) = moving(x + shift)``."""
    fixed = random_smooth(rng, shape, sigma=3.0)
    moving = ndi.shift(fixed, shift, order=3, mode="nearest")
    shapes = level_shapes(shape, levels)
    as_t = lambda a: torch.from_numpy(a.astype(np.float32))[None, None]
    model = LinearModel("translation", shape, shape, 1)
    sched = Schedule(metric=metric, **schedule)
    return (
        model,
        build_pyramid(as_t(fixed), shapes),
        build_pyramid(as_t(moving), shapes),
        [None] * levels,
        sched,
    )


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs", "gauss-newton"])
def test_optimize_recovers_a_known_translation(rng, optimizer):
    shift = (2.3, -1.6)
    model, fixed, moving, weights, schedule = _translation_case(
        rng, shift, iterations=60, optimizer=optimizer
    )
    history = []
    stopped, best = drive(optimize(model, fixed, moving, weights, schedule, history))
    assert not stopped
    np.testing.assert_allclose(model.matrix()[0, :2, 2].detach().numpy(), shift, atol=0.05)
    np.testing.assert_allclose(best[0][0].numpy(), shift, atol=0.05)
    assert history[-1] < 0.1 * history[0]


def test_optimize_stops_within_one_iteration_when_sent_true(rng):
    model, fixed, moving, weights, schedule = _translation_case(
        rng, (2.0, 1.0), iterations=50, report_every=1
    )
    history = []
    run = optimize(model, fixed, moving, weights, schedule, history)
    first = next(run)
    assert isinstance(first, Progress) and (first.level, first.iteration) == (0, 0)
    evaluated = len(history)
    with pytest.raises(StopIteration) as done:
        run.send(True)
    stopped, best = done.value.value
    assert stopped
    assert len(history) == evaluated  # no further evaluation, and no finer level
    # The model holds the best parameters seen; the snapshot's transform is the same.
    np.testing.assert_array_equal(model.shift.detach().numpy(), best[0].numpy())
    np.testing.assert_allclose(first.transform.matrix[:2, 2], best[0][0].numpy(), atol=1e-6)


def test_optimize_keeps_the_best_parameters_when_the_loss_goes_up(rng):
    # Near the answer with a huge step, Adam overshoots: later iterates are worse than
    # earlier ones, and the run must end on the best parameters it evaluated.
    model, fixed, moving, weights, schedule = _translation_case(
        rng, (0.4, -0.3), levels=1, metric="mse", lr=6.0, iterations=8, patience=100
    )
    history = []
    drive(optimize(model, fixed, moving, weights, schedule, history))
    assert history[-1] > min(history) + 1e-4  # the loss did go up
    warped, _ = model.warp(moving[0], fixed[0].shape[2:])
    final = float(((warped - fixed[0]) ** 2).mean())
    assert final == pytest.approx(min(history), rel=1e-5)


def test_optimize_raises_on_a_nan_loss(rng):
    model, fixed, moving, weights, schedule = _translation_case(rng, (1.0, 1.0), levels=1)
    fixed[0][..., 10, 10] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        drive(optimize(model, fixed, moving, weights, schedule, []))


def test_a_progress_reads_a_device_loss_only_when_asked():
    from tests._dispatch_count import DispatchCounter

    loss = torch.tensor(0.25)
    with DispatchCounter() as counter:
        progress = Progress(0, 2, 5, loss, list)
    assert counter.syncs == 0  # handing a snapshot out waits for nothing
    with DispatchCounter() as counter:
        assert progress.loss == 0.25 and progress.loss == 0.25
    assert counter.syncs == 1  # read once, on first access
    assert "loss=0.25" in repr(progress)


# -- per-pair convergence ----------------------------------------------------------------


def _dense_pairs(shape=(48, 48)):
    """Three different deformed pairs ``(3, 1, *S)`` each: fields of 2.5, 1 and 0 px (the
    last pair is already registered, so it ends first)."""
    from tests.registration.cases import deformed_pair

    rng = np.random.default_rng(21)
    pairs = [deformed_pair(rng, shape, amplitude) for amplitude in (2.5, 1.0)]
    still = deformed_pair(rng, shape, 1.0)[0]
    pairs.append((still, still, None))
    fixed = torch.from_numpy(np.stack([p[0] for p in pairs])).float()[:, None]
    moving = torch.from_numpy(np.stack([p[1] for p in pairs])).float()[:, None]
    return fixed, moving


def _run_dense(fixed, moving, on_progress=None, levels=2):
    from napari_simwarp.registration.models import DenseModel

    shapes = level_shapes(tuple(fixed.shape[2:]), levels)
    model = DenseModel("deformable", tuple(fixed.shape[2:]), fixed.shape[0])
    schedule = Schedule(iterations=40, reg_weight=1.0, report_every=1)
    history, pair_history = [], []
    run = optimize(
        model,
        build_pyramid(fixed, shapes),
        build_pyramid(moving, shapes),
        [None] * levels,
        schedule,
        history,
        pair_history=pair_history,
    )
    for progress in run:
        if on_progress is not None:
            on_progress(progress, model)
    return model, history, pair_history


def test_adam_converges_per_pair_as_one_pair_at_a_time():
    """A batch of three pairs gives each pair the transform it gets alone: every pair runs
    its own plateau schedule (its own step, its own end). The pairs share no arithmetic,
    so the fields differ by float32 rounding only (a pair alone and in a batch sums in
    another order), which a few hundred Adam steps carry to about 1e-5 px; 1e-3 px is a
    hundredth of the registration's error on these pairs."""
    fixed, moving = _dense_pairs()
    together, history, pair_history = _run_dense(fixed, moving)
    alone = [_run_dense(fixed[i : i + 1], moving[i : i + 1]) for i in range(3)]
    lengths = [len(h) for _, h, _ in alone]
    assert len(set(lengths)) > 1  # the pairs end at different iterations
    assert len(history) == len(pair_history) == max(lengths)
    for i, (model, single, single_pairs) in enumerate(alone):
        expected = model.transforms()[0].to_displacement(tuple(fixed.shape[2:]))
        found = together.transforms()[i].to_displacement(tuple(fixed.shape[2:]))
        np.testing.assert_allclose(found, expected, atol=1e-3)
        assert [row[0] for row in single_pairs] == single
    np.testing.assert_allclose(history, np.mean(pair_history, axis=1), rtol=1e-12)
    # one level: each pair's losses, as long as it ran, are its losses alone
    _, _, pair_history = _run_dense(fixed, moving, levels=1)
    for i in range(3):
        _, single, _ = _run_dense(fixed[i : i + 1], moving[i : i + 1], levels=1)
        assert len(single) <= len(pair_history)
        found = [row[i] for row in pair_history[: len(single)]]
        np.testing.assert_allclose(found, single, rtol=1e-4, atol=1e-6)


def test_a_pair_that_ended_stops_moving_while_the_others_go_on():
    fixed, moving = _dense_pairs()
    _, alone, _ = _run_dense(fixed[2:], moving[2:], levels=1)  # the registered pair, alone
    fields = []
    _run_dense(fixed, moving, lambda p, m: fields.append(m.field.detach().clone()), levels=1)
    # one snapshot per iteration, after its step; the pair's last step was iteration
    # len(alone) - 1, after which it ended
    after = fields[len(alone) - 1 :]
    assert len(after) >= 2
    for f in after[1:]:
        assert torch.equal(f[2], after[0][2])  # the ended pair: not a bit moved
    assert not torch.equal(after[-1][0], after[0][0])  # the first pair went on
    assert not torch.equal(fields[len(alone) - 2][2], after[0][2])  # it moved until then


def _linear_pairs(shape=(48, 56)):
    """Three different affine pairs ``(3, 1, *S)``, the last one already registered."""
    from tests.registration.cases import affine_pair, centered_affine

    rng = np.random.default_rng(5)
    pairs = [
        affine_pair(rng, shape, centered_affine([[1.03, 0.02], [-0.01, 0.98]], (1.5, -0.8), shape)),
        affine_pair(rng, shape, centered_affine([[0.99, -0.03], [0.02, 1.01]], (-0.6, 1.1), shape)),
        affine_pair(rng, shape, np.eye(3)),
    ]
    fixed = torch.from_numpy(np.stack([p[0] for p in pairs])).float()[:, None]
    moving = torch.from_numpy(np.stack([p[1] for p in pairs])).float()[:, None]
    return fixed, moving


def _run_newton(fixed, moving, on_progress=None):
    shape = tuple(fixed.shape[2:])
    model = LinearModel("affine", shape, shape, fixed.shape[0])
    schedule = Schedule(metric="ncc", optimizer="gauss-newton", iterations=30, report_every=1)
    history, pair_history = [], []
    run = optimize(model, [fixed], [moving], [None], schedule, history, pair_history=pair_history)
    for progress in run:
        if on_progress is not None:
            on_progress(progress, model)
    return model, history, pair_history


def test_gauss_newton_converges_per_pair_as_one_pair_at_a_time():
    """Each pair of a batch takes the steps it takes alone (the normal equations are per
    pair; the CPU's bookkeeping is float64, the pixels' sums float32): the matrices agree to
    1e-5 px of corner motion, far below the 1e-3 px convergence tolerance."""
    from tests.registration.cases import corner_error

    fixed, moving = _linear_pairs()
    together, history, pair_history = _run_newton(fixed, moving)
    alone = [_run_newton(fixed[i : i + 1], moving[i : i + 1]) for i in range(3)]
    lengths = [len(h) for _, h, _ in alone]
    assert len(set(lengths)) > 1 and len(history) == max(lengths)
    shape = tuple(fixed.shape[2:])
    for i, (model, single, _) in enumerate(alone):
        found, expected = together.transforms()[i].matrix, model.transforms()[0].matrix
        assert corner_error(found, expected, shape) < 1e-5
        # the losses: float32 sums over the pixels, in another order in a batch
        found = [row[i] for row in pair_history[: len(single)]]
        np.testing.assert_allclose(found, single, rtol=1e-5)


def test_a_gauss_newton_pair_that_converged_stops_moving():
    fixed, moving = _linear_pairs()
    _, alone, _ = _run_newton(fixed[2:], moving[2:])
    thetas = []
    _run_newton(fixed, moving, lambda p, m: thetas.append(m.flat_parameters().clone()))
    # history: the start, then one entry per iteration; the pair took len(alone) - 1 steps
    after = thetas[len(alone) - 2 :]
    assert len(after) >= 2
    for t in after[1:]:
        assert torch.equal(t[2], after[0][2])
    assert not torch.equal(after[-1][0], after[0][0])
