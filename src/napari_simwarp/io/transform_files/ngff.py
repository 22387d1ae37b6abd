"""OME-NGFF 0.6 (OME-Zarr) scenes: the fixed and moving images and the transform between
them, written with ngff-zarr (docs/maths.md §11).

Layout of the directory written (RFC-5 ``scene``):

- ``fixed/``, ``moving/``: each image as a multiscale group whose dataset transform is
  its grid (``scale`` = pixel size, ``translation`` = origin, array order) into its
  coordinate system ``intrinsic``;
- root ``ome.scene.coordinateTransformations``: for a linear transform, an ``affine``
  from ``moving``'s physical system to ``fixed``'s — the spec's "forward" direction, in
  which a viewer draws the moving image over the fixed one (the inverse of the package's
  fixed → moving map); for a displacement field, ``displacements`` from ``fixed`` to
  ``moving`` (a field has no closed-form inverse), its vectors stored below
  ``coordinateTransformations/displacement`` as an image with a ``displacement`` axis;
- root ``napari_simwarp``: the model and the two grids, so that the file reads back
  exactly (other readers ignore it).

Without images, the scene declares two coordinate systems of its own, ``fixed`` and
``moving``, and holds the transform alone. ngff-zarr (not ome-zarr-py) writes it because
it is the implementation that writes OME-Zarr 0.6 with RFC-5 scenes and field
transformations; ome-zarr-py writes up to 0.5 (no ``coordinateSystems``, no scenes).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

from ._common import TransformFileError, where

SUFFIXES = (".zarr",)
_EXPECTED = "an OME-Zarr (0.6) scene written with a transform"
_FIELD_PATH = "coordinateTransformations/displacement"
_SYSTEM = "intrinsic"
_DIMS = {2: ["y", "x"], 3: ["z", "y", "x"]}


def _ngff_zarr():
    try:
        import ngff_zarr
    except ImportError:  # pragma: no cover - the interop extra is missing
        raise ImportError(
            "writing and reading OME-Zarr transforms needs ngff-zarr (Python 3.11+): "
            "pip install 'napari-simwarp[interop]'"
        ) from None
    return ngff_zarr


def _image(nz, array, dims, spacing, origin, name, units):
    image = nz.to_ngff_image(
        np.asarray(array),
        dims=dims,
        scale=dict(zip(dims, map(float, spacing))),
        translation=dict(zip(dims, map(float, origin))),
        name=name,
        axes_units=None if units is None else dict.fromkeys(dims, units),
    )
    return image


def write_ngff(
    path,
    *,
    fixed_grid,
    moving_grid,
    kind: str,
    matrix=None,
    field=None,
    fixed_image=None,
    moving_image=None,
    units: str | None = None,
    overwrite: bool = False,
) -> pathlib.Path:
    """Write an OME-Zarr 0.6 scene holding a transform (and the images, when given).

    Parameters
    ----------
    path : path of a directory (``.zarr``), created; an existing one is replaced only
        with ``overwrite=True``.
    fixed_grid, moving_grid : ``(spacing, origin)``, per axis, array order.
    kind : the model, kept for reading back.
    matrix : homogeneous ``(D + 1, D + 1)`` fixed physical → moving physical (array
        order), or
    field : physical displacement ``(D, *S)`` on the fixed grid (array order).
    fixed_image, moving_image : arrays ``(*S)``, optional (both or neither), written as
        ``fixed/`` and ``moving/`` with their grids.
    units : the spatial unit of the grids (e.g. "micrometer"), optional.
    """
    nz = _ngff_zarr()
    from ngff_zarr.v06.zarr_metadata import (
        Affine,
        Axis,
        CoordinateSystem,
        Displacements,
    )
    from ngff_zarr.v06.zarr_metadata import CoordinateSystemIdentifier as System

    path = pathlib.Path(path)
    if (matrix is None) == (field is None):
        raise ValueError("write_ngff takes a matrix or a field, one of them")
    if (fixed_image is None) != (moving_image is None):
        raise ValueError("fixed_image and moving_image are written together: give both or none")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{where(path)} exists; it is not replaced (a scene written by napari-simwarp "
            "is, by Transform.save; write_ngff replaces anything with overwrite=True)"
        )
    d = len(fixed_grid[0])
    dims = _DIMS[d]
    images, systems = {}, None
    if fixed_image is not None:
        images = {
            name: nz.to_multiscales(_image(nz, array, dims, *grid, name, units), scale_factors=[])
            for name, array, grid in (
                ("fixed", fixed_image, fixed_grid),
                ("moving", moving_image, moving_grid),
            )
        }
        fixed_system = System(path="fixed", name=_SYSTEM)
        moving_system = System(path="moving", name=_SYSTEM)
    else:
        axes = [Axis(name=n, type="space", unit=units) for n in dims]
        systems = [CoordinateSystem(name="fixed", axes=axes), CoordinateSystem("moving", axes)]
        fixed_system, moving_system = System(name="fixed"), System(name="moving")
    # Built beside the target, then renamed into place: a failed write leaves nothing.
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        if matrix is not None:
            forward = np.linalg.inv(np.asarray(matrix, float))  # moving → fixed
            transform = Affine(
                affine=forward[:d].tolist(),
                input=moving_system,
                output=fixed_system,
                name="moving_to_fixed",
            )
        else:
            displacement = _image(
                nz,
                np.asarray(field, np.float64),
                ["c", *dims],
                [1.0, *fixed_grid[0]],
                [0.0, *fixed_grid[1]],
                "displacement",
                None,
            )
            displacement.axes_types = {"c": "displacement", **dict.fromkeys(dims, "space")}
            multiscales = nz.to_multiscales(displacement, scale_factors=[])
            nz.to_ome_zarr(str(partial / _FIELD_PATH), multiscales, version="0.6")
            transform = Displacements(
                path=_FIELD_PATH,
                interpolation="linear",
                input=fixed_system,
                output=moving_system,
                name="fixed_to_moving",
            )
        scene = nz.NgffScene(
            images=images, coordinateTransformations=[transform], coordinateSystems=systems
        )
        nz.to_ome_zarr(str(partial), scene, version="0.6", overwrite=False)
        _add_root_attributes(
            partial,
            {
                "kind": kind,
                "fixed_grid": {"spacing": list(fixed_grid[0]), "origin": list(fixed_grid[1])},
                "moving_grid": {"spacing": list(moving_grid[0]), "origin": list(moving_grid[1])},
            },
        )
        if path.exists():
            shutil.rmtree(path)
        partial.rename(path)
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return path


def written_here(path) -> bool:
    """Whether ``path`` is a scene :func:`write_ngff` wrote (the only directory that
    ``Transform.save`` replaces: anything else may hold a user's images)."""
    try:
        return "napari_simwarp" in _root_attributes(pathlib.Path(path))
    except (FileNotFoundError, TransformFileError, OSError):
        return False


def _add_root_attributes(path: pathlib.Path, ours: dict) -> None:
    """Add ``ours`` under ``napari_simwarp`` in the root group's attributes (zarr v3: the
    ``attributes`` of ``zarr.json``), keeping everything else."""
    meta_path = path / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("attributes", {})["napari_simwarp"] = ours
    partial = path / ".zarr.json.partial"
    partial.write_text(json.dumps(meta, indent=2))
    partial.replace(meta_path)


def _root_attributes(path: pathlib.Path) -> dict:
    meta_path = path / "zarr.json"
    if not path.is_dir() or not meta_path.is_file():
        if not path.exists():
            raise FileNotFoundError(f"transform file {where(path)} does not exist")
        raise TransformFileError(f"{where(path)} is not {_EXPECTED} (no zarr.json)")
    try:
        return json.loads(meta_path.read_text()).get("attributes", {})
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TransformFileError(f"{where(path)}: its zarr.json is not JSON ({exc})") from None


def _grid_of_image(path: pathlib.Path, image: str, d: int):
    """``(spacing, origin)`` of an image group's first dataset (scale, translation)."""
    try:
        attrs = json.loads((path / image / "zarr.json").read_text())["attributes"]["ome"]
        transforms = attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"]
    except (OSError, KeyError, IndexError, json.JSONDecodeError):
        return None
    spacing, origin = [1.0] * d, [0.0] * d
    flat = []
    for t in transforms:
        flat += t.get("transformations", []) if t.get("type") == "sequence" else [t]
    for t in flat:
        if t.get("type") == "scale":
            spacing = list(map(float, t["scale"]))[-d:]
        elif t.get("type") == "translation":
            origin = list(map(float, t["translation"]))[-d:]
    return spacing, origin


def read_ngff(path):
    """Read the transform of a scene written by :func:`write_ngff` (or any 0.6 scene
    whose first transformation is an ``affine`` or a ``displacements`` between two
    coordinate systems).

    Returns ``(kind, matrix, field, fixed_grid, moving_grid)``: ``matrix`` the homogeneous
    fixed → moving physical matrix (array order) or None, ``field`` the physical
    displacement on the fixed grid or None, grids ``(spacing, origin)`` or None where
    the file does not say.
    """
    path = pathlib.Path(path)
    attrs = _root_attributes(path)
    scene = attrs.get("ome", {}).get("scene") if isinstance(attrs.get("ome"), dict) else None
    transforms = (scene or {}).get("coordinateTransformations") or []
    if not transforms:
        raise TransformFileError(
            f"{where(path)} is not {_EXPECTED}: its root has no ome.scene.coordinateTransformations"
        )
    transform = transforms[0]
    ours = attrs.get("napari_simwarp", {})
    grids = [ours.get(k) for k in ("fixed_grid", "moving_grid")]
    grids = [None if g is None else (g["spacing"], g["origin"]) for g in grids]
    kind_name = transform.get("type")
    if kind_name == "affine":
        forward = np.asarray(transform["affine"], dtype=np.float64)
        d = forward.shape[0]
        if forward.shape != (d, d + 1):
            raise TransformFileError(f"{where(path)}: the affine is {forward.shape}, not (D, D+1)")
        full = np.vstack([forward, np.eye(d + 1)[-1]])
        # moving → fixed points as stored unless the transform runs fixed → moving
        matrix = full if _ends(transform) == ("fixed", "moving") else np.linalg.inv(full)
        field = None
    elif kind_name == "displacements":
        nz = _ngff_zarr()
        field_path = path / transform["path"]
        multiscales = nz.from_ome_zarr(str(field_path))
        field = np.asarray(multiscales.images[0].data, dtype=np.float64)
        d = field.shape[0]
        matrix = None
        if grids[0] is None:
            image = multiscales.images[0]
            dims = _DIMS[d]
            grids[0] = ([image.scale[k] for k in dims], [image.translation[k] for k in dims])
    else:
        raise TransformFileError(
            f"{where(path)} holds a {kind_name!r} transformation; napari-simwarp reads "
            "'affine' and 'displacements'"
        )
    for i, image in enumerate(("fixed", "moving")):
        if grids[i] is None:
            grids[i] = _grid_of_image(path, image, d)
    kind = ours.get("kind", "affine" if matrix is not None else "displacement")
    return kind, matrix, field, grids[0], grids[1]


def _ends(transform) -> tuple[str, str]:
    """``(input, output)`` names, a path standing for its image ("fixed", "moving")."""
    return tuple(
        (transform.get(end) or {}).get("path") or (transform.get(end) or {}).get("name", "")
        for end in ("input", "output")
    )
