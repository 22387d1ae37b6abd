"""Similarity maps for the "Similarity map" widget: request ids, stale results dropped.

The widget asks :meth:`SimilarityModel.new_request` for an id whenever a parameter or
a layer's data changes, computes off the GUI thread with :meth:`SimilarityModel.compute`
and shows the result only if :meth:`SimilarityModel.is_current` still says so: a slow
computation finishing after a newer request never overwrites the newer map. Input
tensors are cached by array identity, so a parameter change recomputes only the map.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from ._arrays import TensorCache

#: metric name → (needs a second layer, what the second layer is)
METRICS = {
    "local std": (False, None),
    "local NCC": (True, "moving"),
    "SSIM": (True, "moving"),
    "ZNCC (template)": (True, "template"),
}

#: result layer name (one layer, reused by every metric)
RESULT_LAYER = "similarity map"


def needs_second(metric: str) -> bool:
    return METRICS[metric][0]


@dataclass(frozen=True)
class SimilarityParams:
    """The knobs of one map.

    metric : one of :data:`METRICS`
    window : odd window size (local std, local NCC, SSIM), an even one is made odd (+1);
        larger than a spatial axis of the image is an error, never a silent clip
    sigma : Gaussian sigma (SSIM, and local NCC with ``kernel="gaussian"``)
    kernel : local NCC window, "box" or "gaussian"
    data_range : SSIM's data range; None: the two images' joint max − min
    """

    metric: str = "local std"
    window: int = 15
    sigma: float = 1.5
    kernel: str = "box"
    data_range: float | None = None


@dataclass
class SimilarityResult:
    request_id: int
    data: np.ndarray
    colormap: str
    contrast_limits: tuple[float, float]
    params: SimilarityParams
    seconds: float
    device: str
    name: str = RESULT_LAYER
    index: tuple[int, ...] = ()  # the plane of the layer (leading axes) the map is of


def display_for(metric: str, data: np.ndarray) -> tuple[str, tuple[float, float]]:
    """A colormap and contrast limits that suit each metric's range."""
    if metric == "local std":
        # The 99.9th percentile of a strided sample: as good for display, 10× cheaper.
        sample = data.ravel()[:: max(1, data.size // 262144)]
        hi = float(np.percentile(sample, 99.9)) if data.size else 1.0
        return "magma", (0.0, hi if hi > 0 else 1.0)
    if metric == "SSIM":
        lo = float(min(0.0, np.min(data))) if data.size else 0.0
        return "viridis", (lo, 1.0)
    return "bwr", (-1.0, 1.0)  # correlations live in [-1, 1]


def _odd_window(window: int, shape) -> int:
    """``window`` made odd, checked against the spatial ``shape`` (an error, not a clip:
    a map computed with another window than the one asked for would mislead)."""
    w = int(window)
    if w < 1:
        raise ValueError(f"window must be a positive odd size, got {window}")
    w = w if w % 2 else w + 1
    if w > min(shape):
        limit = min(shape) if min(shape) % 2 else min(shape) - 1
        raise ValueError(
            f"window {w} is larger than the image's smallest spatial axis (shape "
            f"{tuple(shape)}): choose a window of at most {limit}"
        )
    return w


def _check_budget(inputs, metric: str, device) -> None:
    """Refuse, before reading, a plane (or volume) whose map would not fit in memory."""
    from ..maps import MAPS_PER_PIXEL

    kind = {"local std": "local_std", "local NCC": "local_ncc", "SSIM": "ssim"}.get(metric, "zncc")
    for x in inputs:
        if hasattr(x, "source"):  # a Plane: only its plane is read
            x.source.refuse_beyond_budget(
                MAPS_PER_PIXEL[kind],
                device,
                what=f"the {metric} map",
                advice="pick a coarser level or a smaller layer",
            )


class SimilarityModel:
    """Computes similarity maps; one instance per widget."""

    def __init__(self, device: str = "auto"):
        self.device = device
        self._ids = itertools.count(1)
        self._latest = 0
        self._lock = threading.Lock()
        self._cache = TensorCache()

    # -- request ids -------------------------------------------------------------------
    def new_request(self) -> int:
        """A fresh id; every earlier id becomes stale."""
        with self._lock:
            self._latest = next(self._ids)
            return self._latest

    def is_current(self, request_id: int) -> bool:
        with self._lock:
            return request_id == self._latest

    @property
    def latest(self) -> int:
        return self._latest

    # -- computation -------------------------------------------------------------------
    def compute(self, request_id: int, image, second, params: SimilarityParams) -> SimilarityResult:
        """The map for ``params``; ``image`` and ``second`` are array-likes (2-D or 3-D)
        or :class:`~napari_simwarp.widgets_logic.planes.Plane` s (one plane of a layer,
        read here, only that plane).

        The map has ``image``'s shape (ZNCC is zero-padded so that position ``i`` is the
        template centered on ``i``, as ``skimage.feature.match_template(pad_input=True)``).
        """
        import torch

        from .. import ops
        from .._devices import resolve_device

        if params.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {params.metric!r}")
        start = time.perf_counter()
        dev = resolve_device(self.device)
        _check_budget(
            (image, second) if needs_second(params.metric) else (image,), params.metric, dev
        )
        a = self._cache.get(image, "image", dev)
        b = None
        if needs_second(params.metric):
            what = METRICS[params.metric][1]
            if second is None:
                raise ValueError(f"{params.metric} needs a second ({what}) layer")
            b = self._cache.get(second, what, dev)
            if b.dim() != a.dim():
                raise ValueError(
                    f"the {what} layer must have the image's dimensionality "
                    f"({a.dim() - 2}-D), got {b.dim() - 2}-D"
                )
            if what == "moving" and b.shape != a.shape:
                raise ValueError(
                    f"{params.metric} needs two layers of the same shape, got "
                    f"{tuple(a.shape[2:])} and {tuple(b.shape[2:])}"
                )
        window = _odd_window(params.window, a.shape[2:])
        with torch.no_grad():
            if params.metric == "local std":
                out = ops.local_std(a, window=window)
            elif params.metric == "local NCC":
                kw = {"sigma": params.sigma} if params.kernel == "gaussian" else {}
                out = ops.local_ncc(a, b, window=window, kernel=params.kernel, **kw)
            elif params.metric == "SSIM":
                rng = params.data_range
                if rng is None:
                    rng = float(torch.maximum(a.max(), b.max()) - torch.minimum(a.min(), b.min()))
                out = ops.ssim(
                    a,
                    b,
                    window=window,
                    sigma=params.sigma,
                    data_range=rng if rng > 0 else 1.0,
                    reduction="none",
                )
            else:
                if any(t > s for t, s in zip(b.shape[2:], a.shape[2:])):
                    raise ValueError(
                        f"the template {tuple(b.shape[2:])} must be no larger "
                        f"than the image {tuple(a.shape[2:])}"
                    )
                out = ops.match_template(a, b, pad_input=True)
        data = out[0, 0].float().cpu().numpy()
        colormap, limits = display_for(params.metric, data)
        return SimilarityResult(
            request_id,
            data,
            colormap,
            limits,
            replace(params, window=window),
            time.perf_counter() - start,
            str(dev),
            index=tuple(getattr(image, "index", ())),
        )

    def clear_cache(self) -> None:
        self._cache.clear()
