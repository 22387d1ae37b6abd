"""scikit-image's SSIM map: the independent reference of our SSIM (the op, the losses and
the fused kernels' tests)."""

from __future__ import annotations

import numpy as np


def skimage_ssim_map(a: np.ndarray, b: np.ndarray, data_range: float, sigma: float = 1.5):
    """scikit-image's SSIM map of the arrays ``a`` and ``b`` with our SSIM's window and
    covariance: Gaussian of ``sigma`` (scikit-image truncates it at 3.5 σ: 11 taps for
    1.5) and the population covariance. scikit-image is imported here, so that a test
    module that must run without it (test_host_shim.py) can skip first."""
    from skimage.metrics import structural_similarity

    _, full = structural_similarity(
        a,
        b,
        full=True,
        gaussian_weights=True,
        sigma=sigma,
        use_sample_covariance=False,
        data_range=data_range,
    )
    return full
