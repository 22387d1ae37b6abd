"""Padding of the spatial axes with SciPy's boundary conventions.

``torch.nn.functional.pad`` calls "reflect" what SciPy calls "mirror" (``d c b | a b c d``);
SciPy's "reflect" (``c d | a b c d | d c``, half-sample symmetric) is what
``scipy.ndimage.uniform_filter`` and ``skimage.metrics.structural_similarity`` use, so
it is built here from an index gather. The gather is differentiable (its adjoint is an
``index_add`` that autograd provides), works for pads longer than the axis, and works
in any number of dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

#: padding names accepted by the operators, in SciPy's meaning.
PADDING_MODES = ("reflect", "zeros", "nearest")


def reflect_indices(n: int, before: int, after: int, device=None) -> torch.Tensor:
    """Source indices of SciPy's "reflect" padding of an axis of length ``n``.

    Returns a ``(before + n + after,)`` int64 tensor ``idx`` such that
    ``padded[i] = x[idx[i]]``; index ``-1`` maps to ``0``, ``n`` to ``n - 1``, and the
    pattern repeats with period ``2 n`` for pads longer than the axis.
    """
    i = torch.arange(-before, n + after, device=device)
    i = torch.remainder(i, 2 * n)
    return torch.where(i >= n, 2 * n - 1 - i, i)


def nearest_indices(n: int, before: int, after: int, device=None) -> torch.Tensor:
    """Source indices of edge-replicating padding (SciPy "nearest")."""
    return torch.arange(-before, n + after, device=device).clamp_(0, n - 1)


def pad_spatial(
    x: torch.Tensor, pads: Sequence[tuple[int, int]], mode: str = "reflect", value: float = 0.0
) -> torch.Tensor:
    """Pad the trailing ``len(pads)`` axes of ``x``.

    Parameters
    ----------
    x : Tensor, shape ``(..., *S)``
    pads : sequence of ``(before, after)``, one per trailing axis, array-axis order.
    mode : {"reflect", "zeros", "nearest"}
        SciPy's names: "reflect" is half-sample symmetric (``b a | a b c | c b``).
        "zeros" pads with ``value`` (0 unless given).

    Returns
    -------
    Tensor, shape ``(..., *[S_i + before_i + after_i])``; ``x`` itself when nothing is padded.
    """
    d = len(pads)
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    if mode == "zeros":
        flat = []
        for b, a in reversed(list(pads)):
            flat += [b, a]
        return F.pad(x, flat, mode="constant", value=value)
    index_fn = {"reflect": reflect_indices, "nearest": nearest_indices}.get(mode)
    if index_fn is None:
        raise ValueError(f"padding must be one of {PADDING_MODES}, got {mode!r}")
    out = x
    for axis, (b, a) in enumerate(pads):
        if b == 0 and a == 0:
            continue
        dim = x.dim() - d + axis
        idx = index_fn(x.shape[dim], b, a, device=x.device)
        out = out.index_select(dim, idx)
    return out


def centred_pads(window: Sequence[int]) -> list[tuple[int, int]]:
    """``(k // 2, k - 1 - k // 2)`` per axis: the pads that make a valid pass "same"."""
    return [(k // 2, k - 1 - k // 2) for k in window]
