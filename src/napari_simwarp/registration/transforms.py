"""Registration results as transforms: linear (a homogeneous matrix) and dense fields.

Conventions (docs/maths.md §6), all in array-axis order and pixels of the fixed image:

- a linear transform's ``matrix`` (``(D+1, D+1)``, float64) maps fixed coordinates to
  moving coordinates, the matrix ``scipy.ndimage.affine_transform(moving, matrix)`` takes;
- every transform's ``to_displacement(shape)`` returns ``d`` (``(D, *shape)``) with
  ``fixed(x) ≈ moving(x + d(x))``, the convention of ``skimage.registration.optical_flow_tvl1``;
- ``apply(moving)`` resamples ``moving`` onto the fixed grid (order 1 linear, order 0
  nearest for label images);
- ``fixed_grid`` and ``moving_grid`` (:class:`~.grid.Grid`: pixel size and origin per
  axis) place both images in physical space; with them a linear transform also has a
  ``physical_matrix`` (fixed physical → moving physical coordinates). Both default to unit
  spacing and zero origin, where the physical and pixel forms coincide.

Transforms save to ``.npz`` files holding the arrays and a JSON header with a ``kind`` tag
and the two grids (lossless); :func:`load_transform` reads any of them back. They also save
to, and load from, the files other tools read (docs/maths.md §11): ITK (``.tfm``, ``.txt``,
``.h5``), elastix ``TransformParameters`` and OME-Zarr 0.6 scenes (``.zarr``).
"""

from __future__ import annotations

import json
import pathlib
import warnings

import numpy as np
import torch

from ..io.atomic import check_name_length, write_together
from ..io.lazy import is_lazy
from ..io.transform_files import elastix, format_of, itk, ngff
from ..io.transform_files import grids as grid_files
from ..io.transform_files._common import write_atomic
from ..ops import affine_to_displacement, integrate_velocity, warp, warp_affine
from ..ops._sampling import sample_displaced
from ..ops.integrate_velocity import MAX_STEPS
from .grid import Grid, unit_grid

FORMAT_VERSION = 1
LINEAR_KINDS = ("translation", "rigid", "similarity", "affine")


def _source(array, ndim: int) -> tuple[np.ndarray, tuple, tuple]:
    """``array`` as NumPy, with its leading shape ``C`` and spatial shape ``S`` (checked)."""
    src = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if np.iscomplexobj(src):
        raise TypeError(f"array must be real, got {src.dtype}")
    if src.dtype == object or not (np.issubdtype(src.dtype, np.number) or src.dtype == np.bool_):
        raise TypeError(f"array must hold numbers, got {src.dtype}")
    if src.size == 0:
        raise ValueError(f"array must not be empty, got shape {src.shape}")
    if src.ndim < ndim:
        raise ValueError(
            f"array must have at least {ndim} dimensions (the transform is "
            f"{ndim}-D), got shape {src.shape}"
        )
    return src, src.shape[: src.ndim - ndim], src.shape[src.ndim - ndim :]


#: output voxels whose source positions are computed at once by the exact nearest path
_NEAREST_CHUNK = 1 << 20


