"""io/budget.py: sizes with units, where the budget comes from, refusals with figures."""

import pytest
import torch

from napari_simwarp.io import budget


@pytest.mark.parametrize(
    "text,expected",
    [("2GiB", 2 * 2**30), ("500MB", 500 * 10**6), ("1.5g", int(1.5 * 2**30)), (4096, 4096)],
)
def test_parse_bytes(text, expected):
    assert budget.parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1GiB", "2 parsecs", True, 0])
def test_parse_bytes_refuses_with_the_name(bad):
    with pytest.raises(ValueError, match="memory_budget"):
        budget.parse_bytes(bad)


def test_argument_then_environment_then_free_memory(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(budget.ENVIRONMENT, "3MiB")
    assert budget.memory_budget("1MiB", cpu) == (2**20, "memory_budget")
    assert budget.memory_budget(None, cpu) == (3 * 2**20, budget.ENVIRONMENT)
    monkeypatch.delenv(budget.ENVIRONMENT)
    monkeypatch.setattr("napari_simwarp._devices.available_memory", lambda device: 10 * 2**20)
    got = budget.memory_budget(None, cpu)
    assert got.bytes == 5 * 2**20 and "free" in got.source


def test_refuse_gives_the_figures():
    with pytest.raises(MemoryError, match=r"needs about 2.00 GiB.*budget is 1.00 GiB"):
        budget.refuse(2 * 2**30, budget.Budget(2**30, "test"), what="x", advice="less")
    budget.refuse(10, budget.Budget(2**30, "test"), what="x", advice="less")


@pytest.mark.parametrize("bad", [float("inf"), "1e400", float("nan"), "inf", "1e400GiB"])
def test_non_finite_sizes_are_refused_by_name(bad):
    """``int(inf)`` raised a bare OverflowError, ``int(nan)`` a ValueError about NaN."""
    with pytest.raises(ValueError, match="memory_budget must be a (finite )?size"):
        budget.parse_bytes(bad)
