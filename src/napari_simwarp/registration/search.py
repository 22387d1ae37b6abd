"""The starting transform of a linear run: a batched search over rotations and shifts.

Gradient descent from the identity finds rotations up to about 10° and shifts of a few
tenths of the image; beyond, the loss has other minima in between. Before the first
level, :func:`initial_guess` tries a fixed set of candidates at once on the device and
starts the run from the best:

- the identity, and the phase-correlation shift guess of ``_pair_start.shift_guess``
  (each model);
- for rigid, similarity and affine: rotations of the sample about the fixed image's
  center (2-D: −30° to 30° in steps of 5°, 13 angles; 3-D: ±10°, ±20°, ±30° about each
  axis, 19 rotations with none), each followed by the phase-correlation shift between the
  fixed level and the moving level warped by that rotation.

All candidates are warped, phase-correlated and scored as one batch on a search level
(the finest level of at most 128 pixels a side in 2-D, 32 in 3-D), with the run's own
loss over the fixed image's mask. Measured on one CPU core (AMD EPYC, torch 2.13, load
average about 4.5; the search alone, timed around ``initial_guess`` in
``register(..., model="rigid")``, best of 3): 2-D 256² and 512², 18–33 ms; 3-D 48³
(searched at 24³) 69 ms, 64³ (at 32³) 150 ms, 64×72×80 (at 16×18×20) 34 ms. A 3-D
search side of 48 cost 0.66 s on a 48³ volume (searched at full size) for no gain in
the suite's accuracy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .drift import phase_correlation
from .models import LinearModel
from .optimize import level_loss
from .pyramid import level_anisotropy

#: candidate rotations in degrees: 2-D angles; 3-D angles about each axis in turn
ANGLES_2D = tuple(range(-30, 31, 5))
ANGLES_3D = (-30, -20, -10, 10, 20, 30)
#: largest side of the level the search runs on
SEARCH_SIDE = {2: 128, 3: 32}


def rotation_vectors(ndim: int) -> np.ndarray:
    """Candidate rotations ``(K, 1)`` (2-D: angle) or ``(K, 3)`` (3-D: rotation vector, the
    parameters of :class:`~.models.LinearModel`'s rigid skew), radians; the first is none."""
    if ndim == 2:
        angles = [0.0] + [math.radians(a) for a in ANGLES_2D if a != 0]
        return np.array(angles)[:, None]
    rows = [np.zeros(3)]
    for axis in range(3):
        for a in ANGLES_3D:
            v = np.zeros(3)
            v[axis] = math.radians(a)
            rows.append(v)
    return np.stack(rows)


def search_level(prep) -> int:
    """The finest pyramid level with every side at most ``SEARCH_SIDE`` (else the coarsest)."""
    limit = SEARCH_SIDE.get(len(prep.shape), 48)
    for i in reversed(range(len(prep.fixed))):
        if max(prep.fixed[i].shape[2:]) <= limit:
            return i
    return 0


def _model(prep, kind, batch, init):
    return LinearModel(
        kind,
        prep.shape,
        prep.moving_shape,
        batch,
        init=init,
        device=prep.device,
        fixed_grid=prep.fixed_grid,
        moving_grid=prep.moving_grid,
    )


def rotation_candidates(prep, start: np.ndarray, level: int) -> torch.Tensor:
    """Pixel matrices ``(K, D+1, D+1)``: ``start`` followed by each candidate rotation about
    the fixed center, then by the phase-correlation shift that best aligns the rotated
    moving level with the fixed level."""
    d = len(prep.shape)
    vectors = rotation_vectors(d)
    k = len(vectors)
    mdl = _model(prep, "rigid", k, start)
    f, m = prep.fixed[level], prep.moving[level]
    shape = tuple(f.shape[2:])
    with torch.no_grad():
        # The rigid skew is q / radius; q = angle · radius gives the angle itself.
        mdl.linear.copy_(torch.as_tensor(vectors * mdl.radius, dtype=mdl.linear.dtype))
        warped, _ = mdl.warp(m, shape)
        s = phase_correlation(f, warped).cpu().double()  # f(x) ≈ warped(x − s)
        full = torch.tensor([n / k for n, k in zip(prep.shape, shape)], dtype=torch.float64)
        step = torch.eye(d + 1, dtype=torch.float64).repeat(k, 1, 1)
        step[:, :d, d] = -s * full  # fixed(p) ≈ moving(M (p − s)), in full-resolution pixels
        # the candidates' matrices in float64 on the host, from the model's host factors
        q = torch.as_tensor(vectors * mdl.radius)
        core = mdl.physical_core(torch.zeros(k, d, dtype=torch.float64), q).numpy()
        return torch.as_tensor(mdl.left_host @ core @ mdl.right_host) @ step


def score(prep, schedule, matrices: torch.Tensor, level: int) -> torch.Tensor:
    """The run's loss ``(K,)`` of each pixel matrix on ``level`` (lower is better)."""
    f, m, weight = prep.fixed[level], prep.moving[level], prep.weights[level]
    shape = tuple(f.shape[2:])
    loss_fn = level_loss(
        schedule, shape, level_anisotropy(prep.fixed_grid.spacing, prep.shape, shape)
    )
    mdl = _model(prep, "translation", len(matrices), matrices.numpy())
    with torch.no_grad():
        warped, valid = mdl.warp(m, shape)
        w = valid if weight is None else valid * weight
        # Candidates that leave little overlap could score well on a sliver: they pay
        # for the part of the fixed image they leave uncovered.
        losses = loss_fn(f, warped, w).cpu().double()
        covered = (w.flatten(1).mean(1) / (1.0 if weight is None else weight.mean())).cpu()
    return torch.where(covered > 0.3, losses, torch.full_like(losses, math.inf))


def initial_guess(prep, start, schedule, kind: str, shift_guess=None):
    """The best starting pixel matrix ``(D+1, D+1)`` (NumPy) among the candidates, or None
    when the start (``start``, ``(D+1, D+1)`` NumPy, float64) is the best. ``prep``: one
    pair (a :class:`~._prepared.PreparedPairs` of count 1).

    ``shift_guess``: an extra candidate (the phase-correlation shift of the whole images).
    """
    level = search_level(prep)
    candidates = [torch.as_tensor(start, dtype=torch.float64)[None]]
    if shift_guess is not None:
        candidates.append(torch.as_tensor(shift_guess, dtype=torch.float64)[None])
    if kind != "translation":
        candidates.append(rotation_candidates(prep, start, level))
    matrices = torch.cat(candidates)
    losses = score(prep, schedule, matrices, level)
    best = int(torch.argmin(losses))
    return None if best == 0 or not math.isfinite(float(losses[best])) else matrices[best].numpy()
