"""Template matching for the "Template matching" widget: ZNCC map and the best matches."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

#: result layer names
MAP_LAYER = "ZNCC map"
POINTS_LAYER = "matches"
BOXES_LAYER = "match boxes"


def rectangle_slices(vertices, image_shape) -> tuple[slice, ...]:
    """The bounding box of a shape's ``vertices`` ``(n, D)`` (image data coordinates).

    Only the last two axes of 2-D shapes drawn on a 2-D image are used; the box is
    rounded to whole pixels and clipped to the image.
    """
    v = np.asarray(vertices, np.float64)
    if v.ndim != 2 or v.shape[0] < 2:
        raise ValueError(f"a rectangle needs at least 2 vertices, got shape {v.shape}")
    if len(image_shape) != 2:
        raise ValueError(
            "a template from a rectangle is cut from a 2-D plane: choose '2D per plane' "
            "(the plane the viewer is on), or an image layer as the template of a 3-D volume"
        )
    v = v[:, -2:]
    lo = np.floor(v.min(axis=0) + 0.5).astype(int)
    hi = np.floor(v.max(axis=0) + 0.5).astype(int)
    lo = np.clip(lo, 0, np.asarray(image_shape))
    hi = np.clip(hi, 0, np.asarray(image_shape))
    if np.any(hi - lo < 2):
        raise ValueError(
            f"the rectangle must cover at least 2×2 pixels of the image, got "
            f"rows {lo[0]}:{hi[0]}, columns {lo[1]}:{hi[1]}"
        )
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))


def find_peaks(
    score_map: np.ndarray, k: int = 5, threshold: float = 0.5, min_distance: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best local maxima above ``threshold``, more than ``min_distance`` apart.

    ``skimage.feature.peak_local_max`` with the Chebyshev distance and the border
    included; non-finite values are never peaks. Returns ``coords`` ``(n, D)`` int and
    ``scores`` ``(n,)`` float32, best first, ``n ≤ k``.
    """
    from skimage.feature import peak_local_max

    m = np.asarray(score_map, np.float32)
    if k < 1:
        return np.zeros((0, m.ndim), int), np.zeros(0, np.float32)
    finite = np.where(np.isfinite(m), m, -np.inf)
    coords = peak_local_max(
        finite,
        min_distance=max(int(min_distance), 1),
        threshold_abs=threshold,
        exclude_border=False,
        num_peaks=k,
        p_norm=np.inf,
    )
    coords = coords.reshape(-1, m.ndim).astype(int)
    return coords, finite[tuple(coords.T)].astype(np.float32)


@dataclass
class MatchResult:
    """ZNCC map (image shape; value at ``i``: the template centered on ``i``), the matches'
    centers ``(n, D)``, their scores, and their boxes as rectangles ``(n, 4, 2)`` (2-D)."""

    zncc: np.ndarray
    centers: np.ndarray
    scores: np.ndarray
    corners: np.ndarray
    template_shape: tuple
    seconds: float

    def boxes(self) -> np.ndarray:
        """2-D only: each match as a rectangle's 4 vertices for a Shapes layer."""
        th, tw = self.template_shape[-2:]
        out = []
        for y, x in self.corners[:, -2:]:
            out.append([[y, x], [y, x + tw], [y + th, x + tw], [y + th, x]])
        return np.asarray(out, np.float32).reshape(-1, 4, 2) - 0.5


def match(
    image,
    template,
    *,
    k: int = 5,
    threshold: float = 0.5,
    min_distance: int | None = None,
    device: str = "auto",
) -> MatchResult:
    """ZNCC of ``template`` over ``image`` and its ``k`` best matches (centers).

    ``min_distance`` defaults to half the template's smallest side, so one object gives
    one match.
    """
    import torch

    from .. import ops
    from ._arrays import as_float_array
    from .device import resolve_device

    start = time.perf_counter()
    img = as_float_array(image, "image")
    tpl = as_float_array(template, "template")
    if tpl.ndim != img.ndim:
        raise ValueError(
            f"the template must have the image's dimensionality ({img.ndim}-D), got {tpl.ndim}-D"
        )
    if any(t > s for t, s in zip(tpl.shape, img.shape)):
        raise ValueError(f"the template {tpl.shape} must be no larger than the image {img.shape}")
    if float(tpl.max() - tpl.min()) <= 0:
        raise ValueError("the template is constant: there is nothing to match")
    dev = resolve_device(device)
    with torch.no_grad():
        zncc = ops.match_template(
            torch.from_numpy(np.ascontiguousarray(img))[None, None].to(dev),
            torch.from_numpy(np.ascontiguousarray(tpl))[None, None].to(dev),
            pad_input=True,
        )
    zmap = zncc[0, 0].float().cpu().numpy()
    md = max(1, min(tpl.shape) // 2) if min_distance is None else int(min_distance)
    centers, scores = find_peaks(zmap, k=k, threshold=threshold, min_distance=md)
    corners = centers - np.asarray([t // 2 for t in tpl.shape], int)
    return MatchResult(zmap, centers, scores, corners, tpl.shape, time.perf_counter() - start)


def template_box(vertices, plane) -> tuple[slice, ...]:
    """The box a rectangle cuts from ``plane`` (a
    :class:`~napari_simwarp.widgets_logic.planes.Plane`): ``vertices`` ``(n, D)`` in the
    image layer's full-resolution data coordinates, their last two axes divided by the
    plane's level factors (:func:`rectangle_slices` on the plane's shape)."""
    v = np.asarray(vertices, np.float64)
    if v.ndim == 2 and v.shape[1] >= 2:
        v = v[:, -2:] / np.asarray(plane.source.factors[-2:], np.float64)
    return rectangle_slices(v, plane.shape)


def read_template(image, template=None, box=None) -> tuple[np.ndarray, np.ndarray]:
    """``(image, template)`` as float32 NumPy: the image's plane (only it is read), and the
    ``box`` of that plane or the ``template`` plane (:class:`Plane` s, or arrays)."""
    from ._arrays import as_float_array

    img = image.read() if hasattr(image, "read") else as_float_array(image, "image")
    if box is not None:
        return img, np.array(img[box], dtype=np.float32)
    if template is None:
        raise ValueError("choose a template: a rectangle in a Shapes layer or an image layer")
    tpl = template.read() if hasattr(template, "read") else as_float_array(template, "template")
    return img, tpl


def match_planes(image, template=None, box=None, **options) -> MatchResult:
    """:func:`match` on what :func:`read_template` reads (in the caller's thread: a worker)."""
    return match(*read_template(image, template, box), **options)
