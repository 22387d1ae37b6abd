"""Numerics shared by every operator: compute dtypes, the accumulation dtypes, the flat rule.

See docs/maths.md §1.3 ("Numerics"): sums of squares cancel catastrophically in float32
when a window's mean sits far from its spread, so window sums run in float64 wherever the
device has it (:func:`accumulate_dtype`), except in the moment engine on GPUs, which keeps
float32 and centres each tile on its own mean instead (:func:`moment_dtype`); a window
whose variance is within the rounding level of its sums is "flat" (defined as 0, with a
zero gradient) by one rule, the same for every operator.
"""

from __future__ import annotations

import torch

#: dtypes that are computed in float32 and cast back on return.
LOW_PRECISION = (torch.float16, torch.bfloat16)

#: A window's sum of squared deviations ``V`` at or below ``FLAT_TOLERANCE · eps · E``
#: (``E`` the window's sum of squares of the centered values, ``eps`` the machine epsilon
#: of the dtype the sums ran in) cannot be told from the rounding of the sums, so the
#: window counts as flat. Pairwise and running sums err by a few ulps of ``E`` (about
#: ``log2(k)`` for a pass of ``k`` taps); 64 leaves a wide margin, and in float64 it is a
#: relative ``1.4e-14``, far below any real texture.
FLAT_TOLERANCE = 64.0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an operator computes in: float32 for half types, else ``dtype``."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def to_compute(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its compute dtype (a cast only for float16/bfloat16)."""
    return x.to(compute_dtype(x.dtype))


def accumulate_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype window sums run in: float64 for float32 data where the device has it.

    Even after centering, ``S2 - S1²/N`` keeps a relative error of about
    ``eps · (1 + (local mean / local std)²)``: in float32 that is over 1e-4 wherever the
    local mean sits ~60 local standard deviations from the global mean (dark, smooth
    regions of a natural image; bright blobs in microscopy). Summing in float64, chunk by
    chunk in cache, costs little (the sums are memory-bound and the chunks small) and
    removes the problem; MPS has no float64 and stays in float32.
    """
    if dtype == torch.float32 and device.type != "mps":
        return torch.float64
    return dtype


#: device types on which the moment engine (SSIM, local NCC) sums float32 data in float32,
#: with per-tile centring, rather than in float64: float64 runs at 1/64 of the float32
#: rate on most GPUs (and MPS has none). Tests add "cpu" to run that path on the CPU.
FLOAT32_MOMENT_DEVICE_TYPES = frozenset({"cuda", "mps"})


def moment_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the sums of data of compute dtype ``dtype`` run in, on ``device``.

    float32 on :data:`FLOAT32_MOMENT_DEVICE_TYPES` (no float64 arithmetic on GPUs), else
    :func:`accumulate_dtype`. Each caller keeps float64's accuracy in float32 its own way
    (docs/maths.md §1.3): the moment engine centres each tile on its own mean, the pure
    torch local std sums in compensated float32 pairs, ``ncc`` and the entropies of
    ``mutual_information`` sum terms that do not cancel, ``match_template`` centres each
    FFT block on its own mean.
    """
    if dtype == torch.float32 and device.type in FLOAT32_MOMENT_DEVICE_TYPES:
        return torch.float32
    return accumulate_dtype(dtype, device)


def flat_threshold_factor(dtype: torch.dtype) -> float:
    """``FLAT_TOLERANCE · eps(dtype)``: the relative level below which ``V`` counts as 0."""
    return FLAT_TOLERANCE * torch.finfo(dtype).eps
