"""The run plan: one checked set of options for every entry point (register,
register_stack, the CLI, the Register widget), resolved one way."""

import numpy as np
import pytest

from napari_simwarp.registration import register, register_stack
from napari_simwarp.registration.optimize import level_iterations, model_defaults
from napari_simwarp.registration.plan import (
    PRE_BLUR,
    PRE_BLUR_DEFORMABLE,
    PRE_BLUR_MI,
    RunOptions,
)
from tests.registration.cases import deformed_pair


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"model": "warp"}, ValueError, "model"),
        ({"metric": "l2"}, ValueError, "metric"),
        ({"lr": float("nan")}, ValueError, "lr must be finite"),
        ({"lr": 0}, ValueError, "lr must be positive"),
        ({"tol": -1}, ValueError, "tol must be >= 0"),
        ({"steps": 99}, ValueError, "steps must be an int in"),
        ({"window": 0, "metric": "lncc"}, ValueError, "window must be positive"),
        ({"levels": 0}, ValueError, "levels must be 'auto' or a positive int"),
        ({"iterations": [3, -1]}, ValueError, "iterations must be >= 0"),
        ({"regularization": -0.5}, ValueError, "regularization must be >= 0"),
        ({"report_every": 0}, ValueError, "report_every must be a positive int"),
        ({"optimizer": "sgd"}, ValueError, "optimizer"),
        ({"model": "deformable", "optimizer": "gauss-newton"}, ValueError, "gauss-newton"),
        ({"full_resolution": "yes"}, TypeError, "full_resolution"),
        ({"grid_spacing": -2.0, "model": "deformable"}, ValueError, "grid_spacing"),
    ],
)
def test_every_option_is_checked_and_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        RunOptions.make(**kwargs)


def test_defaults_resolve_as_the_engine_documents():
    linear = RunOptions.make("affine")
    assert (linear.metric, linear.solver(), linear.pre_blur) == ("ncc", "gauss-newton", PRE_BLUR)
    assert linear.solver(landmark_term=True) == "adam"  # the landmark term needs a gradient
    dense = RunOptions.make("deformable")
    assert (dense.metric, dense.solver(), dense.pre_blur) == ("lncc", "adam", PRE_BLUR_DEFORMABLE)
    assert RunOptions.make("rigid", "mi").pre_blur == PRE_BLUR_MI
    with pytest.raises(ValueError, match="landmark term"):
        RunOptions.make("affine", optimizer="gauss-newton").solver(landmark_term=True)
    # the per-level iterations are the optimizer module's, one source of defaults
    its = dense.iterations_per_level((128, 128), 3)
    assert its == level_iterations(None, "deformable", (128, 128), 3, None, "adam", "lncc")
    assert max(its) == model_defaults("deformable", "lncc")["iterations"]


def test_kwargs_round_trip_and_stack_refuses_an_optimizer():
    options = RunOptions.make("similarity", "mse", lr=0.25, iterations=[4, 5], window=None)
    assert RunOptions.make(**options.kwargs()) == options
    assert "optimizer" not in RunOptions.make("rigid").kwargs(stack=True)
    with pytest.raises(ValueError, match="register_stack chooses its optimizer"):
        RunOptions.make("affine", optimizer="adam").kwargs(stack=True)


def test_the_stack_optimizer_route_blurs_frames_as_register_blurs_a_pair(monkeypatch):
    """register_stack's optimizer route and register take the pre-blur of one plan (the
    stack's route blurred with σ 1 px where register blurs a deformable pair with 0.6):
    the same σ per axis reaches the blur of both, on an anisotropic grid too, and both
    runs land near the truth."""
    from napari_simwarp.registration import _prepared, _stack_optimizer

    seen = {"pair": [], "stack": []}

    def spy(where, original):
        def blur(x, sigma):
            seen[where].append([round(float(s), 6) for s in sigma])
            return original(x, sigma)

        return blur

    monkeypatch.setattr(_prepared, "gaussian_blur", spy("pair", _prepared.gaussian_blur))
    monkeypatch.setattr(
        _stack_optimizer, "gaussian_blur", spy("stack", _stack_optimizer.gaussian_blur)
    )
    rng = np.random.default_rng(4)
    fixed, moving, truth = deformed_pair(rng, (96, 96), amplitude=2.0)
    kwargs = dict(model="deformable", levels=2, iterations=30)
    spacing = (2.0, 1.0)
    pair = register(fixed, moving, fixed_spacing=spacing, moving_spacing=spacing, **kwargs)
    stack = register_stack(np.stack([fixed, moving]), spacing=spacing, **kwargs)
    expected = [PRE_BLUR_DEFORMABLE / 2.0, PRE_BLUR_DEFORMABLE]
    assert seen["pair"] == [expected, expected]  # fixed, moving
    assert seen["stack"][-2:] == [expected, expected]  # reference, frames
    inner = (slice(None), slice(8, -8), slice(8, -8))
    for transform in (pair.transform, stack.transforms[1]):
        assert np.abs(transform.to_displacement((96, 96)) - truth)[inner].mean() < 0.1
