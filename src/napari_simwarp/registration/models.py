"""Transform models with trainable parameters, batched over ``N`` image pairs.

A model turns its parameters into a warped moving image at any pyramid level and into
:mod:`.transforms` objects at the end. Parameters are scaled so that one unit moves the
image by about one full-resolution pixel (translation in pixels, linear parts in pixels
of motion at the image's half-size radius); one learning rate then suits every parameter.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from ..ops import warp
from ..ops._autograd import first_order_backward
from ..ops._sampling import (
    affine_grid,
    displacement_to_grid,
    grid_sample,
    identity_grid,
    level_matrix,
)
from ..ops.integrate_velocity import squaring_constants, squarings
from .grid import Grid, unit_grid
from .pyramid import level_anisotropy, resize
from .transforms import AffineTransform, DisplacementTransform, VelocityTransform


def rotation_generators(ndim: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The skew-symmetric generators ``(K, D, D)`` of the rotation parameters: the rigid
    skew is ``Σ_k q_k G_k`` (2-D: one angle; 3-D: a rotation vector, about each array
    axis in turn)."""
    if ndim == 2:
        gens = [[[0, -1], [1, 0]]]
    else:
        gens = [
            [[0, 0, 0], [0, 0, -1], [0, 1, 0]],
            [[0, 0, 1], [0, 0, 0], [-1, 0, 0]],
            [[0, -1, 0], [1, 0, 0], [0, 0, 0]],
        ]
    return torch.tensor(gens, dtype=dtype, device=device)


#: terms of the power series in ``t = θ²`` (``θ = |v|``) of :func:`rodrigues`'s
#: coefficients: the last, ``θ²⁴ / 27!`` at most, is below float64's resolution for
#: ``θ ≤ π`` and about 1e-8 at ``θ = 2π``
ROTATION_TERMS = 13


def rotation_series(dtype=torch.float64, device=None) -> torch.Tensor:
    """``(ROTATION_TERMS, 3)``: the Taylor coefficients in ``t = θ²`` of ``sin θ / θ``,
    ``(1 − cos θ) / θ²`` and ``(θ − sin θ) / θ³`` (columns): three entire functions of
    ``t`` with no cancellation at small angles, where the closed forms lose every digit
    in float32."""
    k = np.arange(ROTATION_TERMS)
    sign = (-1.0) ** k
    cols = [sign / np.array([math.factorial(2 * i + j) for i in k], float) for j in (1, 2, 3)]
    return torch.as_tensor(np.stack(cols, axis=1), dtype=dtype, device=device)


@functools.lru_cache(maxsize=16)
def _rotation_constants(dtype, device):
    """(the series of :func:`rotation_series`, the 3-D generators ``(3, 9)``, ``I`` as
    ``(1, 3, 3)``) on ``device``, made once."""
    return (
        rotation_series(dtype, device),
        rotation_generators(3, dtype, device).reshape(3, 9),
        torch.eye(3, dtype=dtype, device=device)[None],
    )


def rodrigues(v: torch.Tensor, jacobian: bool = False):
    """``R = exp([v]×)`` ``(N, 3, 3)`` of rotation vectors ``v`` ``(N, 3)`` (the skew of
    :func:`rotation_generators`), and with ``jacobian`` its derivatives ``∂R/∂v_k``
    ``(N, 3, 3, 3)`` (``k`` the second axis): the matrix exponentials of
    :class:`LinearModel`'s 3-D rotations in closed form.

    Rodrigues' formula ``R = I + a K + b K²`` (``K = [v]×``, ``a = sin θ / θ``, ``b = (1 −
    cos θ) / θ²``) and ``∂R/∂v_k = R [J e_k]×`` with the right Jacobian ``J = I − b K + c
    K²`` (``c = (θ − sin θ) / θ³``), the coefficients from their power series in ``θ²``
    (:func:`rotation_series`): float32-exact at small angles, differentiable (autograd,
    also at 0), about fifteen launches and no host read, where ``torch.linalg.matrix_exp``
    reads the matrix norm back on CUDA to choose its degree (a sync) and takes 25
    launches for the Van Loan block of its derivative."""
    series, gens, eye = _rotation_constants(v.dtype, v.device)
    n = v.shape[0]
    t = torch.linalg.vecdot(v, v)
    coef = torch.linalg.vander(t, N=ROTATION_TERMS) @ series  # (N, 3): a, b, c
    k = (v @ gens).view(n, 3, 3)
    k2 = k @ k
    a, b, c = (coef[:, i, None, None] for i in range(3))
    rot = eye + a * k + b * k2
    if not jacobian:
        return rot
    right = eye - b * k + c * k2
    # [J e_k]× = Σ_j J[j, k] G_j: one product with the generators
    skews = (right.transpose(1, 2) @ gens).view(n, 3, 3, 3)
    return rot, rot[:, None] @ skews


def _plane_rotation(angle: torch.Tensor) -> torch.Tensor:
    """``exp(α G)`` ``(N, 2, 2)`` of angles ``(N,)``: ``[[cos, −sin], [sin, cos]]``."""
    c, s = torch.cos(angle), torch.sin(angle)
    return torch.stack([c, -s, s, c], dim=-1).view(-1, 2, 2)


#: device types on which the linear models' matrices and the Gauss–Newton bookkeeping run
#: in float64: the CPU only. GPUs run float64 at 1/32 to 1/64 of the float32 rate (and
#: MPS has none), so the small matrices stay in float32 there. Tests add "cpu"'s removal
#: to run the GPU's dtypes on the CPU.
WIDE_DEVICE_TYPES = frozenset({"cpu"})


#: how often (in iterations) the Adam loop reads its losses back to the host, per device
#: type: the read is where the plateau schedule and the convergence test run. A read
#: waits for the device to finish what it was given (tens of µs and an empty launch queue
#: on a GPU), so accelerators read every 10 iterations; on the CPU the host is the device
#: and a read costs nothing, so it reads every iteration and the schedule reacts at once.
#: Tests set "cpu" to the GPU's value to run the GPU's loop on the CPU. (Used by
#: optimize.py's Adam and gauss_newton.py; kept here, beside :data:`WIDE_DEVICE_TYPES`.)
READ_EVERY = {"cpu": 1}
#: :data:`READ_EVERY` of the device types it does not name
READ_EVERY_DEFAULT = 10


def read_every(device) -> int:
    """Iterations between two reads of the loss buffer on ``device``."""
    return READ_EVERY.get(torch.device(device).type, READ_EVERY_DEFAULT)


def wide_dtype(device) -> torch.dtype:
    """float64 on :data:`WIDE_DEVICE_TYPES`, else float32."""
    return torch.float64 if torch.device(device).type in WIDE_DEVICE_TYPES else torch.float32


#: device types on which :func:`inside_mask` takes the largest component of a grid as one
#: infinity norm (one launch); the CPU's is about 50 times slower than ``abs().amax()``
#: (measured 9 ms for a 256² grid), so the CPU takes those two. Tests add "cpu" to count
#: the GPU's launches on the CPU.
INF_NORM_DEVICE_TYPES = frozenset({"cuda", "mps"})


def inside_mask(grid: torch.Tensor, shape, cache: dict) -> torch.Tensor:
    """:func:`~napari_simwarp.ops._sampling.grid_inside` (half a pixel of margin) of a
    normalized grid ``(N, *S_out, D)`` onto an image of ``shape``, as ``(N, 1, *S_out)``,
    with its limits made once (in ``cache``) and, where they are the same on every axis (a
    square image), as one norm ``max_i |g_i| <= limit``: three launches where it takes five.
    """
    limits = [1.0 + 1.0 / (n - 1) if n > 1 else math.inf for n in reversed(shape)]
    if len(set(limits)) == 1:
        if grid.device.type in INF_NORM_DEVICE_TYPES:
            largest = torch.linalg.vector_norm(grid, math.inf, dim=-1)
        else:
            largest = grid.abs().amax(dim=-1)
        inside = largest <= limits[0]
    else:
        key = ("inside", tuple(shape), grid.dtype, grid.device)
        bound = cache.get(key)
        if bound is None:
            bound = cache[key] = torch.tensor(limits, dtype=grid.dtype, device=grid.device)
        inside = (grid.abs() <= bound).all(dim=-1)
    return inside.unsqueeze(1).to(grid.dtype)


