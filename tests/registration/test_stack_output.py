"""The aligned stack's coverage: a translated frame's coverage follows from its shift, the
same as warping a plane of ones (the general path) says."""

import numpy as np
import pytest
import torch

from napari_simwarp.registration import _stack_output
from napari_simwarp.registration.transforms import AffineTransform


def _translations(shifts):
    out = []
    for s in shifts:
        m = np.eye(len(s) + 1)
        m[:-1, -1] = s
        out.append(AffineTransform(m, "translation"))
    return out


@pytest.mark.parametrize("shape", [(17, 23), (6, 9, 11)])
def test_a_translation_covers_what_a_warped_plane_of_ones_covers(shape):
    rng = np.random.default_rng(1)
    shifts = rng.uniform(-4, 4, (5, len(shape)))
    # away from the 1e-3 px band at whole pixels, where the two rules may round apart
    shifts += np.where(np.abs(shifts - np.round(shifts)) < 0.01, 0.05, 0.0)
    shifts[0] = 0.0  # the identity covers everything
    shifts[1] = 0.0
    shifts[1, 0] = 2.0  # a whole-pixel shift covers all but two rows
    raw = torch.from_numpy(rng.random((5, *shape)).astype(np.float32))
    transforms = _translations(shifts)
    moved, cover = _stack_output.warp_frames(raw, transforms)
    ones = torch.stack([raw, torch.ones_like(raw)], dim=1)
    general = _stack_output._warp(ones, transforms)
    np.testing.assert_array_equal(cover.numpy(), (general[:, 1] > 0.999).numpy())
    np.testing.assert_allclose(moved.numpy(), general[:, 0].numpy(), atol=1e-6)
    assert cover[0].all() and cover[1].sum() == (shape[0] - 2) * np.prod(shape[1:])


def test_other_transforms_warp_a_plane_of_ones():
    m = np.eye(3)
    m[:2, :2] = [[np.cos(0.1), -np.sin(0.1)], [np.sin(0.1), np.cos(0.1)]]
    raw = torch.rand(1, 20, 20)
    _, cover = _stack_output.warp_frames(raw, [AffineTransform(m, "rigid")])
    assert 0 < int(cover.sum()) < 400 and not cover[0, 0, -1]
