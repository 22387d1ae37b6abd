"""ITK transform files: text (``.tfm``, ``.txt``) and HDF5 (``.h5``), as SimpleITK and ITK
read and write them (docs/maths.md §11).

ITK's conventions, converted here:

- an ITK transform maps a point of the *fixed* image's physical space to the *moving*
  image's (the map resampling needs), as the package's transforms do;
- points are physical, in x, y, z order (LPS for medical images): the reverse of
  NumPy's array order, so a matrix ``M`` in array order is ``R M R`` for ITK (``R``
  reverses the spatial axes);
- a matrix-offset transform is ``p ↦ A (p − c) + c + t`` with the center ``c`` in its
  fixed parameters; written here with ``c = 0`` (``t`` is then the offset);
- direction cosines are the identity (napari's ``rotate``/``shear`` are not grids).

Written: linear transforms as ``AffineTransform_double_D_D`` (text or HDF5), displacement
fields as ``DisplacementFieldTransform_double_D_D`` (HDF5: the vectors ``moving − fixed``
physical point on the fixed image's grid). Read: the linear types of :data:`READABLE`,
composites of them, and displacement fields; anything else is refused by name.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable

import numpy as np

from ._common import (
    TransformFileError,
    read_head,
    read_text,
    reverse_axes,
    where,
    write_atomic,
)

TEXT_SUFFIXES = (".tfm", ".txt")
HDF5_SUFFIXES = (".h5", ".hdf5")
_MAGIC_TEXT = "#Insight Transform File V1.0"
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_EXPECTED = "an ITK transform file"


def _rotation_2d(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def _euler_3d(angles, zyx: bool) -> np.ndarray:
    ax, ay, az = angles
    cx, sx, cy, sy, cz, sz = (f(a) for a in (ax, ay, az) for f in (math.cos, math.sin))
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx if zyx else rz @ rx @ ry


def _versor(v) -> np.ndarray:
    """The rotation of the unit quaternion with vector part ``v`` (``w ≥ 0``)."""
    x, y, z = v
    w = math.sqrt(max(0.0, 1.0 - (x * x + y * y + z * z)))
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def _matrix_and_translation(name: str, d: int, p: np.ndarray, fixed: np.ndarray):
    """``(A, t, c)`` of ITK's ``p ↦ A (p − c) + c + t`` for a transform type ``name``
    (without its ``_double_D_D`` suffix), parameters ``p`` and fixed parameters."""
    center = fixed[:d] if len(fixed) >= d else np.zeros(d)
    if name in ("AffineTransform", "MatrixOffsetTransformBase"):
        return p[: d * d].reshape(d, d), p[d * d : d * d + d], center
    if name == "TranslationTransform":
        return np.eye(d), p[:d], np.zeros(d)
    if name == "IdentityTransform":
        return np.eye(d), np.zeros(d), np.zeros(d)
    if name == "ScaleTransform":
        return np.diag(p[:d]), np.zeros(d), center
    if d == 2 and name in ("Euler2DTransform", "Rigid2DTransform"):
        return _rotation_2d(p[0]), p[1:3], center
    if d == 2 and name == "Similarity2DTransform":
        return p[0] * _rotation_2d(p[1]), p[2:4], center
    if d == 3 and name == "Euler3DTransform":
        zyx = len(fixed) > 3 and fixed[3] != 0
        return _euler_3d(p[:3], zyx), p[3:6], center
    if d == 3 and name == "VersorRigid3DTransform":
        return _versor(p[:3]), p[3:6], center
    if d == 3 and name == "Similarity3DTransform":
        return p[6] * _versor(p[:3]), p[3:6], center
    raise KeyError(name)


#: the linear ITK transform types this module reads
READABLE = (
    "AffineTransform",
    "MatrixOffsetTransformBase",
    "TranslationTransform",
    "IdentityTransform",
    "ScaleTransform",
    "Euler2DTransform",
    "Rigid2DTransform",
    "Similarity2DTransform",
    "Euler3DTransform",
    "VersorRigid3DTransform",
    "Similarity3DTransform",
)


#: the model each ITK type is (the others are affine)
KINDS = {
    "TranslationTransform": "translation",
    "IdentityTransform": "translation",
    "Euler2DTransform": "rigid",
    "Rigid2DTransform": "rigid",
    "Euler3DTransform": "rigid",
    "VersorRigid3DTransform": "rigid",
    "Similarity2DTransform": "similarity",
    "Similarity3DTransform": "similarity",
}


def _split_type(path, type_name: str) -> tuple[str, int]:
    """``("AffineTransform", 3)`` from ``"AffineTransform_double_3_3"``."""
    parts = type_name.strip().split("_")
    if len(parts) < 4 or parts[-3] not in ("double", "float") or parts[-1] != parts[-2]:
        raise TransformFileError(
            f"{where(path)} holds an ITK transform of type {type_name!r}, expected a "
            "name like AffineTransform_double_3_3"
        )
    d = int(parts[-1]) if parts[-1].isdigit() else 0
    if d not in (2, 3):
        raise TransformFileError(f"{where(path)}: {type_name!r} is {d}-D, expected 2-D or 3-D")
    return "_".join(parts[:-3]), d


def parameter_count(name: str, d: int) -> int | None:
    """How many parameters ITK's ``name`` (without ``_double_D_D``) has in ``d``-D; None
    for a type (or a type in a dimension) this module does not read."""
    counts = {
        "AffineTransform": d * d + d,
        "MatrixOffsetTransformBase": d * d + d,
        "TranslationTransform": d,
        "IdentityTransform": 0,
        "ScaleTransform": d,
    }
    counts.update(
        {"Euler2DTransform": 3, "Rigid2DTransform": 3, "Similarity2DTransform": 4}
        if d == 2
        else {"Euler3DTransform": 6, "VersorRigid3DTransform": 6, "Similarity3DTransform": 7}
    )
    return counts.get(name)


def _fixed_counts(name: str, d: int) -> tuple[int, ...]:
    """The fixed-parameter counts ITK writes for ``name``: none for translation and
    identity, the center (``d``, or none: center 0) for the others, plus Euler3D's
    ComputeZYX flag."""
    if name in ("TranslationTransform", "IdentityTransform"):
        return (0,)
    return (0, d, d + 1) if name == "Euler3DTransform" else (0, d)


def linear_xyz(path, type_name: str, params, fixed, *, label: str | None = None) -> np.ndarray:
    """The homogeneous x, y, z matrix of one linear ITK transform.

    The number of ``params`` (and of ``fixed`` parameters) must be the one ITK's type has:
    a short list is never broadcast nor a long one cut (a :class:`TransformFileError`
    gives the expected and found counts). ``label`` names the transform in those messages
    (default: the ITK type; elastix's reader passes its own name).
    """
    name, d = _split_type(path, type_name)
    label = label or f"ITK {type_name!r}"
    expected = parameter_count(name, d)
    if expected is None:
        raise TransformFileError(
            f"{where(path)} holds an ITK {type_name!r}, which napari-simwarp does not "
            f"read; supported: {', '.join(READABLE)}, their composites, and displacement "
            "fields (.h5)"
        )
    params, fixed = np.asarray(params, float).ravel(), np.asarray(fixed, float).ravel()
    if len(params) != expected:
        raise TransformFileError(
            f"{where(path)}: a {d}-D {label} has {expected} parameters, found {len(params)}"
        )
    allowed = _fixed_counts(name, d)
    if len(fixed) not in allowed:
        raise TransformFileError(
            f"{where(path)}: a {d}-D {label} has "
            f"{' or '.join(map(str, allowed))} fixed parameters, found {len(fixed)}"
        )
    a, t, c = _matrix_and_translation(name, d, params, fixed)
    out = np.eye(d + 1)
    out[:d, :d] = a
    out[:d, d] = t + c - a @ c
    return out


def _compose(path, entries) -> np.ndarray:
    """One homogeneous x, y, z matrix from ITK entries ``(type, params, fixed)``; a
    composite applies its last-listed transform first (ITK's transform queue)."""
    matrices = [linear_xyz(path, *entry) for entry in entries]
    out = np.eye(matrices[0].shape[0])
    for m in matrices:
        if m.shape != out.shape:
            raise TransformFileError(f"{where(path)} mixes 2-D and 3-D transforms")
        out = out @ m
    return out


def _parse_text(path, text: str) -> list[tuple[str, list, list]]:
    if not text.lstrip().startswith(_MAGIC_TEXT):
        raise TransformFileError(
            f"{where(path)} is not {_EXPECTED}: it does not start with {_MAGIC_TEXT!r}"
        )
    entries, current = [], None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "Transform":
            current = [value.strip(), [], []]
            entries.append(current)
        elif key in ("Parameters", "FixedParameters") and current is not None:
            try:
                numbers = [float(v) for v in value.split()]
            except ValueError:
                raise TransformFileError(
                    f"{where(path)}: {key} of {current[0]!r} are not numbers: {value.strip()!r}"
                ) from None
            current[1 if key == "Parameters" else 2] = numbers
    if not entries:
        raise TransformFileError(f"{where(path)} is not {_EXPECTED}: it holds no transform")
    return [tuple(e) for e in entries]


def _strip_composite(entries):
    if entries and entries[0][0].startswith("CompositeTransform_"):
        entries = entries[1:]
    if not entries:
        raise TransformFileError("an empty CompositeTransform holds no transform")
    return entries


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - the interop extra is missing
        raise ImportError(
            "ITK HDF5 transform files (.h5) need h5py: pip install 'napari-simwarp[interop]'"
        ) from None
    return h5py


def _read_hdf5(path):
    h5py = _h5py()

    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise TransformFileError(f"{where(path)} is not {_EXPECTED} (HDF5: {exc})") from None
    with h5:
        group = h5.get("TransformGroup")
        if group is None:
            raise TransformFileError(
                f"{where(path)} is an HDF5 file but not {_EXPECTED} (no /TransformGroup)"
            )
        entries = []
        for key in sorted(group, key=int):
            node = group[key]
            kind = node["TransformType"][0]
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            params = node["TransformParameters"][()] if "TransformParameters" in node else []
            fixed = (
                node["TransformFixedParameters"][()] if "TransformFixedParameters" in node else []
            )
            entries.append((kind, np.asarray(params, float), np.asarray(fixed, float)))
    return entries


def _displacement_from_entry(path, entry):
    """``(field, spacing, origin)`` in array order from a DisplacementFieldTransform."""
    type_name, params, fixed = entry
    _, d = _split_type(path, type_name)
    if len(fixed) != d + d + d + d * d:
        raise TransformFileError(
            f"{where(path)}: a {d}-D displacement field has {d * (3 + d)} fixed parameters "
            f"(size, origin, spacing, direction), found {len(fixed)}"
        )
    size = [round(float(v)) for v in fixed[:d]]
    origin, spacing = fixed[d : 2 * d], fixed[2 * d : 3 * d]
    direction = np.asarray(fixed[3 * d :]).reshape(d, d)
    if not np.allclose(direction, np.eye(d), atol=1e-9):
        raise TransformFileError(
            f"{where(path)}: the displacement field has direction cosines {direction.tolist()}; "
            "napari-simwarp reads axis-aligned grids only (identity direction)"
        )
    if len(params) != d * math.prod(size):
        raise TransformFileError(
            f"{where(path)}: the field of size {size} needs {d * math.prod(size)} "
            f"parameters, found {len(params)}"
        )
    # ITK: x fastest, components interleaved → NumPy (z, y, x, component), then array
    # order for both the axes of the grid and the components.
    field = np.asarray(params, float).reshape(*size[::-1], d)[..., ::-1]
    return np.moveaxis(field, -1, 0).copy(), tuple(spacing[::-1]), tuple(origin[::-1])


def read_itk(path):
    """Read an ITK transform file.

    Returns ``("linear", matrix, kind)``: the homogeneous fixed physical → moving
    physical matrix in array order and the model it is (affine for a composite); or
    ``("displacement", field, spacing, origin)``: the physical displacement ``(D, *S)``
    (array order) on the grid ``spacing``, ``origin`` (array order). A missing file is a
    FileNotFoundError; anything else that is not a readable ITK transform a
    :class:`TransformFileError` naming the path.
    """
    if read_head(path, _EXPECTED) == _HDF5_SIGNATURE:
        entries = _read_hdf5(path)
    else:
        entries = _parse_text(path, read_text(path, _EXPECTED))
    try:
        entries = _strip_composite(entries)
    except TransformFileError as exc:
        raise TransformFileError(f"{where(path)}: {exc}") from None
    fields = [e for e in entries if e[0].startswith("DisplacementFieldTransform_")]
    if fields:
        if len(entries) > 1:
            raise TransformFileError(
                f"{where(path)} composes a displacement field with other transforms; "
                "napari-simwarp reads a field alone"
            )
        return ("displacement", *_displacement_from_entry(path, fields[0]))
    matrix = reverse_axes(_compose(path, entries))
    kind = (
        KINDS.get(_split_type(path, entries[0][0])[0], "affine") if len(entries) == 1 else "affine"
    )
    return "linear", matrix, kind


def _format_numbers(values) -> str:
    return " ".join(repr(float(v)) for v in values)


def linear_parameters(matrix: np.ndarray) -> tuple[str, list[float], list[float]]:
    """ITK's ``(type, parameters, fixed parameters)`` of a homogeneous array-order fixed
    → moving physical matrix: an ``AffineTransform`` with center 0."""
    xyz = reverse_axes(matrix)
    d = xyz.shape[0] - 1
    params = [*xyz[:d, :d].ravel(), *xyz[:d, d]]
    return f"AffineTransform_double_{d}_{d}", params, [0.0] * d


def linear_writer(path, matrix) -> Callable[[pathlib.Path], None]:
    """A function writing a homogeneous array-order fixed → moving physical matrix as an
    ITK ``AffineTransform`` to the path it is given (text, or HDF5 when ``path`` is
    ``.h5``): for :func:`napari_simwarp.io.atomic.write_together`."""
    kind, params, fixed = linear_parameters(np.asarray(matrix, float))
    if str(path).lower().endswith(HDF5_SUFFIXES):
        return _hdf5_writer(kind, params, fixed)
    text = (
        f"{_MAGIC_TEXT}\n#Transform 0\nTransform: {kind}\n"
        f"Parameters: {_format_numbers(params)}\nFixedParameters: {_format_numbers(fixed)}\n"
    )
    return lambda p: p.write_text(text, encoding="utf-8")


def write_itk_linear(path, matrix, *, overwrite: bool = False):
    """Write a homogeneous array-order fixed → moving physical matrix as an ITK
    ``AffineTransform``: text for ``.tfm``/``.txt``, HDF5 for ``.h5``; return the path."""
    return write_atomic(path, linear_writer(path, matrix), overwrite=overwrite)


def displacement_writer(field, spacing, origin) -> Callable[[pathlib.Path], None]:
    """A function writing a physical displacement ``(D, *S)`` (array order, the vectors
    moving − fixed physical point) on the fixed grid ``spacing``, ``origin`` (array
    order) as an ITK HDF5 ``DisplacementFieldTransform`` to the path it is given."""
    field = np.asarray(field, dtype=np.float64)
    d = field.shape[0]
    size = field.shape[1:]
    # array order (component, z, y, x) → ITK's x-fastest pixels with x, y, z components
    params = np.moveaxis(field[::-1], 0, -1).ravel()
    fixed = [*size[::-1], *origin[::-1], *spacing[::-1], *np.eye(d).ravel()]
    return _hdf5_writer(f"DisplacementFieldTransform_double_{d}_{d}", params, fixed)


def write_itk_displacement(path, field, spacing, origin, *, overwrite: bool = False):
    """Write a physical displacement ``(D, *S)`` (array order, the vectors moving − fixed
    physical point) on the fixed grid ``spacing``, ``origin`` (array order) as an ITK
    HDF5 ``DisplacementFieldTransform``; return the path."""
    return write_atomic(path, displacement_writer(field, spacing, origin), overwrite=overwrite)


def _hdf5_writer(kind: str, params, fixed) -> Callable[[pathlib.Path], None]:
    h5py = _h5py()

    def write(partial):
        with h5py.File(partial, "w") as h5:
            strings = h5py.string_dtype(encoding="ascii")  # as ITK writes and reads them
            h5.create_dataset("ITKVersion", data=np.array(["5.4"], dtype=object), dtype=strings)
            node = h5.create_group("TransformGroup/0")
            node.create_dataset("TransformType", data=np.array([kind], dtype=object), dtype=strings)
            node.create_dataset("TransformParameters", data=np.asarray(params, np.float64))
            node.create_dataset("TransformFixedParameters", data=np.asarray(fixed, np.float64))

    return write
