"""One pyramid level of a run, as every solver takes it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..progress import Progress


@dataclass
class Level:
    """What a solver needs for one level.

    model : a model of :mod:`..models` over ``N`` pairs, set to this level
    fixed, moving : ``(N or 1, C, *s)`` the level's images; weight: ``(N or 1, 1, *s)`` or
        None
    shape : the level's spatial shape ``s``
    loss_fn : the per-pair loss ``(fixed, warped, weight) -> (N,)``; one with a
        ``takes_base(fixed)`` that says yes also takes ``base=`` ``(N,)`` in place of its
        constant 1 (the loop's NCC losses: the model's ``1 +`` regularizer goes there, no
        launch to add it); ``moving`` is then what its ``prepare_moving`` made, if it has
        one (:func:`~..optimize.optimize`)
    schedule : the run's :class:`~..optimize.Schedule`
    history, pair_history : lists the mean loss (and, when not None, the ``N`` losses) of
        every iteration are appended to
    penalty : a further per-pair term ``(shape) -> (N,)`` (the landmark constraint) or None
    index, count : this level (0: coarsest) and the number of levels
    iterations : the most iterations here; lr0 : the first step, in level pixels scaled
    """

    model: object
    fixed: torch.Tensor
    moving: torch.Tensor
    weight: torch.Tensor | None
    shape: tuple
    loss_fn: object
    schedule: object
    history: list
    pair_history: list | None
    penalty: object
    index: int
    count: int
    iterations: int
    lr0: float

    def evaluate(self):
        """The per-pair loss ``(N,)`` at the model's current parameters (differentiable)."""
        model, schedule, shape = self.model, self.schedule, self.shape
        term = None  # the weighted regularizer, where the model works it out with the warp
        together = getattr(model, "warp_regularized", None)
        # a loss that takes a base (N,) returns base − score where it returns 1 − score:
        # the model hands it 1 + the term, with no launch to add them
        takes_base = getattr(self.loss_fn, "takes_base", None)
        as_base = takes_base is not None and takes_base(self.fixed)
        if together is not None and schedule.reg_weight:
            warped, valid, term = together(self.moving, shape, schedule.reg_weight, as_base)
        else:
            warped, valid = model.warp(self.moving, shape)
        w = valid if self.weight is None else valid * self.weight
        if term is not None and as_base:
            per_pair = self.loss_fn(self.fixed, warped, w, base=term)
        else:
            per_pair = self.loss_fn(self.fixed, warped, w)
        if term is not None:
            if not as_base:
                per_pair = per_pair + term
        elif schedule.reg_weight:  # (one launch: a + weight · b)
            per_pair = torch.add(per_pair, model.regularizer(), alpha=schedule.reg_weight)
        if self.penalty is not None:
            per_pair = per_pair + self.penalty(shape).to(per_pair.device, per_pair.dtype)
        return per_pair

    def progress(self, iteration: int, loss, values) -> Progress:
        """A snapshot at ``iteration`` with the (possibly unread) ``loss`` and the
        parameters ``values`` (copied by the caller)."""
        model = self.model
        return Progress(
            self.index, self.count, iteration, loss, lambda values=values: model.transforms(values)
        )


def not_finite() -> FloatingPointError:
    return FloatingPointError("the loss became NaN or Inf; lower lr or check the inputs")
