"""elastix ``TransformParameters`` files for linear transforms, as transformix reads them
(docs/maths.md §11).

An elastix transform, like ITK's, maps fixed physical points to moving physical points in
x, y, z order, ``p ↦ A (p − c) + c + t`` with ``c`` the ``CenterOfRotationPoint``; the
file also holds the output grid transformix resamples onto (the fixed image's ``Size``,
``Spacing``, ``Origin``, ``Direction``). Written: an ``AffineTransform`` with ``c = 0``.
Read: ``TranslationTransform``, ``EulerTransform``, ``SimilarityTransform`` and
``AffineTransform`` (2-D and 3-D), and chains of them through
``InitialTransformParameterFileName`` with ``HowToCombineTransforms "Compose"``.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable

import numpy as np

from ._common import TransformFileError, read_text, reverse_axes, where, write_atomic
from .itk import linear_parameters, linear_xyz

_EXPECTED = "an elastix TransformParameters file"
#: elastix transform name → (ITK type in 2-D, in 3-D)
_ITK_NAMES = {
    "TranslationTransform": ("TranslationTransform", "TranslationTransform"),
    "EulerTransform": ("Euler2DTransform", "Euler3DTransform"),
    "SimilarityTransform": ("Similarity2DTransform", "Similarity3DTransform"),
    "AffineTransform": ("AffineTransform", "AffineTransform"),
}
KINDS = {
    "TranslationTransform": "translation",
    "EulerTransform": "rigid",
    "SimilarityTransform": "similarity",
    "AffineTransform": "affine",
}
_LINE = re.compile(r"^\s*\(\s*(\w+)\s*(.*?)\s*\)\s*(//.*)?$")


def _parse(path) -> dict[str, list]:
    """The ``(Key value ...)`` entries of a parameter file: strings unquoted, numbers as
    floats."""
    entries = {}
    for line in read_text(path, _EXPECTED).splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        values = []
        for token in re.findall(r'"[^"]*"|\S+', match.group(2)):
            if token.startswith('"'):
                values.append(token.strip('"'))
            else:
                try:
                    values.append(float(token))
                except ValueError:
                    values.append(token)
        entries[match.group(1)] = values
    if "Transform" not in entries:
        raise TransformFileError(
            f"{where(path)} is not {_EXPECTED}: it has no (Transform ...) entry"
        )
    return entries


def _numbers(path, entries, key, count=None) -> np.ndarray:
    values = entries.get(key)
    if values is None or not all(isinstance(v, float) for v in values):
        raise TransformFileError(f"{where(path)}: ({key} ...) is missing or not numbers")
    if count is not None and len(values) != count:
        raise TransformFileError(
            f"{where(path)}: ({key} ...) has {len(values)} values, expected {count}"
        )
    return np.asarray(values, dtype=np.float64)


def _initial(path, name: str) -> pathlib.Path:
    candidate = pathlib.Path(name)
    if not candidate.is_absolute() and not candidate.exists():
        candidate = pathlib.Path(path).parent / candidate
    if not candidate.exists():
        raise TransformFileError(
            f"{where(path)} starts from the transform in {name!r}, which does not exist"
        )
    return candidate


def read_elastix(path, _seen=()):
    """Read a linear elastix transform parameter file.

    Returns ``(matrix, kind, size, spacing, origin)``: the homogeneous fixed physical →
    moving physical matrix in array order (initial transforms composed in), the model
    (of the last transform), and the output grid in array order. A missing file is a
    FileNotFoundError; anything else a :class:`TransformFileError` naming the path.
    """
    path = pathlib.Path(path)
    entries = _parse(path)
    name = entries["Transform"][0]
    d = int(_numbers(path, entries, "FixedImageDimension", 1)[0])
    if d not in (2, 3) or name not in _ITK_NAMES:
        raise TransformFileError(
            f"{where(path)} holds a {d}-D elastix {name!r}; napari-simwarp reads the 2-D and "
            f"3-D linear transforms {', '.join(_ITK_NAMES)}"
        )
    params = _numbers(path, entries, "TransformParameters")
    if "NumberOfParameters" in entries:
        declared = _numbers(path, entries, "NumberOfParameters", 1)[0]
        if declared != len(params):
            raise TransformFileError(
                f"{where(path)}: (NumberOfParameters {declared:g}) but "
                f"(TransformParameters ...) has {len(params)} values"
            )
    center = (
        _numbers(path, entries, "CenterOfRotationPoint", d)
        if "CenterOfRotationPoint" in entries
        else np.zeros(d)
    )
    itk_name = _ITK_NAMES[name][d - 2]
    # a translation has no center (elastix may still write one)
    fixed = [] if itk_name == "TranslationTransform" else [*center]
    if itk_name == "Euler3DTransform":
        fixed.append(1.0 if entries.get("ComputeZYX", ["false"])[0] == "true" else 0.0)
    xyz = linear_xyz(path, f"{itk_name}_double_{d}_{d}", params, fixed, label=f"elastix {name!r}")
    direction = _numbers(path, entries, "Direction", d * d) if "Direction" in entries else None
    if direction is not None and not np.allclose(direction.reshape(d, d), np.eye(d)):
        raise TransformFileError(
            f"{where(path)}: the fixed image has direction cosines {direction.tolist()}; "
            "napari-simwarp reads axis-aligned grids only (identity direction)"
        )
    initial = entries.get("InitialTransformParameterFileName", ["NoInitialTransform"])[0]
    if initial != "NoInitialTransform":
        how = entries.get("HowToCombineTransforms", ["Compose"])[0]
        if how != "Compose":
            raise TransformFileError(
                f"{where(path)} adds its initial transform (HowToCombineTransforms {how!r}); "
                "napari-simwarp reads composed chains only"
            )
        chained = _initial(path, initial)
        if chained.resolve() in _seen:
            raise TransformFileError(f"{where(path)}: its initial transforms form a loop")
        first, *_ = read_elastix(chained, (*_seen, path.resolve()))
        # Compose: the initial transform maps the fixed point first.
        xyz = xyz @ reverse_axes(first)
    size = _numbers(path, entries, "Size", d)
    spacing = _numbers(path, entries, "Spacing", d)
    origin = _numbers(path, entries, "Origin", d)
    return (
        reverse_axes(xyz),
        KINDS[name],
        tuple(int(n) for n in size[::-1]),
        tuple(spacing[::-1]),
        tuple(origin[::-1]),
    )


def _values(values) -> str:
    return " ".join(repr(float(v)) for v in values)


def write_elastix(path, matrix, shape, spacing, origin, *, overwrite: bool = False):
    """Write a homogeneous array-order fixed → moving physical matrix as an elastix
    ``AffineTransform`` that transformix applies onto the fixed grid ``shape``,
    ``spacing``, ``origin`` (array order); return the path."""
    write = elastix_writer(matrix, shape, spacing, origin)
    return write_atomic(path, write, overwrite=overwrite)


def elastix_writer(matrix, shape, spacing, origin) -> Callable[[pathlib.Path], None]:
    """A function writing the file of :func:`write_elastix` to the path it is given (for
    :func:`napari_simwarp.io.atomic.write_together`)."""
    _, params, center = linear_parameters(np.asarray(matrix, float))
    d = len(shape)
    lines = [
        '(Transform "AffineTransform")',
        f"(NumberOfParameters {len(params)})",
        f"(TransformParameters {_values(params)})",
        f"(CenterOfRotationPoint {_values(center)})",
        '(InitialTransformParameterFileName "NoInitialTransform")',
        '(HowToCombineTransforms "Compose")',
        f"(FixedImageDimension {d})",
        f"(MovingImageDimension {d})",
        '(FixedInternalImagePixelType "float")',
        '(MovingInternalImagePixelType "float")',
        f"(Size {' '.join(str(int(n)) for n in shape[::-1])})",
        f"(Index {' '.join(['0'] * d)})",
        f"(Spacing {_values(spacing[::-1])})",
        f"(Origin {_values(origin[::-1])})",
        f"(Direction {_values(np.eye(d).ravel())})",
        '(UseDirectionCosines "true")',
        '(ResampleInterpolator "FinalBSplineInterpolator")',
        "(FinalBSplineInterpolationOrder 1)",
        '(Resampler "DefaultResampler")',
        "(DefaultPixelValue 0)",
        '(ResultImageFormat "nii")',
        '(ResultImagePixelType "float")',
        '(CompressResultImage "false")',
    ]
    text = "\n".join(lines) + "\n"
    return lambda p: p.write_text(text, encoding="utf-8")