def _nearest_exact(src: np.ndarray, lead, spatial, out_shape, positions) -> np.ndarray:
    """Nearest-neighbour resampling that never passes values through floating point.

    ``positions(rows)`` gives the source positions ``(D, len(rows), *out_shape[1:])``
    (pixels, float64) of the output rows ``rows`` (a slice of the first output axis);
    each output voxel takes the value at the nearest source pixel (``rint``, ties to
    even, as ``grid_sample``'s nearest), or 0 where that pixel is outside the array. Labels
    of any integer type (int64 and uint64 above 2^53 included) come back exactly.
    """
    flat = src.reshape(-1, int(np.prod(spatial)))
    out = np.zeros((flat.shape[0], *out_shape), dtype=src.dtype)
    per_row = int(np.prod(out_shape[1:]))
    step = max(1, _NEAREST_CHUNK // max(per_row, 1))
    sizes = np.asarray(spatial).reshape(-1, *([1] * len(out_shape)))
    for r0 in range(0, out_shape[0], step):
        rows = slice(r0, min(out_shape[0], r0 + step))
        index = np.rint(positions(rows)).astype(np.int64)
        inside = ((index >= 0) & (index < sizes)).all(axis=0)
        linear = np.ravel_multi_index(tuple(np.clip(index, 0, sizes - 1)), spatial)
        values = flat[:, linear]
        values[:, ~inside] = 0
        out[:, rows] = values
    return out.reshape(*lead, *out_shape)


def _linear(src: np.ndarray, lead, spatial, warp_fn) -> np.ndarray:
    """Linear resampling through ``warp_fn((1, C, *S) tensor) -> (1, C, *S_out)``; float64
    is computed and returned in float64, other floats keep their dtype (computed in
    float32), integer and bool arrays come back float32."""
    work = np.float64 if src.dtype == np.float64 else np.float32
    t = torch.as_tensor(src.astype(work, copy=False))
    t = t.reshape(1, int(np.prod(lead)) if lead else 1, *spatial)
    out = warp_fn(t)
    out = out.reshape(*lead, *out.shape[2:]).numpy()
    return out.astype(src.dtype, copy=False) if np.issubdtype(src.dtype, np.floating) else out


class Transform:
    """Base class: a map from fixed-image coordinates to moving-image coordinates.

    ``fixed_grid`` and ``moving_grid`` say where the two images' pixels are in physical
    space (None: unit spacing, zero origin); they travel with the transform when saved.
    """

    kind = "transform"
    fixed_grid: Grid | None = None
    moving_grid: Grid | None = None

    def with_grids(self, fixed_grid: Grid | None, moving_grid: Grid | None) -> Transform:
        """This transform, placed in physical space by the two grids (returns ``self``)."""
        for grid, name in ((fixed_grid, "fixed_grid"), (moving_grid, "moving_grid")):
            if grid is not None and grid.ndim != self.ndim:
                raise ValueError(f"{name} has {grid.ndim} axes, the transform {self.ndim}")
        self.fixed_grid, self.moving_grid = fixed_grid, moving_grid
        return self

    def grids(self) -> tuple[Grid, Grid]:
        """``(fixed_grid, moving_grid)``, unit grids where none was given."""
        unit = unit_grid(self.ndim)
        return self.fixed_grid or unit, self.moving_grid or unit

    @property
    def ndim(self) -> int:
        raise NotImplementedError

    def to_displacement(self, shape) -> np.ndarray:
        """Displacement ``d``, shape ``(D, *shape)`` float32, with fixed(x) ≈ moving(x + d(x))."""
        raise NotImplementedError

    def apply(self, array, order: int = 1, output_shape=None, chunks=None, memory_budget=None):
        """Resample ``array`` (``(*C, *S)``, any leading axes) onto the fixed grid.

        Parameters
        ----------
        array : array-like or tensor, real numbers, shape ``(*C, *S)``
            Never modified.
        order : {0, 1}
            0: nearest neighbour, exact for labels of any integer type (values never
            pass through floating point; 0 outside); 1: linear (zeros outside), float
            arrays keep their dtype (float64 is computed in float64), others come back
            float32.
        output_shape : sequence of int, optional
            The spatial shape of the result (default ``S``).
        chunks : int or sequence of int, optional
            The output's spatial chunk shape. A dask or zarr ``array`` (or any array when
            ``chunks`` is given) gives a lazy ``dask.array.Array`` whose chunks each read
            only the input region they need (:mod:`.chunked`); default chunks: the
            input's.
        memory_budget : int or str, optional
            For lazy results: bytes one task (one output chunk, its input box) may hold
            ("512MiB"; default ``SIMWARP_MEMORY_BUDGET``, else half the free memory).
            Tasks take fewer leading planes than the input's chunks where those would
            not fit; work whose one plane or input chunk cannot fit is refused before
            anything is read. Not used for NumPy results.

        Returns
        -------
        NumPy array, or a dask array for lazy input or ``chunks``.
        """
        if order not in (0, 1):
            raise ValueError(f"order must be 0 (nearest, for labels) or 1 (linear), got {order!r}")
        if chunks is not None or is_lazy(array):
            from .chunked import apply_chunked

            return apply_chunked(
                self,
                array,
                order=order,
                output_shape=output_shape,
                chunks=chunks,
                memory_budget=memory_budget,
            )
        src, lead, spatial = _source(array, self.ndim)
        out_shape = self._output_shape(spatial, output_shape)
        if order == 0:
            return _nearest_exact(
                src, lead, spatial, out_shape, lambda rows: self._positions(rows, out_shape)
            )
        return _linear(src, lead, spatial, lambda t: self._warp_linear(t, out_shape))

    def _output_shape(self, spatial, output_shape) -> tuple:
        if output_shape is None:
            return tuple(spatial)
        shape = tuple(int(n) for n in output_shape)
        if len(shape) != self.ndim or any(n < 1 for n in shape):
            raise ValueError(
                f"output_shape must be {self.ndim} positive ints, got {output_shape!r}"
            )
        return shape

    def _positions(self, rows: slice, out_shape) -> np.ndarray:
        """Source positions ``(D, len(rows), *out_shape[1:])`` of output rows ``rows``."""
        raise NotImplementedError

    def _warp_linear(self, t: torch.Tensor, out_shape) -> torch.Tensor:
        """``t`` ``(1, C, *S)`` (float32 or float64) linearly resampled onto ``out_shape``."""
        raise NotImplementedError

    def _arrays(self) -> dict:
        raise NotImplementedError

    def _meta(self) -> dict:
        return {}

    def save(self, path, format: str | None = None, **options) -> pathlib.Path:
        """Write the transform to ``path``; return the path written.

        Parameters
        ----------
        path : str or path-like
        format : {"npz", "itk", "elastix", "ngff"}, optional
            Default: from the extension (docs/maths.md §11) — ``.npz`` (added when the
            extension is not known) the lossless default; ``.tfm``, ``.txt`` ITK text
            (linear), ``.h5`` ITK HDF5 (linear or displacement field); ``.txt`` named
            ``TransformParameters*`` elastix (linear); ``.zarr`` an OME-Zarr 0.6 scene.
        **options
            ``fixed_shape`` (elastix, linear transforms: the fixed image's spatial shape,
            the grid transformix resamples onto); ``fixed_image``, ``moving_image``,
            ``units`` (ngff: the images to write beside the transform, with the grids).

        Every file holds the transform in physical coordinates through the grids
        (``fixed_grid``, ``moving_grid``); ITK and elastix files in their own x, y, z
        order. ITK and elastix files cannot hold both grids: they are written beside, in
        ``NAME.grids.json`` (:mod:`napari_simwarp.io.transform_files.grids`), which
        :func:`load_transform` reads back. Written whole or not at all (the file and its
        grids together; a ``.zarr`` is built beside and renamed into place); an OSError
        names ``path``; an existing file is replaced, an existing ``.zarr`` directory only when it
        is a scene napari-simwarp wrote (a FileExistsError otherwise: it may hold someone's
        images).
        """
        fmt = format_of(path, format)
        allowed = {"npz": (), "itk": (), "elastix": ("fixed_shape",), "ngff": _NGFF_OPTIONS}
        unknown = sorted(set(options) - set(allowed[fmt]))
        if unknown:
            raise TypeError(
                f"save(format={fmt!r}) got unexpected option(s) {', '.join(unknown)}; "
                f"it takes: {', '.join(allowed[fmt]) or 'none'}"
            )
        if fmt == "npz":
            return self._save_npz(path)
        return _save_interop(self, pathlib.Path(path), fmt, options)

    def _save_npz(self, path) -> pathlib.Path:
        path = pathlib.Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        return write_atomic(path, self.npz_writer(), overwrite=True)

    def npz_writer(self):
        """A function that writes this transform's ``.npz`` file (see :meth:`save`) to the
        path it is given: for :func:`napari_simwarp.io.atomic.write_together`, which
        writes it together with other outputs (an image and its transform: both or
        neither)."""
        fixed_grid, moving_grid = self.grids()
        header = {
            "kind": self.kind,
            "format_version": FORMAT_VERSION,
            **self._meta(),
            "fixed_grid": fixed_grid.as_dict(),
            "moving_grid": moving_grid.as_dict(),
        }

        arrays = self._arrays()

        def write(partial):
            with open(partial, "wb") as f:
                np.savez(f, header=np.array(json.dumps(header)), **arrays)

        return write

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, ndim={self.ndim})"


