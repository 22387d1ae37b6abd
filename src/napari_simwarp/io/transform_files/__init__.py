"""Transforms in files that other tools read: ITK, elastix, OME-NGFF 0.6, BigWarp.

One module per format, each on plain NumPy data (see :mod:`._common` for the
conventions), no torch: :mod:`.itk` (``.tfm``/``.txt`` linear transforms, ``.h5``
displacement fields), :mod:`.elastix` (``TransformParameters`` files for transformix),
:mod:`.ngff` (OME-Zarr 0.6 scenes), :mod:`.bigwarp` (landmark CSV, point pairs).
:func:`format_of` picks the format of a path.
"""

from __future__ import annotations

import pathlib

from ._common import TransformFileError, read_head, where

#: the formats ``Transform.save`` and ``load_transform`` take
FORMATS = ("npz", "itk", "elastix", "ngff")
_BY_SUFFIX = {
    ".npz": "npz",
    ".tfm": "itk",
    ".h5": "itk",
    ".hdf5": "itk",
    ".zarr": "ngff",
    ".csv": "bigwarp",
}


def format_of(path, format: str | None = None, *, reading: bool = False) -> str:
    """The transform format of ``path``: ``format`` when given (checked), else from the
    extension. ``.txt`` is elastix's for files named ``TransformParameters*`` and ITK's
    otherwise; when reading, the first bytes decide. A path without a known extension is
    ``.npz`` (the lossless default). A BigWarp landmark table (``.csv``) holds point
    pairs, not a transform: refused with a pointer to the landmark functions.
    """
    path = pathlib.Path(path)
    if format is not None:
        if format not in FORMATS:
            raise ValueError(
                f"format must be one of {', '.join(map(repr, FORMATS))} or None (from the "
                f"extension), got {format!r}"
            )
        return format
    suffix = path.suffix.lower()
    if suffix == ".txt":
        if reading and path.is_file():
            head = read_head(path, "a transform file", 64)
            return "itk" if head.lstrip().startswith(b"#Insight Transform File") else "elastix"
        return "elastix" if path.name.startswith("TransformParameters") else "itk"
    found = _BY_SUFFIX.get(suffix, "npz")
    if found == "bigwarp":
        raise ValueError(
            f"{where(path)}: a BigWarp landmark table holds point pairs, not a transform; "
            "read it with registration.landmarks.read_bigwarp_landmarks and fit a "
            "transform with fit_landmarks"
        )
    return found


__all__ = ["FORMATS", "TransformFileError", "format_of"]
