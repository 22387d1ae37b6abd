"""Registration results as transforms: linear (a homogeneous matrix) and dense fields.

Conventions (docs/maths.md §6), all in array-axis order and pixels of the fixed image:

- a linear transform's ``matrix`` (``(D+1, D+1)``, float64) maps fixed coordinates to
  moving coordinates, the matrix ``scipy.ndimage.affine_transform(moving, matrix)`` takes;
- every transform's ``to_displacement(shape)`` returns ``d`` (``(D, *shape)``) with
  ``fixed(x) ≈ moving(x + d(x))``, the convention of ``skimage.registration.optical_flow_tvl1``;
- ``apply(moving)`` resamples ``moving`` onto the fixed grid (order 1 linear, order 0
  nearest for label images).

Transforms save to ``.npz`` files holding the arrays and a JSON header with a ``kind`` tag;
:func:`load_transform` reads any of them back.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch

from ..ops import affine_to_displacement, integrate_velocity, warp, warp_affine

FORMAT_VERSION = 1
LINEAR_KINDS = ("translation", "rigid", "similarity", "affine")


def _split_channels(array, ndim: int, name: str):
    """The leading shape ``C`` and the spatial shape ``S`` of ``array`` ``(*C, *S)``.

    Raises a ValueError naming ``name`` when ``array`` has fewer than ``ndim`` axes.
    """
    shape = tuple(array.shape)
    if len(shape) < ndim:
        raise ValueError(
            f"{name} must have at least {ndim} dimensions (the transform is {ndim}-D), "
            f"got shape {shape}"
        )
    lead = shape[: len(shape) - ndim]
    return lead, shape[len(shape) - ndim :]


def _resample_apply(array, ndim: int, order: int, warp_fn):
    """Shared body of ``apply``: cast, fold leading axes into channels, warp, restore."""
    if order not in (0, 1):
        raise ValueError(f"order must be 0 (nearest, for labels) or 1 (linear), got {order!r}")
    src = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    if src.size == 0:
        raise ValueError(f"array must not be empty, got shape {src.shape}")
    lead, spatial = _split_channels(src, ndim, "array")
    # Labels must survive exactly: float64 holds every int32 label; images use float32.
    dtype = torch.float64 if order == 0 else torch.float32
    t = torch.as_tensor(src.astype(np.float64 if order == 0 else np.float32, copy=False))
    t = t.reshape(1, int(np.prod(lead)) if lead else 1, *spatial).to(dtype)
    out = warp_fn(t, "nearest" if order == 0 else "linear")
    out = out.reshape(*lead, *out.shape[2:]).numpy()
    if order == 0:
        return out.astype(src.dtype, copy=False)
    return out if np.issubdtype(src.dtype, np.floating) else out.astype(np.float32)


class Transform:
    """Base class: a map from fixed-image coordinates to moving-image coordinates."""

    kind = "transform"

    @property
    def ndim(self) -> int:
        raise NotImplementedError

    def to_displacement(self, shape) -> np.ndarray:
        """Displacement ``d``, shape ``(D, *shape)`` float32, with fixed(x) ≈ moving(x + d(x))."""
        raise NotImplementedError

    def apply(self, array, order: int = 1, output_shape=None) -> np.ndarray:
        """Resample ``array`` (``(*C, *S)``, any leading axes) onto the fixed grid."""
        raise NotImplementedError

    def _arrays(self) -> dict:
        raise NotImplementedError

    def _meta(self) -> dict:
        return {}

    def save(self, path) -> pathlib.Path:
        """Write the transform to ``path`` (``.npz`` added when missing); return the path."""
        path = pathlib.Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        header = {"kind": self.kind, "format_version": FORMAT_VERSION, **self._meta()}
        np.savez(path, header=np.array(json.dumps(header)), **self._arrays())
        return path

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

    def inverse(self) -> "AffineTransform":
        return AffineTransform(np.linalg.inv(self.matrix), self.kind)

    def to_displacement(self, shape) -> np.ndarray:
        shape = tuple(int(n) for n in shape)
        if len(shape) != self.ndim:
            raise ValueError(f"shape must have {self.ndim} axes, got {shape}")
        d = affine_to_displacement(torch.as_tensor(self.matrix), shape)
        return d[0].to(torch.float32).numpy()

    def apply(self, array, order: int = 1, output_shape=None) -> np.ndarray:
        m = torch.as_tensor(self.matrix)

        def warp_fn(t, mode):
            shape = output_shape if output_shape is not None else t.shape[2:]
            return warp_affine(t, m.to(t.dtype), output_shape=tuple(shape),
                               interpolation=mode, padding="grid-constant")

        return _resample_apply(array, self.ndim, order, warp_fn)

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

    def __init__(self, field):
        f = np.array(field, dtype=np.float32)
        if f.ndim not in (3, 4) or f.shape[0] != f.ndim - 1:
            raise ValueError(
                f"{self.field_name} must be (2, H, W) or (3, D, H, W), got shape {f.shape}")
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
    """A dense displacement field ``d`` (``(D, *S)``, pixels) with fixed(x) ≈ moving(x + d(x))."""

    kind = "displacement"
    field_name = "displacement"

    def to_displacement(self, shape=None) -> np.ndarray:
        return _resize_field(self.displacement, self.shape if shape is None else shape)

    def apply(self, array, order: int = 1, output_shape=None) -> np.ndarray:
        def warp_fn(t, mode):
            shape = tuple(output_shape) if output_shape is not None else tuple(t.shape[2:])
            if shape != tuple(t.shape[2:]):
                raise ValueError(
                    f"output_shape {shape} must equal the array's spatial shape "
                    f"{tuple(t.shape[2:])} for a dense field")
            d = torch.as_tensor(self.to_displacement(shape)).unsqueeze(0).to(t.dtype)
            return warp(t, d.expand(t.shape[0], -1, *shape), interpolation=mode,
                        padding="grid-constant")

        return _resample_apply(array, self.ndim, order, warp_fn)


class VelocityTransform(_FieldTransform):
    """A stationary velocity field ``v`` (``(D, *S)``, pixels); the displacement is
    ``exp(v)`` by scaling and squaring (``steps`` squarings), a diffeomorphism."""

    kind = "velocity"
    field_name = "velocity"

    def __init__(self, velocity, steps: int = 7):
        super().__init__(velocity)
        self.steps = int(steps)

    def to_displacement(self, shape=None) -> np.ndarray:
        shape = self.shape if shape is None else tuple(int(n) for n in shape)
        # Integrate at the target resolution so the result is a diffeomorphism there.
        v = torch.as_tensor(_resize_field(self.velocity, shape)).unsqueeze(0)
        return integrate_velocity(v, self.steps)[0].numpy()

    def apply(self, array, order: int = 1, output_shape=None) -> np.ndarray:
        return DisplacementTransform(
            self.to_displacement(np.asarray(array).shape[-self.ndim :] if output_shape is None
                                 else output_shape)
        ).apply(array, order, output_shape)

    def _meta(self) -> dict:
        return {"steps": self.steps}


def load_transform(path) -> Transform:
    """Read a transform written by ``Transform.save``."""
    path = pathlib.Path(path)
    if not path.exists() and path.with_name(path.name + ".npz").exists():
        path = path.with_name(path.name + ".npz")
    if not path.exists():
        raise FileNotFoundError(f"path {str(path)!r} does not exist")
    with np.load(path, allow_pickle=False) as data:
        if "header" not in data:
            raise ValueError(f"{str(path)!r} is not a napari-simwarp transform (no header)")
        header = json.loads(str(data["header"]))
        kind = header.get("kind")
        if kind in LINEAR_KINDS:
            return AffineTransform(data["matrix"], kind)
        if kind == "displacement":
            return DisplacementTransform(data["displacement"])
        if kind == "velocity":
            return VelocityTransform(data["velocity"], header.get("steps", 7))
    raise ValueError(f"{str(path)!r} holds an unknown transform kind {kind!r}")
