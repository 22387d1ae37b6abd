"""napari_simwarp._threads: a viewer's widgets leave one core to the GUI thread."""

from __future__ import annotations

import pytest
import torch

from napari_simwarp import _threads


@pytest.fixture
def fresh(monkeypatch):
    """A process where no widget has run the policy yet, with no thread variable set and
    torch's threads restored afterwards."""
    before = torch.get_num_threads()
    monkeypatch.setitem(_threads._state, "done", False)
    for name in _threads.USER_CHOICE:
        monkeypatch.delenv(name, raising=False)
    yield
    torch.set_num_threads(before)


def test_one_thread_fewer_once_per_process(fresh):
    torch.set_num_threads(4)
    assert _threads.leave_a_core_for_the_viewer() == 3
    assert torch.get_num_threads() == 3
    # a second widget, or the same docked again: no further thread taken away
    assert _threads.leave_a_core_for_the_viewer() is None
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("name", _threads.USER_CHOICE)
def test_a_count_the_user_chose_is_kept(fresh, monkeypatch, name):
    torch.set_num_threads(4)
    monkeypatch.setenv(name, "4")
    assert _threads.leave_a_core_for_the_viewer() is None
    assert torch.get_num_threads() == 4


def test_never_below_one_thread(fresh):
    torch.set_num_threads(1)
    assert _threads.leave_a_core_for_the_viewer() is None
    assert torch.get_num_threads() == 1
