"""Exponential of a stationary velocity field by scaling and squaring (docs/maths.md §8.3)."""

from __future__ import annotations

import torch

from . import _kernels
from ._autograd import first_order_backward
from ._numerics import compute_dtype
from ._sampling import displacement_to_grid, normalizing_scale
from ._validation import check_field

#: most squarings: 2**30 sub-steps already make the first one ~1e-9 of ``v``, below
#: float32's resolution of a pixel position; more change nothing but the risk of
#: underflow (and ``2**steps`` overflows a float beyond 1023)
MAX_STEPS = 30


def integrate_velocity(v: torch.Tensor, steps: int = 7) -> torch.Tensor:
    """The displacement of the flow of a stationary velocity field, by scaling and squaring.

    ``φ = exp(v)``: start from ``u = v / 2**steps`` (a displacement small enough to be
    its own exponential to first order) and compose it with itself ``steps`` times,
    ``u ← compose(u, u)``. For a smooth ``v`` the result is a diffeomorphism: its
    Jacobian determinant stays positive. A constant ``v`` integrates to itself.

    Parameters
    ----------
    v : Tensor, shape ``(N, D, *S)``
        Velocity in pixels per unit time, array-axis order.
    steps : int in ``[0, MAX_STEPS]``
        Squarings (0 returns ``v``); 7 is the usual choice (``2**7 = 128`` sub-steps).

    Returns
    -------
    Tensor, shape ``(N, D, *S)``, ``v``'s dtype. Differentiable with respect to ``v``.
    """
    check_field(v, "v")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an int in [0, {MAX_STEPS}], got {steps!r}")
    return scaling_and_squaring(v, steps)


