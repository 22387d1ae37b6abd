"""The shared input checks name the argument and what was expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from napari_simwarp.ops._validation import check_image, check_window


@pytest.mark.parametrize(
    "value,error,match",
    [
        (np.zeros((1, 1, 4, 4)), TypeError, "img must be a torch.Tensor.*from_numpy"),
        (torch.zeros(1, 1, 4, 4, dtype=torch.int64), TypeError, "img must be a floating"),
        (torch.zeros(1, 1, 4, 4, dtype=torch.bool), TypeError, "img must be a floating"),
        (torch.zeros(1, 1, 4, 4, dtype=torch.complex64), TypeError, "img must be real"),
        (torch.zeros(4, 4), ValueError, r"img must be \(N, C, H, W\) or \(N, C, D, H, W\)"),
        (torch.zeros(1, 1, 0, 4), ValueError, "img must not be empty"),
    ],
)
def test_check_image_rejects(value, error, match):
    with pytest.raises(error, match=match):
        check_image(value, "img")


def test_check_image_returns_the_same_object():
    x = torch.zeros(1, 1, 4, 4)
    assert check_image(x, "img") is x


@pytest.mark.parametrize(
    "window,expected", [(3, (3, 3)), ((5, 3), (5, 3)), (np.int64(7), (7, 7)), ([1, 1], (1, 1))]
)
def test_check_window_accepts(window, expected):
    assert check_window(window, (8, 8)) == expected


@pytest.mark.parametrize(
    "window,error,match",
    [
        (4, ValueError, "win must be odd and positive"),
        (-3, ValueError, "win must be odd and positive"),
        (0, ValueError, "win must be odd and positive"),
        (9, ValueError, "win .* is larger than"),
        ((3, 3, 3), ValueError, "one size per spatial axis"),
        (True, TypeError, "win must be an int"),
        (3.0, TypeError, "win must be an int"),
        ((3, 2.5), TypeError, "win sizes must be ints"),
    ],
)
def test_check_window_rejects(window, error, match):
    with pytest.raises(error, match=match):
        check_window(window, (8, 8), "win")
