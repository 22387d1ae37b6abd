"""Input coercion of the registration engine: the robust intensity range, read-only input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.registration import _inputs
from napari_simwarp.registration._inputs import normalize, robust_range


@pytest.mark.parametrize("n", [1000, 262_144, 1_000_003])
def test_robust_range_matches_torch_quantile_on_the_same_sample(n):
    rng = np.random.default_rng(n)
    t = torch.from_numpy(rng.gamma(2.0, 3.0, n).astype(np.float32))
    step = max(1, n // 200_000)  # the documented subsample: every step-th value
    sample = t[::step].double()
    expected = torch.quantile(sample, torch.tensor([0.005, 0.995], dtype=torch.float64))
    lo, hi = robust_range(t, "image")
    np.testing.assert_allclose([lo, hi], expected.numpy(), rtol=1e-12)


def test_normalize_maps_the_percentiles_to_0_and_1_without_touching_the_input():
    rng = np.random.default_rng(0)
    a = rng.normal(5.0, 2.0, (64, 64)).astype(np.float32)
    t = torch.from_numpy(a.copy())
    out = normalize(t, "image")
    lo, hi = np.percentile(a, [0.5, 99.5])
    np.testing.assert_allclose(np.percentile(out.numpy(), [0.5, 99.5]), [0, 1], atol=1e-5)
    np.testing.assert_allclose(out.numpy(), (a - lo) / (hi - lo), atol=1e-5)
    np.testing.assert_array_equal(t.numpy(), a)


def test_a_constant_image_is_refused_by_name():
    with pytest.raises(ValueError, match="fixed is constant"):
        robust_range(torch.full((8, 8), 3.0), "fixed")


def test_a_read_only_input_is_shared_without_a_warning(recwarn):
    """A read-only array (a memory map, a decoded Zarr chunk) becomes a tensor without
    torch's "not writable" warning reaching the user, and a registration leaves it as it
    was."""
    import warnings

    from napari_simwarp.registration import register

    rng = np.random.default_rng(0)
    fixed = rng.random((48, 48)).astype(np.float32)
    fixed.flags.writeable = False
    moving = np.roll(fixed, 2, axis=1)
    moving.flags.writeable = False
    before = fixed.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        t = _inputs.to_tensor(fixed, "fixed")
    assert np.shares_memory(t.numpy(), fixed)
    register(fixed, moving, model="translation")
    assert not [w for w in recwarn if "not writable" in str(w.message)]
    np.testing.assert_array_equal(fixed, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_to_tensor_refuses_nan_and_inf_in_float_input(bad):
    a = np.zeros((8, 9), np.float32)
    a[3, 4] = bad
    with pytest.raises(ValueError, match="image contains NaN or Inf"):
        _inputs.to_tensor(a, "image")
    with pytest.raises(ValueError, match="stack contains NaN or Inf"):
        _inputs.to_tensor(np.stack([np.zeros_like(a), a]), "stack", leading=1)


def test_nan_advice_is_followable_and_names_the_mask_for_the_fixed_image_only():
    # The message's advice (replace the NaNs; for the fixed image, a mask that is 0
    # there) must work: a run so prepared finds the shift a clean pair gives.
    from scipy import ndimage as ndi

    from napari_simwarp import data, register

    clean = data.camera()[128:256, 128:256].astype(np.float32)
    moving = ndi.shift(clean, (1.5, -2.25), order=3, mode="nearest").astype(np.float32)
    fixed = clean.copy()
    fixed[40:70, 50:90] = np.nan  # a dead region of the detector
    with pytest.raises(ValueError, match=r"fixed contains NaN.*mask that is 0 there"):
        register(fixed, moving, model="translation")
    with pytest.raises(ValueError, match="moving contains NaN") as refused:
        register(clean, np.where(np.isnan(fixed), np.nan, moving), model="translation")
    assert "mask" not in str(refused.value)  # a moving image's pixels move: no mask helps
    valid = ~np.isnan(fixed)
    masked = register(np.nan_to_num(fixed), moving, model="translation", mask=valid)
    unmasked = register(np.nan_to_num(fixed), moving, model="translation")
    reference = register(clean, moving, model="translation")
    truth = np.asarray(reference.transform.translation, np.float64)
    error = np.abs(np.asarray(masked.transform.translation, np.float64) - truth).max()
    assert error < 0.02, (masked.transform.translation, truth)
    # the zeros left in would have pulled it (what the mask is for)
    assert np.abs(np.asarray(unmasked.transform.translation) - truth).max() > error


def test_to_tensor_accepts_finite_values_whose_sum_overflows():
    # The one-reduction shortcut sees an infinite sum; the elementwise test then passes.
    a = np.full((4, 4), 3.0e38, np.float32)
    assert not torch.isfinite(torch.from_numpy(a).sum())
    t = _inputs.to_tensor(a, "image")
    assert t.dtype == torch.float32 and torch.equal(t, torch.from_numpy(a))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64, np.uint64, np.bool_])
def test_to_tensor_converts_integer_input_exactly_to_float32(dtype):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    high = 2 if info is None else min(int(info.max), 2**62)
    a = rng.integers(0, high, (6, 7), dtype=np.int64 if dtype != np.uint64 else np.uint64)
    a = a.astype(dtype)
    t = _inputs.to_tensor(a, "image")
    assert t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy(), a.astype(np.float32))
    assert torch.isfinite(t).all()
