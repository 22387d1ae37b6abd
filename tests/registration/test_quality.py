"""Plausibility checks: the similarity a result reports and the warnings it earns."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi
from skimage.metrics import normalized_mutual_information

from napari_simwarp import data, register, register_stack
from napari_simwarp.registration.quality import (
    MIN_NMI,
    RegistrationWarning,
    masked_nmi,
    masked_zncc,
    problems,
)
from tests.ops.mutual_information_reference import mutual_information_reference


def _t(x):
    return torch.as_tensor(np.asarray(x, np.float64))[None, None]


def test_masked_zncc_is_pearson_over_the_mask(rng):
    a, b = rng.random((40, 30)), rng.random((40, 30))
    mask = np.zeros((40, 30))
    mask[5:30, 3:20] = 1
    keep = mask > 0
    expected = np.corrcoef(a[keep], b[keep])[0, 1]
    assert float(masked_zncc(_t(a), _t(b), _t(mask))[0]) == pytest.approx(expected, abs=1e-12)


def test_masked_zncc_of_float32_frames_holds_to_1e_6_at_2048(rng):
    # A contrast of 1 on an offset of 100: float32 sums of uncentred products would lose
    # the score to cancellation; each frame has its own mask, the fixed image is shared.
    fixed = rng.random((2048, 2048), dtype=np.float32) + 100
    frames = [rng.random((2048, 2048), dtype=np.float32) + 100 + k * fixed for k in (0.2, 1.0)]
    masks = np.ones((2, 2048, 2048), np.float32)
    masks[0, :300] = 0
    masks[1, :, 1500:] = 0
    got = masked_zncc(
        torch.from_numpy(fixed)[None, None],
        torch.from_numpy(np.stack(frames))[:, None],
        torch.from_numpy(masks)[:, None],
    )
    assert got.dtype == torch.float32
    for k in range(2):
        keep = masks[k] > 0
        expected = np.corrcoef(fixed[keep].astype(np.float64), frames[k][keep].astype(np.float64))
        assert float(got[k]) == pytest.approx(expected[0, 1], abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_zncc_of_a_flat_image_is_0(rng, dtype):
    flat = torch.full((1, 1, 300, 200), 1234.567, dtype=dtype)
    other = torch.as_tensor(rng.random((1, 1, 300, 200)), dtype=dtype)
    ones = torch.ones_like(other)
    assert float(masked_zncc(flat, other, ones)[0]) == 0.0
    assert float(masked_zncc(other, flat, ones)[0]) == 0.0
    assert float(masked_zncc(other, other, torch.zeros_like(other))[0]) == 0.0


def test_masked_zncc_edge_cases_and_gradient(rng):
    # no frame; weights summing below 1 (the mean is the weighted one: offset-invariant);
    # a gradient for every input, as float64 autograd gives it
    assert masked_zncc(
        torch.rand(1, 1, 5, 5), torch.rand(0, 1, 5, 5), torch.ones(0, 1, 5, 5)
    ).shape == (0,)
    a, b = rng.random((32, 32)), rng.random((32, 32))
    w = np.full((32, 32), 0.5 / 1024)
    shifted = float(masked_zncc(_t(a + 50), _t(b), _t(w))[0])
    assert shifted == pytest.approx(np.corrcoef(a.ravel(), b.ravel())[0, 1], abs=1e-12)
    inputs = [_t(x).requires_grad_() for x in (a, b, 0.2 + rng.random((32, 32)))]
    assert torch.autograd.gradcheck(lambda f, m, v: masked_zncc(f, m, v), inputs)


def test_masked_nmi_is_the_parzen_nmi_over_the_mask(rng):
    image = ndi.gaussian_filter(rng.random((96, 80)), 2)
    related, unrelated = 1.0 - image**2, ndi.gaussian_filter(rng.random((96, 80)), 2)
    mask = np.zeros_like(image)
    mask[10:90, 5:60] = 1
    ours = [float(masked_nmi(_t(image), _t(m), _t(mask))[0]) for m in (related, unrelated)]
    expected = [
        mutual_information_reference(image, m, weight=mask, normalize=True)
        for m in (related, unrelated)
    ]
    np.testing.assert_allclose(ours, expected, rtol=1e-9)
    assert ours[0] > MIN_NMI > ours[1]
    # scikit-image's plain histogram ranks the pair the same way
    assert normalized_mutual_information(image, related) > normalized_mutual_information(
        image, unrelated
    )


def test_a_multimodal_pair_is_judged_by_mutual_information():
    fixed = data.deformed_pair()[0]
    moving = ndi.shift(1.0 - fixed**2, (3.0, -2.0), order=1, mode="nearest")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RegistrationWarning)  # no warning at all
        result = register(fixed, moving, model="translation", metric="mi")
    assert result.similarity_measure == "nmi" and result.similarity > MIN_NMI
    assert result.similarity > result.initial_similarity
    # The ZNCC of the aligned pair is strongly negative: judged by it, this right
    # answer would have been reported as wrong.
    zncc = np.corrcoef(fixed.ravel(), result.warped.ravel())[0, 1]
    assert zncc < -0.5
    assert np.allclose(result.transform.matrix[:2, 2], (3.0, -2.0), atol=0.1)


def test_unimodal_metrics_report_zncc():
    fixed, moving, _ = data.deformed_pair()
    result = register(fixed, moving, model="translation", metric="ncc", iterations=5)
    assert result.similarity_measure == "zncc"


def test_a_dense_fit_of_unrelated_images_is_flagged():
    found = problems(0.9, 0.1, 1.0, dense=True)
    assert set(found) == {"unrelated"} and "linear model first" in found["unrelated"]
    assert problems(0.9, 0.1, 1.0, dense=False) == {}  # a linear model cannot fake it
    assert "unrelated" not in problems(0.9, 0.1, 1.0, dense=True, measure="nmi")


def test_thresholds_follow_the_measure():
    assert set(problems(1.01, 1.0, 1.0, measure="nmi")) == {"similarity"}
    assert set(problems(1.3, 1.4, 1.0, measure="nmi")) == {"worse"}
    assert problems(1.3, 1.3, 1.0, measure="nmi") == {}
    assert "normalized MI" in problems(1.01, 1.0, 1.0, measure="nmi")["similarity"]


def test_lowest_jacobian_in_slabs_equals_the_whole_field_and_finds_a_fold():
    """The slabbed minimum equals ``jacobian_determinant`` of the whole field (a field
    longer than a slab along its first axis, 2-D and 3-D), and a field that folds in one
    plane is found with its determinant (float64 reference: NumPy's gradient)."""
    from napari_simwarp.ops import jacobian_determinant
    from napari_simwarp.registration.quality import JACOBIAN_SLAB, lowest_jacobian

    rng = np.random.default_rng(4)
    for shape in ((3 * JACOBIAN_SLAB + 5, 40), (JACOBIAN_SLAB + 3, 12, 10)):
        d = rng.normal(0, 0.3, (len(shape), *shape))
        whole = float(jacobian_determinant(torch.from_numpy(d)[None]).min())
        assert lowest_jacobian(d) == pytest.approx(whole, rel=1e-12)
    # u(y) = -1.5 y around row 50 of a 2-D field: the map folds there (det 1 - 1.5 < 0)
    d = np.zeros((2, 100, 30))
    d[0, 45:56] = -1.5 * (np.arange(45, 56) - 50)[:, None]
    reference = np.min(1 + np.gradient(d[0], axis=0)[46:55])
    assert lowest_jacobian(d) == pytest.approx(reference) and reference < 0


def test_a_folded_dense_result_is_warned_and_the_default_metric_holds_under_shading():
    """Under an illumination that varies by ±30 % across the moving image, global NCC folds
    a deformable field (tens of pixels off; issue 16) and says so; the default metric
    (local NCC) recovers the known field within a tenth of its size, unfolded, unwarned."""
    from napari_simwarp.registration.quality import RegistrationWarning, lowest_jacobian
    from tests.registration.cases import deformed_pair

    rng = np.random.default_rng(11)
    fixed, moving, d = deformed_pair(rng, (128, 128), amplitude=2.0, sigma=8.0)
    ramp = np.linspace(-1.0, 1.0, moving.shape[1])[None, :]
    shaded = moving * (1 + 0.3 * ramp)
    inner = (slice(8, -8), slice(8, -8))
    with pytest.warns(RegistrationWarning, match="folds"):
        folded = register(fixed, shaded, model="deformable", metric="ncc")
    assert lowest_jacobian(folded.transform.to_displacement(fixed.shape)) <= 0
    with pytest.warns(RegistrationWarning, match=r"frame\(s\) 1: the displacement field folds"):
        register_stack(np.stack([fixed, shaded]), model="deformable", metric="ncc")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = register(fixed, shaded, model="deformable")
    assert result.metric == "lncc" and not [w for w in seen if "folds" in str(w.message)]
    est = result.transform.to_displacement(fixed.shape)
    epe = np.linalg.norm(est - d, axis=0)[inner].mean()
    assert epe < 0.1 * 2.0, epe
    assert lowest_jacobian(est) > 0
