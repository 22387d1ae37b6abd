"""SciPy-convention padding against numpy.pad (NumPy's "symmetric" is SciPy's "reflect",
"reflect" SciPy's "mirror", "edge" SciPy's "nearest")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._padding import pad_spatial


@pytest.mark.parametrize(
    "mode,np_mode",
    [
        ("reflect", "symmetric"),
        ("mirror", "reflect"),
        ("nearest", "edge"),
        ("constant", "constant"),
    ],
)
@pytest.mark.parametrize(
    "pads",
    [
        [(3, 0)],
        [(12, 17)],
        [(2, 3), (0, 1)],
        [(7, 9), (11, 4)],
        [(1, 1), (2, 0), (3, 5)],
        [(11, 0), (6, 13), (0, 9)],
    ],
)
def test_matches_numpy_pad(mode, np_mode, pads, rng):
    # Pads longer than the axis, (12, 17) and (7, 9) on 5, (6, 13) on 6, (11, 0) and (0, 9)
    # on 5 and 4, exercise repeated reflection; the 3-D ones fill corners of corners.
    shape = (5, 6, 4)[: len(pads)]
    x = rng.standard_normal(shape)
    out = pad_spatial(torch.from_numpy(x)[None, None], pads, mode)[0, 0].numpy()
    np.testing.assert_array_equal(out, np.pad(x, pads, mode=np_mode))


def test_constant_value(rng):
    x = rng.standard_normal((3, 4))
    out = pad_spatial(torch.from_numpy(x)[None], [(1, 2), (2, 1)], "constant", value=-7.0)[0]
    np.testing.assert_array_equal(out.numpy(), np.pad(x, [(1, 2), (2, 1)], constant_values=-7))


@pytest.mark.parametrize("mode", ["reflect", "mirror", "nearest"])
@pytest.mark.parametrize(
    "shape,pads", [((4, 5), [(3, 2), (1, 6)]), ((3, 1, 4), [(2, 4), (1, 2), (0, 5)])]
)
def test_gradient_folds_back(mode, shape, pads, rng):
    # The adjoint of a gather adds each padded cell's gradient onto its source pixel; the
    # borders are gathered from the output itself, so corners are pads of pads.
    x = torch.from_numpy(rng.standard_normal((2, 1, *shape))).requires_grad_()
    before = x.detach().clone()
    assert torch.autograd.gradcheck(lambda t: pad_spatial(t, pads, mode), (x,))
    assert torch.equal(x.detach(), before)


@pytest.mark.parametrize(
    "mode,np_mode", [("reflect", "symmetric"), ("mirror", "reflect"), ("nearest", "edge")]
)
def test_an_axis_of_one_pixel_and_a_strided_input(mode, np_mode, rng):
    x = rng.standard_normal((6, 1, 7))
    view = torch.from_numpy(x).permute(2, 0, 1)  # not contiguous
    out = pad_spatial(view[None], [(3, 2), (2, 3)], mode)[0].numpy()
    expected = np.pad(x.transpose(2, 0, 1), [(0, 0), (3, 2), (2, 3)], mode=np_mode)
    np.testing.assert_array_equal(out, expected)


def test_unknown_mode():
    with pytest.raises(ValueError, match="padding must be one of"):
        pad_spatial(torch.zeros(1, 1, 3, 3), [(1, 1), (1, 1)], "wrap")
