"""Transforms in files that other tools read: ITK, elastix, OME-NGFF 0.6, BigWarp.

One module per format, each on plain NumPy data (see :mod:`._common` for the
conventions), no torch: :mod:`.itk` (``.tfm``/``.txt`` linear transforms, ``.h5``
displacement fields), :mod:`.elastix` (``TransformParameters`` files for transformix),
:mod:`.ngff` (OME-Zarr 0.6 scenes), :mod:`.bigwarp` (landmark CSV).
"""

from ._common import TransformFileError

__all__ = ["TransformFileError"]
