"""Transform.apply on dask and zarr arrays (registration/chunked.py): every chunking gives
the in-memory result, chunk borders included; each chunk reads only its preimage box."""

import numpy as np
import pytest
from scipy import ndimage

da = pytest.importorskip("dask.array")  # the [large] extra
zarr = pytest.importorskip("zarr")

from napari_simwarp.registration.transforms import (  # noqa: E402
    AffineTransform,
    DisplacementTransform,
    VelocityTransform,
)


def _transforms(rng, shape):
    d = len(shape)
    m = np.eye(d + 1)
    m[:d, :d] += rng.normal(0, 0.08, (d, d))
    m[:d, d] = rng.normal(0, 3, d)
    field = ndimage.gaussian_filter(rng.normal(0, 2.5, (d, *shape)), (0, *[3] * d))
    return [
        AffineTransform(m),
        AffineTransform(np.diag([0.5] * d + [1.0])),  # exact ties for nearest
        DisplacementTransform(field.astype(np.float32)),
        VelocityTransform(field.astype(np.float32)),
    ]


@pytest.mark.parametrize("shape", [(40, 52), (14, 18, 20)])
def test_every_chunking_equals_the_in_memory_apply(rng, shape):
    image = ndimage.gaussian_filter(rng.random(shape), 2)
    labels = (image * 40).astype(np.int32)
    chunkings = [7, 16, tuple(n // 2 + 1 for n in shape), max(shape)]
    for t in _transforms(rng, shape):
        expected = t.apply(image)  # float64: the reference to float64 rounding
        expected32 = t.apply(image.astype(np.float32))
        expected_labels = t.apply(labels, order=0)
        for chunks in chunkings:
            lazy = da.from_array(image, chunks=chunks)
            got = t.apply(lazy, chunks=chunks)
            assert isinstance(got, da.Array)
            np.testing.assert_allclose(got.compute(), expected, atol=1e-9, rtol=0)
            got32 = t.apply(lazy.astype(np.float32)).compute()
            assert got32.dtype == np.float32
            # float32: the sampling grid's rounding (a few 1e-6 of these [0, 1] values,
            # in the in-memory float32 path too) bounds the distance between the two
            np.testing.assert_allclose(got32, expected, atol=5e-6, rtol=0)
            np.testing.assert_allclose(got32, expected32, atol=1e-5, rtol=0)
            got_labels = t.apply(da.from_array(labels, chunks=chunks), order=0).compute()
            assert got_labels.dtype == labels.dtype
            np.testing.assert_array_equal(got_labels, expected_labels)


def test_leading_axes_zarr_input_and_output_shape(rng):
    stack = ndimage.gaussian_filter(rng.random((3, 30, 34)), (0, 2, 2)).astype(np.float64)
    z = zarr.create_array(store=zarr.storage.MemoryStore(), shape=stack.shape, chunks=(2, 9, 9),
                          dtype=stack.dtype)  # fmt: skip
    z[:] = stack
    t = _transforms(rng, (30, 34))[0]
    got = t.apply(z, output_shape=(20, 41), chunks=(8, 11))
    assert got.chunks[0] == (2, 1)  # the leading chunks are the input's
    np.testing.assert_allclose(got.compute(), t.apply(stack, output_shape=(20, 41)), atol=1e-9)


def test_each_chunk_reads_only_its_box(rng):
    """A translation by +10 rows: the output chunk of rows 0-9 reads input rows 9-21 at
    most (its preimage 10-19 plus the footprint and margin), never the whole input."""
    image = rng.random((60, 20))
    read = []

    def record(block, block_info=None):
        read.append(block_info[0]["array-location"][0])
        return block

    src = da.from_array(image, chunks=(5, 20)).map_blocks(record, dtype=image.dtype)
    m = np.eye(3)
    m[0, 2] = 10.0
    AffineTransform(m).apply(src, chunks=(10, 20)).blocks[0].compute()
    rows = {r for span in read for r in range(*span)}
    assert rows and min(rows) >= 5 and max(rows) < 25


def test_chunks_are_checked():
    t = AffineTransform(np.eye(3))
    with pytest.raises(ValueError, match="chunks must be"):
        t.apply(da.zeros((8, 8)), chunks=(0, 4))
    x = da.arange(64.0, chunks=8).reshape(8, 8)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        t.apply(x[x[:, 0] > 3])


def test_a_stack_chunked_over_many_frames_gives_tasks_that_fit_the_budget(rng):
    """16 float32 frames of 64² per chunk (256 KiB); each frame's task holds about
    64² * (4 + 8 + 12) bytes (96 KiB): a 300 KiB budget takes two frames a task on one
    thread (the tasks were the input's 16 frames, refused however small the frames). The
    values are the in-memory apply's."""
    import dask

    stack = ndimage.gaussian_filter(rng.random((32, 64, 64)), (0, 2, 2)).astype(np.float32)
    t = _transforms(rng, (64, 64))[0]
    lazy = da.from_array(stack, chunks=(16, 64, 64))
    with dask.config.set(scheduler="threads", num_workers=1):
        got = t.apply(lazy, memory_budget=300 * 2**10)
    assert max(got.chunks[0]) == 2
    np.testing.assert_allclose(got.compute(), t.apply(stack), atol=1e-5, rtol=0)
    with dask.config.set(scheduler="threads", num_workers=2):  # two at once: one each
        assert max(t.apply(lazy, memory_budget=300 * 2**10).chunks[0]) == 1


def test_work_that_cannot_fit_the_budget_is_refused_before_reading(rng):
    t = _transforms(rng, (64, 64))[0]
    reads = []

    def block(block_info=None):
        reads.append(1)
        return np.zeros((16, 64, 64))

    meta = np.empty((0, 0, 0))
    lazy = da.map_blocks(block, chunks=((16, 16), (64,), (64,)), dtype=np.float64, meta=meta)
    with pytest.raises(MemoryError, match=r"one chunk of array \(shape \(16, 64, 64\)\)"):
        t.apply(lazy, memory_budget="256KiB")  # the 512 KiB chunk is read whole
    with pytest.raises(MemoryError, match=r"one plane\) needs .* choose smaller chunks"):
        t.apply(lazy.rechunk((1, 64, 64)), memory_budget="64KiB")  # one frame: 115 KiB
    assert reads == []
