"""The operators the optimiser uses, plus the grid helpers of its hot loop.

The operators are :mod:`napari_simwarp.ops` itself. The helpers build sampling grids for
``F.affine_grid``/``F.grid_sample`` directly in normalised coordinates
(``align_corners=False``, the pixel-centre convention the pyramid uses), so that one
full-resolution transform drives every pyramid level without per-level conversions; the
pixel conventions are the ops' own (array-axis order, fixed → moving).
"""

from __future__ import annotations

import torch

from ..ops import (  # noqa: F401  (re-exported for the register package)
    affine_to_displacement,
    integrate_velocity,
    jacobian_determinant,
    local_ncc,
    ncc,
    ssim,
    warp,
    warp_affine,
)


def identity_grid(shape, dtype, device) -> torch.Tensor:
    """Normalised (align_corners=False) identity grid, shape ``(*S, D)`` in xyz order."""
    axes = [((torch.arange(n, dtype=dtype, device=device) * 2 + 1) / n - 1) for n in shape]
    mesh = torch.meshgrid(*axes, indexing="ij")
    return torch.stack(mesh[::-1], dim=-1)


def pixel_matrix_to_theta(matrix: torch.Tensor, in_shape, out_shape) -> torch.Tensor:
    """Homogeneous pixel matrices ``(N, D+1, D+1)`` (array order, output → input) to the
    ``theta`` ``(N, D, D+1)`` that ``F.affine_grid(align_corners=False)`` takes (xyz order).

    Pixel ``x`` and normalised ``u`` coordinates relate by ``x = P u + c`` with
    ``P = diag(n / 2)``, ``c = (n - 1) / 2`` per axis, whatever the pyramid level, since
    every level spans the same field of view.
    """
    d = len(in_shape)
    dt, dev = matrix.dtype, matrix.device
    p_out = torch.tensor([n / 2 for n in out_shape], dtype=dt, device=dev)
    c_out = torch.tensor([(n - 1) / 2 for n in out_shape], dtype=dt, device=dev)
    p_in = torch.tensor([n / 2 for n in in_shape], dtype=dt, device=dev)
    c_in = torch.tensor([(n - 1) / 2 for n in in_shape], dtype=dt, device=dev)
    a = matrix[:, :d, :d]
    t = matrix[:, :d, d]
    lin = a * p_out.view(1, 1, d) / p_in.view(1, d, 1)
    off = ((a @ c_out.view(d, 1)).squeeze(-1) + t - c_in) / p_in
    lin = lin.flip(1).flip(2)
    off = off.flip(1)
    return torch.cat([lin, off.unsqueeze(-1)], dim=-1)
