"""Adam with a plateau schedule per pair, the dense models' solver (and the linear ones'
with metrics Gauss–Newton does not take)."""

from __future__ import annotations

import math

import torch

from ..models import read_every
from ._level import Level, not_finite


def make_adam(params, lr: float, iterations: int | None = None):
    """Adam, fused where the device has the fused kernel (one launch per step and no host
    sync: the plain form reads its step count back each step).

    With ``iterations`` (the most steps it will take), :class:`FusedAdam`: the same
    kernel with its step counts made once, so a step is that one launch (torch's counts
    its steps with a second); torch's Adam where it cannot run."""
    if iterations is not None and FusedAdam.runs_on(params):
        return FusedAdam(params, lr, iterations)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # a device without the fused kernel
        return torch.optim.Adam(params, lr=lr)


class FusedAdam:
    """``torch.optim.Adam(params, lr, fused=True)`` (default betas and eps, no weight
    decay) for at most ``iterations`` steps, its state made once: the step counts
    ``1 … iterations`` are one tensor on the device, and step ``k`` hands the fused
    kernel a view of its count (torch's optimizer adds 1 to a count tensor first, a
    launch per step). Takes what the loop uses of an optimizer: ``param_groups[0]["lr"]``
    (read at each step), :meth:`zero_grad` and :meth:`step`. Where the kernel fails at the
    first step (a device torch has none for), torch's Adam takes over, nothing moved."""

    BETAS, EPS = (0.9, 0.999), 1e-8

    def __init__(self, params, lr: float, iterations: int):
        self.params = list(params)
        self.param_groups = [{"lr": float(lr), "params": self.params}]
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        first = self.params[0]
        self.counts = torch.arange(1, iterations + 1, dtype=torch.float32, device=first.device)
        self.taken = 0
        self.fallback = None

    @staticmethod
    def runs_on(params) -> bool:
        return hasattr(torch, "_fused_adam_") and all(
            p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda")
            for p in params
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        if self.fallback is not None:
            self.fallback.param_groups[0]["lr"] = self.param_groups[0]["lr"]
            self.fallback.step()
            return
        if self.taken >= self.counts.numel():
            raise RuntimeError(f"FusedAdam was made for {self.counts.numel()} steps")
        count = self.counts[self.taken]  # a view: no launch
        try:
            torch._fused_adam_(
                self.params,
                [p.grad for p in self.params],
                self.exp_avg,
                self.exp_avg_sq,
                [],
                [count] * len(self.params),
                amsgrad=False,
                lr=self.param_groups[0]["lr"],
                beta1=self.BETAS[0],
                beta2=self.BETAS[1],
                weight_decay=0.0,
                eps=self.EPS,
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )
        except (RuntimeError, NotImplementedError):
            if self.taken:
                raise
            self.fallback = make_adam(self.params, self.param_groups[0]["lr"])
            self.fallback.step()
        self.taken += 1


def solve(level: Level):
    """One level by Adam with a plateau schedule per pair (a generator returning
    ``(stopped, best)``).

    Nothing in an iteration waits on the host: the losses ``(N,)`` of each iteration stay
    on the device, the parameters they belong to are copied into a ring of
    :func:`read_every` slots, and the host reads the losses every :func:`read_every`
    iterations. There it checks that they are finite, keeps the parameters of each pair's
    lowest loss so far (:class:`_Best`, from the ring) and runs each pair's plateau
    schedule over them in order (:class:`_Plateau`: halving the pair's step, ending the
    pair). Progress snapshots hand the losses over unread.

    Each pair has its own step size. Adam's step is linear in its learning rate, so the
    optimizer runs at the largest step of the pairs still going and each pair's update is
    scaled by its own step over that one (a pair that ended is scaled by 0: it stops
    moving); the level ends once every pair has ended. While the pairs share one step (N =
    1 always) nothing is scaled.
    """
    model, schedule, history, pair_history = (
        level.model,
        level.schedule,
        level.history,
        level.pair_history,
    )
    lr0, iterations = level.lr0, level.iterations
    params = model.parameters()
    pairs = params[0].shape[0]
    optimizer = make_adam(params, lr0, iterations)
    every = read_every(level.fixed.device)
    best = _Best(model.snapshot(), every)
    pending = []  # this level's losses ((N,), on the device) not read yet
    plateaus = [_Plateau(lr0, schedule) for _ in range(pairs)]
    back = None  # per parameter, 1 − each pair's step over the optimizer's; None: all 1
    ones = None  # d(Σ losses)/d(losses), made once
    for iteration in range(iterations):
        optimizer.zero_grad(set_to_none=True)
        per_pair = level.evaluate()
        values = per_pair.detach()
        # The loss belongs to the parameters before the step.
        best.hold(len(pending), params)
        pending.append(values)
        if ones is None:
            ones = torch.ones_like(values)
        per_pair.backward(ones)
        before = None if back is None else [p.detach().clone() for p in params]
        optimizer.step()
        if before is not None:
            with torch.no_grad():  # p ← before + (own step / optimizer's) · (p − before)
                for p, b, w in zip(params, before, back):
                    p.lerp_(b, w)
        end = False
        if len(pending) >= every or iteration == iterations - 1:
            rows = torch.stack(pending).tolist()  # (k, N): the one read
            pending = []
            for row in rows:
                if not all(math.isfinite(v) for v in row):
                    raise not_finite()
            best.take(rows)
            for row in rows:
                history.append(sum(row) / len(row))
                if pair_history is not None:
                    pair_history.append(list(row))
                for plateau, value in zip(plateaus, row):
                    plateau.update(value)
            steps = [p.lr for p in plateaus]
            lr = max(steps)
            end = lr == 0.0
            if not end:
                for group in optimizer.param_groups:
                    group["lr"] = lr
                back = None
                if any(s != lr for s in steps):
                    scale = torch.tensor([1.0 - s / lr for s in steps], dtype=params[0].dtype)
                    scale = scale.to(params[0].device)
                    back = [scale.view(-1, *([1] * (p.dim() - 1))) for p in params]
        if end:
            break
        if schedule.report_every and iteration % schedule.report_every == 0:
            loss = values if pending else history[-1]
            signal = yield level.progress(iteration, loss, best.values)
            if signal:
                if pending:  # the best among the losses not read yet (one read)
                    best.take(torch.stack(pending).tolist())
                return True, best.values
    return False, best.values


class _Best:
    """The parameters of each pair's lowest loss so far, picked on the host.

    :meth:`hold` copies the parameters an iteration's loss belongs to into slot ``k`` of a
    ring (one launch per parameter tensor); :meth:`take` reads which slot holds each pair's
    lowest loss among those just read, and where it is lower than the pair's best so far,
    takes the parameters from there (new tensors: a snapshot handed out keeps its values).
    A NaN loss is never lower.
    """

    def __init__(self, start: list, slots: int):
        self.values = start
        self.loss = [math.inf] * start[0].shape[0]
        self.ring = [v.new_empty((slots, *v.shape)) for v in start]

    def hold(self, slot: int, params) -> None:
        for r, p in zip(self.ring, params):
            r[slot].copy_(p.detach())

    def take(self, rows: list) -> None:
        pick = {}  # pair → slot
        for slot, row in enumerate(rows):
            for pair, value in enumerate(row):
                if value < self.loss[pair]:
                    self.loss[pair], pick[pair] = value, slot
        if not pick:
            return
        pairs = len(self.loss)
        if len(pick) == pairs and len(set(pick.values())) == 1:  # one slot for all (N = 1)
            slot = pick[0]
            self.values = [r[slot].clone() for r in self.ring]
            return
        which = sorted(pick)
        index = torch.tensor(which, device=self.ring[0].device)
        slots = torch.tensor([pick[i] for i in which], device=self.ring[0].device)
        updated = []
        for r, v in zip(self.ring, self.values):
            v = v.clone()
            v[index] = r[slots, index]
            updated.append(v)
        self.values = updated


class _Plateau:
    """One pair's plateau schedule: its step ``lr`` is halved after ``patience`` losses
    without a relative improvement of ``tol`` over the best so far, and set to 0 (the
    pair has ended) once it falls below ``lr0 · min_lr_factor``."""

    def __init__(self, lr0: float, schedule):  # an optimize.Schedule
        self.lr, self.floor = lr0, lr0 * schedule.min_lr_factor
        self.tol, self.patience = schedule.tol, schedule.patience
        self.reference, self.since_progress = math.inf, 0

    def update(self, value: float) -> None:
        if self.lr == 0.0:
            return
        ref = self.reference
        if not math.isfinite(ref) or value < ref - self.tol * max(abs(ref), 1e-6):
            self.reference, self.since_progress = min(value, ref), 0
        else:
            self.since_progress += 1
        if self.since_progress >= self.patience:
            self.lr *= 0.5
            self.since_progress = 0
            if self.lr < self.floor:
                self.lr = 0.0
