"""Pure logic of the similarity-map widget (no Qt, no viewer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp import ops
from napari_simwarp.widgets_logic.similarity import (
    SimilarityModel,
    SimilarityParams,
    display_for,
)


def test_request_ids_make_earlier_ones_stale():
    model = SimilarityModel()
    first = model.new_request()
    assert model.is_current(first)
    second = model.new_request()
    assert not model.is_current(first) and model.is_current(second)


def test_maps_equal_the_ops(rng):
    a = rng.random((40, 48), dtype=np.float32)
    b = a + 0.1 * rng.random((40, 48), dtype=np.float32)
    ta, tb = (torch.from_numpy(x)[None, None] for x in (a, b))
    model = SimilarityModel("cpu")
    res = model.compute(1, a, None, SimilarityParams("local std", window=8))
    assert res.params.window == 9  # even windows become odd
    np.testing.assert_allclose(res.data, ops.local_std(ta, window=9)[0, 0].numpy(), rtol=1e-6)
    res = model.compute(2, a, b, SimilarityParams("local NCC", window=5))
    np.testing.assert_allclose(res.data, ops.local_ncc(ta, tb, window=5)[0, 0].numpy(), atol=1e-6)
    res = model.compute(3, a, b[5:20, 7:30], SimilarityParams("ZNCC (template)"))
    assert res.data.shape == a.shape and res.colormap == "bwr"
    assert np.unravel_index(res.data.argmax(), a.shape)  # a map, not a scalar


def test_tensor_cache_reuses_by_identity(rng):
    a = rng.random((32, 32), dtype=np.float32)
    model = SimilarityModel("cpu")
    model.compute(1, a, None, SimilarityParams())
    t1 = model._cache.get(a, "image", torch.device("cpu"))
    assert model._cache.get(a, "image", torch.device("cpu")) is t1
    assert model._cache.get(a.copy(), "image", torch.device("cpu")) is not t1


def test_errors_name_the_problem(rng):
    model = SimilarityModel("cpu")
    a = rng.random((16, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="second"):
        model.compute(1, a, None, SimilarityParams("SSIM"))
    with pytest.raises(ValueError, match="same shape"):
        model.compute(1, a, a[:8], SimilarityParams("SSIM"))
    with pytest.raises(ValueError, match="2-D or 3-D"):
        model.compute(1, a[0], None, SimilarityParams())


def test_display_ranges():
    assert display_for("local std", np.array([0.0, 2.0]))[1][0] == 0.0
    assert display_for("local NCC", np.zeros(3)) == ("bwr", (-1.0, 1.0))
    assert display_for("SSIM", np.array([-0.2, 1.0]))[1] == (-0.2, 1.0)
