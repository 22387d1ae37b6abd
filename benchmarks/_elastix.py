"""itk-elastix glue shared by the registration benchmarks.

One place builds elastix's inputs (float32 ITK images, with the pixel sizes when given),
runs one of its default parameter maps (its metric optionally replaced) and reads a linear
result back through napari-simwarp's own elastix reader, as a homogeneous fixed physical →
moving physical matrix in array order (pixels with the default unit spacing).
"""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Callable

import numpy as np


def import_itk(report, section: str):
    """The ``itk`` module, or None after noting in ``section`` that its rows are missing."""
    try:
        import itk
    except ImportError:
        report.note(section, "itk-elastix is not installed: its rows are missing.")
        return None
    return itk


def registration(
    itk, fixed, moving, kind: str, *, metric=None, spacing=None, threads=None, overrides=None
) -> Callable:
    """A call running elastix's default map ``kind`` on ``fixed``, ``moving`` (array order;
    ``spacing`` per axis, array order) with ``metric`` in place of the map's and the
    entries of ``overrides`` (parameter name → value or list of values, written as elastix
    reads them) in place of the default map's; it returns elastix's ``(result image,
    transform parameter object)``."""
    images = [
        itk.image_view_from_array(np.ascontiguousarray(a, dtype=np.float32))
        for a in (fixed, moving)
    ]
    if spacing is not None:
        for image in images:
            image.SetSpacing([float(s) for s in spacing[::-1]])  # ITK: x, y, z
    params = itk.ParameterObject.New()
    pmap = params.GetDefaultParameterMap(kind)
    if metric is not None:
        pmap["Metric"] = [metric]
    for name, value in (overrides or {}).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        pmap[name] = [str(v) for v in values]
    params.AddParameterMap(pmap)
    options = {} if threads is None else {"number_of_threads": threads}

    def run():
        return itk.elastix_registration_method(
            *images, parameter_object=params, log_to_console=False, **options
        )

    return run


def linear_matrix(tparams) -> np.ndarray:
    """A linear result's homogeneous fixed physical → moving physical matrix, array order."""
    from napari_simwarp.io.transform_files.elastix import read_elastix

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "TransformParameters.0.txt"
        tparams.WriteParameterFile(str(path))  # one map: written to this name
        return read_elastix(path)[0]
