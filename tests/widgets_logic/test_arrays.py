"""RGB layers as the widgets use them (widgets_logic/_arrays.py): luminance, said aloud."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from napari_simwarp.widgets_logic._arrays import luminance_note, rgb_to_gray


def test_rgb_to_gray_equals_scikit_image_rgb2gray():
    from skimage.color import rgb2gray

    rgb = np.random.default_rng(0).random((9, 7, 3))
    np.testing.assert_allclose(rgb_to_gray(rgb), rgb2gray(rgb), atol=1e-6)
    rgba = np.concatenate([rgb, np.zeros((9, 7, 1))], -1)  # alpha is not luminance
    np.testing.assert_allclose(rgb_to_gray(rgba), rgb2gray(rgb), atol=1e-6)


def test_luminance_note_names_each_rgb_layer_and_the_weights():
    rgb = SimpleNamespace(name="photo", rgb=True)
    gray = SimpleNamespace(name="scan", rgb=False)
    assert luminance_note([("fixed", gray), ("moving", gray)]) == ""
    assert luminance_note([("fixed", None), ("moving", gray)]) == ""
    note = luminance_note([("fixed", rgb), ("moving", gray)])
    assert note.startswith("the fixed layer 'photo' is RGB: registered on luminance")
    assert "0.2125 R + 0.7154 G + 0.0721 B" in note and "scan" not in note
    both = luminance_note([("fixed", rgb), ("moving", SimpleNamespace(name="b", rgb=True))])
    assert "the fixed layer 'photo' and the moving layer 'b' are RGB" in both
