"""The widgets' result layer names (widgets_logic/result_names.py)."""

from __future__ import annotations

import pytest

from napari_simwarp.widgets_logic.result_names import is_result


@pytest.mark.parametrize(
    "name",
    ["similarity map", "similarity map (stack)", "ZNCC map", "moving registered", "a registered"],
)
def test_each_widgets_result_image_is_a_result(name):
    assert is_result(name)


@pytest.mark.parametrize("name", ["moving", "fixed", "time-lapse", "registered cells", "map"])
def test_a_users_layer_is_not_a_result(name):
    assert not is_result(name)
