"""Levenberg–Marquardt (damped Gauss–Newton) steps for the linear models at one level.

A linear model has few parameters ``θ`` (2 to 12) and its loss is, or has the optimum of,
a sum of squares over the pixels (docs/maths.md §6.4): for ``metric="mse"`` the residual
is ``r = w − f`` (``w``: the warped moving level, ``f``: the fixed level); for
``metric="ncc"`` it is the residual after the best intensity fit, ``r = α w + β − f``,
whose least-squares minimum over ``(α, β)`` is ``Σ W (f − f̄)² · (1 − ZNCC²)``: the
global NCC optimum wherever the correlation is positive. Each step solves

    (JᵀWJ + λ diag(JᵀWJ)) δ = −JᵀWr,    J = ∂r/∂θ = α ∇w(T(x)) · ∂T(x)/∂θ,

with ``∇w`` the moving level's central-difference gradient sampled where the pixels land
and ``∂T/∂θ`` from :meth:`~.models.LinearModel.matrix_jacobian`; for NCC, ``(α, β)`` join
``θ`` in the system (columns ``w`` and 1): the Gauss–Newton step of the joint problem. The
small normal equations are formed from float32 pixels and solved in float64. ``W`` is
the fixed image's mask times :func:`edge_taper` of both images' edges. A step is kept
when it lowers the run's loss (then ``λ`` shrinks), else ``λ`` grows and the step is
retried; a pair is done once a step moves no corner of the fixed level by
:data:`TOLERANCE` level pixels (:data:`MI_TOLERANCE` for "mi"), or once the loss refuses
a step shorter than :data:`REFUSED_TOLERANCE`. Near the optimum the convergence is
quadratic: a few steps per level where Adam takes tens.

``metric="mi"`` runs the same steps with another system, on the device
(:class:`DeviceMutualInformationProblem`; the Gaussian window on the host,
:class:`MutualInformationProblem`): it builds the gradient and a positive semi-definite
approximate Hessian of the loss from the derivatives of the Parzen joint histogram
(docs/maths.md §6.4, §10.3).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..ops._numerics import moment_dtype
from ..ops._sampling import affine_grid, grid_sample, level_matrix
from ..ops.mutual_information import (
    _Parzen,
    bin_coordinates,
    bspline_histograms,
    bspline_pixel_derivatives,
    cell_taps,
    frame_of,
    joint_histogram,
    joint_jacobian,
    moving_taps,
    parzen_frames,
    pixel_derivatives,
    score_and_gradient,
    score_curvature,
    score_of_joint,
)
from .models import read_every, rotation_generators, wide_dtype
from .models import rotation_series as models_rotation_series

#: metrics whose loss is a sum of squares over the pixels (after the intensity fit for NCC),
#: and the mutual information (a Fisher-information matrix in place of ``JᵀWJ``)
METRICS = ("ncc", "mse", "mi")
#: a level ends once no corner of the fixed image moves this many level pixels in a step
TOLERANCE = 1e-3
#: metric "mi": its level ends once no corner moves this many level pixels. Its steps
#: converge linearly (each about a quarter of the one before), so what such a step leaves
#: is about a third of it. On five draws each of bench_quality's multimodal pairs (2-D
#: 256², 3-D 48³; docs/benchmarks.md, issue 16): 1e-2 changed no corner error by more than
#: 1e-4 px against 1e-3; 2e-2 saved one more step of the finest level on 2 of 5 draws in
#: 2-D and in 3-D, the corner errors within 7e-4 px (one 2-D draw 0.0084 → 0.0091 px, one
#: 3-D draw 0.0201 → 0.0178 px; elastix 0.014 to 0.030 px on these pairs)
MI_TOLERANCE = 2e-2
#: ... or once the loss refuses a step that moves no corner this many level pixels
REFUSED_TOLERANCE = 0.02
#: width in level pixels of the weight's ramp at the edges of both images (:func:`edge_taper`)
TAPER = 2.0
#: metric "mi": the histogram's own curvature joins the Hessian on levels of at most
#: this many pixels (:class:`MutualInformationProblem`)
COUPLING_PIXELS = 32 * 32
#: Levenberg–Marquardt damping: start, shrink on success, grow on failure, give up above
DAMPING = dict(start=1e-3, shrink=0.1, grow=10.0, most=1e6)


def axis_gradients(x: torch.Tensor, dims) -> list[torch.Tensor]:
    """The derivative of ``x`` along each axis of ``dims`` (each of ``x``'s shape):
    central differences, one-sided at the edges, in pixels. An axis of one pixel (a
    1 × 40 image, a 1 × 24 × 24 volume, the coarsest level of a deep pyramid) has no
    difference to take: its derivative is 0, so nothing moves the image along it
    (``torch.gradient`` refuses such an axis)."""
    dims = list(dims)
    long = [dim for dim in dims if x.shape[dim] > 1]
    found = dict(zip(long, torch.gradient(x, dim=long))) if long else {}
    return [found[dim] if dim in found else torch.zeros_like(x) for dim in dims]


def gradient_channels(moving: torch.Tensor) -> torch.Tensor:
    """``moving`` ``(N, 1, *S)`` followed by its derivative along each array axis, central
    differences (one-sided at the edges; 0 along an axis of one pixel), in level pixels:
    ``(N, 1 + D, *S)``."""
    d = moving.dim() - 2
    grads = axis_gradients(moving, range(2, 2 + d))
    return torch.cat([moving, *grads], dim=1)


def pixel_coordinates(shape, dtype, device) -> torch.Tensor:
    """Homogeneous pixel coordinates of a level about its center, ``(D + 1, prod(shape))``,
    C order (centered: the normal equations are then far better conditioned)."""
    axes = [torch.arange(n, dtype=dtype, device=device) - (n - 1) / 2 for n in shape]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij")).reshape(len(shape), -1)
    return torch.cat([grid, torch.ones_like(grid[:1])])


def edge_taper(position: torch.Tensor, shape) -> torch.Tensor:
    """A weight ``(..., )`` for pixel positions ``(..., D)`` (array order) in an image of
    ``shape``: 0 from half a pixel outside it, rising linearly to 1 at :data:`TAPER` − ½
    pixels inside, 1 beyond (axes of length 1 are ignored).

    The edge pixels of a pyramid level are blurred with repeated edge values, so that they
    match the other image less well than the inside; a hard in/out weight would add or
    drop them whole as a step moves the image, a jump in the loss that the damped steps
    cannot follow. The taper makes the loss continuous in the parameters.
    """
    sizes = torch.tensor(shape, dtype=position.dtype, device=position.device)
    inside = torch.minimum(position, sizes - 1 - position) + 0.5
    w = (inside / TAPER).clamp(0.0, 1.0)
    w = torch.where(sizes > 1, w, torch.ones_like(w))
    return w.prod(dim=-1)


def precise(device) -> torch.dtype:
    """float64, but float32 on MPS (which has no float64)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def intensity_fit(moving, fixed, weight):
    """The weighted least-squares ``(α, β)`` ``(N,)`` each of ``fixed ≈ α·moving + β`` over
    each row of ``(N, pixels)``, in :func:`precise` arithmetic."""
    wide = precise(moving.device)
    total = weight.sum(1, dtype=wide).clamp_min(1e-12)
    mean_m = (weight * moving).sum(1, dtype=wide) / total
    mean_f = (weight * fixed).sum(1, dtype=wide) / total
    mc = moving.to(wide) - mean_m[:, None]
    var = (weight * mc * mc).sum(1).clamp_min(1e-30)
    alpha = (weight * mc * (fixed.to(wide) - mean_f[:, None])).sum(1) / var
    return alpha, mean_f - alpha * mean_m


class LevelProblem:
    """The least-squares problem of one pyramid level for a :class:`~.models.LinearModel`.

    fixed : ``(N or 1, 1, *S)``; moving : ``(N or 1, 1, *S_m)``; weight : ``(N or 1, 1,
    *S)`` or None; loss_fn : the run's loss at this level (``(N,)`` per pair); metric : one
    of :data:`METRICS`.
    """

    #: a step moving no corner this many level pixels ends the level
    tolerance = TOLERANCE

    def __init__(self, model, fixed, moving, weight, loss_fn, metric: str):
        self.model, self.fixed = model, fixed
        self.loss_fn, self.metric = loss_fn, metric
        self.shape = tuple(fixed.shape[2:])
        self.moving_level = tuple(moving.shape[2:])
        self.channels = gradient_channels(moving)
        self.coords = pixel_coordinates(self.shape, moving.dtype, moving.device)
        d = len(self.shape)
        # A level pixel is its centered coordinate plus the center.
        center = torch.tensor([(n - 1) / 2 for n in self.shape], dtype=torch.float64)
        self.uncenter = torch.eye(d + 1, dtype=torch.float64)
        self.uncenter[:d, d] = center
        own = edge_taper(self.coords[:d].T + center.to(self.coords), self.shape)
        own = own.reshape(1, 1, *self.shape)
        self.weight = own if weight is None else weight * own

    def level_matrices(self, matrices: torch.Tensor) -> torch.Tensor:
        """Full-resolution pixel matrices (or their derivatives) ``(..., D+1, D+1)`` → the
        level's (the map is linear in the matrix: derivatives carry over alike)."""
        m = self.model
        lead = matrices.shape[:-2]
        flat = matrices.reshape(-1, *matrices.shape[-2:])
        out = level_matrix(flat, m.moving_shape, self.moving_level, m.fixed_shape, self.shape)
        return out.reshape(*lead, *out.shape[-2:])

    def sample(self):
        """At the model's current parameters: the warped level and its gradient ``(N, 1 +
        D, *S)`` and the pixel weight ``(N or 1, 1, *S)`` (the fixed image's weight ×
        :func:`edge_taper` of where each pixel lands in the moving level)."""
        with torch.no_grad():
            matrix = self.level_matrices(self.model.matrix())
            grid = affine_grid(matrix.to(self.channels.dtype), self.moving_level, self.shape)
            sampled = grid_sample(self.channels, grid, "linear", "nearest")
            # align_corners=True normalized (x, y[, z]) → moving level pixels, array order
            sizes = torch.tensor(self.moving_level[::-1], dtype=grid.dtype, device=grid.device)
            position = ((grid + 1) * (sizes - 1) / 2).flip(-1)
            return sampled, edge_taper(position, self.moving_level).unsqueeze(1) * self.weight

    def loss(self, samples, weight=None) -> torch.Tensor:
        """The run's loss ``(N,)`` of ``samples`` (from :meth:`sample`), over their own
        weight or ``weight``, on the CPU; in float64 (:func:`precise`), since near the
        optimum a step changes the loss by less than float32 resolves."""
        sampled, own = samples
        w = own if weight is None else weight
        wide = precise(sampled.device)
        with torch.no_grad():
            loss = self.loss_fn(self.fixed.to(wide), sampled[:, :1].to(wide), w.to(wide))
        return loss.cpu().double()

    def _jacobian_rows(self, samples):
        """``(warped (N, P), rows (N, D(D+1), P), fixed (N, P), weight (N, P), chain (N,
        D(D+1), p))``: the warped level, its derivatives ``∂w/∂A_ij = ∂_i w · x_j`` with
        respect to the level matrix ``A`` (on centered coordinates), and the chain rule
        ``∂A/∂θ`` (float64, CPU) that carries them to the model's ``p`` parameters."""
        sampled, w = samples
        n, d = sampled.shape[0], len(self.shape)
        warped = sampled[:, 0].reshape(n, -1)
        grad = sampled[:, 1:].reshape(n, d, -1)
        f = self.fixed.reshape(self.fixed.shape[0], -1).expand(n, -1)
        weight = w.reshape(w.shape[0], -1).expand(n, -1)
        rows = (grad[:, :, None] * self.coords).reshape(n, d * (d + 1), -1)
        jac = self.level_matrices(self.model.matrix_jacobian()).cpu().double()
        chain = jac[:, :, :d] @ self.uncenter
        return warped, rows, f, weight, chain.flatten(2).transpose(1, 2)

    def normal_equations(self, samples):
        """The normal equations ``(H (N, Q, Q), b (N, Q))``, float64 on the CPU (small), of
        the linearized
        residual at ``samples`` (from :meth:`sample`): ``Q = P`` for "mse", ``P + 2`` for
        "ncc" (``θ``, then the intensity fit's ``α, β``)."""
        with torch.no_grad():
            # least squares in A's D(D+1) entries, carried to θ by the chain rule below
            warped, rows, f, weight, chain = self._jacobian_rows(samples)
            n, d = warped.shape[0], len(self.shape)
            if self.metric == "ncc":
                alpha, beta = intensity_fit(warped, f, weight)
                alpha, beta = alpha.to(warped.dtype), beta.to(warped.dtype)
                residual = alpha[:, None] * warped + beta[:, None] - f
                rows = torch.cat(
                    [
                        alpha[:, None, None] * rows,
                        warped[:, None],
                        torch.ones_like(rows[:, :1]),
                    ],
                    dim=1,
                )
                # (α, β) pass through the chain rule unchanged.
                p = chain.shape[2]
                wide = chain.new_zeros(n, d * (d + 1) + 2, p + 2)
                wide[:, : d * (d + 1), :p] = chain
                wide[:, -2:, p:] = torch.eye(2, dtype=chain.dtype, device=chain.device)
                chain = wide
            else:
                residual = warped - f
            weighted = rows * weight[:, None]
            hessian = (weighted @ rows.transpose(1, 2)).cpu().double()
            gradient = (weighted @ residual[..., None]).cpu().double()
            hessian = chain.transpose(1, 2) @ hessian @ chain
            gradient = (chain.transpose(1, 2) @ gradient)[..., 0]
        return hessian, gradient

    def corner_motion(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Largest motion ``(N,)`` of a fixed-level corner between two full-resolution pixel
        matrices ``(N, D+1, D+1)``, in moving level pixels."""
        d = len(self.shape)
        corners = torch.cartesian_prod(
            *[
                torch.tensor([0.0, n - 1.0], dtype=before.dtype, device=before.device)
                for n in self.shape
            ]
        ).reshape(-1, d)
        corners = torch.cat([corners, torch.ones_like(corners[:, :1])], dim=1)
        delta = self.level_matrices(after - before)[:, :d]  # (N, D, D+1)
        return torch.linalg.vector_norm(corners @ delta.transpose(1, 2), dim=-1).amax(dim=1)


class MutualInformationProblem(LevelProblem):
    """The Newton-type problem of one level for ``metric="mi"`` (docs/maths.md §6.4, §10.3).

    The loss ``L(J)`` is a function of the Parzen joint histogram ``J`` of the fixed and
    the warped level, a sum over the pixels. Its Hessian in ``θ`` is, without the terms in
    the images' second derivatives (as Gauss–Newton drops them),

        H = Σ_x ℓ_x'' (∂w/∂θ)(∂w/∂θ)ᵀ + (∂J/∂θ)ᵀ (∂²L/∂J²) (∂J/∂θ),

    with ``ℓ_x'' = ∂²/∂w(x)² Σ_ικ G[ι, κ] J[ι, κ]`` at ``G = ∂L/∂J`` held fixed (the
    Parzen window's second derivative, :func:`~..ops.mutual_information.pixel_derivatives`)
    and ``b = Σ_x ℓ_x' ∂w/∂θ`` the gradient. The second term, how the histogram itself
    moves, is negative semi-definite (the mutual information is convex in the joint
    distribution for a fixed marginal); it matters on the coarse levels, whose few pixels
    spread thinly over the bins (there it halves the steps of a run), and is left out
    above :data:`COUPLING_PIXELS` pixels, where it costs more than it saves. ``H`` is then
    made positive semi-definite (its negative eigenvalues raised to ``1e-6`` of the
    largest) so that the damped step descends.
    """

    tolerance = MI_TOLERANCE
    #: (sampled, own weight, frames, histogram) of the samples whose histogram over their
    #: own weight was built last (by :meth:`loss`), for :meth:`normal_equations`
    _kept = None
    #: (lo, hi, taps, ξ): the fixed level's B-spline taps (:func:`cell_taps`) and bin
    #: coordinates in the frame ``[lo, hi]``; the frame follows the pixels of positive
    #: weight, so it rarely changes
    _fixed_taps = None
    #: the fixed level's pixels ``(N, P)`` in :func:`precise` arithmetic
    _fixed_rows = None
    #: (source, lo, hi, ξ, ∂ξ/∂b): the last warped level's bin coordinates in ``[lo, hi]``
    _moving_bins = None

    def _rows(self, samples, weight=None):
        """``(warped, fixed, weight)`` ``(N, P)`` each in :func:`precise` arithmetic: the
        samples' warped level, the fixed level and the samples' own weight (or ``weight``,
        ``(N or 1, 1, *S)``)."""
        sampled, own = samples
        w = own if weight is None else weight
        wide = precise(sampled.device)
        n = sampled.shape[0]
        warped = sampled[:, 0].reshape(n, -1).to(wide)
        if self._fixed_rows is None or self._fixed_rows.shape[0] != n:  # the same each step
            self._fixed_rows = self.fixed.reshape(self.fixed.shape[0], -1).expand(n, -1).to(wide)
        return warped, self._fixed_rows, w.reshape(w.shape[0], -1).expand(n, -1).to(wide)

    def _frames(self, warped, fixed, weight, source=None):
        """``(taps_a, xi_a, xi_b, ∂ξ_b/∂b)`` over the pixels of positive ``weight``: the
        frames of :func:`~..ops.mutual_information.parzen_frames`, the fixed taps kept while
        the fixed frame holds, the moving bin coordinates while the moving frame holds for
        the same ``source`` (the sampled tensor ``warped`` comes from)."""
        bins = self.loss_fn.bins
        valid = weight > 0
        lo, hi = frame_of(fixed, valid)
        kept = self._fixed_taps
        if kept is None or not (torch.equal(kept[0], lo) and torch.equal(kept[1], hi)):
            xi_a = bin_coordinates(fixed, lo, hi, bins, 1.0)[0]
            kept = self._fixed_taps = (lo, hi, cell_taps(xi_a, bins), xi_a)
        lo_b, hi_b = frame_of(warped, valid)
        moving = self._moving_bins
        same = moving is not None and source is not None and moving[0] is source
        if not (same and torch.equal(moving[1], lo_b) and torch.equal(moving[2], hi_b)):
            moving = (source, lo_b, hi_b, *bin_coordinates(warped, lo_b, hi_b, bins, 1.0))
            self._moving_bins = moving
        return kept[2], kept[3], moving[3], moving[4]

    def _histograms(self, samples, weight=None):
        """The joint histogram over the samples' own weight, kept (with its frames) for
        :meth:`normal_equations`, and the one over ``weight`` where given: ``(own, other
        or None)``. Where their frames agree, the own one is the other plus the pixels
        where the two weights differ (:func:`_partial_histogram`)."""
        kept = self._kept
        warped, fixed, own = self._rows(samples)
        fn = self.loss_fn
        if fn.kernel != "bspline":  # every bin a tap: the generic histogram
            frames = parzen_frames(fixed, warped, own, fn.bins, fn.kernel, fn.sigma)
            joint = joint_histogram(frames[0], frames[1], own, frames[3])
            frames = (None, *frames[:3], frames[3])
            other = None
            if weight is not None:
                _, _, w = self._rows(samples, weight)
                other_frames = parzen_frames(fixed, warped, w, fn.bins, fn.kernel, fn.sigma)
                other = joint_histogram(*other_frames[:2], w, other_frames[3])
            self._kept = (samples[0], samples[1], frames, joint)
            return joint, other
        have = kept is not None and kept[0] is samples[0] and kept[1] is samples[1]
        frames = kept[2] if have else self._frames(warped, fixed, own, samples[0])
        if weight is None:
            if not have:
                joint = bspline_histograms(frames[0], frames[2], [own], fn.bins)[0]
                self._kept = (samples[0], samples[1], frames, joint)
            return self._kept[3], None
        _, _, w = self._rows(samples, weight)
        other_frames = self._frames(warped, fixed, w, samples[0])
        other = bspline_histograms(other_frames[0], other_frames[2], [w], fn.bins)[0]
        if not have:
            same = other_frames[0] is frames[0] and other_frames[2] is frames[2]
            if same:
                # The histogram is linear in the weight, and the two weights differ only
                # where the moving image's edges moved: own = w + (own − w) on those pixels.
                joint = other + _partial_histogram(frames, own - w, fn.bins)
            else:
                joint = bspline_histograms(frames[0], frames[2], [own], fn.bins)[0]
            self._kept = (samples[0], samples[1], frames, joint)
        return self._kept[3], other

    def _loss_of(self, joint) -> torch.Tensor:
        score = score_of_joint(joint, self.loss_fn.normalize)
        loss = 2.0 - score if self.loss_fn.normalize else -score
        return loss.cpu().double()

    def loss(self, samples, weight=None) -> torch.Tensor:
        """:meth:`LevelProblem.loss` (the value of the run's loss function, here from the
        histogram itself). The histogram over the samples' own weight is built with the
        one over ``weight`` and kept for the next :meth:`loss` and
        :meth:`normal_equations` on the same samples: after a step the run compares the
        trial's loss over the weight it started from, then, where it keeps the step,
        needs the trial's own."""
        with torch.no_grad():
            own, other = self._histograms(samples, weight)
        return self._loss_of(own if weight is None else other)

    def normal_equations(self, samples):
        """``(H (N, P, P), b (N, P))``, float64 on the CPU, in the model's ``P`` parameters."""
        fn = self.loss_fn
        with torch.no_grad():
            _, rows, _, _, chain = self._jacobian_rows(samples)
            joint = self._histograms(samples)[0].double()
            taps_a, xi_a, xi_b, slope = self._kept[2][:4]
            _, _, weight = self._rows(samples)
        with torch.enable_grad():
            joint.requires_grad_()
            (grad_joint,) = torch.autograd.grad(-score_of_joint(joint, fn.normalize).sum(), joint)
        with torch.no_grad():
            if taps_a is None:  # the generic window
                parzen = self._kept[2][4]
                first, second = pixel_derivatives(
                    xi_a, xi_b, slope, weight, parzen, grad_joint.detach()
                )
            else:
                first, second = bspline_pixel_derivatives(
                    taps_a, xi_b, slope, weight, grad_joint.detach(), fn.bins
                )
            first, second = first.to(rows.dtype), second.to(rows.dtype)
            gradient = (rows @ first[..., None]).cpu().double()
            hessian = ((rows * second[:, None]) @ rows.transpose(1, 2)).cpu().double()
        if xi_b.shape[1] <= COUPLING_PIXELS:
            with torch.no_grad():
                parzen = _Parzen(fn.kernel, fn.bins, fn.sigma)
                moves = joint_jacobian(xi_a, xi_b, slope, weight, parzen, rows.to(xi_a))
                moves = moves.double()
                # the loss is −score (+ 2): its curvature is the score's, negated
                curvature = score_curvature(joint.detach(), moves, fn.normalize).cpu()
            hessian = hessian - curvature
        with torch.no_grad():
            hessian = chain.transpose(1, 2) @ hessian @ chain
            gradient = (chain.transpose(1, 2) @ gradient)[..., 0]
            values, vectors = torch.linalg.eigh(hessian)
            floor = 1e-6 * values.abs().amax(-1, keepdim=True)
            values = torch.maximum(values, floor)
            hessian = vectors @ torch.diag_embed(values) @ vectors.transpose(1, 2)
        return hessian, gradient


def _partial_histogram(frames, weight, bins: int) -> torch.Tensor:
    """The B-spline joint histogram ``(M, bins, bins)`` of ``frames`` (from
    :meth:`MutualInformationProblem._frames`) over ``weight`` ``(M, P)``, counting only
    the pixels where some row's weight is not 0 (a thin band at the edges)."""
    taps_a, _, xi_b, _ = frames
    changed = (weight != 0).any(0).nonzero().squeeze(1)
    rows_a, wa = taps_a
    part = (rows_a[:, changed], wa[:, :, changed])
    return bspline_histograms(part, xi_b[:, changed], [weight[:, changed]], bins)[0]


def _level_to_full(full_shape, level_shape) -> np.ndarray:
    """:func:`~..ops._sampling.level_to_full` in NumPy float64 (host constants)."""
    d = len(full_shape)
    out = np.eye(d + 1)
    for axis, (big, small) in enumerate(zip(full_shape, level_shape)):
        factor = big / small
        out[axis, axis] = factor
        out[axis, d] = 0.5 * factor - 0.5
    return out


def _theta_maps(in_shape, out_shape) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` with ``theta = A · matrix · B`` the ``F.affine_grid`` theta of a pixel
    matrix (:func:`~..ops._sampling.affine_to_theta`, ``align_corners=True``)."""
    d = len(in_shape)
    normalize = np.eye(d + 1)
    for axis, n in enumerate(in_shape):
        if n > 1:
            normalize[axis, axis], normalize[axis, d] = 2.0 / (n - 1), -1.0
        else:
            normalize[axis, axis] = normalize[axis, d] = 0.0
    denormalize = np.eye(d + 1)
    for axis, n in enumerate(out_shape):
        denormalize[axis, axis] = denormalize[axis, d] = (n - 1) / 2.0
    reverse = np.eye(d + 1)
    reverse[:d, :d] = np.eye(d)[::-1]
    return reverse @ normalize, denormalize @ reverse


class SquaresProblem:
    """The least-squares problem of one level ("ncc", "mse") with everything on the device.

    The same problem as :class:`LevelProblem`, set up for a loop that does not wait on the
    host: the parameters ``θ`` ``(N, P)`` stay on the device, in the model's
    :func:`~.models.wide_dtype` (float64 on the CPU, float32 on GPUs), and every map from
    ``θ`` to the level's pixels is one product with constants worked out once per level in
    float64 on the host: the level's pixel matrix ``A(θ) = P · C(θ) · Q`` (``C``: the
    model's :meth:`~.models.LinearModel.physical_core`; ``P``, ``Q``: the grids, the
    initial transform and the levels), the ``F.affine_grid`` theta
    ``P' · C(θ) · Q'`` and the chain rule ``∂A/∂θ = P · ∂C/∂θ · Q`` (constant for the
    translation and affine models). The normal equations are summed over the pixels in
    the pixels' dtype (float32), as :class:`LevelProblem` sums them.

    fixed : ``(N or 1, 1, *S)``; moving : ``(N or 1, 1, *S_m)``; weight : ``(N or 1, 1,
    *S)`` or None; loss_fn : the run's loss at this level (``(N,)`` per pair).
    """

    tolerance = TOLERANCE

    def __init__(self, model, fixed, moving, weight, loss_fn, metric: str):
        self.model, self.metric, self.loss_fn = model, metric, loss_fn
        self.shape = tuple(fixed.shape[2:])
        self.moving_level = tuple(moving.shape[2:])
        device = moving.device
        small = self.small = wide_dtype(device)
        d = self.ndim = len(self.shape)
        n = model.shift.shape[0]
        self.pairs, self.params = n, d + model.linear.shape[1]
        self.fixed = fixed.to(small)
        # the fixed level twice over (losses() evaluates 2N rows), and as pixel rows
        twice = (2, *[1] * (fixed.dim() - 1))
        self.fixed_twice = self.fixed if fixed.shape[0] == 1 else self.fixed.repeat(twice)
        self.fixed_rows = fixed.reshape(fixed.shape[0], -1)
        self.channels = gradient_channels(moving)
        self.coords = pixel_coordinates(self.shape, moving.dtype, device)
        # this level's own taper (fixed edges), as LevelProblem.__init__ makes it
        center = torch.tensor([(k - 1) / 2 for k in self.shape], dtype=moving.dtype)
        own = edge_taper(self.coords[:d].T + center.to(self.coords), self.shape)
        own = own.reshape(1, 1, *self.shape)
        self.weight = own if weight is None else weight * own

        def const(x):
            return torch.as_tensor(np.ascontiguousarray(x), dtype=small, device=device)

        to_level = np.linalg.inv(_level_to_full(model.moving_shape, self.moving_level))
        p_full = to_level @ np.asarray(model.left_host)  # (N, D+1, D+1)
        q_full = np.asarray(model.right_host) @ _level_to_full(model.fixed_shape, self.shape)
        before, after = _theta_maps(self.moving_level, self.shape)
        self.p, self.q = const(p_full), const(q_full)
        self.p_theta, self.q_theta = const(before @ p_full), const(q_full @ after)
        uncenter = np.eye(d + 1)
        uncenter[:d, d] = [(k - 1) / 2 for k in self.shape]
        self.p_rows, self.q_rows = const(p_full[:, :d]), const(q_full @ uncenter)
        corners = np.array(np.meshgrid(*[[0.0, k - 1.0] for k in self.shape], indexing="ij"))
        corners = corners.reshape(d, -1).T
        corners = np.hstack([corners, np.ones((len(corners), 1))])  # (K, D+1)
        self.corners = const(corners)
        # ∂C/∂θ: the shift's part is constant, and so is an affine or translation model's
        # whole chain rule
        k = model.linear.shape[1]
        shift_part = np.zeros((n, d, d + 1, d + 1))
        for axis in range(d):
            shift_part[:, axis, axis, d] = model.unit
        self.shift_part = const(shift_part)
        self.chain_const = self.theta_map = self.motion_map = None
        if model.kind in ("translation", "affine"):
            # C(θ) = I + Σ θ_i ∂C/∂θ_i: every map of θ is one batched product with constants
            core = shift_part
            if k:
                basis = np.zeros((n, k, d + 1, d + 1))
                basis[:, :, :d, :d] = np.eye(d * d).reshape(k, d, d) / model.radius
                core = np.concatenate([shift_part, basis], axis=1)
            self.chain_const = self._chain(const(core))
            p_theta, q_theta = before @ p_full, q_full @ after
            self.theta_map = (
                const((p_theta @ q_theta)[:, None, :d].reshape(n, 1, -1)),
                const((p_theta[:, None] @ core @ q_theta)[:, :, :d].reshape(n, self.params, -1)),
            )
            corner_rows = (p_full[:, None] @ core @ q_full)[:, :, :d]  # (N, P, D, D+1)
            self.motion_map = const(corner_rows @ corners.T).reshape(n, self.params, -1)
        self.feature_map = None
        self._features = {}  # id(θ) → (θ, φ(θ)): see features()
        self._ones = self._ncc_chain = None  # made on first use
        self.space = None
        if model.kind in ("rigid", "similarity") and d == 2:
            self._plane_features(model, n, shift_part, p_full, q_full, before, after, corners)
        elif model.kind in ("rigid", "similarity"):
            self._space_features(model, n, shift_part, p_full, q_full, before, after, corners)
        extra = 2 if metric == "ncc" else 0
        # (α, β) pass through the chain rule unchanged: the identity in the last rows
        tail = np.zeros((n, extra, self.params + extra))
        tail[:, :, self.params :] = np.eye(extra)
        self.chain_tail = const(tail)
        half = [(k - 1) / 2 for k in self.moving_level[::-1]]  # (x, y[, z]), as the grid

        def pixels(values):
            return torch.tensor(values, dtype=moving.dtype, device=device)

        self.taper_offset = pixels([(h + 0.5) / TAPER for h in half])
        self.taper_slope = pixels([-h / TAPER for h in half])
        self.taper_off = pixels([float(h <= 0) for h in half])  # axes of 1 pixel: no taper
        self.any_off = any(h <= 0 for h in half)

    def _plane_features(self, model, n, shift_part, p_full, q_full, before, after, corners):
        """2-D rigid and similarity: ``C(θ)`` is linear in ``φ = (shift, R · vec(L − I))``,
        the affine model's parameters of the same matrix (``R``: the model's radius), so the
        affine model's constant maps (``F.affine_grid``'s theta, the corner motion, the chain
        rule) serve on ``φ``; ``L = e^σ [[cos α, −sin α], [sin α, cos α]]`` (α, σ: the
        parameters over ``R``) is one complex exponential, four launches in all where the
        matrix exponentials take about fifty (:meth:`features`)."""
        d, radius, p = 2, model.radius, self.params
        small, device = self.small, self.corners.device

        def const(x):
            return torch.as_tensor(np.ascontiguousarray(x), dtype=small, device=device)

        basis = np.zeros((n, 4, d + 1, d + 1))
        basis[:, :, :d, :d] = np.eye(4).reshape(4, d, d) / radius
        core = np.concatenate([shift_part, basis], axis=1)  # ∂C/∂φ, (N, 6, 3, 3)
        q = 6
        self.chain_phi = self._chain(const(core))  # (N, D(D+1), 6)
        p_theta, q_theta = before @ p_full, q_full @ after
        self.theta_map = (
            const((p_theta @ q_theta)[:, None, :d].reshape(n, 1, -1)),
            const((p_theta[:, None] @ core @ q_theta)[:, :, :d].reshape(n, q, -1)),
        )
        corner_rows = (p_full[:, None] @ core @ q_full)[:, :, :d]
        self.motion_map = const(corner_rows @ corners.T).reshape(n, q, -1)
        # θ → (σ, α): the real and imaginary parts of the exponent
        to_log = np.zeros((p, 2))
        to_log[d, 1] = 1.0 / radius
        if model.kind == "similarity":
            to_log[d + 1, 0] = 1.0 / radius
        # φ = θ · keep + (e^σ cos α, e^σ sin α) · spread + φ0
        keep = np.zeros((p, q))
        keep[:d, :d] = np.eye(d)
        spread = np.zeros((2, q))
        spread[0, [2, 5]] = radius  # cos: the diagonal of L
        spread[1, 3], spread[1, 4] = -radius, radius  # sin: −sin above, sin below
        phi0 = np.zeros((1, q))
        phi0[0, [2, 5]] = -radius
        # ∂φ/∂θ, linear in φ: (c, s) = (1 + φ₂/R, φ₄/R); ∂(c, s)/∂α = (−s, c), ∂/∂σ = (c, s)
        jac0 = np.zeros((q, p))
        jac0[:d, :d] = np.eye(d)
        jac_c, jac_s = np.zeros((q, p)), np.zeros((q, p))  # the parts times c and times s
        # rows 2..5 of φ are R (c − 1), −R s, R s, R (c − 1); by α (θ_d / R): (−s, −c, c, −s)
        jac_c[[3, 4], d] = -1.0, 1.0
        jac_s[[2, 5], d] = -1.0
        if model.kind == "similarity":  # by σ: (c, −s, s, c)
            jac_c[[2, 5], d + 1] = 1.0
            jac_s[3, d + 1], jac_s[4, d + 1] = -1.0, 1.0
        jac0 = jac0 + jac_c  # c = 1 + φ₂/R
        jac_map = np.zeros((q, q * p))
        jac_map[2] = jac_c.reshape(-1) / radius
        jac_map[4] = jac_s.reshape(-1) / radius
        self.feature_map = (
            const(np.hstack([np.zeros((1, 2)), phi0])),
            const(np.hstack([to_log, keep])),
            const(spread),
        )
        self.jacobian_map = (const(jac0.reshape(1, -1)), const(jac_map))

    def _space_features(self, model, n, shift_part, p_full, q_full, before, after, corners):
        """3-D rigid and similarity: as :meth:`_plane_features`, ``C(θ)`` is linear in
        ``φ = (shift, R · vec(L − I))`` (12 numbers), whose maps the affine model's are;
        ``L = e^σ exp([v]×)`` (``v``, ``σ``: the parameters over ``R``) by Rodrigues'
        formula with its coefficients' series (:func:`~.models.rodrigues`), ``φ`` and
        ``∂φ/∂θ`` together in about fifteen launches (:meth:`_space_terms`), where the
        matrix exponentials took about ninety and read the matrix norm back on a GPU."""
        d, radius = 3, model.radius
        small, device = self.small, self.corners.device

        def const(x):
            return torch.as_tensor(np.ascontiguousarray(x), dtype=small, device=device)

        basis = np.zeros((n, 9, d + 1, d + 1))
        basis[:, :, :d, :d] = np.eye(9).reshape(9, d, d) / radius
        core = np.concatenate([shift_part, basis], axis=1)  # ∂C/∂φ, (N, 12, 4, 4)
        q = 12
        chain_phi = self._chain(const(core))  # (N, D(D+1), 12)
        # the shift's columns of ∂A/∂θ are constant: ∂φ/∂shift = [I | 0]
        self.chain_phi = (chain_phi[:, :, :d].contiguous(), chain_phi[:, :, d:].contiguous())
        p_theta, q_theta = before @ p_full, q_full @ after
        self.theta_map = (
            const((p_theta @ q_theta)[:, None, :d].reshape(n, 1, -1)),
            const((p_theta[:, None] @ core @ q_theta)[:, :, :d].reshape(n, q, -1)),
        )
        corner_rows = (p_full[:, None] @ core @ q_full)[:, :, :d]
        self.motion_map = const(corner_rows @ corners.T).reshape(n, q, -1)
        self.feature_map = "space"
        if model.kind == "similarity":
            # its features carry R e^σ L where φ has R (e^σ L − I): the maps' constants
            # take the offset (R I) instead (corner motion takes differences: none there)
            offset = np.zeros((n, 1, q))
            offset[:, 0, d:] = radius * np.eye(3).reshape(9)
            theta0 = (p_theta @ q_theta)[:, None, :d].reshape(n, 1, -1)
            theta1 = (p_theta[:, None] @ core @ q_theta)[:, :, :d].reshape(n, q, -1)
            self.theta_map = (const(theta0 - offset @ theta1), self.theta_map[1])
        # the coefficients' rows [[1, a, b], [1, −b, c], [0, R a, R b]] of (I, K, K²) for
        # (L, the right Jacobian J, R (L − I)), K = [θ_rot]× = R [v]×: a, b, c of v = θ/R
        series = np.asarray(models_rotation_series())  # (T, 3) in t = |v|²
        scale = radius ** (-2.0 * np.arange(len(series)))[:, None]  # t = |θ_rot|² / R²
        a, b, c = (series[:, i] * scale[:, 0] for i in range(3))
        rows = np.zeros((len(series), 9))
        rows[:, 1], rows[:, 2] = a / radius, b / radius**2
        rows[:, 4], rows[:, 5] = -b / radius, c / radius**2
        rows[:, 7], rows[:, 8] = a, b / radius
        bias = np.zeros(9)
        bias[[0, 3]] = 1.0
        similarity = model.kind == "similarity"
        if similarity:  # the third row R L (its I: R), scaled with L by e^σ
            bias[6] = radius
        gens = np.asarray(rotation_generators(3).reshape(3, 9))
        self.space = dict(
            rows=const(rows),
            bias=const(bias),
            powers=const(np.arange(len(series), dtype=float)),
            gens=const(gens),
            skews=const(gens.T.copy()),  # (9, 3): [x]× = skews @ x
            eye=const(np.eye(3).reshape(1, 1, 9)),
            # e^σ = (e^{1/R})^θ on the rows of L and R L, 1^θ on J's: one power
            grow=const(np.exp([1.0 / radius, 0.0, 1.0 / radius])[:, None]),
            radius=radius,
            similarity=similarity,
        )

    def _space_terms(self, theta):
        """``[φ | ∂φ/∂θ_lin]`` ``(N, 12 + 9 K)`` of a 3-D rigid or similarity ``θ`` (see
        :meth:`_space_features`; ``∂φ/∂θ_lin`` ``(N, 9, K)`` flattened, the shift's part
        of ``∂φ/∂θ`` is constant)."""
        sp = self.space
        n, d = theta.shape[0], self.ndim
        rot = theta[:, d : d + 3]
        t = torch.bmm(rot.unsqueeze(1), rot.unsqueeze(2)).view(n, 1)  # |θ_rot|²
        coef = torch.addmm(sp["bias"], t.pow(sp["powers"]), sp["rows"])
        if sp["similarity"]:  # e^σ L: the rows of L and R L scaled
            rows = torch.pow(sp["grow"], theta[:, None, d + 3 : d + 4])  # (N, 3, 1)
            coef = (coef.view(n, 3, 3) * rows).view(n, 9)
        k = rot @ sp["gens"]  # (N, 9): R [v]×
        k2 = torch.bmm(k.view(n, 3, 3), k.view(n, 3, 3)).view(n, 1, 9)
        basis = torch.cat([sp["eye"].expand(n, 1, 9), k.view(n, 1, 9), k2], dim=1)
        # (N, 3, 9): L (e^σ L), J, R (L − I) (similarity: R e^σ L; see _space_features)
        terms = torch.bmm(coef.view(n, 3, 3), basis)
        lin, right, moved = terms.unbind(1)
        # ∂(R (L − I))/∂θ_k = L [J e_k]× (R ∂L/∂v_k / R): [J e_k]× for every k in one
        # product ((N, 9 (i, j), 3 k)), then L times them ((N, 9 (a, j), 3 k))
        skews = torch.matmul(sp["skews"], right.view(n, 3, 3))
        jac = torch.bmm(lin.view(n, 3, 3), skews.view(n, 3, 9)).view(n, 9, 3)
        if sp["similarity"]:  # ∂/∂θ_σ: e^σ L
            jac = torch.cat([jac, lin.view(n, 9, 1)], dim=2)
        # φ and ∂φ/∂θ side by side: one tensor for keep() to select
        return torch.cat([theta[:, :d], moved, jac.flatten(1)], dim=1)

    def features(self, theta: torch.Tensor) -> torch.Tensor:
        """``φ(θ)`` ``(N, 6)`` (see :meth:`_plane_features`), worked out once per ``θ``
        tensor."""
        hit = self._features.get(id(theta))
        if hit is not None and hit[0] is theta:
            return hit[1]
        if self.space is not None:
            both = self._space_terms(theta)
            self._remember(theta, both[:, :12], both)
            return both[:, :12]
        bias, linear, spread = self.feature_map
        both = torch.addmm(bias, theta, linear)  # [(σ, α) | θ · keep + φ0]
        turn = torch.view_as_real(torch.exp(torch.view_as_complex(both[:, :2])))
        phi = torch.addmm(both[:, 2:], turn, spread)
        self._remember(theta, phi)
        return phi

    def _remember(self, theta, phi, jac=None) -> None:
        self._features[id(theta)] = (theta, phi, jac)
        while len(self._features) > 4:  # the loop holds at most θ, the trial, the kept
            self._features.pop(next(iter(self._features)))

    def keep(self, better: torch.Tensor, trial: torch.Tensor, theta: torch.Tensor):
        """``θ`` ``(N, P)`` where ``better`` ``(N,)``, else the ``trial`` (its features
        carried along, not worked out again)."""
        kept = torch.where(better[:, None], trial, theta)
        if self.space is not None:  # φ and ∂φ/∂θ, worked out together
            self.features(trial), self.features(theta)
            both = [self._features[id(x)][2] for x in (trial, theta)]
            both = torch.where(better[:, None], *both)
            self._remember(kept, both[:, :12], both)
        elif self.feature_map is not None:
            phi = torch.where(better[:, None], self.features(trial), self.features(theta))
            self._remember(kept, phi)
        return kept

    def select(self, better: torch.Tensor, trial, samples):
        """The samples (from :meth:`sample`) ``trial`` where ``better`` ``(N,)``, else
        ``samples``: the samples the next step starts from."""
        keep = better.view(-1, *([1] * (samples[0].dim() - 1)))
        return (
            torch.where(keep, trial[0], samples[0]),
            torch.where(keep, trial[1], samples[1]),
        )

    def start(self) -> torch.Tensor:
        """The model's parameters ``θ`` ``(N, P)``, detached, in the problem's dtype."""
        m = self.model
        return torch.cat([m.shift.detach(), m.linear.detach()], dim=1).to(self.small)

    def _core(self, theta):
        d = self.ndim
        return self.model.physical_core(theta[:, :d], theta[:, d:])

    def _chain(self, core_jacobian):
        """``∂A/∂θ`` as ``(N, D(D+1), P)`` on centered coordinates, from ``∂C/∂θ``
        ``(N, P, D+1, D+1)``."""
        chain = self.p_rows[:, None] @ core_jacobian @ self.q_rows  # (N, P, D, D+1)
        return chain.flatten(2).transpose(1, 2)

    def chain(self, theta) -> torch.Tensor:
        """``∂A/∂θ`` at ``θ`` (see :meth:`_chain`)."""
        if self.chain_const is not None:
            return self.chain_const
        if self.space is not None:  # ∂A/∂φ · ∂φ/∂θ: the shift's columns constant
            self.features(theta)
            n = theta.shape[0]
            jac = self._features[id(theta)][2][:, 12:].view(n, 9, -1)
            turn = torch.bmm(self.chain_phi[1], jac)
            return torch.cat([self.chain_phi[0], turn], dim=2)
        if self.feature_map is not None:  # ∂A/∂φ · ∂φ/∂θ, the latter linear in φ
            n = theta.shape[0]
            jac = torch.addmm(self.jacobian_map[0], self.features(theta), self.jacobian_map[1])
            return self.chain_phi @ jac.view(n, -1, self.params)
        d = self.ndim
        lin = self.model._linear_jacobian(theta[:, d:])  # (N, K, D, D)
        lin = F.pad(lin, (0, 1, 0, 1))
        return self._chain(torch.cat([self.shift_part, lin], dim=1))

    def level_matrix(self, theta) -> torch.Tensor:
        """The level's pixel matrices ``A(θ)`` ``(N, D+1, D+1)``."""
        return self.p @ self._core(theta) @ self.q

    def _affine_theta(self, theta) -> torch.Tensor:
        """The ``F.affine_grid`` theta ``(N, D, D+1)`` at ``θ``."""
        n, d = theta.shape[0], self.ndim
        if self.theta_map is not None:
            x = theta if self.feature_map is None else self.features(theta)
            flat = torch.baddbmm(self.theta_map[0], x[:, None], self.theta_map[1])
            return flat.view(n, d, d + 1)
        return (self.p_theta @ self._core(theta) @ self.q_theta)[:, :d]

    def sample(self, theta):
        """At ``θ``: the warped level and its gradient ``(N, 1 + D, *S)`` and the pixel
        weight ``(N or 1, 1, *S)`` (see :meth:`LevelProblem.sample`)."""
        n = theta.shape[0]
        affine = self._affine_theta(theta)
        dtype = self.channels.dtype
        grid = F.affine_grid(affine.to(dtype), (n, 1, *self.shape), align_corners=True)
        sampled = grid_sample(self.channels, grid, "linear", "nearest")
        # edge_taper of where the pixels land: at normalized u along an axis of n pixels,
        # the distance to the nearer edge pixel is h (1 − |u|), h = (n − 1) / 2
        ramp = torch.addcmul(self.taper_offset, grid.abs(), self.taper_slope).clamp(0.0, 1.0)
        taper = (torch.maximum(ramp, self.taper_off) if self.any_off else ramp).prod(dim=-1)
        return sampled, taper.unsqueeze(1) * self.weight

    def losses(self, samples, other_weight) -> torch.Tensor:
        """The run's loss of ``samples`` over their own weight and over ``other_weight``:
        ``(2, N)``, in the problem's dtype, in one batched call."""
        sampled, own = samples
        n = sampled.shape[0]
        if self.metric == "ncc" and self.small != torch.float64:
            shape = (n, *own.shape[1:])
            weights = torch.cat([own.expand(shape), other_weight.expand(shape)]).flatten(1)
            warped = sampled[:, 0].reshape(n, -1).repeat(2, 1)
            fixed = (
                self.fixed_rows if self.fixed_rows.shape[0] == 1 else self.fixed_rows.repeat(2, 1)
            )
            return _ncc_as_squares(fixed, warped, weights).view(2, n)
        warped = sampled[:, :1].to(self.small).repeat(2, *([1] * (sampled.dim() - 1)))
        weights = torch.cat(
            [own.expand(n, *own.shape[1:]), other_weight.expand(n, *own.shape[1:])]
        ).to(self.small)
        return self.loss_fn(self.fixed_twice, warped, weights).view(2, n)

    def loss(self, samples) -> torch.Tensor:
        """The run's loss ``(N,)`` of ``samples`` over their own weight."""
        sampled, own = samples
        if self.metric == "ncc" and self.small != torch.float64:
            n = sampled.shape[0]
            weights = own.expand(n, *own.shape[1:]).flatten(1)
            return _ncc_as_squares(self.fixed_rows, sampled[:, 0].reshape(n, -1), weights)
        return self.loss_fn(self.fixed, sampled[:, :1].to(self.small), own.to(self.small))

    def normal_equations(self, samples, theta):
        """``(H (N, Q, Q), b (N, Q))`` at ``θ``, in the problem's dtype (see
        :meth:`LevelProblem.normal_equations`)."""
        sampled, w = samples
        n, d = sampled.shape[0], self.ndim
        warped = sampled[:, 0].reshape(n, -1)
        grad = sampled[:, 1:].reshape(n, d, -1)
        f = self.fixed_rows.expand(n, -1)
        weight = w.reshape(w.shape[0], -1).expand(n, -1)
        rows = (grad[:, :, None] * self.coords).reshape(n, d * (d + 1), -1)
        chain = self.chain(theta)
        if self.metric == "ncc":
            alpha, beta = _fit(warped, f, weight)
            residual = torch.addcmul(beta[:, None] - f, alpha[:, None], warped)
            if self._ones is None or self._ones.shape[0] != n:
                self._ones = torch.ones_like(rows[:, :1])
            rows = torch.cat([alpha[:, None, None] * rows, warped[:, None], self._ones], dim=1)
            if self.chain_const is not None:  # the intensity fit's rows added once
                if self._ncc_chain is None:
                    self._ncc_chain = torch.cat([F.pad(chain, (0, 2)), self.chain_tail], dim=1)
                chain = self._ncc_chain
            else:
                chain = torch.cat([F.pad(chain, (0, 2)), self.chain_tail], dim=1)
        else:
            residual = warped - f
        weighted = rows * weight[:, None]
        hessian = (weighted @ rows.transpose(1, 2)).to(self.small)
        gradient = (weighted @ residual[..., None]).to(self.small)
        chain_t = chain.transpose(1, 2)
        return chain_t @ hessian @ chain, (chain_t @ gradient)[..., 0]

    def corner_motion(self, before, after) -> torch.Tensor:
        """Largest motion ``(N,)`` of a fixed-level corner between ``θ`` ``before`` and
        ``after``, in moving level pixels."""
        n, d = before.shape[0], self.ndim
        if self.motion_map is not None:
            if self.feature_map is not None:
                before, after = self.features(before), self.features(after)
            moves = torch.bmm((after - before)[:, None], self.motion_map).view(n, d, -1)
            return torch.linalg.vector_norm(moves, dim=1).amax(1)
        delta = (self.level_matrix(after) - self.level_matrix(before))[:, :d]
        return torch.linalg.vector_norm(self.corners @ delta.transpose(1, 2), dim=-1).amax(1)


class DeviceMutualInformationProblem(SquaresProblem):
    """``metric="mi"`` (the B-spline Parzen window) on the device, for
    :func:`_run_on_device`: the Newton-type system of :class:`MutualInformationProblem`
    (the same gradient and pixel curvature, the histogram's own curvature on levels of
    at most :data:`COUPLING_PIXELS` pixels) with no host read and no float64 on a GPU.

    The histogram's frames are the level's, fixed for the level (as elastix's Mattes
    metric fixes them for a run): the fixed level's range over its pixels of positive
    weight and the moving level's whole range, which holds every value the warped level
    can take (linear interpolation). The loss is then a continuous function of ``θ``: no
    frame that moves with the overlap (:class:`MutualInformationProblem`'s frames follow
    the pixels of positive weight, read back to test whether they changed), and the
    fixed image's taps (:func:`~..ops.mutual_information.cell_taps`) are made once.

    Per step: one pass for the trial's two histograms (over its own weight and over the
    weight of the point it starts from), their scores in closed form
    (:func:`~..ops.mutual_information.score_and_gradient`, float32 on a GPU, float64 on
    the CPU as :func:`~..ops._numerics.moment_dtype` has it); the system of the point
    kept from its histogram's gradient, kept with it (:meth:`select`). The matrix is
    positive semi-definite by construction: each pixel's curvature counts where it is
    positive, and the histogram's own curvature joins it only where the sum stays positive
    definite (a Cholesky factorization's status, tested on the device), where
    :class:`MutualInformationProblem` raises its eigenvalues (``eigh`` reads its status
    back on a GPU: a sync).
    """

    tolerance = MI_TOLERANCE

    def __init__(self, model, fixed, moving, weight, loss_fn, metric: str):
        super().__init__(model, fixed, moving, weight, loss_fn, metric)
        bins = self.bins = loss_fn.bins
        self.normalize = loss_fn.normalize
        n = self.pairs
        dtype = self.channels.dtype
        with torch.no_grad():
            fixed_rows = self.fixed_rows.to(dtype).expand(n, -1)
            own = self.weight.reshape(self.weight.shape[0], -1).expand(n, -1)
            lo, hi = frame_of(fixed_rows, own > 0)
            #: the fixed level's bin coordinates ``(N, P)`` and B-spline taps
            self.xi_fixed = bin_coordinates(fixed_rows, lo, hi, bins, 1.0)[0]
            self.fixed_taps = cell_taps(self.xi_fixed, bins)
            values = moving.reshape(moving.shape[0], -1).to(dtype)
            low = values.amin(1, keepdim=True).expand(n, 1)
            span = values.amax(1, keepdim=True).expand(n, 1) - low
            span = torch.where(span > 0, span, torch.ones_like(span))
            #: ``∂ξ/∂w`` ``(N, 1)`` in the moving frame, and the bin coordinate 1 (its low
            #: end) as a tensor (:meth:`_bin_coordinates`)
            self.moving_slope = (bins - 3) / span
            self._slopes = torch.stack([self.moving_slope, self.moving_slope**2])
            self._one = torch.ones((), dtype=dtype, device=low.device)
            # The warped level is sampled less the frame's low end (interpolation
            # commutes with the shift; the derivatives are the same): its bin coordinates
            # are then one product, without the rounding of a far-off low end.
            channels = self.channels.clone()
            channels[:, :1] -= low[: channels.shape[0]].view(-1, 1, *[1] * (channels.dim() - 2))
            self.channels = channels
        #: (sampled tensor, ξ (N, P), joint (N, bins, bins)) of the samples the next
        #: system is built at, and of the last trial (:meth:`losses`, :meth:`select`)
        self._kept = self._trial = None

    def _bin_coordinates(self, sampled) -> torch.Tensor:
        """The warped level's bin coordinates ``(N, P)`` in the level's moving frame
        (linear interpolation keeps every sample within it: not clamped; a rounding
        outside moves a tap weight by an ulp, :func:`_bspline3_cells` clamps the cell)."""
        n = sampled.shape[0]
        warped = sampled[:, 0].reshape(n, -1)  # less the frame's low end
        return torch.addcmul(self._one, warped, self.moving_slope)

    def _weight_rows(self, weight) -> torch.Tensor:
        return weight.reshape(weight.shape[0], -1).expand(self.pairs, -1)

    def _histograms(self, xi, weights) -> list:
        return bspline_histograms(self.fixed_taps, xi, weights, self.bins)

    def _scores(self, joint):
        """``(loss, ∂loss/∂J)`` of joint histograms ``(K, bins, bins)``: the loss ``(K,)``
        ``−MI`` (or ``2 − NMI``) in the problem's dtype, its gradient in the dtype the
        entropies run in (:func:`~..ops._numerics.moment_dtype`)."""
        wide = moment_dtype(joint.dtype, joint.device)
        # (a pair with no pixel of positive weight: NaN, a loss no step improves on)
        score, grad = score_and_gradient(joint.to(wide), self.normalize, negate=True, empty=False)
        loss = 2.0 - score if self.normalize else -score
        return loss.to(self.small), grad

    def loss(self, samples) -> torch.Tensor:
        """The loss ``(N,)`` of ``samples`` over their own weight (what the system at
        them needs kept for :meth:`normal_equations`)."""
        with torch.no_grad():
            xi = self._bin_coordinates(samples[0])
            taps = moving_taps(xi, self.bins)
            joint = self._histograms(taps, [self._weight_rows(samples[1])])[0]
            loss, grad = self._scores(joint)
            self._kept = (samples[0], xi, taps, grad)
            return loss

    def losses(self, samples, other_weight) -> torch.Tensor:
        """The loss of ``samples`` over their own weight and over ``other_weight``:
        ``(2, N)``, both histograms in one pass, their scores in one call."""
        n = self.pairs
        with torch.no_grad():
            xi = self._bin_coordinates(samples[0])
            taps = moving_taps(xi, self.bins)  # kept for the system, where the step is
            weights = [self._weight_rows(samples[1]), self._weight_rows(other_weight)]
            joints = torch.stack(self._histograms(taps, weights))  # (2, N, bins, bins)
            loss, grad = self._scores(joints.view(2 * n, self.bins, self.bins))
            self._trial = (samples[0], xi, taps, grad[:n])
            return loss.view(2, n)

    def select(self, better, trial, samples):
        """:meth:`SquaresProblem.select`, with what the system needs of the kept samples
        (their bin coordinates, the loss's gradient in their histogram): :meth:`losses`'
        trial's where ``better``."""
        out = super().select(better, trial, samples)
        kept, tried = self._kept, self._trial
        if (
            kept is not None
            and tried is not None
            and tried[0] is trial[0]
            and kept[0] is samples[0]
        ):
            # ξ only where the histogram's own curvature needs it (the coarse levels)
            coupled = kept[2][0].shape[1] <= COUPLING_PIXELS
            xi = torch.where(better[:, None], tried[1], kept[1]) if coupled else None
            cell = torch.where(better[:, None], tried[2][0], kept[2][0])
            taps = torch.where(better[:, None], tried[2][1], kept[2][1])
            grad = torch.where(better[:, None, None], tried[3], kept[3])
            self._kept = (out[0], xi, (cell, taps), grad)
        return out

    def normal_equations(self, samples, theta):
        """``(H (N, P, P), b (N, P))`` at ``θ``, in the problem's dtype: ``b`` the
        gradient of the loss, ``H`` (:class:`MutualInformationProblem`) positive
        semi-definite."""
        sampled, w = samples
        with torch.no_grad():
            if self._kept is None or self._kept[0] is not sampled:
                self.loss(samples)
            _, xi, taps, grad_joint = self._kept
            n, d = sampled.shape[0], self.ndim
            weight = self._weight_rows(w)
            first, second = bspline_pixel_derivatives(
                self.fixed_taps, taps, self._slopes, weight, grad_joint, self.bins
            )
            # each pixel's curvature where it is positive: a positive semi-definite sum
            second = second.clamp_min_(0.0)
            grad = sampled[:, 1:].reshape(n, d, -1)
            rows = (grad[:, :, None] * self.coords).reshape(n, d * (d + 1), -1)
            gradient = torch.bmm(rows, first.unsqueeze(-1)).to(self.small)
            hessian = torch.bmm(rows * second.unsqueeze(1), rows.transpose(1, 2))
            hessian = hessian.to(self.small)
            chain = self.chain(theta)
            chain_t = chain.transpose(1, 2)
            hessian = chain_t @ hessian @ chain
            gradient = (chain_t @ gradient)[..., 0]
            if weight.shape[1] <= COUPLING_PIXELS:
                joint = self._histograms(taps, [weight])[0]
                parzen = _Parzen("bspline", self.bins, self.loss_fn.sigma)
                moves = joint_jacobian(self.xi_fixed, xi, self.moving_slope, weight, parzen, rows)
                curvature = score_curvature(joint, moves, self.normalize).to(self.small)
                coupled = hessian - chain_t @ curvature @ chain
                # The histogram's own curvature is no part of the matrix where it makes it
                # indefinite (a Cholesky factorization fails): a test on the device, where
                # MutualInformationProblem's eigenvalues are read back.
                info = torch.linalg.cholesky_ex(coupled)[1]
                hessian = torch.where((info == 0)[:, None, None], coupled, hessian)
        return hessian, gradient


def _ncc_as_squares(fixed, moving, weight) -> torch.Tensor:
    """``1 −`` the weighted ZNCC of each row of ``moving`` ``(M, P)`` with ``fixed`` ``(1 or
    M, P)`` over ``weight`` ``(M, P)``, as half the weighted sum of squared differences of
    the two standardized images: ``½ Σ W (f̂ − ŵ)² = 1 − ZNCC``.

    The run's "ncc" loss, for float32: there ``1 − ZNCC`` computed from the correlation
    (as :class:`~..ops.losses.NCCLoss` does) rounds to about 1e-7 of 1, more than a
    step near the optimum changes it, so the steps that would reach the optimum are
    refused; the sum of squares rounds to about 1e-7 *of the loss*. (On the drift case of
    benchmarks/bench_dispatch.py the comparison in float32 from the correlation left a
    median corner error 6 % above float64's; this form, the same as float64's.)
    """
    total = weight.sum(1, keepdim=True).clamp_min(1e-12)

    def standardized(x):
        xc = x - (weight * x).sum(1, keepdim=True) / total
        energy = (weight * xc * xc).sum(1, keepdim=True)
        return xc * energy.clamp_min(1e-30).rsqrt()

    difference = standardized(fixed.expand_as(moving)) - standardized(moving)
    return 0.5 * (weight * difference * difference).sum(1)


def _fit(moving, fixed, weight):
    """:func:`intensity_fit` in the pixels' dtype (two passes: means, then centered sums)."""
    fixed = fixed.expand_as(moving)
    # each pass's weighted sums of both images in one product (issue 24: 21 -> 14 launches)
    total = weight.sum(1, keepdim=True).clamp_min(1e-12)
    means = torch.bmm(weight.unsqueeze(1), torch.stack([moving, fixed], dim=2))[:, 0] / total
    centered = torch.stack([moving, fixed], dim=1) - means.unsqueeze(2)  # (N, 2, P)
    wmc = (weight * centered[:, 0]).unsqueeze(1)
    var, cov = torch.bmm(wmc, centered.transpose(1, 2))[:, 0].unbind(1)
    alpha = cov / var.clamp_min(1e-30)
    mean_m, mean_f = means.unbind(1)
    return alpha, torch.addcmul(mean_f, alpha, mean_m, value=-1.0)


def level_problem(model, fixed, moving, weight, loss_fn, metric: str):
    """The problem of ``metric`` (one of :data:`METRICS`): :class:`SquaresProblem` for the
    sums of squares, :class:`DeviceMutualInformationProblem` for "mi" with the B-spline
    window (the run's), :class:`MutualInformationProblem` with the Gaussian."""
    if metric == "mi" and loss_fn.kernel == "bspline":
        return DeviceMutualInformationProblem(model, fixed, moving, weight, loss_fn, metric)
    if metric == "mi":  # the Gaussian window (every bin a tap): on the host
        return MutualInformationProblem(model, fixed, moving, weight, loss_fn, metric)
    return SquaresProblem(model, fixed, moving, weight, loss_fn, metric)


def damped_step(hessian, gradient, damping, p: int, frozen=None, sign: int = 1) -> torch.Tensor:
    """The Levenberg–Marquardt step ``(N, p)`` of the model's ``p`` parameters from the
    normal equations ``(N, Q, Q)``, ``(N, Q)`` (``Q >= p``; the intensity fit's unknowns
    last, undamped) and the damping ``λ`` ``(N,)``. A ridge of 1e-12 of the largest
    diagonal keeps a degenerate system (a flat image) solvable; a failed solve gives no
    step, and so does a pair of ``frozen`` ``(N,)`` (bool) where given. ``sign=-1`` gives
    the step negated (one launch less for a caller that subtracts it)."""
    diag = torch.diagonal(hessian, dim1=-2, dim2=-1)
    damp = damping[:, None] * diag[:, :p]
    if p < diag.shape[1]:
        damp = F.pad(damp, (0, diag.shape[1] - p))
    # λ diag + ridge, in one launch (an all-zero diagonal: no ridge, the solve fails, no step)
    ridge = diag.amax(dim=1, keepdim=True)
    system = hessian + torch.diag_embed(torch.add(damp, ridge, alpha=1e-12))
    step, info = torch.linalg.solve_ex(system, gradient if sign < 0 else -gradient)
    step = step[:, :p]
    # (a sum times 0 is 0 unless a component is NaN or ±inf: three launches for the test,
    # where isfinite takes four and abs().amax() < inf four)
    bad = (info != 0) | (step.sum(dim=1).mul_(0.0) != 0)
    if frozen is not None:
        bad = bad | frozen
    return step.masked_fill(bad[:, None], 0.0)


def run_level(
    problem: LevelProblem,
    iterations: int,
    history: list,
    report_every: int,
    progress,
    pair_history: list | None = None,
):
    """Levenberg–Marquardt on one level, at most ``iterations`` steps: a generator that
    yields ``progress(iteration, loss)`` every ``report_every`` steps (a true value sent
    back stops the run); the mean loss of every evaluation is appended to ``history``, and
    the list of the ``N`` pairs' losses to ``pair_history`` when given.

    Convergence is per pair: a pair whose step moves no corner by the problem's tolerance
    (or whose loss refuses a short step, or whose damping grew past its limit) is done and
    takes no more steps, while the others go on; the level ends once every pair is done.

    Returns True when stopped. The model ends at the last step kept: a step is kept where
    it lowers that pair's loss over the weights of the point it starts from (the sum of
    squares it minimizes; the weights follow the images' edges, and their change is no
    part of the step).
    """
    if isinstance(problem, SquaresProblem):
        return (
            yield from _run_on_device(
                problem, iterations, history, report_every, progress, pair_history
            )
        )
    model = problem.model
    # The per-pair bookkeeping (parameters, losses, systems) is small: float64 on the CPU.
    theta = model.flat_parameters().cpu().double()
    n, p = theta.shape
    samples = problem.sample()
    loss = problem.loss(samples)
    _record(loss.tolist(), history, pair_history)
    hessian, gradient = problem.normal_equations(samples)
    damping = torch.full((n,), DAMPING["start"], dtype=torch.float64, device=theta.device)
    done = torch.zeros(n, dtype=torch.bool, device=theta.device)
    for iteration in range(iterations):
        step = damped_step(hessian, gradient, damping, p)
        step = torch.where(done[:, None], torch.zeros_like(step), step)
        before = model.matrix().detach().cpu().double()
        model.set_flat_parameters(theta + step)
        moved = problem.corner_motion(before, model.matrix().detach().cpu().double())
        trial = problem.sample()
        better = (problem.loss(trial, samples[1]) < loss) & ~done
        theta = torch.where(better[:, None], model.flat_parameters().cpu().double(), theta)
        model.set_flat_parameters(theta)
        damping = torch.where(
            better, (damping * DAMPING["shrink"]).clamp_min(1e-12), damping * DAMPING["grow"]
        )
        # Done: a step too small to matter, or a small step the loss refuses (the loss
        # cannot tell points this close apart: its minimum lies within half the step).
        settled = (moved < problem.tolerance) | (~better & (moved < REFUSED_TOLERANCE))
        done = done | settled | (damping > DAMPING["most"]) | ~torch.isfinite(moved)
        if bool(better.all()):
            samples = trial  # the same tensors: what the problem kept of them still holds
        elif bool(better.any()):
            keep = better.view(-1, *([1] * (samples[0].dim() - 1))).to(samples[0].device)
            samples = (
                torch.where(keep, trial[0], samples[0]),
                torch.where(keep, trial[1], samples[1].expand_as(trial[1])),
            )
        if bool(better.any()):
            loss = torch.where(better, problem.loss(samples), loss)
            if not bool(done.all()):
                system = problem.normal_equations(samples)
                hessian = torch.where(better[:, None, None], system[0], hessian)
                gradient = torch.where(better[:, None], system[1], gradient)
        total = _record(loss.tolist(), history, pair_history)
        if report_every and iteration % report_every == 0 and (yield progress(iteration, total)):
            return True
        if bool(done.all()):
            break
    return False


def _record(row: list, history: list, pair_history: list | None) -> float:
    """Append the mean of the pairs' losses ``row`` to ``history`` (and ``row`` itself to
    ``pair_history``, when given); return the mean."""
    total = sum(row) / len(row)
    history.append(total)
    if pair_history is not None:
        pair_history.append(list(row))
    return total


def _run_on_device(
    problem: SquaresProblem, iterations, history, report_every, progress, pair_history=None
):
    """:func:`run_level` for a :class:`SquaresProblem`, with one host read per iteration.

    Every per-pair decision (keep the step, damp it, is the pair done) is a
    ``torch.where`` on the device; the trial's loss over both weights comes from one
    batched call, and the system at the kept points is rebuilt at every step (a pair whose
    step was refused gets its own system again). The host reads the mean loss and whether
    every pair is done, once per iteration: one sync.
    """
    model, p, n = problem.model, problem.params, problem.pairs
    host_reads = read_every(problem.fixed.device) == 1
    theta = problem.start()
    samples = problem.sample(theta)
    loss = problem.loss(samples)
    _record(loss.tolist(), history, pair_history)
    hessian, gradient = problem.normal_equations(samples, theta)
    damping = torch.full_like(loss, DAMPING["start"])
    done = torch.zeros_like(loss, dtype=torch.bool)
    # the constants of the decisions, on the device once (not one transfer per use)
    shrink, grow, tolerance, refused, most = (
        torch.tensor(v, dtype=loss.dtype, device=loss.device)
        for v in (
            DAMPING["shrink"],
            DAMPING["grow"],
            problem.tolerance,
            REFUSED_TOLERANCE,
            DAMPING["most"],
        )
    )
    true = torch.ones((), dtype=torch.bool, device=loss.device)
    stopped = False
    for iteration in range(iterations):
        trial_theta = theta - damped_step(hessian, gradient, damping, p, frozen=done, sign=-1)
        moved = problem.corner_motion(theta, trial_theta)
        trial = problem.sample(trial_theta)
        own, over_start = problem.losses(trial, samples[1])
        better = (over_start < loss) > done  # (a > b is a & ~b for bools: one launch less)
        theta = problem.keep(better, trial_theta, theta)
        damping = torch.mul(damping, torch.where(better, shrink, grow)).clamp_min_(1e-12)
        # Done: a step too small to matter, or a small step the loss refuses (the loss
        # cannot tell points this close apart: its minimum lies within half the step);
        # a step that is not finite ends the pair too.
        settled = moved < torch.where(better, tolerance, refused)
        done = torch.where(moved < math.inf, done | settled | (damping > most), true)
        samples = problem.select(better, trial, samples)
        loss = torch.where(better, own, loss)
        # Where the host is the device a read costs nothing: skip the system when no step
        # was kept (it is the one already held); elsewhere rebuild it without asking.
        if not host_reads or bool(better.any()):
            hessian, gradient = problem.normal_equations(samples, theta)
        read = torch.cat([loss, done.to(loss.dtype)]).tolist()  # the one sync
        total, finished = _record(read[:n], history, pair_history), all(read[n:])
        if report_every and iteration % report_every == 0:
            _set_parameters(model, theta)
            if (yield progress(iteration, total)):
                stopped = True
                break
        if finished:
            break
    _set_parameters(model, theta)
    return stopped


def _set_parameters(model, theta) -> None:
    """The model's parameters set to ``θ`` ``(N, P)``."""
    d = model.shift.shape[1]
    with torch.no_grad():
        model.shift.copy_(theta[:, :d])
        model.linear.copy_(theta[:, d:])
