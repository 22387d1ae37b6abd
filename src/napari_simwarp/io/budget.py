"""The memory budget: how many bytes one run may hold at once, and refusing work up front.

Every batch of frames, tile of a map and group of output chunks is sized from a budget:
by default a fraction (:data:`DEFAULT_FRACTION`) of the memory free now (RAM, or the free
memory of the GPU a run uses); set it with an argument (``memory_budget=``) or the
environment variable :data:`ENVIRONMENT` (``SIMWARP_MEMORY_BUDGET=2GiB``). Work whose
smallest unit cannot fit is refused before anything is read, with the figures.
"""

from __future__ import annotations

import math
import os
import re
from typing import NamedTuple

#: the environment variable that sets the budget (a size such as "2GiB" or "500MB")
ENVIRONMENT = "SIMWARP_MEMORY_BUDGET"
#: the share of the free memory a run may use when no budget is given
DEFAULT_FRACTION = 0.5
#: the budget where the free memory is unknown (Apple MPS, platforms without /proc)
FALLBACK_BYTES = 4 * 2**30

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
    "t": 2**40,
    "tb": 10**12,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class Budget(NamedTuple):
    """A memory budget: ``bytes`` and where the figure came from (for messages)."""

    bytes: int
    source: str

    def describe(self) -> str:
        return f"{format_bytes(self.bytes)} ({self.source})"


def format_bytes(n: float) -> str:
    """``n`` bytes for a person: "1.50 GiB", "12.0 MiB", "512 B"."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if unit in ("TiB", "GiB") else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def parse_bytes(value, name: str = "memory_budget") -> int:
    """A size as bytes: an int (bytes) or a string with a unit ("2GiB", "500 MB", "1.5g").

    Binary units (KiB, MiB, GiB, TiB, and the bare K, M, G, T) are powers of 1024; decimal
    ones (kB, MB, GB, TB) powers of 1000. Raises a ValueError naming ``name``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a size such as 2GiB or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(
                f"{name} must be a size such as '2GiB', '500MB' or a number of bytes, got {value!r}"
            )
        number, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(number * _UNITS[unit]):  # inf, nan, "1e400"
        raise ValueError(
            f"{name} must be a finite size such as '2GiB' or a number of bytes, got {value!r}"
        )
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{name} must be a positive size, got {value!r}")
    return size


def memory_budget(budget=None, device=None) -> Budget:
    """The budget of one run on ``device`` (a ``torch.device``; None or CPU: RAM).

    ``budget`` (bytes or a size string) wins; then :data:`ENVIRONMENT`; then
    :data:`DEFAULT_FRACTION` of the memory free now on ``device`` (on a GPU, its free
    memory). An explicit budget on a GPU is also capped by the GPU's free memory.
    """
    from .._devices import available_memory

    if device is None:
        import torch

        device = torch.device("cpu")
    free = available_memory(device)
    where = "RAM" if device.type == "cpu" else str(device)
    if budget is not None:
        chosen = Budget(parse_bytes(budget, "memory_budget"), "memory_budget")
    elif os.environ.get(ENVIRONMENT):
        chosen = Budget(parse_bytes(os.environ[ENVIRONMENT], ENVIRONMENT), ENVIRONMENT)
    elif free is not None:
        share = int(DEFAULT_FRACTION * free)
        return Budget(
            share, f"{DEFAULT_FRACTION:.0%} of the {format_bytes(free)} of {where} free now"
        )
    else:
        return Budget(FALLBACK_BYTES, f"the default for {where}, whose free memory is unknown")
    if device.type != "cpu" and free is not None and free < chosen.bytes:
        return Budget(free, f"{chosen.source}, capped by the {format_bytes(free)} free on {where}")
    return chosen


def refuse(need: int, budget: Budget, *, what: str, advice: str) -> None:
    """Raise a MemoryError with the figures when ``need`` bytes exceed ``budget``."""
    if need > budget.bytes:
        raise MemoryError(
            f"{what} needs about {format_bytes(need)}, but the memory budget is "
            f"{budget.describe()}; {advice} (or raise the budget: memory_budget= or "
            f"{ENVIRONMENT})"
        )
