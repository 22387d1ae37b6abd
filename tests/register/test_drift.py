"""The drift route's building blocks: phase correlation sign and both sampling paths."""

import numpy as np
import torch
from scipy import ndimage as ndi

from napari_simwarp.register.drift import _sample_inner, phase_correlation
from tests.register.cases import textured


def test_phase_correlation_follows_the_displacement_convention(rng):
    ref = textured(rng, (96, 96))
    d = np.array([3.0, -5.0])  # ref(x) = frame(x + d)  <=>  frame(y) = ref(y - d)
    frame = ndi.shift(ref, d, order=3, mode="nearest")
    est = phase_correlation(torch.tensor(frame, dtype=torch.float32)[None, None],
                            torch.tensor(ref, dtype=torch.float32)[None, None])
    np.testing.assert_allclose(est[0].numpy(), d, atol=0.3)


def test_cpu_slicing_matches_grid_sample_path(rng):
    frames = torch.tensor(textured(rng, (3, 40, 48)), dtype=torch.float32)[:, None]
    shifts = torch.tensor([[0.3, -1.7], [2.25, 0.5], [-2.9, 2.9]])
    a = _sample_inner(frames, shifts, [5, 5], [30, 38], use_grid_sample=False)
    b = _sample_inner(frames, shifts, [5, 5], [30, 38], use_grid_sample=True)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