class AffineTransform(Transform):
    """A linear transform ``y = A x + t`` held as one homogeneous matrix.

    Parameters
    ----------
    matrix : array, shape ``(D+1, D+1)``
        Homogeneous, array-axis order, fixed → moving pixel coordinates.
    kind : {"translation", "rigid", "similarity", "affine"}
        Which model produced it (metadata; the matrix is the transform).
    """

    def __init__(self, matrix, kind: str = "affine"):
        m = np.array(matrix, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] not in (3, 4):
            raise ValueError(f"matrix must be (3, 3) or (4, 4) homogeneous, got shape {m.shape}")
        if kind not in LINEAR_KINDS:
            raise ValueError(f"kind must be one of {LINEAR_KINDS}, got {kind!r}")
        self.matrix = m
        self.kind = kind

    @property
    def ndim(self) -> int:
        return self.matrix.shape[0] - 1

    @property
    def translation(self) -> np.ndarray:
        """The ``t`` of ``y = A x + t`` (pixels, array order); for pure translation the shift."""
        return self.matrix[:-1, -1].copy()

    @property
    def physical_matrix(self) -> np.ndarray:
        """The transform in physical coordinates: fixed physical → moving physical, array
        order, homogeneous ``(D + 1, D + 1)`` (``moving_grid · matrix · fixed_grid⁻¹``)."""
        fixed_grid, moving_grid = self.grids()
        return moving_grid.to_physical() @ self.matrix @ fixed_grid.to_pixels()

    def inverse(self) -> AffineTransform:
        """The moving → fixed transform (the grids swap places)."""
        return AffineTransform(np.linalg.inv(self.matrix), self.kind).with_grids(
            self.moving_grid, self.fixed_grid
        )

    def to_displacement(self, shape) -> np.ndarray:
        shape = tuple(int(n) for n in shape)
        if len(shape) != self.ndim:
            raise ValueError(f"shape must have {self.ndim} axes, got {shape}")
        d = affine_to_displacement(torch.as_tensor(self.matrix), shape)
        return d[0].to(torch.float32).numpy()

    def _positions(self, rows: slice, out_shape) -> np.ndarray:
        axes = [np.arange(rows.start, rows.stop), *[np.arange(n) for n in out_shape[1:]]]
        grid = np.stack(np.meshgrid(*axes, indexing="ij")).astype(np.float64)
        d = self.ndim
        linear, shift = self.matrix[:d, :d], self.matrix[:d, d]
        return np.tensordot(linear, grid, axes=1) + shift.reshape(-1, *([1] * d))

    def _warp_linear(self, t: torch.Tensor, out_shape) -> torch.Tensor:
        # The float64 matrix makes warp_affine build its sampling grid in float64 (a float32
        # grid is off by ~1e-5 px at 2048 px, enough to show in a chunked comparison).
        return warp_affine(
            t,
            torch.as_tensor(self.matrix),
            output_shape=out_shape,
            padding="grid-constant",
        )

    def _arrays(self) -> dict:
        return {"matrix": self.matrix}

    def __repr__(self) -> str:
        rows = np.array2string(self.matrix, precision=4, suppress_small=True)
        return f"AffineTransform(kind={self.kind!r}, matrix=\n{rows})"


