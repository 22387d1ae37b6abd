"""Plausibility checks: the similarity a result reports and the warnings it earns."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi
from skimage.metrics import normalized_mutual_information

from napari_simwarp import data, register
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
