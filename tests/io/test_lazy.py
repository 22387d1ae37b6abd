"""io/lazy.py: recognizing NumPy, dask, zarr and multiscale data; refusals that name the
argument."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")  # the [large] extra
zarr = pytest.importorskip("zarr")

from napari_simwarp.io import lazy  # noqa: E402


def test_kinds_are_recognized():
    x = np.zeros((4, 5))
    z = zarr.create_array(store=zarr.storage.MemoryStore(), shape=(4, 5), dtype="f4")
    assert not lazy.is_lazy(x) and lazy.is_lazy(da.from_array(x)) and lazy.is_lazy(z)
    assert lazy.is_dask(da.from_array(x)) and lazy.is_zarr(z) and not lazy.is_dask(z)


def test_multiscale_needs_an_explicit_level():
    levels = [np.arange(64.0).reshape(8, 8), np.arange(16.0).reshape(4, 4)]
    assert lazy.is_multiscale(levels)
    # np.asarray of such a list is no level at all (an object array or an error)
    with pytest.raises(ValueError, match=r"data is multiscale \(2 levels"):
        lazy.pick_level(levels, None)
    assert lazy.pick_level(levels, 1) is levels[1]
    with pytest.raises(ValueError, match="out of range"):
        lazy.pick_level(levels, 2)
    # a list of equal frames is a stack, not a pyramid; nor is a list of numbers
    assert not lazy.is_multiscale([np.zeros((4, 4)), np.zeros((4, 4))])
    assert not lazy.is_multiscale([[1, 2], [3]])


def test_unknown_chunks_and_unreadable_dtypes_are_refused():
    x = da.from_array(np.arange(10.0), chunks=3)
    unknown = x[x > 3]  # boolean indexing: chunk sizes unknown (NaN)
    with pytest.raises(ValueError, match="stack is a dask array with unknown chunk sizes"):
        lazy.check_array(unknown, "stack")
    with pytest.raises(TypeError, match="stack must hold numbers"):
        lazy.check_array(da.from_array(np.array(["a", "b"])), "stack")
    with pytest.raises(TypeError, match="must hold real numbers"):
        lazy.check_array(da.zeros(3, dtype=complex), "stack")


def test_read_reads_a_region():
    x = np.arange(60).reshape(3, 4, 5)
    assert np.array_equal(lazy.read(da.from_array(x, chunks=2), (1, slice(0, 2))), x[1, :2])