class LinearModel:
    """Translation, rigid, similarity or affine, in physical space about the fixed image's
    center (docs/maths.md §6.1).

    ``y = L (x − c) + c + t`` maps fixed physical coordinates ``x`` to moving physical
    coordinates (``c``: the fixed image's physical center), composed after an optional
    initial transform: ``P = P0 @ P(θ)``. The pixel matrix the warps take is
    ``M = G_moving⁻¹ · P · G_fixed`` (``G``: pixel → physical maps of the two
    :class:`~.grid.Grid`). Rotations are thus rotations of the sample, whatever the voxel
    shape; with unit grids ``M = P``. Centering decouples rotation from translation, which
    is what lets the optimizer move them independently. Parameters are in units of the
    fixed image's finest pixel size ``u``: ``t = u · shift`` and ``L = exp(q / R)`` with
    ``R`` the image's half-extent in ``u``.

    ``init`` (``(D + 1, D + 1)`` or ``(N, D + 1, D + 1)``) is a *pixel* matrix, fixed →
    moving, as ``Transform.matrix``.
    """

    def __init__(
        self,
        kind: str,
        fixed_shape,
        moving_shape,
        batch: int,
        *,
        init=None,
        dtype=torch.float32,
        device="cpu",
        fixed_grid: Grid | None = None,
        moving_grid: Grid | None = None,
    ):
        self.kind = kind
        self.fixed_shape = tuple(fixed_shape)
        self.moving_shape = tuple(moving_shape)
        d = self.ndim = len(fixed_shape)
        self.fixed_grid = fixed_grid or unit_grid(d)
        self.moving_grid = moving_grid or unit_grid(d)
        spacing = self.fixed_grid.spacing
        unit = min(spacing)
        extent = max(s * n for s, n in zip(spacing, self.fixed_shape))
        self.unit = unit
        self.radius = max(extent / 2.0 / unit, 1.0)
        n_lin = {
            "translation": 0,
            "rigid": 1 if d == 2 else 3,
            "similarity": (1 if d == 2 else 3) + 1,
            "affine": d * d,
        }[kind]
        self.shift = torch.zeros(batch, d, dtype=dtype, device=device, requires_grad=True)
        self.linear = torch.zeros(batch, n_lin, dtype=dtype, device=device, requires_grad=True)
        # The fixed parts of M are kept in float64 on the CPU, so that origins far from zero
        # cost no precision; in float32 on accelerators (:data:`WIDE_DEVICE_TYPES`).
        wide = self.wide = wide_dtype(device)
        origin = self.fixed_grid.origin
        center = [o + s * (n - 1) / 2 for o, s, n in zip(origin, spacing, fixed_shape)]
        to_center, from_center = np.eye(d + 1), np.eye(d + 1)
        to_center[:d, d], from_center[:d, d] = center, [-c for c in center]
        # M = left @ [L | u·shift] @ right, with left = G_m⁻¹ P0 T(c), right = T(-c) G_f.
        if init is None:
            p0 = np.eye(d + 1)[None]
        else:
            m0 = np.asarray(init.detach().cpu() if isinstance(init, torch.Tensor) else init)
            m0 = m0.astype(np.float64).reshape(-1, d + 1, d + 1)
            p0 = self.moving_grid.to_physical() @ m0 @ self.fixed_grid.to_pixels()
        left = self.moving_grid.to_pixels() @ p0 @ to_center
        right = from_center @ self.fixed_grid.to_physical()
        # float64 copies on the host, for the solvers' constants (gauss_newton.py)
        self.left_host = np.broadcast_to(left, (batch, d + 1, d + 1))
        self.right_host = right
        self.left = torch.as_tensor(left, dtype=wide, device=device).expand(batch, -1, -1)
        self.right = torch.as_tensor(right, dtype=wide, device=device)
        self._level_ends = {}  # warp()'s constants per (moving level, fixed level)

    @property
    def init(self) -> torch.Tensor:
        """The initial pixel matrices ``(N, D + 1, D + 1)`` (θ = 0)."""
        with torch.no_grad():
            return self.left @ self.right

    def parameters(self) -> list[torch.Tensor]:
        return [self.shift, self.linear] if self.linear.shape[1] else [self.shift]

    def set_level(self, shape) -> None:  # linear parameters do not depend on the level
        pass

    def _linear_part(self, linear: torch.Tensor) -> torch.Tensor:
        n, d = linear.shape[0], self.ndim
        q = linear / self.radius
        eye = torch.eye(d, dtype=q.dtype, device=q.device).expand(n, d, d)
        if self.kind == "translation":
            return eye
        if self.kind == "affine":
            return eye + q.view(n, d, d)
        k = 1 if d == 2 else 3
        rot = _plane_rotation(q[:, 0]) if d == 2 else rodrigues(q[:, :k])
        if self.kind == "similarity":
            rot = rot * torch.exp(q[:, k]).view(n, 1, 1)
        return rot

    def _linear_jacobian(self, linear: torch.Tensor) -> torch.Tensor:
        """``∂L/∂linear`` ``(N, K, D, D)`` (no gradient), in closed form: in 2-D the
        rotation commutes with its generator (``∂R/∂α = R G``), in 3-D :func:`rodrigues`'
        derivatives (no matrix exponential: no host read on a GPU)."""
        n, d = linear.shape[0], self.ndim
        q = linear.detach() / self.radius
        if self.kind == "affine":
            basis = torch.eye(d * d, dtype=q.dtype, device=q.device).view(d * d, d, d)
            return basis.expand(n, -1, -1, -1) / self.radius
        if d == 2:
            k = 1
            rot = _plane_rotation(q[:, 0])[:, None]
            out = rot @ rotation_generators(2, q.dtype, q.device)
        else:
            k = 3
            rot, out = rodrigues(q[:, :k], jacobian=True)
            rot = rot[:, None]
        if self.kind == "similarity":
            scale = torch.exp(q[:, k]).view(n, 1, 1, 1)
            out = torch.cat([out * scale, rot * scale], dim=1)
        return out / self.radius

    def physical_core(self, shift=None, linear=None) -> torch.Tensor:
        """``[L | u·shift]`` as homogeneous matrices ``(N, D+1, D+1)`` (about the center),
        at the model's parameters or at ``shift`` ``(N, D)`` and ``linear`` ``(N, K)``."""
        shift = self.shift if shift is None else shift
        linear = self.linear if linear is None else linear
        n, d = shift.shape
        lin = self._linear_part(linear)
        top = torch.cat([lin, (self.unit * shift).unsqueeze(-1)], dim=-1)
        bottom = torch.zeros(n, 1, d + 1, dtype=lin.dtype, device=lin.device)
        bottom[..., -1] = 1
        return torch.cat([top, bottom], dim=1)

    def matrix(self, shift=None, linear=None) -> torch.Tensor:
        """Homogeneous fixed → moving *pixel* matrices ``(N, D+1, D+1)`` (float64 but on
        MPS), full resolution; differentiable with respect to the parameters (the model's,
        or ``shift`` and ``linear`` as :meth:`physical_core` takes them)."""
        return self.left @ self.physical_core(shift, linear).to(self.wide) @ self.right

    def matrix_jacobian(self) -> torch.Tensor:
        """``∂M/∂θ`` ``(N, P, D+1, D+1)`` at the current parameters: the derivative of
        :meth:`matrix` with respect to each of the ``P`` parameters ``θ = (shift,
        linear)`` (the order of :meth:`parameters`, flattened), in the matrix's dtype
        (float64 but on MPS); no gradient."""
        with torch.no_grad():
            linear = self.linear.detach().to(self.wide)
            n, d = self.shift.shape
            k = linear.shape[1]
            core = torch.zeros(n, d + k, d + 1, d + 1, dtype=self.wide, device=linear.device)
            for axis in range(d):
                core[:, axis, axis, d] = self.unit
            if k:
                core[:, d:, :d, :d] = self._linear_jacobian(linear)
            return self.left[:, None] @ core @ self.right

    def flat_parameters(self) -> torch.Tensor:
        """``θ = (shift, linear)`` per pair, ``(N, P)``, detached, in the matrix's dtype."""
        return torch.cat([self.shift.detach(), self.linear.detach()], dim=1).to(self.wide)

    def set_flat_parameters(self, theta: torch.Tensor) -> None:
        """Set ``θ`` ``(N, P)`` (the layout of :meth:`flat_parameters`)."""
        d = self.shift.shape[1]
        with torch.no_grad():
            self.shift.copy_(theta[:, :d])
            self.linear.copy_(theta[:, d:])

    def warp(self, moving: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
        """Warp a moving level onto a fixed level of ``shape``; return (warped, in-bounds).

        The full-resolution matrix is carried to the two levels' pixels
        (:func:`~napari_simwarp.ops._sampling.level_matrix`) and sampled as ``warp_affine``
        samples, with the edge pixels repeated beyond the border; "in-bounds" is 1 where
        a sample fell within half a pixel of the moving level.
        """
        moving_level = tuple(moving.shape[2:])
        key = (moving_level, tuple(shape))
        ends = self._level_ends.get(key)
        if ends is None:  # L_moving⁻¹ · left and right · L_fixed, made once per level
            # (level_matrix of equal full and level shapes: its factor there is the identity)
            same, other = tuple(shape), moving_level
            with torch.no_grad():
                ends = self._level_ends[key] = (
                    level_matrix(self.left, self.moving_shape, moving_level, same, same),
                    level_matrix(self.right[None], other, other, self.fixed_shape, shape)[0],
                )
        matrix = ends[0] @ self.physical_core().to(self.wide) @ ends[1]
        grid = affine_grid(matrix.to(moving.dtype), moving_level, shape)
        warped = grid_sample(moving, grid, "linear", "nearest")
        return warped, inside_mask(grid.detach(), moving_level, self._level_ends)

    def regularizer(self) -> torch.Tensor:
        return self.shift.new_zeros(self.shift.shape[0])

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.parameters()]

    def restore(self, values, which=None) -> None:
        with torch.no_grad():
            for p, v in zip(self.parameters(), values):
                if which is None:
                    p.copy_(v)
                else:
                    p.copy_(torch.where(which.view(-1, *([1] * (p.dim() - 1))), v, p))

    def transforms(self, values=None) -> list[AffineTransform]:
        if values is not None:
            current = self.snapshot()
            self.restore(values)
        with torch.no_grad():
            mats = self.matrix().double().cpu().numpy()
        if values is not None:
            self.restore(current)
        return [
            AffineTransform(m, self.kind).with_grids(self.fixed_grid, self.moving_grid)
            for m in mats
        ]


