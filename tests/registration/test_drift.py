"""The drift route's building blocks (registration/drift.py): phase correlation against
scikit-image, both sampling paths, the refinement."""

import functools

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.registration.drift import phase_correlation, shifted
from tests.registration.cases import textured


def test_phase_correlation_follows_the_displacement_convention(rng):
    ref = textured(rng, (96, 96))
    d = np.array([3.0, -5.0])  # ref(x) = frame(x + d)  <=>  frame(y) = ref(y - d)
    frame = ndi.shift(ref, d, order=3, mode="nearest")
    # scikit-image's order and sign: the shift s with ref(x) = frame(x - s), i.e. s = -d.
    est = phase_correlation(
        torch.tensor(ref, dtype=torch.float32)[None, None],
        torch.tensor(frame, dtype=torch.float32)[None, None],
    )
    np.testing.assert_allclose(est[0].numpy(), -d, atol=0.3)


@pytest.mark.parametrize(
    "shape,shifts",
    [
        ((96, 80), [(3.4, -5.7), (-7.2, 2.5), (0.0, 0.0), (-1.45, -0.6), (0.3, 0.8)]),
        ((48, 40, 52), [(2.6, -1.3, 4.1), (-3.3, 0.7, -2.2), (0.4, -0.6, 0.2)]),
    ],
)
def test_phase_correlation_matches_scikit_image(rng, shape, shifts):
    # phase_correlation(reference, moving) keeps phase_cross_correlation's argument order
    # and sign: the returned s satisfies scipy.ndimage.shift(moving, s) ≈ reference.
    from skimage.registration import phase_cross_correlation

    pad = 10  # crops of one larger scene: new content enters at the borders, as in drift
    scene = textured(rng, tuple(n + 2 * pad for n in shape))
    crop = tuple(slice(pad, pad + n) for n in shape)
    reference = scene[crop]
    moving = np.stack(
        [
            ndi.shift(scene, -np.asarray(s), order=3)[crop] + rng.normal(0, 0.01, shape)
            for s in shifts
        ]
    )
    est = phase_correlation(
        torch.tensor(reference, dtype=torch.float32)[None, None],
        torch.tensor(moving, dtype=torch.float32)[:, None],
    )
    assert est.shape == (len(shifts), len(shape)) and est.dtype == torch.float32
    # scikit-image on the same mean-free, Hann-windowed images (as its docs advise for
    # non-periodic images; unwindowed, the border's own zero-shift peak pulls its
    # sub-pixel estimate of small shifts by up to 1 px here).
    hann = functools.reduce(np.multiply.outer, [np.hanning(n) for n in shape])
    prepared = lambda x: hann * (x - x.mean())
    for got, m, true in zip(est.numpy(), moving, shifts):
        expected, _, _ = phase_cross_correlation(
            prepared(reference), prepared(m), upsample_factor=20
        )
        np.testing.assert_allclose(got, expected, atol=0.25)
        np.testing.assert_allclose(got, true, atol=0.3)


def test_cpu_slicing_matches_grid_sample_path(rng):
    frames = torch.tensor(textured(rng, (3, 40, 48)), dtype=torch.float32)[:, None]
    shifts = torch.tensor([[0.3, -1.7], [2.25, 0.5], [-2.9, 2.9]])
    a, valid_a = shifted(frames, shifts, use_grid_sample=False)
    b, valid_b = shifted(frames, shifts, use_grid_sample=True)
    torch.testing.assert_close(valid_a, valid_b)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # Inside the overlap, the bilinear sample of frame(x + d), checked against SciPy.
    from scipy import ndimage as ndi

    for n, d in enumerate(shifts.numpy()):
        ref = ndi.shift(frames[n, 0].numpy(), -d, order=1, mode="constant")
        inside = valid_a[n, 0].numpy() > 0
        np.testing.assert_allclose(a[n, 0].numpy()[inside], ref[inside], atol=1e-5)


def _hot_stack(img, truth, hot, value, rng):
    stack = np.stack([ndi.shift(img, s, order=3, mode="nearest") for s in truth])
    stack = np.clip(np.rint(stack), 0, 65535).astype(np.uint16)
    for t in range(len(stack)):
        stack[t, rng.integers(0, img.shape[0], hot), rng.integers(0, img.shape[1], hot)] = value
    return stack


def test_register_stack_ignores_hot_pixels(rng):
    from napari_simwarp.data import camera
    from napari_simwarp.registration import register_stack

    img = 255 * np.asarray(camera(), dtype=np.float32)[100:357, 100:401]
    truth = np.array([[0.0, 0.0], [3.4, -5.3], [-2.7, 1.45], [0.6, 4.25]])
    stack = _hot_stack(img, truth, 50, 65535, rng)  # 50 saturated pixels per frame
    shifts = register_stack(stack, device="cpu").shifts
    np.testing.assert_allclose(shifts, truth - truth[0], atol=0.05)


def test_register_stack_single_hot_pixel_on_smooth_frames_does_not_crash(rng):
    from napari_simwarp.registration import register_stack

    f = ndi.gaussian_filter(rng.random((96, 96)), 5)
    f = 1000 * (f - f.min()) / (f.max() - f.min())
    truth = np.array([[0.0, 0.0], [1.5, -2.2], [-0.8, 1.3], [2.1, 0.4]])
    stack = _hot_stack(f, truth, 1, 36624, rng)
    for reference in ("first", "previous", "mean"):
        shifts = register_stack(stack, reference=reference, device="cpu").shifts
        np.testing.assert_allclose(shifts, truth - truth[0], atol=0.1)


def test_refinement_widens_its_box_instead_of_crashing(rng):
    from napari_simwarp.registration.drift import refine_translation

    f = ndi.gaussian_filter(rng.random((64, 64)), 6).astype(np.float32)
    m = ndi.shift(f, (5.0, 0.0), order=3, mode="nearest")
    shifts, _, _ = refine_translation(
        torch.from_numpy(m)[None, None],
        torch.from_numpy(f)[None, None],
        torch.zeros(1, 2),
        iterations=20,
    )
    np.testing.assert_allclose(shifts[0].numpy(), [5.0, 0.0], atol=0.1)
