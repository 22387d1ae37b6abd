"""Padding of the spatial axes, with SciPy's names and meanings (docs/maths.md §7).

One vocabulary for every operator that looks past the border of an image:

=============== ========================================= ===============================
name            outside the image                         torch's name for it
=============== ========================================= ===============================
"reflect"       half-sample symmetric: ``c b a | a b c``  none (``grid_sample`` reflection
                                                          with ``align_corners=False``)
"mirror"        whole-sample symmetric: ``c b | a b c``   ``F.pad`` "reflect"
"nearest"       the edge value repeated: ``a a | a b c``  "replicate" / "border"
"constant"      zeros: ``0 0 | a b c``                    "constant" / "zeros"
=============== ========================================= ===============================

(SciPy's "grid-constant" is accepted as a synonym of "constant", as SciPy's filters do.)
"reflect" is what ``scipy.ndimage.uniform_filter`` and
``skimage.metrics.structural_similarity`` use. The padding here is an index gather: it is
differentiable (its adjoint is an ``index_add`` that autograd provides), works for pads
longer than the axis and in any number of dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._validation import check_choice

#: padding names accepted by the window operators (local_std), SciPy's meanings.
PADDINGS = ("reflect", "mirror", "nearest", "constant")

#: torch's names, refused with a pointer to SciPy's name for the same thing.
TORCH_NAMES = {
    "zeros": "constant",
    "border": "nearest",
    "replicate": "nearest",
    "reflection": "mirror",
}


def check_padding(padding, choices: Sequence[str] = PADDINGS, name: str = "padding") -> str:
    """``padding`` as one of ``choices`` ("grid-constant" read as "constant").

    torch's names ("zeros", "border", "reflection") are refused with SciPy's name for the
    same boundary, since "reflect" means a different boundary in torch and in SciPy.
    """
    if padding == "grid-constant" and "constant" in choices:
        return "constant"
    if padding in TORCH_NAMES and padding not in choices:
        scipy_name = TORCH_NAMES[padding]
        if scipy_name not in choices:
            scipy_name = "grid-constant"
        raise ValueError(
            f"{name}={padding!r} is torch's name; napari-simwarp uses SciPy's: "
            f"{scipy_name!r} (one of {', '.join(map(repr, choices))})"
        )
    return check_choice(padding, name, choices)


def reflect_indices(n: int, before: int, after: int, device=None) -> torch.Tensor:
    """Source indices of SciPy's "reflect" padding of an axis of length ``n``.

    Returns a ``(before + n + after,)`` int64 tensor ``idx`` such that
    ``padded[i] = x[idx[i]]``; index ``-1`` maps to ``0``, ``n`` to ``n - 1``, and the
    pattern repeats with period ``2 n`` for pads longer than the axis.
    """
    i = torch.arange(-before, n + after, device=device)
    i = torch.remainder(i, 2 * n)
    return torch.where(i >= n, 2 * n - 1 - i, i)


def mirror_indices(n: int, before: int, after: int, device=None) -> torch.Tensor:
    """Source indices of SciPy's "mirror" padding: ``-1`` maps to ``1``, period ``2n - 2``."""
    i = torch.arange(-before, n + after, device=device)
    if n == 1:
        return torch.zeros_like(i)
    i = torch.remainder(i, 2 * n - 2)
    return torch.where(i >= n, 2 * n - 2 - i, i)


def nearest_indices(n: int, before: int, after: int, device=None) -> torch.Tensor:
    """Source indices of edge-replicating padding (SciPy "nearest")."""
    return torch.arange(-before, n + after, device=device).clamp_(0, n - 1)


_INDICES = {"reflect": reflect_indices, "mirror": mirror_indices, "nearest": nearest_indices}


def pad_spatial(
    x: torch.Tensor, pads: Sequence[tuple[int, int]], mode: str = "reflect", value: float = 0.0
) -> torch.Tensor:
    """Pad the trailing ``len(pads)`` axes of ``x``.

    Parameters
    ----------
    x : Tensor, shape ``(..., *S)``
    pads : sequence of ``(before, after)``, one per trailing axis, array-axis order.
    mode : {"reflect", "mirror", "nearest", "constant"}
        SciPy's names (see the module's table); "constant" pads with ``value``.

    Returns
    -------
    Tensor, shape ``(..., *[S_i + before_i + after_i])``; ``x`` itself when nothing is padded.
    """
    d = len(pads)
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    if mode == "constant":
        flat = []
        for b, a in reversed(list(pads)):
            flat += [b, a]
        return F.pad(x, flat, mode="constant", value=value)
    index_fn = _INDICES.get(mode)
    if index_fn is None:
        raise ValueError(f"padding must be one of {PADDINGS}, got {mode!r}")
    # One allocation: the interior copied once, then each axis's two border slabs gathered
    # from the output itself (a gather per axis of the whole array cost 5× the time at 2048²).
    # Axis by axis: over the axes before it the slabs span the padded extent (the corners
    # are pads of pads), over those after it the interior only (not filled yet).
    lead = x.dim() - d
    out = x.new_empty(x.shape[:lead] + tuple(n + b + a for n, (b, a) in zip(x.shape[lead:], pads)))
    interior = out
    for axis, (b, _) in enumerate(pads):
        interior = interior.narrow(lead + axis, b, x.shape[lead + axis])
    interior.copy_(x)
    for axis, (b, a) in enumerate(pads):
        dim = lead + axis
        n = x.shape[dim]
        region = out
        for later in range(axis + 1, d):
            region = region.narrow(lead + later, pads[later][0], x.shape[lead + later])
        idx = index_fn(n, b, a, device=x.device) + b  # source positions in ``out``
        if b:
            region.narrow(dim, 0, b).copy_(region.index_select(dim, idx[:b]))
        if a:
            region.narrow(dim, b + n, a).copy_(region.index_select(dim, idx[b + n :]))
    return out


def centered_pads(window: Sequence[int]) -> list[tuple[int, int]]:
    """``(k // 2, k - 1 - k // 2)`` per axis: the pads that make a valid pass "same"."""
    return [(k // 2, k - 1 - k // 2) for k in window]