def _resize_field(field: np.ndarray, shape) -> np.ndarray:
    """Resample a pixel displacement ``(D, *S)`` to ``(D, *shape)`` over the same field of
    view (pixel-center convention), rescaling each component to the new pixel size."""
    shape = tuple(int(n) for n in shape)
    src = field.shape[1:]
    if len(shape) != len(src):
        raise ValueError(f"shape must have {len(src)} axes, got {shape}")
    if shape == tuple(src):
        return field.astype(np.float32, copy=True)
    t = torch.as_tensor(field, dtype=torch.float32).unsqueeze(0)
    mode = "bilinear" if len(shape) == 2 else "trilinear"
    out = torch.nn.functional.interpolate(t, size=shape, mode=mode, align_corners=False)[0]
    scale = torch.tensor([n / m for n, m in zip(shape, src)], dtype=torch.float32)
    return (out * scale.view(-1, *([1] * len(shape)))).numpy()


class _FieldTransform(Transform):
    """A transform held as one dense field ``(D, *S)`` in pixels, stored under
    :attr:`field_name` (``displacement`` or ``velocity``)."""

    field_name = "field"
    #: the moving image's spatial shape when it differs from the field's (a pair on two
    #: grids): the field then holds positions in that image's pixels and is not resized
    moving_shape: tuple | None = None

    def __init__(self, field):
        f = np.array(field, dtype=np.float32)
        if f.ndim not in (3, 4) or f.shape[0] != f.ndim - 1:
            raise ValueError(
                f"{self.field_name} must be (2, H, W) or (3, D, H, W), got shape {f.shape}"
            )
        setattr(self, self.field_name, f)

    @property
    def field(self) -> np.ndarray:
        return getattr(self, self.field_name)

    @property
    def ndim(self) -> int:
        return self.field.shape[0]

    @property
    def shape(self) -> tuple:
        return tuple(self.field.shape[1:])

    def _arrays(self) -> dict:
        return {self.field_name: self.field}


