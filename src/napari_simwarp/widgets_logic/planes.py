"""Which part of a layer a map is computed on: the spatial axes and the plane shown.

A layer of napari is ``(*L, *S)`` (plus a trailing channel axis when it is RGB): ``S`` the
2 or 3 spatial axes the map runs over, ``L`` the axes the viewer slices (time, channel,
or the planes of a volume shown plane by plane). A (T, Y, X) time-lapse is a stack of 2-D
frames, never a volume, unless the user says "3D volume". The map is computed for the
plane (or volume) the viewer is on only, read with :func:`napari_simwarp.io.lazy.read`:
a lazy (dask, zarr) layer is read one plane at a time, a multiscale layer at the level the
user chose (:func:`napari_simwarp.io.lazy.pick_level`), never whole.

No Qt, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..io import lazy

#: the widget's choices of spatial axes: the layer's last 2 or last 3 axes
MODES = {"2D per plane": 2, "3D volume": 3}


def default_mode(layer_ndim: int, ndisplay: int) -> str:
    """The mode the widget proposes: 3D only for a layer of 3 or more axes shown in 3D."""
    return "3D volume" if layer_ndim >= 3 and ndisplay == 3 else "2D per plane"


@dataclass(frozen=True)
class PlaneSource:
    """A layer's data as the map reads it.

    data : the array (a NumPy, dask or zarr array; of a multiscale layer, the chosen
        level), ``(*L, *S)`` or ``(*L, *S, 3|4)`` when ``rgb``
    rgb : whether the last axis is RGB(A) (read as luminance)
    d : number of spatial axes (2 or 3), the trailing ones
    factors : per axis (not the channel), full-resolution size / this level's size
        (all 1 without multiscale): a full-resolution coordinate divided by it is one here
    """

    data: object
    rgb: bool
    d: int
    factors: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape without the RGB axis."""
        shape = lazy.shape_of(self.data)
        return shape[:-1] if self.rgb else shape

    @property
    def lead_shape(self) -> tuple[int, ...]:
        return self.shape[: len(self.shape) - self.d]

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return self.shape[len(self.shape) - self.d :]

    def index_at(self, data_position) -> tuple[int, ...]:
        """The index over the leading axes of the plane at ``data_position`` (full
        resolution data coordinates of every axis, e.g. ``layer.world_to_data(point)``),
        rounded and clipped into range as napari slices it."""
        lead = self.lead_shape
        pos = list(data_position)[-len(self.shape) :] if len(self.shape) else []
        index = []
        for axis, n in enumerate(lead):
            p = pos[axis] / self.factors[axis] if axis < len(pos) else 0.0
            index.append(int(min(max(np.round(p), 0), n - 1)))
        return tuple(index)

    def nbytes(self) -> int:
        """float32 bytes of one plane (or volume)."""
        return 4 * math.prod(self.spatial_shape)

    @property
    def lazy(self) -> bool:
        """Whether reading costs I/O (a dask or zarr array, or a multiscale level)."""
        return not isinstance(self.data, np.ndarray)

    def refuse_beyond_budget(self, per_pixel: float, device, *, what: str, advice: str) -> None:
        """Raise a MemoryError with the figures, before anything is read, when work on one
        plane needing ``per_pixel`` float32 maps exceeds the memory budget of ``device``
        (:func:`napari_simwarp.io.budget.memory_budget`)."""
        from ..io import budget

        budget.refuse(
            int(self.nbytes() * per_pixel),
            budget.memory_budget(None, device),
            what=f"{what} of one {self.d}-D plane {self.spatial_shape}",
            advice=advice,
        )

    def read(self, index) -> np.ndarray:
        """The plane at ``index`` (leading axes) as float32 NumPy ``S`` (RGB: luminance);
        only that plane of a lazy array is read."""
        from ._arrays import as_float_array, rgb_to_gray

        index = tuple(int(i) for i in index)
        if len(index) != len(self.lead_shape):
            raise ValueError(
                f"index must hold {len(self.lead_shape)} ints (one per leading axis), got {index!r}"
            )
        arr = lazy.read(self.data, index) if index else lazy.read(self.data)
        if self.rgb:
            arr = rgb_to_gray(arr)
        return as_float_array(arr, "the layer's plane")


def source(data, *, rgb: bool, mode: str, level=None, name: str = "image") -> PlaneSource:
    """The :class:`PlaneSource` of a layer's ``data`` in ``mode`` (one of :data:`MODES`).

    A multiscale ``data`` needs ``level`` (0: full resolution); errors name ``name`` and
    what was expected: too few axes for the mode, a non-multiscale layer with a level.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    d = MODES[mode]
    full = data
    if lazy.is_multiscale(data):
        full = lazy.levels_of(data)[0]
        data = lazy.pick_level(data, level, name)
    elif level not in (None, 0):
        raise ValueError(f"{name} is not multiscale, so level must be 0, got {level!r}")
    lazy.check_array(data, name)
    shape = lazy.shape_of(data)
    ndim = len(shape) - (1 if rgb else 0)
    if ndim < d:
        raise ValueError(
            f"{name} has {ndim} axes{' (RGB)' if rgb else ''}, shape {shape}: mode {mode!r} "
            f"needs at least {d}; choose '2D per plane'"
        )
    factors = tuple(f / s if s else 1.0 for f, s in zip(lazy.shape_of(full)[:ndim], shape[:ndim]))
    return PlaneSource(data, bool(rgb), d, factors)


@dataclass(frozen=True)
class Plane:
    """One plane (or volume) of a :class:`PlaneSource`: what a map is computed on."""

    source: PlaneSource
    index: tuple[int, ...]

    def read(self) -> np.ndarray:
        return self.source.read(self.index)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.spatial_shape


def plane_at(data, data_position, *, rgb: bool, mode: str, level=None, name: str = "image"):
    """The :class:`Plane` of a layer's ``data`` at ``data_position`` (the layer's data
    coordinates of the viewer's point, ``layer.world_to_data(viewer.dims.point)``): the
    plane (``mode`` "2D per plane") or volume ("3D volume") the viewer is on. Nothing is
    read."""
    src = source(data, rgb=rgb, mode=mode, level=level, name=name)
    return Plane(src, src.index_at(data_position))


def mode_for(ndim: int) -> str:
    """The :data:`MODES` name of ``ndim`` (2 or 3) spatial axes."""
    return next(name for name, d in MODES.items() if d == ndim)
