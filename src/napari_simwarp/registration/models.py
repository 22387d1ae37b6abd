"""Transform models with trainable parameters, batched over ``N`` image pairs.

A model turns its parameters into a warped moving image at any pyramid level and into
:mod:`.transforms` objects at the end. Parameters are scaled so that one unit moves the
image by about one full-resolution pixel (translation in pixels, linear parts in pixels
of motion at the image's half-size radius); one learning rate then suits every parameter.
"""

from __future__ import annotations

import math

import torch

from ..ops import integrate_velocity, warp
from ..ops._sampling import affine_grid, grid_inside, grid_sample, level_matrix
from .pyramid import resize
from .transforms import AffineTransform, DisplacementTransform, VelocityTransform


class LinearModel:
    """Translation, rigid, similarity or affine, about the fixed image's center.

    ``y = L (x − c) + c + t`` in full-resolution pixels of the fixed image, composed after
    an optional initial matrix: ``M = M0 @ M(θ)``. Centering decouples rotation from
    translation, which is what lets the optimizer move them independently.
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
    ):
        self.kind = kind
        self.fixed_shape = tuple(fixed_shape)
        self.moving_shape = tuple(moving_shape)
        d = self.ndim = len(fixed_shape)
        self.radius = max(max(self.fixed_shape) / 2.0, 1.0)
        n_lin = {
            "translation": 0,
            "rigid": 1 if d == 2 else 3,
            "similarity": (1 if d == 2 else 3) + 1,
            "affine": d * d,
        }[kind]
        self.shift = torch.zeros(batch, d, dtype=dtype, device=device, requires_grad=True)
        self.linear = torch.zeros(batch, n_lin, dtype=dtype, device=device, requires_grad=True)
        # The initial matrix is kept in float64 (MPS has no float64: float32 there).
        wide = torch.float32 if torch.device(device).type == "mps" else torch.float64
        eye = torch.eye(d + 1, dtype=wide, device=device)
        if init is None:
            m0 = eye.expand(batch, -1, -1)
        else:
            m0 = torch.as_tensor(init, dtype=wide, device=device)
            m0 = m0.reshape(-1, d + 1, d + 1).expand(batch, -1, -1)
        self.init = m0.clone()
        self.center = torch.tensor(
            [(n - 1) / 2 for n in self.fixed_shape], dtype=dtype, device=device
        )

    def parameters(self) -> list[torch.Tensor]:
        return [self.shift, self.linear] if self.linear.shape[1] else [self.shift]

    def set_level(self, shape) -> None:  # linear parameters do not depend on the level
        pass

    def _linear_part(self) -> torch.Tensor:
        n, d = self.shift.shape
        q = self.linear / self.radius
        eye = torch.eye(d, dtype=q.dtype, device=q.device).expand(n, d, d)
        if self.kind == "translation":
            return eye
        if self.kind == "affine":
            return eye + q.view(n, d, d)
        k = 1 if d == 2 else 3
        skew = torch.zeros(n, d, d, dtype=q.dtype, device=q.device)
        if d == 2:
            skew[:, 0, 1], skew[:, 1, 0] = -q[:, 0], q[:, 0]
        else:
            a, b, c = q[:, 0], q[:, 1], q[:, 2]
            skew = torch.stack(
                [
                    torch.stack([0 * a, -c, b], -1),
                    torch.stack([c, 0 * a, -a], -1),
                    torch.stack([-b, a, 0 * a], -1),
                ],
                -2,
            )
        rot = torch.linalg.matrix_exp(skew)
        if self.kind == "similarity":
            rot = rot * torch.exp(q[:, k]).view(n, 1, 1)
        return rot

    def matrix(self) -> torch.Tensor:
        """Homogeneous fixed → moving matrices ``(N, D+1, D+1)`` in full-res pixels."""
        n, d = self.shift.shape
        lin = self._linear_part()
        t = self.center + self.shift - (lin @ self.center.view(d, 1)).squeeze(-1)
        top = torch.cat([lin, t.unsqueeze(-1)], dim=-1)
        bottom = torch.zeros(n, 1, d + 1, dtype=lin.dtype, device=lin.device)
        bottom[..., -1] = 1
        m = torch.cat([top, bottom], dim=1)
        return self.init.to(m.dtype) @ m

    def warp(self, moving: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
        """Warp a moving level onto a fixed level of ``shape``; return (warped, in-bounds).

        The full-resolution matrix is carried to the two levels' pixels
        (:func:`~napari_simwarp.ops._sampling.level_matrix`) and sampled as ``warp_affine``
        samples, with the edge pixels repeated beyond the border; "in-bounds" is 1 where
        a sample fell within half a pixel of the moving level.
        """
        moving_level = tuple(moving.shape[2:])
        matrix = level_matrix(
            self.matrix(), self.moving_shape, moving_level, self.fixed_shape, shape
        )
        grid = affine_grid(matrix.to(moving.dtype), moving_level, shape)
        warped = grid_sample(moving, grid, "linear", "nearest")
        return warped, grid_inside(grid.detach(), moving_level)

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
        return [AffineTransform(m, self.kind) for m in mats]


class DenseModel:
    """A displacement (``deformable``) or stationary velocity (``diffeomorphic``) field.

    The field lives on a control grid ``grid_spacing`` level pixels apart, in
    full-resolution pixels, and is upsampled (bilinear) to the level; a coarse grid is its
    own smoothness prior and keeps the parameter count small. Between levels the control
    grid is refined by interpolation. ``Reg`` is the diffusion energy, the mean squared
    spatial derivative of the displacement (dimensionless).
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
    ):
        self.kind = kind
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.grid_spacing = float(grid_spacing)
        self.steps = int(steps)
        self.field = None
        self.dtype, self.device, self.batch = dtype, device, batch
        self.init = None
        if init is not None:
            self.init = torch.as_tensor(init, dtype=dtype, device=device).reshape(
                -1, self.ndim, *self.shape
            )

    def parameters(self) -> list[torch.Tensor]:
        return [self.field]

    def _control_shape(self, level_shape):
        return tuple(max(2, math.ceil(n / self.grid_spacing)) for n in level_shape)

    def set_level(self, level_shape) -> None:
        cshape = self._control_shape(level_shape)
        if self.field is None:
            f = torch.zeros(self.batch, self.ndim, *cshape, dtype=self.dtype, device=self.device)
        else:
            f = resize(self.field.detach(), cshape)
        self.field = f.clone().requires_grad_(True)

    def _rescale(self, d: torch.Tensor, from_shape, to_shape) -> torch.Tensor:
        """A displacement in pixels of a grid ``from_shape`` to pixels of ``to_shape``."""
        scale = torch.tensor(
            [t / f for t, f in zip(to_shape, from_shape)], dtype=d.dtype, device=d.device
        )
        return d * scale.view(1, -1, *([1] * self.ndim))

    def displacement(self, shape, field=None) -> torch.Tensor:
        """The displacement at a level of ``shape``, in that level's pixels ``(N, D, *shape)``."""
        f = self.field if field is None else field
        if self.kind == "diffeomorphic":
            # Integrate on the control grid (cheap), in control-grid pixels.
            cshape = tuple(f.shape[2:])
            v = self._rescale(f, self.shape, cshape)
            f = self._rescale(integrate_velocity(v, self.steps), cshape, self.shape)
        d = self._rescale(resize(f, shape), self.shape, shape)
        if self.init is not None:
            d = d + self._rescale(resize(self.init, shape), self.shape, shape)
        return d

    def warp(self, moving: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
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

    def regularizer(self) -> torch.Tensor:
        f = self.field
        total = f.new_zeros(f.shape[0])
        for axis in range(self.ndim):
            spacing = self.shape[axis] / f.shape[2 + axis]  # full-res pixels per control cell
            g = torch.diff(f, dim=2 + axis) / spacing
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
        f = (self.field if values is None else values[0]).detach()
        out = []
        with torch.no_grad():
            if self.kind == "diffeomorphic" and self.init is None:
                v = resize(f, self.shape).cpu().numpy()
                return [VelocityTransform(v[i], self.steps) for i in range(v.shape[0])]
            d = self.displacement(self.shape, f).cpu().numpy()
        for i in range(d.shape[0]):
            out.append(DisplacementTransform(d[i]))
        return out
