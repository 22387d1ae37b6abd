"""L-BFGS with a strong-Wolfe line search (few evaluations for the few parameters of a
linear model; it stalls on the kinks bilinear interpolation puts in the loss, so it is
asked for, never chosen)."""

from __future__ import annotations

import math

import torch

from ._level import Level, not_finite


def solve(level: Level):
    """One level by L-BFGS with a strong-Wolfe line search (a generator returning
    ``(stopped, best)``): the line search reads the loss at every evaluation."""
    model, schedule, history, pair_history = (
        level.model,
        level.schedule,
        level.history,
        level.pair_history,
    )
    state = {"best": model.snapshot(), "best_loss": None, "total": math.inf}

    def closure():
        """Loss at the current parameters, with gradients; keeps the best per pair."""
        optimizer.zero_grad(set_to_none=True)
        per_pair = level.evaluate()
        values = per_pair.detach()
        if not torch.isfinite(values).all():
            raise not_finite()
        if state["best_loss"] is None:
            state["best_loss"], state["best"] = values.clone(), model.snapshot()
        else:
            better = values < state["best_loss"]
            if bool(better.any()):
                current = model.snapshot()
                state["best"] = [
                    torch.where(better.view(-1, *([1] * (c.dim() - 1))), c, b)
                    for c, b in zip(current, state["best"])
                ]
                state["best_loss"] = torch.minimum(state["best_loss"], values)
        row = values.tolist()
        total = sum(row) / len(row)
        history.append(total)
        if pair_history is not None:
            pair_history.append(row)
        per_pair.sum().backward()
        state["total"] = total
        return values.sum()

    optimizer = torch.optim.LBFGS(
        model.parameters(),
        lr=1.0,
        max_iter=1,
        history_size=10,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-12,
        tolerance_change=1e-12,
    )
    reference = math.inf
    since_progress = 0
    for iteration in range(level.iterations):
        optimizer.step(closure)
        total = min(state["total"], float(state["best_loss"].mean()))
        # Quasi-Newton: stop once an iteration gains (almost) nothing.
        if total > reference - schedule.tol * max(abs(reference), 1e-6):
            since_progress += 1
            if since_progress >= 2:
                break
        else:
            since_progress = 0
        reference = min(reference, total)
        if schedule.report_every and iteration % schedule.report_every == 0:
            values = [b.clone() for b in state["best"]]
            signal = yield level.progress(iteration, total, values)
            if signal:
                return True, state["best"]
    return False, state["best"]