class DisplacementTransform(_FieldTransform):
    """A dense displacement field ``d`` (``(D, *S)``, pixels) with fixed(x) ≈ moving(x + d(x)).

    On one grid (no ``moving_shape``, and the fixed and moving grids equal or unknown) the
    field is a map of the field of view: ``apply`` and ``to_displacement`` resize it to any
    array's shape. On two grids (a pair of another shape or pixel size, or a field read
    from a file whose grids differ), ``x + d(x)`` are positions in the moving image's own
    pixels: ``apply`` takes that image (of shape ``moving_shape`` where it is known) and
    returns the field's shape ``S``, and the field is never resized.
    """

    kind = "displacement"
    field_name = "displacement"

    def __init__(self, displacement, moving_shape=None):
        super().__init__(displacement)
        if moving_shape is not None:
            shape = tuple(int(n) for n in moving_shape)
            if len(shape) != self.ndim or any(n < 1 for n in shape):
                raise ValueError(
                    f"moving_shape must be {self.ndim} positive ints, got {moving_shape!r}"
                )
            self.moving_shape = shape

    @property
    def _on_two_grids(self) -> bool:
        """Whether ``x + d(x)`` are positions in a moving image on another grid."""
        if self.moving_shape is not None:
            return True
        fixed, moving = self.fixed_grid, self.moving_grid
        return fixed is not None and moving is not None and fixed != moving

    def to_displacement(self, shape=None) -> np.ndarray:
        shape = self.shape if shape is None else tuple(int(n) for n in shape)
        if self._on_two_grids and shape != self.shape:
            into = "" if self.moving_shape is None else f" of shape {self.moving_shape}"
            raise ValueError(
                f"this field maps the fixed grid {self.shape} into a moving image{into} on "
                f"another grid; it has no displacement on a grid of shape {shape}"
            )
        return _resize_field(self.displacement, shape)

    def _output_shape(self, spatial, output_shape) -> tuple:
        if self.moving_shape is not None and tuple(spatial) != self.moving_shape:
            raise ValueError(
                f"array must have the moving image's spatial shape {self.moving_shape} "
                f"(this field maps the fixed grid into it), got {tuple(spatial)}"
            )
        if self._on_two_grids:
            spatial = self.shape
        shape = super()._output_shape(spatial, output_shape)
        if shape != tuple(spatial):
            raise ValueError(
                f"output_shape {shape} must equal the spatial shape "
                f"{tuple(spatial)} for a dense field"
            )
        return shape

    def _positions(self, rows: slice, out_shape) -> np.ndarray:
        d = self.to_displacement(out_shape)[:, rows].astype(np.float64)
        axes = [np.arange(rows.start, rows.stop), *[np.arange(n) for n in out_shape[1:]]]
        return d + np.stack(np.meshgrid(*axes, indexing="ij"))

    def _warp_linear(self, t: torch.Tensor, out_shape) -> torch.Tensor:
        d = torch.as_tensor(self.to_displacement(out_shape)).unsqueeze(0).to(t.dtype)
        if self._on_two_grids:  # an image of another shape: sample it directly
            return sample_displaced(t, d, padding="grid-constant")
        return warp(t, d, padding="grid-constant")

    def _meta(self) -> dict:
        return {} if self.moving_shape is None else {"moving_shape": list(self.moving_shape)}


