"""The similarity losses (ops/losses.py) against NumPy, SciPy and scikit-image references
of ``1 − metric``: weights, reductions, batch broadcasting, gradients, option checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from napari_simwarp.ops import (
    LOSSES,
    LocalNCCLoss,
    MILoss,
    MSELoss,
    NCCLoss,
    SSIMLoss,
    loss_for,
)
from tests.images import random_smooth
from tests.ops.mutual_information_reference import mutual_information_reference
from tests.ops.ssim_reference import skimage_ssim_map

SHAPE = (30, 34)


# -- references, per 2-D image ----------------------------------------------------------


def _ncc(f, m, mask=None):
    sel = np.ones(f.shape, bool) if mask is None else mask.astype(bool)
    return np.corrcoef(f[sel], m[sel])[0, 1]


def _local_ncc_map(f, m, window, kernel="box"):
    if kernel == "box":
        filt = lambda x: ndi.uniform_filter(x, window, mode="reflect")
    else:  # a Gaussian truncated to the window, σ = (window - 1) / 6
        filt = lambda x: ndi.gaussian_filter(
            x,
            (window - 1) / 6,
            radius=window // 2,
            mode="reflect",
        )
    mf, mm = filt(f), filt(m)
    cov = filt(f * m) - mf * mm
    return cov / np.sqrt((filt(f * f) - mf**2) * (filt(m * m) - mm**2))


def _mean(x, mask=None):
    return x.mean() if mask is None else x[mask.astype(bool)].mean()


def reference(metric, f, m, mask=None, **options):
    """``1 − metric`` (or the mean squared difference) of one 2-D image pair."""
    if metric == "ncc":
        return 1 - _ncc(f, m, mask)
    if metric == "lncc":
        return 1 - _mean(
            _local_ncc_map(f, m, options.get("window", 9), options.get("kernel", "box")), mask
        )
    if metric == "ssim":
        return 1 - _mean(skimage_ssim_map(f, m, options.get("data_range", 1.0)), mask)
    if metric == "mi":
        normalize = options.get("normalize", True)
        score = mutual_information_reference(f, m, mask, normalize=normalize)
        return 2 - score if normalize else -score
    return _mean((m - f) ** 2, mask)


def _pairs(rng, n, channels=1, shape=SHAPE):
    fixed = np.stack([[random_smooth(rng, shape, 1.5) for _ in range(channels)] for _ in range(n)])
    moving = np.clip(0.6 * fixed + 0.4 * rng.random(fixed.shape), 0, 1)
    return fixed, moving


def _t(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))


METRICS = ["ncc", "lncc", "ssim", "mse", "mi"]


# -- values -----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_each_loss_matches_its_reference(rng, metric):
    fixed, moving = _pairs(rng, 3)
    out = LOSSES[metric](reduction="none")(_t(fixed), _t(moving))
    assert out.shape == (3,) and out.dtype == torch.float64
    expected = [reference(metric, fixed[i, 0], moving[i, 0]) for i in range(3)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("window,kernel", [(5, "box"), (11, "box"), (7, "gaussian")])
def test_local_ncc_loss_options(rng, window, kernel):
    fixed, moving = _pairs(rng, 1)
    out = LocalNCCLoss(window=window, kernel=kernel)(_t(fixed), _t(moving))
    expected = reference("lncc", fixed[0, 0], moving[0, 0], window=window, kernel=kernel)
    np.testing.assert_allclose(float(out), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("normalize", [True, False])
def test_mi_loss_options(rng, normalize):
    fixed, moving = _pairs(rng, 1)
    out = MILoss(bins=16, normalize=normalize)(_t(fixed), _t(moving))
    score = mutual_information_reference(fixed, moving, bins=16, normalize=normalize)
    np.testing.assert_allclose(float(out), 2 - score if normalize else -score, rtol=1e-10)


def test_ssim_loss_data_range(rng):
    fixed, moving = _pairs(rng, 1)
    fixed, moving = 4000 * fixed + 100, 4000 * moving + 100
    out = SSIMLoss(data_range=4000.0)(_t(fixed), _t(moving))
    expected = reference("ssim", fixed[0, 0], moving[0, 0], data_range=4000.0)
    np.testing.assert_allclose(float(out), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("metric", ["ncc", "lncc", "ssim"])
def test_perfect_match_is_zero_loss(rng, metric):
    fixed, _ = _pairs(rng, 2)
    out = LOSSES[metric](reduction="none")(_t(fixed), _t(fixed))
    np.testing.assert_allclose(out.numpy(), 0.0, atol=1e-12)


@pytest.mark.parametrize("metric", METRICS)
def test_channels_are_averaged(rng, metric):
    fixed, moving = _pairs(rng, 2, channels=3)
    out = LOSSES[metric](reduction="none")(_t(fixed), _t(moving))
    expected = [
        np.mean([reference(metric, fixed[i, c], moving[i, c]) for c in range(3)]) for i in range(2)
    ]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)


def test_3d_losses_match_their_references(rng):
    shape = (10, 12, 11)
    fixed, moving = _pairs(rng, 1, shape=shape)
    f, m = fixed[0, 0], moving[0, 0]
    np.testing.assert_allclose(float(NCCLoss()(_t(fixed), _t(moving))), 1 - _ncc(f, m), atol=1e-10)
    np.testing.assert_allclose(
        float(LocalNCCLoss(window=5)(_t(fixed), _t(moving))),
        1 - _local_ncc_map(f, m, 5).mean(),
        atol=1e-10,
    )
    # scikit-image truncates its Gaussian at 3.5 σ: 9 taps for σ = 1.
    np.testing.assert_allclose(
        float(SSIMLoss(window=9, sigma=1.0)(_t(fixed), _t(moving))),
        1 - skimage_ssim_map(f, m, 1.0, sigma=1.0).mean(),
        atol=1e-10,
    )
    np.testing.assert_allclose(
        float(MSELoss()(_t(fixed), _t(moving))), ((m - f) ** 2).mean(), atol=1e-12
    )


# -- weights ----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_a_weight_of_ones_is_no_weight(rng, metric):
    fixed, moving = _pairs(rng, 2)
    loss = LOSSES[metric](reduction="none")
    ones = torch.ones(2, 1, *SHAPE, dtype=torch.float64)
    torch.testing.assert_close(
        loss(_t(fixed), _t(moving), ones), loss(_t(fixed), _t(moving)), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("metric", METRICS)
def test_a_binary_weight_is_the_metric_on_the_selected_pixels(rng, metric):
    fixed, moving = _pairs(rng, 2)
    masks = np.zeros((2, 1, *SHAPE))
    masks[0, 0, 5:20, 3:25] = 1
    masks[1, 0] = rng.random(SHAPE) < 0.4
    out = LOSSES[metric](reduction="none")(_t(fixed), _t(moving), _t(masks))
    # Windowed metrics: the map is computed on the whole image, then averaged where selected.
    expected = [reference(metric, fixed[i, 0], moving[i, 0], masks[i, 0]) for i in range(2)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)
    unweighted = [reference(metric, fixed[i, 0], moving[i, 0]) for i in range(2)]
    assert np.abs(np.array(expected) - unweighted).min() > 1e-4  # the mask matters here


def test_one_weight_broadcasts_over_the_batch(rng):
    fixed, moving = _pairs(rng, 3)
    mask = np.zeros((1, 1, *SHAPE))
    mask[..., 4:18, 6:30] = 1
    out = MSELoss(reduction="none")(_t(fixed), _t(moving), _t(mask))
    expected = [((moving[i, 0] - fixed[i, 0]) ** 2)[mask[0, 0] > 0].mean() for i in range(3)]
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)


# -- reductions and broadcasting --------------------------------------------------------


@pytest.mark.parametrize("metric", METRICS)
def test_reductions(rng, metric):
    fixed, moving = _pairs(rng, 3)
    expected = np.array([reference(metric, fixed[i, 0], moving[i, 0]) for i in range(3)])
    f, m = _t(fixed), _t(moving)
    np.testing.assert_allclose(LOSSES[metric](reduction="none")(f, m).numpy(), expected, atol=1e-10)
    mean = LOSSES[metric]()(f, m)  # the default
    assert mean.shape == ()
    np.testing.assert_allclose(float(mean), expected.mean(), atol=1e-10)
    np.testing.assert_allclose(
        float(LOSSES[metric](reduction="sum")(f, m)), expected.sum(), atol=1e-10
    )
    with pytest.raises(ValueError, match="reduction must be one of"):
        LOSSES[metric](reduction="max")


@pytest.mark.parametrize("metric", METRICS)
def test_a_fixed_batch_of_one_serves_every_moving_image(rng, metric):
    fixed, moving = _pairs(rng, 3)
    out = LOSSES[metric](reduction="none")(_t(fixed[:1]), _t(moving))
    expected = [reference(metric, fixed[0, 0], moving[i, 0]) for i in range(3)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "fixed_shape,moving_shape",
    [
        ((1, 1, 8, 8), (1, 1, 8, 9)),
        ((2, 1, 8, 8), (3, 1, 8, 8)),
        ((3, 1, 8, 8), (1, 1, 8, 8)),
        ((1, 2, 8, 8), (1, 1, 8, 8)),
    ],
)
def test_mismatched_shapes_are_an_error_naming_fixed_and_moving(fixed_shape, moving_shape):
    with pytest.raises(ValueError, match="fixed and moving must have the same shape"):
        MSELoss()(torch.rand(fixed_shape), torch.rand(moving_shape))


# -- gradients --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metric,options",
    [
        ("ncc", {}),
        ("lncc", {"window": 3}),
        ("lncc", {"window": 5, "kernel": "gaussian"}),
        ("ssim", {"window": 5, "sigma": 1.0}),
        ("mse", {}),
        # "mi": its frame (each image's min and max) is held fixed, which finite
        # differences of the extreme pixels do not; gradchecked with a fixed frame in
        # tests/ops/test_mutual_information.py
    ],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradcheck(metric, options, weighted):
    gen = torch.Generator().manual_seed(5)
    fixed = torch.rand(2, 1, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    moving = torch.rand(2, 1, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = (
        (torch.rand(1, 1, 7, 8, generator=gen, dtype=torch.float64) > 0.3).double()
        if weighted
        else None
    )
    loss = loss_for(metric, reduction="none", **options)
    assert torch.autograd.gradcheck(
        lambda f, m: loss(f, m, weight), (fixed, moving), fast_mode=True
    )


# -- loss_for ---------------------------------------------------------------------------


def test_loss_for_builds_the_module_with_its_options():
    lncc = loss_for("lncc", window=7, kernel="gaussian", reduction="sum")
    assert isinstance(lncc, LocalNCCLoss)
    assert (lncc.window, lncc.kernel, lncc.reduction) == (7, "gaussian", "sum")
    ssim = loss_for("ssim", data_range=255.0)
    assert isinstance(ssim, SSIMLoss) and ssim.data_range == 255.0 and ssim.reduction == "mean"
    assert type(loss_for("ncc")) is NCCLoss and type(loss_for("mse")) is MSELoss


@pytest.mark.parametrize(
    "metric,options,named,accepted",
    [
        ("ncc", {"window": 9}, "window", "none"),
        ("mse", {"sigma": 1.0, "window": 3}, "sigma, window", "none"),
        ("lncc", {"data_range": 1.0}, "data_range", "window, kernel, sigma"),
        ("ssim", {"kernel": "box"}, "kernel", "window, sigma, data_range, k1, k2"),
        ("mi", {"window": 9}, "window", "bins, kernel, sigma, normalize"),
    ],
)
def test_loss_for_rejects_unknown_options_by_name(metric, options, named, accepted):
    with pytest.raises(TypeError) as info:
        loss_for(metric, **options)
    message = str(info.value)
    assert f"unexpected keyword argument(s) {named}" in message
    assert f"accepts: {accepted}" in message


def test_loss_for_names_the_caller_and_rejects_unknown_metrics():
    with pytest.raises(TypeError, match=r"similarity_gradient\(metric='ncc'\)"):
        loss_for("ncc", caller="similarity_gradient", window=3)
    with pytest.raises(ValueError, match="metric must be one of 'ncc', 'lncc', 'ssim', 'mse'"):
        loss_for("mutual_information")


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-6])
def test_weighted_ncc_loss_does_not_depend_on_the_images_scale(rng, scale):
    # NCC is scale-free; the weighted path used to add an absolute 1e-8 under its square
    # root, which pulled the loss towards 1 for intensities of order 1e-3 and below.
    fixed, moving = _pairs(rng, 2)
    mask = np.zeros((2, 1, *SHAPE))
    mask[:, :, 3:25, 2:30] = 1
    out = NCCLoss(reduction="none")(_t(scale * fixed), _t(scale * moving), _t(mask))
    expected = [1 - _ncc(fixed[i, 0], moving[i, 0], mask[i, 0]) for i in range(2)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-10)


def test_weighted_ncc_loss_of_a_flat_image_is_one_with_zero_gradient(rng):
    flat = torch.full((1, 1, 9, 10), 7.0, dtype=torch.float64, requires_grad=True)
    other = _t(rng.random((1, 1, 9, 10))).requires_grad_()
    loss = NCCLoss()(flat, other, torch.ones(1, 1, 9, 10, dtype=torch.float64))
    grads = torch.autograd.grad(loss, (flat, other))
    assert float(loss.detach()) == 1.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
