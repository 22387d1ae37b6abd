"""The dtype that window sums are accumulated in (shared by local_std, ZNCC and the
moment engine of SSIM and local NCC)."""

from __future__ import annotations

import torch


def accumulate_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype the window sums run in: float64 for float32 data where the device has it.

    Even after centring, ``S2 - S1²/N`` keeps a relative error of about
    ``eps · (1 + (local mean / local std)²)``: in float32 that is over 1e-4 wherever the
    local mean sits ~60 local standard deviations from the global mean (dark, smooth
    regions of a natural image; bright blobs in microscopy). Summing in float64, chunk by
    chunk in cache, costs little (the sums are memory-bound and the chunks small) and
    removes the problem; MPS has no float64 and stays in float32.
    """
    if dtype == torch.float32 and device.type != "mps":
        return torch.float64
    return dtype