class VelocityTransform(_FieldTransform):
    """A stationary velocity field ``v`` (``(D, *S)``, pixels); the displacement is
    ``exp(v)`` by scaling and squaring (``steps`` squarings), a diffeomorphism."""

    kind = "velocity"
    field_name = "velocity"

    def __init__(self, velocity, steps: int = 7):
        super().__init__(velocity)
        whole = isinstance(steps, (int, np.integer)) and not isinstance(steps, bool)
        if not whole or not 0 <= steps <= MAX_STEPS:
            raise ValueError(f"steps must be an int in [0, {MAX_STEPS}], got {steps!r}")
        self.steps = int(steps)

    def to_displacement(self, shape=None) -> np.ndarray:
        shape = self.shape if shape is None else tuple(int(n) for n in shape)
        # Integrate at the target resolution so the result is a diffeomorphism there.
        v = torch.as_tensor(_resize_field(self.velocity, shape)).unsqueeze(0)
        return integrate_velocity(v, self.steps)[0].numpy()

    def apply(self, array, order: int = 1, output_shape=None, chunks=None, memory_budget=None):
        if chunks is not None or is_lazy(array):
            return super().apply(array, order, output_shape, chunks, memory_budget)
        _, _, spatial = _source(array, self.ndim)
        shape = spatial if output_shape is None else output_shape
        return DisplacementTransform(self.to_displacement(shape)).apply(array, order, output_shape)

    def _meta(self) -> dict:
        return {"steps": self.steps}


def load_transform(
    path, format: str | None = None, *, fixed_grid: Grid | None = None, moving_grid=None
) -> Transform:
    """Read a transform written by ``Transform.save``, ITK, elastix or an OME-Zarr scene.

    ``format`` as in :meth:`Transform.save` (default: from the extension; a ``.txt`` by its
    first line). Files that do not hold a grid (ITK linear files: neither; ITK fields and
    elastix files: the moving one) take it from the ``NAME.grids.json`` that ``save``
    wrote beside them, else from ``fixed_grid`` / ``moving_grid``, or else the unit grid
    (with a warning: the pixel form of a physical transform depends on the grids); a grid
    passed for a file that holds a different one is an error.

    Raises FileNotFoundError for a missing file and a ValueError that names the path for
    anything else that is not a complete transform of the format: an empty or truncated
    file, another kind of file, a missing array, an unknown kind, an ITK or elastix
    transform type napari-simwarp does not read.
    """
    fmt = format_of(path, format, reading=True)
    if fmt != "npz":
        return _load_interop(pathlib.Path(path), fmt, fixed_grid, moving_grid)
    transform = _load_npz(path)
    _check_given(path, (transform.fixed_grid, transform.moving_grid), (fixed_grid, moving_grid))
    return transform.with_grids(
        transform.fixed_grid or fixed_grid, transform.moving_grid or moving_grid
    )


