"""The one-line "device · kernels" description the widgets show."""

from __future__ import annotations

from .._devices import resolve_device


def describe_backend(device: str = "auto", op: str = "local_std") -> str:
    """``"device: cpu · kernels: compiled"`` (or ``torch (reason)``) for ``op``.

    Cheap: it never triggers the kernel build (``backend_info(build=False)``); before the
    first operator call has loaded the kernels it says they are built on first use.
    """
    from ..backend import backend_info

    dev = resolve_device(device)
    info = backend_info(build=False)
    per_device = info["ops"].get(op, {})
    backend, why = per_device.get("cuda" if dev.type == "cuda" else "cpu", ("torch", "?"))
    if backend == "pending":
        kernels = "not loaded yet (built on first use)"
    else:
        kernels = backend if backend == "compiled" else f"pure torch ({_short(why)})"
    return f"device: {dev} · kernels: {kernels}"


def _short(text: str, limit: int = 60) -> str:
    text = str(text).splitlines()[0] if text else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"