#: the memory order of a fused B-spline field's axes, by dimension (see
#: :class:`_SplineGrid2d`, :class:`_SplineGrid3d`): the components before the last axis
FUSED_LAYOUT = {2: (0, 2, 1, 3), 3: (0, 2, 3, 1, 4)}

#: the dense models' control-grid interpolations (see :class:`DenseModel`)
CONTROLS = ("linear", "bspline")
#: each dense model's control grid by default (see :class:`DenseModel`)
DEFAULT_CONTROL = {"deformable": "bspline", "diffeomorphic": "linear"}


def bspline_weights(n_control: int, size: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The cubic B-spline weights ``(size, n_control)`` of ``n_control`` control points
    spread over an axis of ``size`` pixels (pixel-center convention: the axis spans
    ``[-0.5, size - 0.5]``), as ``dtype`` on ``device``.

    Worked out once per ``(n_control, size)`` in float64 on the CPU (Apple's MPS has no
    float64) and cached: a run evaluates the field with the same few matrices at every
    iteration.
    """
    # A copy: the cached matrix is never handed out to be written into.
    return _bspline_weights(n_control, size).to(device=device, dtype=dtype, copy=True)


@functools.lru_cache(maxsize=64)
def _bspline_weights(n_control: int, size: int) -> torch.Tensor:
    """:func:`bspline_weights` in float64 on the CPU.

    The knots are ``h = size / (n_control - 3)`` pixels apart, one outside each end of the
    axis and one more beyond it (a cubic B-spline spans four knots, so every pixel is
    covered by four of them, as in elastix's B-spline transform): pixel ``x`` sits at knot
    coordinate ``t = (x + 0.5) / h + 1`` and takes ``Σ_k c_k β³(t − k)``. The weights
    depend only on where a pixel sits in the field of view, so the same control points
    give the same field at every pyramid level.
    """
    if n_control < 4:
        raise ValueError(f"n_control must be at least 4 for a cubic B-spline, got {n_control}")
    h = size / (n_control - 3)
    t = (torch.arange(size, dtype=torch.float64) + 0.5) / h + 1.0
    r = (t[:, None] - torch.arange(n_control, dtype=torch.float64)).abs()
    return torch.where(
        r < 1, 2.0 / 3.0 - r**2 + r**3 / 2, torch.where(r < 2, (2 - r).clamp(min=0) ** 3 / 6, 0.0)
    )


def _half_dot(rows, cols, ones):
    """``½ rows · cols`` per pair ``(N,)``, ``rows`` ``(N, 1, K)``, ``cols`` ``(N, K, 1)``, in
    one launch; with ``ones`` ``(N, 1, 1)``: ``1 +`` it, in the same launch. The weighted
    regularizer's sum ``½ Σ g · (2 w g)`` of :class:`_WeightedSquares` and the spline
    Functions."""
    if ones is None:  # β = 0: the first argument (a view of rows) is only read for its shape
        out = torch.baddbmm(rows[:, :, :1], rows, cols, beta=0, alpha=0.5)
    else:
        out = torch.baddbmm(ones, rows, cols, alpha=0.5)
    return out.view(rows.shape[0])


def _spline_field_gradient(rows, m_x, wg, grad_term, stencils, padding, shape):
    """The backward tail of the spline Functions: ``∂/∂F = rows m_xᵀ + stencilsᵀ ⋆ (wg ·
    t)`` ``(N, R, D·c_x)`` (``shape``), or None where neither share is asked.

    ``rows`` ``(N, R, X·D)``: ``∂/∂(F m_x)`` from the grid's gradient, or None; ``wg``: the
    stencils' responses times twice their weights, as the forward saved them, or None (no
    regularizer); ``grad_term`` ``(N,)``: the term's gradient ``t``, or None; ``padding``:
    the forward's convolution padding. The regularizer's share is summed in by the last
    product's ``baddbmm`` (no launch of its own).
    """
    reg = None  # ∂/∂F of the term
    if grad_term is not None and wg is not None:
        scaled = torch.mul(wg, grad_term.view(-1, 1, 1, 1, 1))
        reg = F.conv_transpose3d(scaled, stencils, padding=padding).view(shape)
    if rows is None:
        return reg
    m_t = m_x.t().expand(rows.shape[0], *m_x.t().shape)
    if reg is None:
        return torch.bmm(rows, m_t)
    return torch.baddbmm(reg, rows, m_t)


class _WeightedSquares(torch.autograd.Function):
    """``(g (N, K), w2 (1, K)) ↦ ½ Σ_k w2_k g_k²`` per row ``(N,)`` in two launches, and
    its gradient ``w2 g · grad`` in one (autograd's form of ``(g * g * w).sum(1)`` takes
    three forward and four backward). ``w2`` (twice the weights) is a constant."""

    @staticmethod
    def forward(ctx, g, w2, ones=None):
        wg2 = torch.mul(g, w2)
        ctx.save_for_backward(wg2)
        return _half_dot(g.unsqueeze(1), wg2.unsqueeze(2), ones)

    @staticmethod
    def backward(ctx, grad):
        (wg2,) = ctx.saved_tensors
        return torch.mul(wg2, grad.unsqueeze(1)), None, None


class _SplineGrid2d(torch.autograd.Function):
    """A 2-D B-spline field ``(N, D, c_y, c_x)`` (stored ``(N, c_y, D, c_x)`` in memory)
    ↦ ``(grid (N, H, W, D), term (N,))``: grid_sample's grid ``base + B_y F m_x`` (two
    batched matrix products: the x axis's B-spline weights, the components' flip and scale
    in ``m_x``; the y axis's weights and the identity in one ``baddbmm``) and the weighted
    regularizer ``Σ w g²`` of the stencils' responses ``g`` (one convolution over
    ``(c_y, D, c_x)`` that leaves the components apart; ``ones`` ``(N, 1, 1)``: ``1 +`` the
    term, in the same launch).

    Backward: ``∂/∂F = B_yᵀ G m_xᵀ + stencilsᵀ ⋆ (2 w g · t)`` (``G``: the grid's
    gradient, ``t``: the term's), the second summed into the first by the last product's
    ``baddbmm``: four launches where autograd's forms take eight.
    """

    @staticmethod
    def forward(ctx, field, m_x, w_y, base, stencils, w2, ones):
        n, d, cy, cx = field.shape
        h = w_y.shape[0]
        fp = field.permute(0, 2, 1, 3)  # (N, c_y, D, c_x): contiguous as stored
        # batched products, a pair per batch entry, also for one pair: each pair's
        # arithmetic is the same alone and in a batch (a pair's rows in one larger mm can
        # take another BLAS path, and round otherwise)
        x_done = torch.bmm(fp.reshape(n, cy, d * cx), m_x.expand(n, *m_x.shape))
        grid = torch.baddbmm(base.expand(n, *base.shape), w_y.expand(n, *w_y.shape), x_done)
        grid = grid.view(n, h, -1, d)
        wg = None
        if stencils is None:
            term = field.new_zeros(n) if ones is None else ones.view(n).clone()
        else:
            g = F.conv3d(fp.reshape(n, 1, cy, d, cx), stencils, padding=(1, 0, 1))
            wg = torch.mul(g, w2)  # (N, T, c_y, D, c_x), twice the weights
            term = _half_dot(g.view(n, 1, -1), wg.view(n, -1, 1), ones)
        ctx.save_for_backward(m_x, w_y, stencils, wg)
        ctx.shape = (n, d, cy, cx)
        return grid, term

    @staticmethod
    @first_order_backward("B-spline grid")
    def backward(ctx, grad_grid, grad_term):
        m_x, w_y, stencils, wg = ctx.saved_tensors
        n, d, cy, cx = ctx.shape
        rows = None  # ∂/∂(F m_x) (N, c_y, W·D)
        if grad_grid is not None:
            g = grad_grid.reshape(n, grad_grid.shape[1], -1)  # (N, H, W·D)
            rows = torch.bmm(w_y.t().expand(n, *w_y.t().shape), g)
        out = _spline_field_gradient(rows, m_x, wg, grad_term, stencils, (1, 0, 1), (n, cy, d * cx))
        if out is None:
            return (None,) * 7
        return out.view(n, cy, d, cx).permute(0, 2, 1, 3), None, None, None, None, None, None


class _SplineGrid3d(torch.autograd.Function):
    """:class:`_SplineGrid2d` in 3-D: a B-spline field ``(N, D, c_z, c_y, c_x)`` (stored
    ``(N, c_z, c_y, D, c_x)`` in memory) ↦ ``(grid (N, Z, Y, X, D), term (N,))``.

    The grid in three batched products: the x axis's weights with the components' flip
    and scale (``m_x``), the y axis's (a product per ``(pair, z knot)``), the z axis's and
    the identity in one ``baddbmm``. The regularizer's stencils ``(T, 1, 3, 3, 3)`` run
    over ``(c_z, c_y, D·c_x)``, the components side by side along the last axis: a tap
    that crosses from one component into the next falls where the term's weight is 0
    (every stencil is weighted only where all its taps are on the grid), so neither the
    term nor its gradient mixes components.

    Backward: ``∂/∂F = (B_zᵀ, B_yᵀ) G m_xᵀ + stencilsᵀ ⋆ (2 w g · t)``, the regularizer's
    share summed in by the last product: five launches (autograd's separable form takes
    about twenty, forward and backward, with its copies).
    """

    @staticmethod
    def forward(ctx, field, m_x, w_y, w_z, base, stencils, w2, ones):
        n, d, cz, cy, cx = field.shape
        zs, ys = w_z.shape[0], w_y.shape[0]
        fp = field.permute(0, 2, 3, 1, 4)  # (N, c_z, c_y, D, c_x): contiguous as stored
        x_done = torch.bmm(fp.reshape(n, cz * cy, d * cx), m_x.expand(n, *m_x.shape))
        xd = x_done.shape[-1]  # X·D
        y_done = torch.bmm(w_y.expand(n * cz, *w_y.shape), x_done.view(n * cz, cy, xd))
        grid = torch.baddbmm(
            base.expand(n, *base.shape),
            w_z.expand(n, *w_z.shape),
            y_done.view(n, cz, ys * xd),
        )
        grid = grid.view(n, zs, ys, -1, d)
        wg = None
        if stencils is None:
            term = field.new_zeros(n) if ones is None else ones.view(n).clone()
        else:
            g = F.conv3d(fp.reshape(n, 1, cz, cy, d * cx), stencils, padding=1)
            wg = torch.mul(g, w2)  # (N, T, c_z, c_y, D·c_x), twice the weights
            term = _half_dot(g.view(n, 1, -1), wg.view(n, -1, 1), ones)
        ctx.save_for_backward(m_x, w_y, w_z, stencils, wg)
        ctx.shape = (n, d, cz, cy, cx)
        return grid, term

    @staticmethod
    @first_order_backward("B-spline grid")
    def backward(ctx, grad_grid, grad_term):
        m_x, w_y, w_z, stencils, wg = ctx.saved_tensors
        n, d, cz, cy, cx = ctx.shape
        zs, ys = w_z.shape[0], w_y.shape[0]
        rows = None  # ∂/∂(F m_x) (N, c_z·c_y, X·D)
        if grad_grid is not None:
            g = grad_grid.reshape(n, zs, -1)  # (N, Z, Y·X·D)
            zt, yt = w_z.t(), w_y.t()
            rz = torch.bmm(zt.expand(n, *zt.shape), g)  # (N, c_z, Y·X·D)
            xd = g.shape[-1] // ys
            rows = torch.bmm(yt.expand(n * cz, *yt.shape), rz.view(n * cz, ys, xd))
            rows = rows.view(n, cz * cy, xd)
        out = _spline_field_gradient(rows, m_x, wg, grad_term, stencils, 1, (n, cz * cy, d * cx))
        if out is None:
            return (None,) * 8
        out = out.view(n, cz, cy, d, cx).permute(0, 3, 1, 2, 4)
        return (out,) + (None,) * 7


def _doubled(plan):
    """A regularizer plan ``(stencils, weights)`` with its weights doubled (or ``(None,
    None)``)."""
    stencils, weights = plan
    return (stencils, None if weights is None else 2.0 * weights)


def apply_per_axis(x: torch.Tensor, matrices) -> torch.Tensor:
    """``x`` ``(N, C, *S)`` with matrix ``A_a`` ``(T_a, S_a)`` applied along each spatial axis
    ``a``: ``(N, C, *T)``. A separable linear map (B-spline evaluation, its least-squares
    inverse), differentiable with respect to ``x``."""
    for axis, a in enumerate(matrices):
        dim = 2 + axis
        x = torch.movedim(torch.movedim(x, dim, -1) @ a.T.to(x.dtype), -1, dim)
    return x


class DenseModel:
    """A displacement (``deformable``) or stationary velocity (``diffeomorphic``) field.

    The field lives on a control grid, in full-resolution pixels, and is upsampled to the
    level; a coarse grid is its own smoothness prior and keeps the parameter count small.
    ``control="linear"``: the control values are the field's values at the nodes, upsampled
    bilinearly (trilinear in 3-D) and refined by interpolation between levels;
    ``"bspline"``: they are the coefficients of a cubic B-spline (:func:`bspline_weights`,
    a smooth field with continuous second derivatives, as elastix's B-spline transform),
    refined between levels by a least-squares fit of the finer grid to the coarser field
    (diffeomorphic runs: linear only); ``None``: :data:`DEFAULT_CONTROL` of ``kind``. The
    nodes are about ``grid_spacing`` level pixels apart along the level's finest axes and
    the same physical distance along the others (``spacing``: the fixed image's pixel size
    per axis; default isotropic). ``Reg`` is
    the diffusion energy, the mean squared spatial derivative of the control values in
    physical units per control cell (dimensionless), so that z is smoothed as much as xy
    in an anisotropic volume; ``regularizer_kind="bending"``: the bending energy instead,
    the mean squared second differences (cross terms twice) per squared control cell
    (``None``: bending for a B-spline grid, diffusion for a linear one).

    The bending energy is measured in the pixels of the level being optimized, as the
    similarity is: at a level whose pixels are ``s`` full-resolution pixels (``s``: the
    largest ratio of the full shape to the level's), displacements and lengths both in
    level pixels, i.e. ``s²`` times its value in full-resolution units (docs/maths.md
    §6.3). At full resolution (``s = 1``) nothing changes; on a coarser level, where the
    cells are ``s`` times wider in full-resolution pixels, a wiggle spanning the same
    level pixels costs as much as at full resolution in level units, where it would cost
    ``s²`` times less in full-resolution units. It matters where the finest level is
    skipped (images above 256² with Adam): there the field is fitted on that level alone
    (docs/benchmarks.md, issue 16: the 512² pair of bench_register, EPE 0.068 → 0.062 px;
    the bench_quality cases unchanged). The diffusion energy is unchanged.
    """

    def __init__(
        self,
        kind: str,
        shape,
        batch: int,
        *,
        grid_spacing: float = 8.0,
        steps: int = 7,
        init=None,
        dtype=torch.float32,
        device="cpu",
        spacing=None,
        fixed_grid: Grid | None = None,
        moving_grid: Grid | None = None,
        moving_shape=None,
        control: str | None = None,
        regularizer_kind: str | None = None,
    ):
        if control is None:
            control = DEFAULT_CONTROL[kind]
        if regularizer_kind is None:  # elastix's pairing: a cubic B-spline, bending energy
            regularizer_kind = "bending" if control == "bspline" else "diffusion"
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")
        if control == "bspline" and kind == "diffeomorphic":
            raise ValueError("control='bspline' is for the deformable model only")
        if regularizer_kind not in ("diffusion", "bending"):
            raise ValueError(
                f"regularizer_kind must be 'diffusion' or 'bending', got {regularizer_kind!r}"
            )
        self.control = control
        self.regularizer_kind = regularizer_kind
        self.kind = kind
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.fixed_grid, self.moving_grid = fixed_grid, moving_grid
        # Set when the moving image was resampled onto the fixed grid before the run: the
        # field then maps fixed pixels into that copy, and ``onto_moving`` (fixed pixels →
        # the original moving pixels) completes the transform.
        self.moving_shape = None if moving_shape is None else tuple(moving_shape)
        self.onto_moving = None
        if self.moving_shape is not None:
            unit = unit_grid(self.ndim)
            to_physical = (fixed_grid or unit).to_physical()
            self.onto_moving = (moving_grid or unit).to_pixels() @ to_physical
        self.grid_spacing = float(grid_spacing)
        self.spacing = (1.0,) * self.ndim if spacing is None else tuple(float(s) for s in spacing)
        self.steps = int(steps)
        self.field = None
        self.level_pixel = 1.0  # set by set_level
        self.dtype, self.device, self.batch = dtype, device, batch
        self._constants = {}  # see _constant
        self._buffers, self._buffers_version = {}, {}  # see _inside
        self.init = None
        if init is not None:
            self.init = torch.as_tensor(init, dtype=dtype, device=device).reshape(
                -1, self.ndim, *self.shape
            )

    def parameters(self) -> list[torch.Tensor]:
        return [self.field]

    def _control_shape(self, level_shape):
        ratios = level_anisotropy(self.spacing, self.shape, level_shape)
        cells = [math.ceil(m * r / self.grid_spacing) for m, r in zip(level_shape, ratios)]
        if self.control == "bspline":  # a cubic B-spline's knots reach 1.5 cells past the ends
            return tuple(max(1, c) + 3 for c in cells)
        return tuple(max(2, c) for c in cells)

    def _cells(self, cshape) -> list[float]:
        """The control cell's size per axis, in full-resolution pixels."""
        if self.control == "bspline":
            return [n / (c - 3) for n, c in zip(self.shape, cshape)]
        return [n / c for n, c in zip(self.shape, cshape)]

    def _interpolate(self, f: torch.Tensor, shape) -> torch.Tensor:
        """Control values ``(N, D, *c)`` → the field at a grid of ``shape``, same units."""
        if self.control == "linear":
            return resize(f, shape)
        key = (tuple(f.shape[2:]), tuple(shape), f.dtype, f.device)
        weights = self._constants.get(key)
        if weights is None:  # the same few matrices every iteration: made once
            weights = [bspline_weights(c, n, f.dtype, f.device) for c, n in zip(f.shape[2:], shape)]
            self._constants[key] = weights
        return apply_per_axis(f, weights)

    def _constant(self, key, make) -> torch.Tensor:
        """A small constant tensor of the model's, made once (no host → device copy and no
        launch per iteration)."""
        value = self._constants.get(key)
        if value is None:
            value = self._constants[key] = make()
        return value

    def set_level(self, level_shape) -> None:
        # The level's pixel, in full-resolution pixels: the bending energy's unit.
        self.level_pixel = max(n / m for n, m in zip(self.shape, level_shape))
        cshape = self._control_shape(level_shape)
        if self.field is None:
            f = torch.zeros(self.batch, self.ndim, *cshape, dtype=self.dtype, device=self.device)
        elif tuple(self.field.shape[2:]) == cshape:
            # The same grid: the same field (the refit below would give it back, through
            # the host).
            f = self.field.detach()
        elif self.control == "bspline":
            # The finer grid's least-squares fit to the coarser field at this level's pixels
            # (exact where the knots nest, e.g. a grid of half the cells; elsewhere a
            # least-squares fit, off by about 1e-2 px at most in a measured worst case).
            # In float64 on the CPU (MPS has no float64); the control grids are small.
            old = self.field.detach()
            dense = self._interpolate(old.cpu().double(), level_shape)
            fits = [torch.linalg.pinv(bspline_weights(c, n)) for c, n in zip(cshape, level_shape)]
            fitted = apply_per_axis(dense, fits)
            # onto the device into a tensor made there: one host → device copy, as
            # .to(device) makes, which tests/_dispatch_count.py sees as the device's (it
            # takes what .to() makes on the CPU of a tensor read back for a host tensor,
            # and a level's ops on it for no launches)
            f = old.new_empty((*old.shape[:2], *cshape)).copy_(fitted)
        else:
            f = resize(self.field.detach(), cshape)
        if self._fused_field():
            # stored with the components before the last grid axis, (N, c_y, D, c_x) or
            # (N, c_z, c_y, D, c_x) in memory, as _SplineGrid2d/3d read and write it (no
            # copy in either direction)
            order = FUSED_LAYOUT[self.ndim]
            f = f.permute(*order).contiguous().permute(*np.argsort(order).tolist())
        self.field = f.clone().requires_grad_(True)

    def _fused_field(self) -> bool:
        """Whether :meth:`warp_regularized` evaluates the field, its warp grid and its
        regularizer in one :class:`_SplineGrid2d` or :class:`_SplineGrid3d` (B-spline
        displacement fields)."""
        return self.control == "bspline" and self.kind == "deformable" and self.init is None

    def _rescale(self, d: torch.Tensor, from_shape, to_shape) -> torch.Tensor:
        """A displacement in pixels of a grid ``from_shape`` to pixels of ``to_shape``."""
        ratios = tuple(t / f for t, f in zip(to_shape, from_shape))
        if all(r == 1.0 for r in ratios):
            return d
        scale = self._constant(
            ("rescale", ratios, d.dtype, d.device),
            lambda: torch.tensor(ratios, dtype=d.dtype, device=d.device).view(
                1, -1, *([1] * self.ndim)
            ),
        )
        return d * scale

    def displacement(self, shape, field=None) -> torch.Tensor:
        """The displacement at a level of ``shape``, in that level's pixels ``(N, D, *shape)``."""
        f = self.field if field is None else field
        if self.kind == "diffeomorphic":
            f = self._rescale(self._flow(f), tuple(f.shape[2:]), self.shape)
        d = self._rescale(self._interpolate(f, shape), self.shape, shape)
        if self.init is not None:
            d = d + self._rescale(resize(self.init, shape), self.shape, shape)
        return d

    def _flow_scale(self, cshape) -> tuple[float, ...]:
        """The squarings' scale of a velocity on a control grid of ``cshape``: to control
        pixels (from full-resolution ones) and by ``2**-steps``, per component."""
        return tuple(c / n / 2**self.steps for c, n in zip(cshape, self.shape))

    def _flow(self, f: torch.Tensor, with_input=False):
        """The diffeomorphic field's displacement on its control grid, in control-grid
        pixels: the velocity ``f`` (full-resolution pixels) integrated there (cheap), its
        scaling to control pixels and by ``2**-steps`` the squarings' scale (the compiled
        op's first squaring each way: no launch of its own). ``with_input``: ``(flow, u)``,
        ``u`` the scaled velocity the first squaring reads (see
        :func:`~..ops.integrate_velocity.squarings`)."""
        cshape = tuple(f.shape[2:])
        key = (cshape, f.dtype, f.device)
        scale = self._flow_scale(cshape)

        def constants():  # the torch path's, made (and kept) only where that path runs
            return self._constant(("squaring", *key), lambda: squaring_constants(*key, scale=scale))

        return squarings(f, self.steps, scale, constants, with_input=with_input)

    def moving_displacement(self, shape, field=None) -> torch.Tensor:
        """The displacement from the fixed grid into the original moving image,
        ``(N, D, *shape)`` (``shape``: the fixed image's), as the result's transform holds it:
        ``onto_moving(x + d(x)) − x`` when the moving image was resampled first."""
        d = self.displacement(shape, field)
        if self.onto_moving is None:
            return d
        # float64 on the CPU (far origins), float32 on accelerators (WIDE_DEVICE_TYPES)
        wide = wide_dtype(d.device)
        mat = torch.as_tensor(self.onto_moving, dtype=wide, device=d.device)
        pos = identity_grid(shape, dtype=wide, device=d.device) + d.to(wide)
        moved = torch.einsum("ij,nj...->ni...", mat[:-1, :-1], pos)
        moved = moved + mat[:-1, -1].view(1, -1, *([1] * self.ndim))
        return (moved - identity_grid(shape, dtype=wide, device=d.device)).to(d.dtype)

    def warp(self, moving: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
        """Warp a moving level ``(N or 1, C, *shape)`` onto the fixed level's grid; return
        (warped, in-bounds), in-bounds 1 where a sample fell within half a pixel of the
        moving level. What :func:`~napari_simwarp.ops.warp` computes, without its input
        checks: they read values back to the host, and the model makes its own field."""
        if tuple(moving.shape[2:]) == tuple(shape) and min(shape) > 1:
            if self.kind == "diffeomorphic" and self.init is None:
                return self._warp_by_flow(moving, shape, self._flow(self.field))
            return self._warp_by(moving, shape, self.displacement(shape), tuple(shape))
        d = self.displacement(shape)
        n = d.shape[0]
        src = moving if moving.shape[0] == n else moving.expand(n, *moving.shape[1:])
        warped = warp(src, d, padding="nearest")
        with torch.no_grad():
            pos = [torch.arange(s, dtype=d.dtype, device=d.device) for s in shape]
            inside = torch.ones_like(d[:, :1])
            for axis, s in enumerate(shape):
                view = [1] * self.ndim
                view[axis] = s
                p = pos[axis].view(1, *view) + d[:, axis]
                inside = inside * ((p >= -0.5) & (p <= s - 0.5)).unsqueeze(1).to(d.dtype)
        return warped, inside

    def _warp_by_flow(self, moving, shape, flow):
        """:meth:`_warp_by` a diffeomorphic flow ``(N, D, *control)`` on the control grid
        (control pixels), interpolated to the level's ``shape``: ``(warped, in-bounds)``
        as :meth:`warp`."""
        return self._warp_by(moving, shape, self._interpolate(flow, shape), tuple(flow.shape[2:]))

    def _warp_by(self, moving, shape, d, units):
        """:meth:`warp` of a moving level of the level's ``shape`` by ``d`` ``(N, D,
        *shape)``, in pixels of a grid ``units``: displacement_to_grid's positions, with the
        identity part made once: in grid_sample's normalized (x, y[, z]) order, base + dᵀ ·
        mix (one launch; mix flips the components, scales them to normalized units and, for
        a diffeomorphic field interpolated in control pixels, to the level's pixels)."""
        n, dims = d.shape[:2]
        src = moving if moving.shape[0] == n else moving.expand(n, *moving.shape[1:])
        base, mix = self._constant(
            ("grid-mix", tuple(shape), units, src.dtype, src.device),
            lambda: self._grid_mix(shape, units, src.dtype, src.device),
        )
        flat = d.to(src.dtype).reshape(n, dims, -1).transpose(1, 2)
        grid = torch.baddbmm(base.expand(n, *base.shape[1:]), flat, mix.expand(n, dims, dims))
        grid = grid.view(n, *shape, dims)
        warped = grid_sample(src, grid, "linear", "nearest")
        if self.ndim == 3 or self.kind == "diffeomorphic":
            # one launch; it differs from inside_mask only at a position exactly half a
            # pixel past the last (half-to-even): a pixel at the border's very edge, in or
            # out, for a diffeomorphic field (a given init could land there exactly; the
            # B-spline and 2-D paths keep the exact mask, which a test of a 1.5 px shift
            # holds to its tie)
            return warped, self._inside_sampled(grid.detach(), shape)
        return warped, inside_mask(grid.detach(), shape, self._constants)

    def warp_regularized(self, moving: torch.Tensor, shape, weight: float, plus_one=False):
        """:meth:`warp` and ``weight ·`` :meth:`regularizer`: ``(warped, in-bounds, term
        (N,))``, the term None where the two are not evaluated together (``plus_one``:
        ``1 +`` the term, for a loss that takes it as its base, as
        :class:`~..ops._lncc_pair.PairLocalNCCLoss` does; other fields then give
        :meth:`_regularizer_plus_one`, which saves the loop the launch of a sum).

        A B-spline displacement field warping a moving level of the level's shape
        (:meth:`_fused_field`) takes one :class:`_SplineGrid2d` (3-D:
        :class:`_SplineGrid3d`): the grid_sample grid (the field's B-spline evaluation,
        its components' flip into grid_sample's (x, y) order and scaling, the identity
        added: two matrix products, three in 3-D) and the weighted
        bending or diffusion energy, with its gradient folded into the field's (a few
        launches where the separate forms take about fifteen, forward and backward).

        A diffeomorphic field (``plus_one``) takes its regularizer of the scaled velocity
        the squarings read first (:meth:`_flow` ``with_input``; the weights divided by the
        scale's squares, per component: the same term): the compiled squarings' backward
        adds its gradient in, where a term of the field took a sum of its own.
        """
        if (
            plus_one
            and weight
            and self.kind == "diffeomorphic"
            and self.init is None
            and self.steps > 0
            and tuple(moving.shape[2:]) == tuple(shape)
            and min(shape) > 1
        ):
            flow, u = self._flow(self.field, with_input=True)
            warped, valid = self._warp_by_flow(moving, shape, flow)
            scale = self._flow_scale(tuple(u.shape[2:]))
            return warped, valid, self._regularizer_plus_one(weight, u, scale)
        if not (
            self._fused_field()
            and weight
            and tuple(moving.shape[2:]) == tuple(shape)
            and min(shape) > 1
            and moving.dtype == self.field.dtype
        ):
            warped, valid = self.warp(moving, shape)
            if not (weight and plus_one):
                return warped, valid, None
            # a loss that takes a base: 1 + weight · the regularizer in its own launches
            return warped, valid, self._regularizer_plus_one(weight)
        f = self.field
        n = f.shape[0]
        src = moving if moving.shape[0] == n else moving.expand(n, *moving.shape[1:])
        key = ("fused", tuple(f.shape[2:]), tuple(shape), self.level_pixel, float(weight))
        consts = self._constant(
            (*key, f.dtype, f.device), lambda: self._fused_constants(shape, weight)
        )
        ones = None
        if plus_one:
            ones = self._constant(("ones", n, f.dtype, f.device), lambda: f.new_ones((n, 1, 1)))
        spline = _SplineGrid2d if self.ndim == 2 else _SplineGrid3d
        grid, term = spline.apply(f, *consts, ones)
        warped = grid_sample(src, grid, "linear", "nearest")
        if self.ndim == 3:
            return warped, self._inside_sampled(grid.detach(), shape), term
        return warped, self._inside(grid.detach(), shape), term

    def _inside_sampled(self, grid: torch.Tensor, shape) -> torch.Tensor:
        """:func:`inside_mask` of a normalized grid ``(N, *S, D)`` onto an image of
        ``shape`` as one launch: a ones image sampled at the nearest pixel with zero
        padding, 1 where the nearest pixel is on the image, i.e. within half a pixel of it
        (the comparisons of :func:`inside_mask` take four launches where the axes' limits
        differ). The two differ only where a position rounds to exactly half a pixel past
        the last one (half-to-even rounding there)."""
        ones = self._constant(
            ("ones", tuple(shape), grid.dtype, grid.device),
            lambda: grid.new_ones((1, 1, *shape)),
        )
        n = grid.shape[0]
        return F.grid_sample(
            ones.expand(n, 1, *shape),
            grid,
            mode="nearest",
            padding_mode="zeros",
            align_corners=True,
        )

    def _inside(self, grid: torch.Tensor, shape) -> torch.Tensor:
        """:func:`inside_mask` written into a tensor of the model's, one per shape (one
        launch less: the comparison writes the float mask). The loop's use: a mask is read
        (by the loss and its backward) before the next iteration makes the next one."""
        limits = [1.0 + 1.0 / (n - 1) for n in reversed(shape)]
        if len(set(limits)) != 1:
            return inside_mask(grid, shape, self._constants)
        if grid.device.type in INF_NORM_DEVICE_TYPES:
            largest = torch.linalg.vector_norm(grid, math.inf, dim=-1)
        else:
            largest = grid.abs().amax(dim=-1)
        key = ("mask", tuple(grid.shape[:-1]), grid.dtype, grid.device)
        out = self._buffers.get(key)
        if out is None or out._version != self._buffers_version.get(key):
            out = self._buffers[key] = grid.new_empty((grid.shape[0], 1, *grid.shape[1:-1]))
        torch.le(largest.unsqueeze(1), limits[0], out=out)
        self._buffers_version[key] = out._version
        return out

    def _fused_constants(self, shape, weight):
        """The constants of :class:`_SplineGrid2d` at a level of ``shape`` (made once):
        ``(m_x (D·c_x, W·D), w_y (H, c_y), base (H, W·D), stencils (T, 1, 3, 1, 3) or
        None, w2 (1, T, c_y, D, c_x) or None)``; in 3-D :class:`_SplineGrid3d`'s, ``(m_x
        (D·c_x, X·D), w_y (Y, c_y), w_z (Z, c_z), base (Z, Y·X·D), stencils (T, 1, 3, 3, 3)
        or None, w2 (1, T, c_z, c_y, D·c_x) or None)``.

        ``m_x[(d, k), (w, e)] = B_x[w, k] · S[e, d]``: the x axis's B-spline weights and
        ``S``, which takes the field's component ``d`` (array order, full-resolution
        pixels) to grid component ``e`` ((x, y) order, grid_sample's normalized units at
        this level)."""
        f = self.field
        dtype, device = f.dtype, f.device
        cy, cx = f.shape[-2:]
        h, w = shape[-2:]
        d = self.ndim
        wy = bspline_weights(cy, h, dtype, device)  # (H, c_y)
        bx = bspline_weights(cx, w, dtype, device)  # (W, c_x)
        ratios = [m / n for m, n in zip(shape, self.shape)]  # full → level pixels
        mix = np.zeros((d, d))  # S[e, d]
        for axis in range(d):
            mix[d - 1 - axis, axis] = ratios[axis] * 2.0 / (shape[axis] - 1)
        mix = torch.as_tensor(mix, dtype=dtype, device=device)
        # m_x[d, k, w, e] = B_x[w, k] S[e, d] (in the field's dtype: no float64 on a GPU)
        m_x = torch.einsum("wk,ed->dkwe", bx, mix).reshape(d * cx, w * d)
        base, _ = self._grid_constants(shape, dtype, device)
        cshape = tuple(f.shape[2:])
        stencils, weights = self._regularizer_plan(cshape, dtype, device)
        if d == 3:
            wz = bspline_weights(cshape[0], shape[0], dtype, device)  # (Z, c_z)
            if stencils is not None:
                # (D, T, c_z, c_y, c_x) → (1, T, c_z, c_y, D·c_x), the layout of the
                # stencils' output; twice the weights
                weights = (weights * (2.0 * weight)).permute(1, 2, 3, 0, 4)
                weights = weights.reshape(1, -1, *cshape[:2], d * cx).contiguous()
            base = base.reshape(shape[0], -1)
            return m_x, wy.contiguous(), wz.contiguous(), base, stencils, weights
        if stencils is not None:
            stencils = stencils[:, :, :, None, :]
            # (D, T, c_y, c_x) → (1, T, c_y, D, c_x), the layout of the stencils' output;
            # twice the weights (the term is ½ Σ g · w2 g)
            weights = (weights * (2.0 * weight)).permute(1, 2, 0, 3)[None].contiguous()
        return m_x, wy.contiguous(), base.reshape(h, w * d), stencils, weights

    def _grid_mix(self, shape, units, dtype, device):
        """``(base (1, P, D), mix (D, D))``: the identity grid of ``shape`` (``P`` pixels)
        and ``mix[a, D − 1 − a]``, the factor from a displacement along array axis ``a``
        in pixels of a grid ``units`` to grid_sample's normalized units at ``shape``."""
        d = len(shape)
        base, _ = self._grid_constants(shape, dtype, device)
        mix = torch.zeros(d, d, dtype=dtype, device=device)
        for a, (n, u) in enumerate(zip(shape, units)):
            mix[a, d - 1 - a] = (n / u) * 2.0 / (n - 1)
        return base.reshape(1, -1, d), mix

    def _grid_constants(self, shape, dtype, device):
        """``(base (1, *S, D), scale (D,))``: the identity grid of ``shape`` and the pixel
        → normalized factor per component, (x, y[, z]) order (``align_corners=True``)."""
        zero = torch.zeros(1, len(shape), *shape, dtype=dtype, device=device)
        base = displacement_to_grid(zero, shape)
        scale = torch.tensor([2.0 / (n - 1) for n in reversed(shape)], dtype=dtype)
        return base.contiguous(), scale.to(device)

    def regularizer(self) -> torch.Tensor:
        """The regularizer ``(N,)`` of the field (see the class docstring): one convolution
        of every component with the difference stencils of all the terms at once, their
        squares weighted by a constant that carries each term's weight, its valid
        positions, the spacing and the level's pixel (a few launches where the
        differences take tens); equal to :meth:`regularizer_by_differences`."""
        f = self.field
        n, d = f.shape[:2]
        cshape = tuple(f.shape[2:])
        stencils, twice = self._constant(
            ("regularizer", self.regularizer_kind, cshape, self.level_pixel, f.dtype, f.device),
            lambda: _doubled(self._regularizer_plan(cshape, f.dtype, f.device)),
        )
        if stencils is None:
            return f.new_zeros(n)
        conv = F.conv2d if d == 2 else F.conv3d
        g = conv(f.reshape(n * d, 1, *cshape), stencils, padding=1)
        return _WeightedSquares.apply(g.view(n, -1), twice.view(1, -1))

    def _regularizer_plan(self, cshape, dtype, device):
        """``(stencils (T, 1, 3, …), weights (D, T, *c))`` of :meth:`regularizer` on a
        control grid of ``cshape`` (``(None, None)`` when no term fits the grid).

        Each term is a difference stencil in a 3-wide box (one pixel of zero padding), valid
        where all its taps are on the grid: the weight there carries the term's weight over
        its number of valid positions, the components and the squared cell sizes; 0
        elsewhere."""
        d = self.ndim
        cells = [c * s for c, s in zip(self._cells(cshape), self.spacing)]  # physical
        stencils, masks = [], []

        def term(taps, lo, hi, scale):
            """A stencil from ``{offset per axis: coefficient}`` (offsets -1, 0, 1: the tap
            reads ``f[i + offset]``), valid at ``lo[a] <= i_a < c_a - hi[a]``."""
            k = np.zeros((3,) * d)
            for offset, c in taps.items():
                k[tuple(1 + o for o in offset)] = c
            m = np.zeros(cshape)
            m[tuple(slice(lo[a], cshape[a] - hi[a]) for a in range(d))] = 1.0
            stencils.append(k * scale)
            masks.append(m / m.sum())

        def unit(axis, step):
            return tuple(step if a == axis else 0 for a in range(d))

        def plus(x, y):
            return tuple(p + q for p, q in zip(x, y))

        zero, none = (0,) * d, [0] * d
        if self.regularizer_kind == "bending":
            for a in range(d):
                for b in range(a, d):
                    if min(cshape[a], cshape[b]) < (3 if a == b else 2):
                        continue
                    if a == b:  # torch.diff twice puts f[i-1] - 2 f[i] + f[i+1] at i - 1
                        taps = {unit(a, -1): 1.0, zero: -2.0, unit(a, 1): 1.0}
                        lo, hi = list(none), list(none)
                        lo[a] = hi[a] = 1
                        term(taps, lo, hi, 1.0 / (cells[a] * cells[a]))
                    else:  # ∂²/∂a∂b and ∂²/∂b∂a: weight 2 on the square
                        ua, ub = unit(a, 1), unit(b, 1)
                        taps = {zero: 1.0, ua: -1.0, ub: -1.0, plus(ua, ub): 1.0}
                        hi = list(none)
                        hi[a] = hi[b] = 1
                        term(taps, none, hi, 2.0**0.5 / (cells[a] * cells[b]))
            level = self.level_pixel**2
        else:
            for a in range(d):
                if cshape[a] < 2:
                    continue
                hi = list(none)
                hi[a] = 1
                term({zero: -1.0, unit(a, 1): 1.0}, none, hi, 1.0 / cells[a])
            level = 1.0
        if not stencils:
            return None, None
        # Component c in physical units: × s_c², and the mean over the D components.
        per_component = np.array([s * s for s in self.spacing]) / d * level
        weights = per_component.reshape(d, 1, *[1] * d) * np.stack(masks)[None]
        kernel = np.stack(stencils)[:, None]
        return (
            torch.as_tensor(kernel, dtype=dtype, device=device),
            torch.as_tensor(weights, dtype=dtype, device=device),
        )

    def _regularizer_plus_one(self, weight: float, field=None, scale=None) -> torch.Tensor:
        """``1 + weight ·`` :meth:`regularizer` ``(N,)`` in :meth:`regularizer`'s
        launches (the weight in its constant, the 1 in its last product's). ``field``
        ``(N, D, *control)``: the field times ``scale`` (D factors, one per component) in
        its place, of which the term is the same with each component's weights divided by
        its factor squared."""
        f = self.field if field is None else field
        n, d = f.shape[:2]
        cshape = tuple(f.shape[2:])
        key = (self.regularizer_kind, cshape, self.level_pixel, float(weight), f.dtype, f.device)
        key = key if scale is None else (*key, tuple(scale))

        def make():
            stencils, weights = self._regularizer_plan(cshape, f.dtype, f.device)
            if weights is None:
                return stencils, None
            if scale is not None:  # weights (D, T, *c): the term of f / scale
                factors = [1.0 / s**2 for s in scale]
                weights = weights * weights.new_tensor(factors).view(d, *[1] * (weights.dim() - 1))
            return stencils, (2.0 * weight) * weights

        stencils, twice = self._constant(("regularizer-plus-one", *key), make)
        ones = self._constant(("ones", n, f.dtype, f.device), lambda: f.new_ones((n, 1, 1)))
        if stencils is None:
            return ones.view(n).clone()
        conv = F.conv2d if d == 2 else F.conv3d
        g = conv(f.reshape(n * d, 1, *cshape), stencils, padding=1)
        return _WeightedSquares.apply(g.view(n, -1), twice.view(1, -1), ones)

    def regularizer_by_differences(self) -> torch.Tensor:
        """:meth:`regularizer` written with :func:`torch.diff` term by term (the
        definition; the reference of the tests)."""
        f = self.field
        # Component a in physical units (× s_a), differences along b per physical length.
        if any(s != 1.0 for s in self.spacing):
            spacing = self._constant(
                ("spacing", f.dtype, f.device),
                lambda: torch.tensor(self.spacing, dtype=f.dtype, device=f.device).view(
                    1, -1, *([1] * self.ndim)
                ),
            )
            f = f * spacing
        cells = [c * s for c, s in zip(self._cells(f.shape[2:]), self.spacing)]  # physical
        total = f.new_zeros(f.shape[0])
        if self.regularizer_kind == "bending":
            for a in range(self.ndim):
                for b in range(a, self.ndim):
                    if min(f.shape[2 + a], f.shape[2 + b]) < (3 if a == b else 2):
                        continue
                    g = torch.diff(torch.diff(f, dim=2 + a), dim=2 + b) / (cells[a] * cells[b])
                    w = 1.0 if a == b else 2.0  # ∂²/∂a∂b and ∂²/∂b∂a
                    total = total + w * (g * g).mean(dim=tuple(range(1, g.dim())))
            # In the level's pixels: displacements / s, lengths / s, so (s²/s)² = s².
            return total * self.level_pixel**2
        for axis in range(self.ndim):
            g = torch.diff(f, dim=2 + axis) / cells[axis]  # per control cell
            total = total + (g * g).mean(dim=tuple(range(1, g.dim())))
        return total

    def snapshot(self) -> list[torch.Tensor]:
        return [self.field.detach().clone()]

    def restore(self, values, which=None) -> None:
        with torch.no_grad():
            if which is None:
                self.field.copy_(values[0])
            else:
                keep = which.view(-1, *([1] * (self.ndim + 1)))
                self.field.copy_(torch.where(keep, values[0], self.field))

    def transforms(self, values=None) -> list:
        """One transform per pair: a velocity field for a diffeomorphic run from the
        identity on one grid, else the displacement into the (original) moving image."""
        f = (self.field if values is None else values[0]).detach()
        grids = (self.fixed_grid, self.moving_grid)
        with torch.no_grad():
            if self.kind == "diffeomorphic" and self.init is None and self.onto_moving is None:
                v = resize(f, self.shape).cpu().numpy()
                return [
                    VelocityTransform(v[i], self.steps).with_grids(*grids)
                    for i in range(v.shape[0])
                ]
            d = self.moving_displacement(self.shape, f).cpu().numpy()
        return [
            DisplacementTransform(d[i], moving_shape=self.moving_shape).with_grids(*grids)
            for i in range(d.shape[0])
        ]