def _load_npz(path) -> Transform:
    path = pathlib.Path(path)
    if not path.exists() and path.with_name(path.name + ".npz").exists():
        path = path.with_name(path.name + ".npz")
    if not path.exists():
        raise FileNotFoundError(f"transform file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory, expected a transform file (.npz)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        what = "empty" if not magic else "not a .npz (zip) archive"
        raise ValueError(f"{str(path)!r} is not a napari-simwarp transform file: it is {what}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except Exception as exc:  # empty, truncated, foreign (not a .npz), pickled objects...
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ValueError(
            f"{str(path)!r} is not a napari-simwarp transform file: it cannot "
            f"be read as .npz ({type(exc).__name__}: {reason})"
        ) from exc
    if not isinstance(arrays, dict) or "header" not in arrays:
        raise ValueError(f"{str(path)!r} is not a napari-simwarp transform file (no header)")
    try:
        header = json.loads(str(arrays["header"]))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} has a header that is not JSON: {exc}") from exc
    kind = header.get("kind") if isinstance(header, dict) else None
    needed = {
        **dict.fromkeys(LINEAR_KINDS, "matrix"),
        "displacement": "displacement",
        "velocity": "velocity",
    }
    if kind not in needed:
        raise ValueError(
            f"{str(path)!r} holds an unknown transform kind {kind!r}; expected "
            f"one of {', '.join(needed)}"
        )
    if needed[kind] not in arrays:
        raise ValueError(
            f"{str(path)!r} is incomplete: a {kind!r} transform needs a "
            f"{needed[kind]!r} array, the file has {sorted(arrays)}"
        )
    try:
        if kind in LINEAR_KINDS:
            transform = AffineTransform(arrays["matrix"], kind)
        elif kind == "displacement":
            transform = DisplacementTransform(
                arrays["displacement"], moving_shape=header.get("moving_shape")
            )
        else:
            transform = VelocityTransform(arrays["velocity"], header.get("steps", 7))
        grids = [
            Grid.make(transform.ndim, **header[key]) if key in header else None
            for key in ("fixed_grid", "moving_grid")
        ]
        return transform.with_grids(*grids)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{str(path)!r}: {exc}") from exc


# -- the formats other tools read (docs/maths.md §11) ----------------------------------

_NGFF_OPTIONS = ("fixed_image", "moving_image", "units")


def _pixels_and_grids(shape, fixed: Grid, moving: Grid):
    """Pixel positions ``(D, *shape)`` and the grids' spacing and origin shaped to
    broadcast against them: ``(x, fixed spacing, fixed origin, moving spacing, origin)``."""
    x = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")).astype(np.float64)
    per_axis = (-1, *([1] * len(shape)))
    return x, *(
        np.reshape(v, per_axis)
        for v in (fixed.spacing, fixed.origin, moving.spacing, moving.origin)
    )


def _physical_field(transform: _FieldTransform) -> np.ndarray:
    """The physical displacement ``u`` ``(D, *S)`` on the fixed grid: moving physical point
    minus fixed physical point, per fixed pixel (array order)."""
    d = transform.to_displacement(transform.shape).astype(np.float64)
    x, fs, fo, ms, mo = _pixels_and_grids(transform.shape, *transform.grids())
    return mo + ms * (x + d) - (fo + fs * x)


def _pixel_field(u: np.ndarray, fixed: Grid, moving: Grid) -> np.ndarray:
    """The pixel displacement ``d`` of a physical one ``u`` (the inverse of
    :func:`_physical_field`)."""
    x, fs, fo, ms, mo = _pixels_and_grids(u.shape[1:], fixed, moving)
    return (fo + fs * x + u - mo) / ms - x


def _grid_pair(grid: Grid) -> tuple[tuple, tuple]:
    return tuple(grid.spacing), tuple(grid.origin)


def _shape_option(shape, ndim: int) -> tuple[int, ...]:
    """``fixed_shape`` checked: ``ndim`` positive whole numbers (never rounded)."""
    message = (
        f"fixed_shape must be the fixed image's spatial shape ({ndim} positive ints: the "
        f"grid transformix resamples onto), got {shape!r}"
    )
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != ndim:
        raise ValueError(message)
    out = []
    for n in shape:
        whole = isinstance(n, (int, np.integer)) or (
            isinstance(n, (float, np.floating)) and float(n).is_integer()
        )
        if isinstance(n, bool) or not whole or n < 1:
            raise ValueError(message)
        out.append(int(n))
    return tuple(out)


def _save_interop(transform: Transform, path: pathlib.Path, fmt: str, options) -> pathlib.Path:
    linear = isinstance(transform, AffineTransform)
    fixed, moving = transform.grids()
    if fmt == "itk":
        if linear:
            write = itk.linear_writer(path, transform.physical_matrix)
        elif path.suffix.lower() not in itk.HDF5_SUFFIXES:
            raise ValueError(
                f"{str(path)!r}: a {transform.kind} field is written as ITK HDF5 (.h5); "
                "ITK text files (.tfm, .txt) hold linear transforms"
            )
        else:
            field = _physical_field(transform)
            write = itk.displacement_writer(field, *_grid_pair(fixed))
        return _write_with_grids(path, write, fixed, moving)
    if fmt == "elastix":
        if not linear:
            raise ValueError(
                f"{str(path)!r}: elastix parameter files are written for linear transforms; "
                "save a field as ITK HDF5 (.h5) or OME-Zarr (.zarr)"
            )
        shape = _shape_option(options.get("fixed_shape"), transform.ndim)
        write = elastix.elastix_writer(transform.physical_matrix, shape, *_grid_pair(fixed))
        return _write_with_grids(path, write, fixed, moving)
    images = {}
    for name in ("fixed_image", "moving_image"):
        if options.get(name) is not None:
            array = _source(options[name], transform.ndim)[0]
            if array.ndim != transform.ndim:
                raise ValueError(f"{name} must be a {transform.ndim}-D image, got {array.shape}")
            images[name] = array
    return ngff.write_ngff(
        path,
        fixed_grid=_grid_pair(fixed),
        moving_grid=_grid_pair(moving),
        kind=transform.kind,
        matrix=transform.physical_matrix if linear else None,
        field=None if linear else _physical_field(transform),
        units=options.get("units"),
        overwrite=ngff.written_here(path),  # never a directory that may hold user data
        **images,
    )


def _write_with_grids(path: pathlib.Path, write, fixed: Grid, moving: Grid) -> pathlib.Path:
    """Write an ITK or elastix file (which cannot hold both grids) and its grids sidecar
    ``NAME.grids.json`` together: both or neither."""
    check_name_length(grid_files.sidecar_path(path), "transform file (with .grids.json)")
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a directory, expected a file path")
    items = grid_files.writers(path, write, _grid_pair(fixed), _grid_pair(moving))
    return write_together(items)[0]


def _check_given(path, held, given) -> None:
    """A grid passed to load_transform must be the one the file holds, where it holds one."""
    for have, want, name in zip(held, given, ("fixed_grid", "moving_grid")):
        if want is not None and have is not None and want != have:
            raise ValueError(
                f"{str(path)!r} holds its {name} ({have}); the {name} passed differs ({want})"
            )


def _grid_from(pair, ndim: int) -> Grid | None:
    return None if pair is None else Grid.make(ndim, *pair)


def _load_interop(path: pathlib.Path, fmt: str, fixed_grid, moving_grid) -> Transform:
    if fmt == "itk":
        found = itk.read_itk(path)
        if found[0] == "linear":
            kind, matrix, field, held = found[2], found[1], None, (None, None)
        else:
            kind, matrix, field = "displacement", None, found[1]
            held = ((found[2], found[3]), None)
    elif fmt == "elastix":
        matrix, kind, _, spacing, origin = elastix.read_elastix(path)
        field, held = None, ((spacing, origin), None)
    else:
        kind, matrix, field, fixed_pair, moving_pair = ngff.read_ngff(path)
        held = (fixed_pair, moving_pair)
    ndim = (matrix.shape[0] - 1) if matrix is not None else field.shape[0]
    try:
        fixed_held, moving_held = (_grid_from(pair, ndim) for pair in held)
        beside = grid_files.read_grids(path) if fmt != "ngff" else None
        if beside is not None:
            fixed_beside, moving_beside = (_grid_from(pair, ndim) for pair in beside)
            if fixed_held is not None and fixed_held != fixed_beside:
                raise ValueError(
                    f"the file's fixed grid {fixed_held} differs from the one in "
                    f"{grid_files.sidecar_path(path).name!r} ({fixed_beside})"
                )
            fixed_held, moving_held = fixed_beside, moving_beside
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{str(path)!r}: its grids are not valid ({exc})") from None
    _check_given(path, (fixed_held, moving_held), (fixed_grid, moving_grid))
    missing = [
        name
        for name, held_grid, given in (
            ("fixed_grid", fixed_held, fixed_grid),
            ("moving_grid", moving_held, moving_grid),
        )
        if held_grid is None and given is None
    ]
    if missing:
        names = " and ".join(missing)
        warnings.warn(
            f"{str(path)!r} holds no {names} (pixel size and origin) and none was passed: "
            "the unit grid (spacing 1, origin 0) is assumed, and the transform's pixel form "
            "(matrix, to_displacement, apply) depends on it. Pass "
            f"{', '.join(f'{n}=Grid.make(...)' for n in missing)} to load_transform "
            f"(napari-simwarp's save writes the grids beside the file, in "
            f"{grid_files.sidecar_path(path).name!r})",
            UserWarning,
            stacklevel=3,
        )
    fixed = fixed_held or fixed_grid or unit_grid(ndim)
    moving = moving_held or moving_grid or unit_grid(ndim)
    if matrix is not None:
        pixels = moving.to_pixels() @ matrix @ fixed.to_physical()
        kind = kind if kind in LINEAR_KINDS else "affine"
        return AffineTransform(pixels, kind).with_grids(fixed, moving)
    return DisplacementTransform(_pixel_field(field, fixed, moving)).with_grids(fixed, moving)
