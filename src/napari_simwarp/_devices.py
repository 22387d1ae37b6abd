"""Torch devices: "auto" resolution, what this machine has, and free memory.

Shared by the registration, the widgets and the demo, so that every entry point resolves
and reports devices the same way. torch is imported on first use.
"""

from __future__ import annotations


def resolve_device(device="auto"):
    """``"auto"`` → cuda, then mps, then cpu; anything else is checked and returned.

    Raises a ValueError naming the device when it is unknown or not available here.
    """
    import torch

    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}"
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    if dev.type == "mps" and not _mps_available():
        raise ValueError(f"device {device!r} was asked for but Apple MPS is not available")
    return dev


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def available_devices() -> list[str]:
    """``"auto"`` followed by the torch device types present on this machine."""
    import torch

    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if _mps_available():
        out.append("mps")
    return out


def available_memory(device) -> int | None:
    """Free bytes on ``device`` (a ``torch.device``), or None when unknown."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None
