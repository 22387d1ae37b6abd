"""FrameSource (registration/_frames.py): frames kept between passes over a lazy stack."""

import collections
import pickle

import numpy as np
import pytest
import torch

da = pytest.importorskip("dask.array")

from napari_simwarp.registration._frames import FrameSource  # noqa: E402


def _counted(stack):
    reads = collections.Counter()

    def block(x, block_info=None):
        reads[block_info[0]["array-location"][0][0]] += 1
        return x

    data = da.from_array(stack, chunks=(1, *stack.shape[1:])).map_blocks(block, dtype=stack.dtype)
    return data, reads


def _passes(src, batch, times=3):
    out = []
    for _ in range(times):
        out.append(torch.cat([src.raw(slice(s, s + batch)) for s in range(0, src.total, batch)]))
    return out


def test_kept_frames_are_read_once_and_equal_the_stack():
    stack = np.random.default_rng(0).integers(0, 60000, (10, 8, 9), dtype=np.uint16)
    data, reads = _counted(stack)
    src = FrameSource(data, torch.device("cpu"))
    src.keep(10 * 8 * 9 * 2)  # the whole stack, as read (uint16)
    src.raw(slice(4, 5))  # a frame read alone first (as the intensity sample reads)
    for got in _passes(src, 3):
        np.testing.assert_array_equal(got.numpy(), stack.astype(np.float32))
    assert reads == dict.fromkeys(range(10), 1)


def test_only_the_first_frames_that_fit_are_kept():
    stack = np.random.default_rng(1).integers(0, 60000, (10, 8, 9), dtype=np.uint16)
    data, reads = _counted(stack)
    src = FrameSource(data, torch.device("cpu"))
    src.keep(4 * 8 * 9 * 2 + 100)  # four frames
    for got in _passes(src, 3):
        np.testing.assert_array_equal(got.numpy(), stack.astype(np.float32))
    assert reads == {**dict.fromkeys(range(4), 1), **dict.fromkeys(range(4, 10), 3)}


def test_nothing_is_kept_by_default_or_in_a_copy_sent_elsewhere():
    stack = np.random.default_rng(2).integers(0, 60000, (6, 8, 9), dtype=np.uint16)
    data, reads = _counted(stack)
    src = FrameSource(data, torch.device("cpu"))
    _passes(src, 2, times=2)
    assert reads == dict.fromkeys(range(6), 2)
    kept = FrameSource(da.from_array(stack, chunks=(1, 8, 9)), torch.device("cpu"))
    kept.keep(2**20)
    kept.raw(slice(0, 6))
    assert len(kept._kept) == 6
    sent = pickle.loads(pickle.dumps(kept))  # as a dask.distributed worker receives it
    assert sent._kept == {} and sent._keep == 0
    np.testing.assert_array_equal(sent.raw(slice(0, 6)).numpy(), stack.astype(np.float32))


@pytest.mark.parametrize("reference,model", [("first", "translation"), ("mean", "rigid")])
def test_register_stack_reads_each_frame_of_a_lazy_stack_once(reference, model):
    """The registration, the mean reference and the scores read the frames the budget
    keeps once (the lazy aligned stack reads them again only when computed), with the same
    result as a stack read anew at every pass."""
    from napari_simwarp import register_stack
    from tests.registration.cases import shifted_stack

    stack = shifted_stack(np.random.default_rng(2), (48, 48), 6)[0].astype(np.float32)
    data, reads = _counted(stack)
    kept = register_stack(data, reference=reference, model=model, memory_budget="256MiB")
    assert reads and max(reads.values()) == 1, dict(reads)
    again = register_stack(stack, reference=reference, model=model)
    np.testing.assert_allclose(kept.shifts, again.shifts, atol=1e-6)
