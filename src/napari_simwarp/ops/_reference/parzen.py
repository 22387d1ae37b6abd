"""Pure torch twin of ``simwarp::parzen_fwd`` / ``parzen_bwd``: the B-spline Parzen mutual
information of :mod:`..mutual_information` (its torch path, autograd through its own
hand-written histogram and entropy gradients)."""

from __future__ import annotations


def parzen_mutual_information(a, b, weight, bins: int, normalize: bool, value_range):
    """The B-spline Parzen mutual information ``(M,)`` of intensities ``a``, ``b`` ``(M,
    P)`` (``weight`` ``(M, P)`` or None; ``value_range`` None or ``(lo, hi)``), NaN for a
    row holding a non-finite value, differentiable in ``a`` and ``b``."""
    # imported here: mutual_information imports _kernels, which imports this package
    from ..mutual_information import _Parzen, parzen_score

    return parzen_score(a, b, weight, _Parzen("bspline", bins, 1.0), normalize, value_range)
