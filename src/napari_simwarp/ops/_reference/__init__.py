"""Pure torch implementations of the compiled ops: the fallback and the tests' oracle.

Each function has the signature of its compiled twin in :mod:`.._kernels.calls`, so an
operator calls ``_kernels.implementation(op, x).<function>`` and gets one or the other;
tests hold the kernels to these (and both to independent references: SciPy,
scikit-image, float64 autograd).

========================= =================================== ===========================
function                   what it computes                   kernel
========================= =================================== ===========================
``box_sum``                window sums (valid / full)         ``simwarp::box_sum``
``correlate``              separable correlation / transpose  ``simwarp::correlate``
``moments5``               the five windowed moments          ``simwarp::moments5``
``local_std_valid``        local std of a padded, centered map ``simwarp::local_std_fwd``
``local_std_2d``           local std with its padding          ``simwarp::local_std_2d_fwd``
``splat_fwd``              splatting, with its weights         ``simwarp::splat_fwd``
========================= =================================== ===========================

The twin of ``simwarp::parzen_fwd`` / ``parzen_bwd`` (the B-spline Parzen mutual
information) is :func:`..mutual_information.parzen_score`, beside the op.
"""

from .local_std import local_std_2d, local_std_valid
from .moments import moments5
from .splat import splat_fwd
from .window_sums import box_sum, correlate

__all__ = [
    "box_sum",
    "correlate",
    "local_std_2d",
    "local_std_valid",
    "moments5",
    "splat_fwd",
]
