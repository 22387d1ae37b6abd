"""Layer data → float32 torch tensors ``(1, 1, *S)``, with a small identity cache."""

from __future__ import annotations

import threading

import numpy as np


def as_float_array(data, name: str) -> np.ndarray:
    """Any array-like (NumPy, dask, zarr) → finite float32 NumPy, never a view to edit."""
    arr = np.asarray(data)
    if arr.dtype == bool:
        arr = arr.astype(np.float32)
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be a numeric image, got dtype {arr.dtype}")
    if arr.ndim not in (2, 3):
        raise ValueError(f"{name} must be 2-D or 3-D, got {arr.ndim}-D shape {arr.shape}")
    if min(arr.shape) < 2:
        raise ValueError(f"{name} is too small: shape {arr.shape}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


#: the weights of R, G and B in the luminance an RGB layer is used as (scikit-image's
#: ``rgb2gray``, ITU-R BT.709)
LUMA = (0.2125, 0.7154, 0.0721)


def rgb_to_gray(data) -> np.ndarray:
    """``(..., 3 or 4)`` RGB(A) → luminance ``(...)`` float32 (:data:`LUMA`; alpha unused)."""
    arr = np.asarray(data, dtype=np.float32)
    return arr[..., :3] @ np.array(LUMA, np.float32)


def luminance_note(layers) -> str:
    """What the widgets say when they use an RGB layer: ``layers`` is ``((role, layer),
    ...)`` (role: "fixed", "moving", ...); "" when none is RGB. RGB layers are converted
    to luminance, explicitly: the message names each and the weights (issue 27: an RGB
    fixed image was used as luminance without a word)."""
    names = [
        f"the {role} layer {layer.name!r}"
        for role, layer in layers
        if layer is not None and getattr(layer, "rgb", False)
    ]
    if not names:
        return ""
    r, g, b = LUMA
    return (
        f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} RGB: registered on "
        f"luminance ({r} R + {g} G + {b} B)"
    )


class TensorCache:
    """Keeps the tensor made from each input array, keyed by the array's identity.

    napari layers get new data by assignment (``layer.data = new``), so the identity of
    the array is a sound key: a parameter change reuses the tensors, a data change makes
    new ones. A :class:`~napari_simwarp.widgets_logic.planes.Plane` is keyed by its
    layer's array and its index. Holds at most ``size`` entries (strong references, so
    ids stay valid).
    """

    def __init__(self, size: int = 4):
        self._size = size
        self._entries: list[tuple[object, object, object]] = []  # (array, device, tensor)
        self._lock = threading.Lock()

    def get(self, data, name: str, device):
        import torch

        with self._lock:
            for arr, dev, tensor in self._entries:
                if _same(arr, data) and dev == device:
                    return tensor
        # A Plane (widgets_logic.planes) reads only its plane of the layer, here, off the
        # GUI thread; anything else is an array-like read whole.
        array = data.read() if hasattr(data, "source") else as_float_array(data, name)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        tensor = tensor.to(device)[None, None]
        with self._lock:
            self._entries.append((data, device, tensor))
            del self._entries[: max(len(self._entries) - self._size, 0)]
        return tensor

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _same(a, b) -> bool:
    """Whether cache key ``a`` stands for ``b``: the same array, or the same plane of it."""
    if hasattr(a, "source") and hasattr(b, "source"):
        return (
            a.source.data is b.source.data and a.source.rgb == b.source.rgb and (a.index == b.index)
        )
    return a is b
