"""Whole-stack similarity maps for the "Similarity map" widget: an explicit action.

The live map is of the plane the viewer is on (:mod:`.planes`); this is the map of every
plane of a layer, built as a lazy dask array by :mod:`napari_simwarp.maps` (tile by tile,
nothing computed until a plane is shown or written), or written to an OME-Zarr store
(:mod:`napari_simwarp.io.omezarr`) block by block. Either way nothing larger than a tile
is held. Every plane equals the per-plane map the widget shows for it, except SSIM, whose
data range is the two layers' joint range over the whole stack (one read pass), not each
plane's.

No Qt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..io import lazy
from .planes import PlaneSource
from .similarity import METRICS, SimilarityParams, _odd_window, display_for, needs_second

#: the name of the layer a whole-stack map goes to (apart from the live map's layer)
STACK_LAYER = "similarity map (stack)"
#: widget metric → :mod:`napari_simwarp.maps` function name
MAP_KINDS = {
    "local std": "local_std",
    "local NCC": "local_ncc",
    "SSIM": "ssim",
    "ZNCC (template)": "zncc",
}
#: OME-Zarr letters of the leading (non-spatial) axes, by how many there are
LEAD_AXES = {0: "", 1: "t", 2: "tc"}


@dataclass
class StackMap:
    """A whole-stack map.

    data : lazy dask array ``(*L, *S)`` (float32), the layer's shape without RGB
    axes : one letter per axis (``"tyx"``, ``"tczyx"``...), leading axes first
    params : the parameters it was made with (window made odd)
    colormap, contrast_limits : for display, from the map of the plane ``index``
    index : the plane whose map set the contrast limits
    """

    data: object
    axes: str
    params: SimilarityParams
    colormap: str
    contrast_limits: tuple[float, float]
    index: tuple[int, ...]


def axes_of(src: PlaneSource) -> str:
    """Axis letters of ``src``'s map: the spatial ones ("yx" or "zyx") and, before them,
    "t" and "c" for up to two leading axes (planes that are separate images: not halved in
    a pyramid). More leading axes are refused (OME-Zarr 0.4 holds five axes)."""
    lead = len(src.lead_shape)
    if lead not in LEAD_AXES:
        raise ValueError(
            f"a whole-stack map covers at most 2 axes besides the {src.d} spatial ones, the "
            f"layer has {lead} (shape {src.shape}): slice it first"
        )
    return LEAD_AXES[lead] + "zyx"[3 - src.d :]


def _lazy_planes(src: PlaneSource):
    """``src``'s data as a float32 dask array ``(*L, *S)``, one plane per chunk (RGB read
    as luminance, plane by plane)."""
    from ._arrays import rgb_to_gray

    x = lazy.as_dask(src.data)
    lead = len(src.lead_shape)
    if src.rgb:
        x = x.rechunk((1,) * lead + (-1,) * (x.ndim - lead))
        return x.map_blocks(rgb_to_gray, drop_axis=x.ndim - 1, dtype=np.float32)
    if not lazy.is_lazy(src.data):
        x = x.rechunk((1,) * lead + (-1,) * src.d)
    return x.astype(np.float32)


def stack_map(
    image: PlaneSource,
    second: PlaneSource | None,
    params: SimilarityParams,
    *,
    index=None,
    device="cpu",
    template_index=None,
) -> StackMap:
    """The map of every plane of ``image`` (and ``second``) for ``params``, lazily.

    ``second``: the moving layer (same shape) for local NCC and SSIM, the template layer
    for ZNCC (its plane ``template_index`` is the template). ``index``: the plane whose
    map sets the contrast limits (computed here: one plane). Errors name what is wrong
    before anything but that plane is computed.
    """
    if params.metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {params.metric!r}")
    from .. import maps

    axes = axes_of(image)
    a = _lazy_planes(image)
    kind = MAP_KINDS[params.metric]
    window = _odd_window(params.window, image.spatial_shape)
    if needs_second(params.metric) and second is None:
        what = METRICS[params.metric][1]
        raise ValueError(f"{params.metric} needs a second ({what}) layer")
    if kind == "zncc":
        template = second.read(tuple(template_index or (0,) * len(second.lead_shape)))
        if template.ndim != image.d or any(
            t > s for t, s in zip(template.shape, image.spatial_shape)
        ):
            raise ValueError(
                f"the template {template.shape} must be a {image.d}-D plane no larger than "
                f"the image's planes {image.spatial_shape}"
            )
        data = maps.zncc(a, template, axes=axes, device=device)
    elif kind == "local_std":
        data = maps.local_std(a, window=window, axes=axes, device=device)
    else:
        if second.shape != image.shape:
            raise ValueError(
                f"{params.metric} of a whole stack needs two layers of the same shape, got "
                f"{image.shape} and {second.shape}"
            )
        b = _lazy_planes(second)
        if kind == "local_ncc":
            sigma = params.sigma if params.kernel == "gaussian" else None
            data = maps.local_ncc(
                a, b, window=window, kernel=params.kernel, sigma=sigma, axes=axes, device=device
            )
        else:
            data_range = params.data_range
            if data_range is None:  # the joint range, as the live map takes its plane's
                import dask

                lo_a, lo_b, hi_a, hi_b = dask.compute(a.min(), b.min(), a.max(), b.max())
                data_range = float(max(hi_a, hi_b) - min(lo_a, lo_b))
            data = maps.ssim(
                a,
                b,
                window=window,
                sigma=params.sigma,
                data_range=data_range if data_range > 0 else 1.0,
                axes=axes,
                device=device,
            )
    index = tuple(int(i) for i in (index or (0,) * len(image.lead_shape)))
    colormap, limits = display_for(params.metric, np.asarray(data[index]))
    return StackMap(
        data,
        axes,
        replace(params, window=window),
        colormap,
        limits,
        index,
    )


def write_stack_map(
    result: StackMap, path, *, pixel_size=None, origin=None, progress=None, overwrite=False
):
    """Write ``result`` to the OME-Zarr store ``path`` (a pyramid over the spatial axes, one
    plane per chunk; resumable), with the spatial ``pixel_size`` and ``origin`` of the
    layer it was computed from, and return the store's path."""
    from ..io.omezarr import write_ome_zarr

    return write_ome_zarr(
        path,
        result.data,
        axes=result.axes,
        pixel_size=pixel_size,
        origin=origin,
        name=result.params.metric,
        progress=progress,
        overwrite=overwrite,
        key_extra=repr(result.params),
    )
