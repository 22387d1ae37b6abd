"""The drift route's building blocks: phase correlation sign and both sampling paths."""

import numpy as np
import torch
from scipy import ndimage as ndi

from napari_simwarp.registration.drift import phase_correlation, shifted
from tests.registration.cases import textured


def test_phase_correlation_follows_the_displacement_convention(rng):
    ref = textured(rng, (96, 96))
    d = np.array([3.0, -5.0])  # ref(x) = frame(x + d)  <=>  frame(y) = ref(y - d)
    frame = ndi.shift(ref, d, order=3, mode="nearest")
    # scikit-image's order and sign: the shift s with ref(x) = frame(x - s), i.e. s = -d.
    est = phase_correlation(torch.tensor(ref, dtype=torch.float32)[None, None],
                            torch.tensor(frame, dtype=torch.float32)[None, None])
    np.testing.assert_allclose(est[0].numpy(), -d, atol=0.3)


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
    shifts, _, _ = refine_translation(torch.from_numpy(m)[None, None],
                                      torch.from_numpy(f)[None, None], torch.zeros(1, 2),
                                      iterations=20)
    np.testing.assert_allclose(shifts[0].numpy(), [5.0, 0.0], atol=0.1)