def scaling_and_squaring(v: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`integrate_velocity` without its input checks (the registration loop's: the
    finite check reads a value back to the host, a sync per iteration on a GPU; the
    model's own field needs none).

    Where the compiled kernels run (``_kernels.use_compiled("integrate_velocity", ...)``) the whole
    chain is one ``simwarp::squaring_fwd`` and its backward one ``squaring_bwd``
    (csrc/cpu/squaring.cpp, csrc/cuda/squaring.cu). Otherwise (``SIMWARP_BACKEND=torch``,
    devices without kernels) each squaring ``u ← u + u(x + u(x))`` is three launches (the
    grid as one ``baddbmm``, the sampling, the sum) and, where a gradient is wanted, the
    whole chain is one autograd Function (:class:`_Squarings`) whose backward takes three
    per squaring. Both sample as :func:`~._sampling.sample_displaced` does (linear, the
    edge values beyond the border), so the values are :func:`~.compose.resample_field`'s
    up to rounding. The division by ``2**steps`` is the squarings' scale (exact: a power of
    two), which the compiled op applies in its first squaring each way.
    """
    scale = (2.0**-steps,) * (v.dim() - 2)
    return squarings(v.to(compute_dtype(v.dtype)), steps, scale).to(v.dtype)


def squarings(v: torch.Tensor, steps: int, scale=None, constants=None, with_input=False):
    """``steps`` squarings ``u ← u + u(x + u(x))`` of ``u = scale · v`` (``v`` ``(N, D,
    *S)``, pixels, a compute dtype; ``scale``: ``D`` floats, one per component, or None for
    none), no checks: :func:`scaling_and_squaring` with its factors. The compiled op reads
    ``v`` times the scale in its first squaring and scales the gradient in its last step
    back (no launch of its own either way). ``constants``: a function of no argument that
    gives :func:`squaring_constants` of ``S`` and ``scale``, for a caller that keeps them;
    called only where the torch path runs (the compiled op needs none), made here where it
    is None. ``with_input``: ``(the squarings, u)``, ``u`` differentiable: a term of ``u``
    (the regularizer of a velocity, in ``u``'s units) gives its gradient to the compiled
    backward, which adds it in its first step (where a term of ``v`` would take a sum of
    its own)."""
    if not steps and scale is None and not with_input:
        return v
    if steps and _kernels.use_compiled("integrate_velocity", v):
        from ._kernels import calls

        return calls.squarings(v, steps, scale, with_input=with_input)
    made = None if constants is None else constants()
    return torch_squarings(v, steps, scale, made, with_input=with_input)


def torch_squarings(v: torch.Tensor, steps: int, scale=None, constants=None, with_input=False):
    """:func:`squarings` through torch's ``grid_sampler`` (the compiled op's twin and
    fallback): ``v`` ``(N, D, *S)`` times ``scale`` (D factors) as one product (and its
    backward), then three launches per squaring each way; returns the field ``(N, D, *S)``
    (and ``u = scale · v`` with ``with_input``)."""
    if constants is None:
        constants = squaring_constants(tuple(v.shape[2:]), v.dtype, v.device, scale)
    base, mix, factors = constants
    u = v if factors is None else v * factors
    if not steps:
        out = u
    elif torch.is_grad_enabled() and u.requires_grad:
        out = _Squarings.apply(u, base, mix, steps)
    else:
        out = u
        with torch.no_grad():  # nothing saved for a backward (a full field: 14 copies)
            for _ in range(steps):
                out = _square(out, base, mix)[0]
    return (out, u) if with_input else out


#: grid_sampler's codes: bilinear interpolation, "border" padding (SciPy's "nearest")
_BILINEAR, _BORDER = 0, 1


def squaring_constants(shape, dtype, device, scale=None):
    """``(base (1, P, D), mix (D, D), factors (1, D, 1…) or None)`` for a field of
    spatial ``shape`` (``P`` pixels): grid_sample's normalized grid of ``x + u(x)`` is
    ``base + uᵀ mix`` (``uᵀ``: ``(N, P, D)``), ``base`` the identity grid, ``mix[d, e]``
    the factor that takes array component ``d`` (pixels) to grid component ``e`` ((x, y[,
    z]) order, normalized units; ``displacement_to_grid``'s scale, 0 along an axis of
    length 1); ``factors`` the torch path's ``scale`` (None for none)."""
    d = len(shape)
    factors = None
    if scale is not None:
        factors = torch.tensor([float(s) for s in scale], dtype=dtype, device=device)
        factors = factors.view(1, d, *[1] * d)
    mix = torch.zeros(d, d, dtype=dtype, device=device)
    for axis, (scale, _) in enumerate(normalizing_scale(shape)):
        mix[axis, d - 1 - axis] = scale
    zero = torch.zeros(1, d, *shape, dtype=dtype, device=device)
    base = displacement_to_grid(zero, shape).reshape(1, -1, d).contiguous()
    return base, mix, factors


def _square(u, base, mix):
    """One squaring of ``u`` ``(N, D, *S)``: ``(u + u(x + u(x)), its grid (N, *S, D))``."""
    n, d = u.shape[:2]
    spatial = u.shape[2:]
    grid = torch.baddbmm(
        base.expand(n, *base.shape[1:]), u.view(n, d, -1).transpose(1, 2), mix.expand(n, d, d)
    )
    grid = grid.view(n, *spatial, d)
    sampled = torch.grid_sampler(u, grid, _BILINEAR, _BORDER, True)
    return u + sampled, grid


class _Squarings(torch.autograd.Function):
    """``u ↦ u_steps`` with ``u_{k+1} = u_k + u_k(x + u_k(x))`` (:func:`_square`).

    Backward, from the last squaring to the first: with ``a`` the gradient with respect
    to ``u_{k+1}`` and ``(g_u, g_grid)`` grid_sampler's backward at ``(u_k, grid_k)``, the
    gradient with respect to ``u_k`` is ``a + g_u + mix g_gridᵀ`` (the grid depends on
    ``u_k`` through ``base + u_kᵀ mix``): three launches per squaring where autograd's
    graph of the separate ops takes about twelve.
    """

    @staticmethod
    def forward(ctx, u, base, mix, steps):
        saved = []
        for _ in range(steps):
            nxt, grid = _square(u, base, mix)
            saved += [u, grid]
            u = nxt
        ctx.save_for_backward(mix, *saved)
        return u

    @staticmethod
    @first_order_backward("scaling and squaring")
    def backward(ctx, grad):
        mix, *saved = ctx.saved_tensors
        n, d = grad.shape[:2]
        backward = (
            torch.ops.aten.grid_sampler_2d_backward
            if d == 2
            else torch.ops.aten.grid_sampler_3d_backward
        )
        mix_t = mix.expand(n, d, d)
        a = grad.contiguous()
        for k in reversed(range(len(saved) // 2)):
            u, grid = saved[2 * k], saved[2 * k + 1]
            g_u, g_grid = backward(a, u, grid, _BILINEAR, _BORDER, True, [True, True])
            a = torch.baddbmm(
                (a + g_u).view(n, d, -1), mix_t, g_grid.view(n, -1, d).transpose(1, 2)
            ).view_as(a)
        return a, None, None, None
