"""Transforms saved in the formats other tools read, checked by those tools: SimpleITK's
Resample for ITK files, transformix (itk-elastix) for elastix files, napari-ome-zarr's
reader for OME-Zarr scenes; round trips back through load_transform."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from napari_simwarp.registration import AffineTransform, DisplacementTransform, load_transform
from napari_simwarp.registration.grid import Grid
from tests.images import random_smooth
from tests.registration.cases import smooth_field

sitk = pytest.importorskip("SimpleITK")

GRIDS = {
    2: (Grid.make(2, (0.8, 0.5), (3.0, -2.0)), Grid.make(2, (0.6, 0.7), (-1.0, 4.0))),
    3: (
        Grid.make(3, (2.0, 0.5, 0.6), (1.0, -2.0, 0.5)),
        Grid.make(3, (1.5, 0.4, 0.7), (0.0, 1.0, -3.0)),
    ),
}
SHAPES = {2: ((40, 52), (44, 46)), 3: ((12, 30, 26), (14, 32, 24))}


def _physical_transform(d: int) -> AffineTransform:
    """A rotation, a scaling and a shift of the sample, in physical space."""
    fixed, moving = GRIDS[d]
    rotation = Rotation.from_rotvec([0.0, 0.0, 0.12] if d == 2 else [0.05, -0.08, 0.1])
    linear = rotation.as_matrix()[-d:, -d:] * 1.04
    physical = np.eye(d + 1)
    physical[:d, :d] = linear
    physical[:d, d] = [1.5, -0.7, 0.9][:d]
    # placed so that the moving image is sampled inside its field of view
    fixed_center = fixed.to_physical() @ [*((np.array(SHAPES[d][0]) - 1) / 2), 1]
    moving_center = moving.to_physical() @ [*((np.array(SHAPES[d][1]) - 1) / 2), 1]
    physical[:d, d] += moving_center[:d] - physical[:d] @ fixed_center
    matrix = moving.to_pixels() @ physical @ fixed.to_physical()
    return AffineTransform(matrix).with_grids(fixed, moving)


def _sitk_image(array, grid: Grid):
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(grid.spacing[::-1])
    image.SetOrigin(grid.origin[::-1])
    return image


def _sitk_resample(path, moving, fixed_shape, fixed_grid, moving_grid):
    reference = _sitk_image(np.zeros(fixed_shape), fixed_grid)
    out = sitk.Resample(
        _sitk_image(moving, moving_grid),
        reference,
        sitk.ReadTransform(str(path)),
        sitk.sitkLinear,
        0.0,
        sitk.sitkFloat64,
    )
    return sitk.GetArrayFromImage(out)


def _inside(transform, fixed_shape, moving_shape, margin=1.0):
    """The fixed pixels whose source lies ``margin`` pixels inside the moving image."""
    d = transform.to_displacement(fixed_shape)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in fixed_shape], indexing="ij"))
    src = grid + d
    lim = np.reshape(moving_shape, (-1, *[1] * len(fixed_shape)))
    return ((src >= margin) & (src <= lim - 1 - margin)).all(0)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("suffix", [".tfm", ".txt", ".h5"])
def test_itk_file_resampled_by_simpleitk_matches_apply(tmp_path, rng, d, suffix):
    fixed_shape, moving_shape = SHAPES[d]
    transform = _physical_transform(d)
    moving = random_smooth(rng, moving_shape, 2.0)
    path = transform.save(tmp_path / f"t{suffix}")
    assert path.suffix == suffix
    ours = transform.apply(moving, output_shape=fixed_shape)
    theirs = _sitk_resample(path, moving, fixed_shape, *GRIDS[d])
    inside = _inside(transform, fixed_shape, moving_shape)
    assert inside.mean() > 0.3
    np.testing.assert_allclose(ours[inside], theirs[inside], atol=1e-4)
    back = load_transform(path, fixed_grid=GRIDS[d][0], moving_grid=GRIDS[d][1])
    np.testing.assert_allclose(back.matrix, transform.matrix, atol=1e-12)


@pytest.mark.parametrize("d", [2, 3])
def test_itk_displacement_field_resampled_by_simpleitk_matches_apply(tmp_path, rng, d):
    fixed_grid, moving_grid = GRIDS[d]
    fixed_shape, moving_shape = SHAPES[d]
    linear = _physical_transform(d)
    field = linear.to_displacement(fixed_shape) + smooth_field(rng, fixed_shape, 1.5, 4.0)
    transform = DisplacementTransform(field).with_grids(fixed_grid, moving_grid)
    # on two grids x + d(x) are the moving image's own pixels, whatever its shape: the
    # field is not resized to it (the fixed grid's shape comes out)
    moving = random_smooth(rng, moving_shape, 2.0)
    path = transform.save(tmp_path / "field.h5")
    theirs = _sitk_resample(path, moving, fixed_shape, fixed_grid, moving_grid)
    inside = _inside(transform, fixed_shape, moving_shape)
    assert inside.mean() > 0.3
    back = load_transform(path, moving_grid=moving_grid)
    assert back.fixed_grid == fixed_grid
    np.testing.assert_allclose(back.displacement, field, atol=1e-5)
    for t in (transform, back):
        ours = t.apply(moving)
        assert ours.shape == fixed_shape
        np.testing.assert_allclose(ours[inside], theirs[inside], atol=1e-4)
    with pytest.raises(ValueError, match="another grid"):
        back.to_displacement(moving_shape)


@pytest.mark.parametrize("d", [2, 3])
def test_elastix_file_applied_by_transformix_matches_apply(tmp_path, rng, d):
    itk = pytest.importorskip("itk")
    fixed_shape, moving_shape = SHAPES[d]
    fixed_grid, moving_grid = GRIDS[d]
    transform = _physical_transform(d)
    moving = random_smooth(rng, moving_shape, 2.0).astype(np.float32)
    path = transform.save(tmp_path / "TransformParameters.0.txt", fixed_shape=fixed_shape)
    parameters = itk.ParameterObject.New()
    parameters.ReadParameterFile(str(path))
    image = itk.image_view_from_array(moving)
    image.SetSpacing(moving_grid.spacing[::-1])
    image.SetOrigin(moving_grid.origin[::-1])
    theirs = np.asarray(itk.transformix_filter(image, parameters, log_to_console=False))
    assert theirs.shape == fixed_shape
    ours = transform.apply(moving, output_shape=fixed_shape)
    inside = _inside(transform, fixed_shape, moving_shape)
    np.testing.assert_allclose(ours[inside], theirs[inside], atol=1e-3)
    back = load_transform(path, moving_grid=moving_grid)
    assert back.fixed_grid == fixed_grid
    np.testing.assert_allclose(back.matrix, transform.matrix, atol=1e-10)


def test_elastix_needs_the_fixed_shape_and_a_linear_transform(tmp_path):
    transform = _physical_transform(2)
    with pytest.raises(ValueError, match="fixed_shape must be the fixed image's spatial shape"):
        transform.save(tmp_path / "TransformParameters.0.txt")
    field = DisplacementTransform(np.zeros((2, 8, 8)))
    with pytest.raises(ValueError, match="elastix parameter files are written for linear"):
        field.save(tmp_path / "x.txt", format="elastix")


@pytest.mark.parametrize("d", [2, 3])
def test_ome_zarr_scene_opens_in_napari_with_moving_over_fixed(tmp_path, rng, d):
    pytest.importorskip("ngff_zarr")
    reader_module = pytest.importorskip("napari_ome_zarr._reader")
    fixed_shape, moving_shape = SHAPES[d]
    fixed_grid, moving_grid = GRIDS[d]
    transform = _physical_transform(d)
    fixed, moving = rng.random(fixed_shape), rng.random(moving_shape)
    path = transform.save(
        tmp_path / "pair.ome.zarr", fixed_image=fixed, moving_image=moving, units="micrometer"
    )
    layers = reader_module.napari_get_reader(str(path))(str(path))
    by_shape = {data[0].shape: meta for data, meta, kind in layers if kind == "image"}
    assert set(by_shape) == {fixed_shape, moving_shape}

    def world(meta, pixel):
        """Where napari draws a pixel of the layer: affine ∘ scale (translate is 0)."""
        scaled = np.asarray(meta["scale"]) * pixel
        m = meta["affine"].affine_matrix
        return m[:d, :d] @ scaled + m[:d, d] + np.asarray(meta.get("translate", 0.0))

    for pixel in rng.uniform(0, 10, (4, d)):
        np.testing.assert_allclose(
            world(by_shape[fixed_shape], pixel), fixed_grid.to_physical()[:d] @ [*pixel, 1]
        )
        # a moving pixel is drawn at the fixed physical point the transform sends to it
        fixed_physical = np.linalg.solve(
            transform.physical_matrix, moving_grid.to_physical() @ [*pixel, 1]
        )[:d]
        np.testing.assert_allclose(world(by_shape[moving_shape], pixel), fixed_physical, atol=1e-9)
    back = load_transform(path)
    assert (back.fixed_grid, back.moving_grid, back.kind) == (fixed_grid, moving_grid, "affine")
    np.testing.assert_allclose(back.matrix, transform.matrix, atol=1e-10)


def test_ome_zarr_displacement_field_round_trip(tmp_path, rng):
    ngff_zarr = pytest.importorskip("ngff_zarr")
    fixed_grid, moving_grid = GRIDS[2]
    field = smooth_field(rng, (20, 24), 2.0, 4.0)
    transform = DisplacementTransform(field).with_grids(fixed_grid, moving_grid)
    path = transform.save(tmp_path / "field.zarr")
    scene = ngff_zarr.from_ome_zarr(str(path), kind="scene")  # valid for ngff-zarr's reader
    (stored,) = scene.coordinateTransformations
    assert stored.type == "displacements" and stored.input.name == "fixed"
    back = load_transform(path)
    assert (back.fixed_grid, back.moving_grid) == (fixed_grid, moving_grid)
    np.testing.assert_allclose(back.displacement, field, atol=1e-5)
    transform.save(path)  # our own scene is replaced


def test_a_zarr_directory_not_written_here_is_never_replaced(tmp_path):
    pytest.importorskip("ngff_zarr")
    store = tmp_path / "images.zarr"
    store.mkdir()
    (store / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(FileExistsError, match="not replaced"):
        _physical_transform(2).save(store)
    assert (store / "zarr.json").read_text() == '{"zarr_format": 3, "node_type": "group"}'


# -- the lossless default, format choice and bad input ---------------------------------


def test_npz_stays_the_default_and_format_overrides_the_extension(tmp_path):
    transform = _physical_transform(2)
    assert transform.save(tmp_path / "plain").name == "plain.npz"
    path = transform.save(tmp_path / "itk.bin", format="itk")
    assert path.read_text().startswith("#Insight Transform File V1.0")
    back = load_transform(path, format="itk", fixed_grid=GRIDS[2][0], moving_grid=GRIDS[2][1])
    np.testing.assert_allclose(back.matrix, transform.matrix, atol=1e-12)


def test_a_grid_passed_for_a_file_that_holds_another_is_refused(tmp_path):
    transform = _physical_transform(2)
    path = transform.save(tmp_path / "t.npz")
    with pytest.raises(ValueError, match="holds its fixed_grid"):
        load_transform(path, fixed_grid=Grid.make(2, 0.1))


@pytest.mark.parametrize(
    "name, content, error, message",
    [
        ("t.tfm", "hello", ValueError, "not an ITK transform file"),
        (
            "t.tfm",
            "#Insight Transform File V1.0\nTransform: BSplineTransform_double_2_2\n"
            "Parameters: 1 2\nFixedParameters: 0\n",
            ValueError,
            "BSplineTransform_double_2_2.*does not read",
        ),
        ("TransformParameters.0.txt", "(Foo 1)\n", ValueError, "no \\(Transform"),
        (
            "TransformParameters.1.txt",
            '(Transform "BSplineTransform")\n(FixedImageDimension 2)\n',
            ValueError,
            "BSplineTransform",
        ),
        ("t.h5", "not hdf5", ValueError, "not an ITK transform file"),
        ("t.zarr", None, ValueError, "not an OME-Zarr"),
        ("pairs.csv", "x", ValueError, "BigWarp landmark table holds point pairs"),
    ],
)
def test_files_of_the_wrong_kind_are_refused_with_the_path(tmp_path, name, content, error, message):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(error, match=message) as info:
        load_transform(path)
    assert str(path) in str(info.value)


def test_unknown_formats_and_options_are_named(tmp_path):
    transform = _physical_transform(2)
    with pytest.raises(ValueError, match="format must be one of"):
        transform.save(tmp_path / "t.npz", format="ants")
    with pytest.raises(ValueError, match="format must be one of"):
        load_transform(tmp_path / "t.npz", format="ants")
    with pytest.raises(TypeError, match="unexpected option\\(s\\) fixed_shape"):
        transform.save(tmp_path / "t.tfm", fixed_shape=(3, 3))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_transform(tmp_path / "missing.tfm")
    field = DisplacementTransform(np.zeros((2, 8, 8)))
    with pytest.raises(ValueError, match="written as ITK HDF5"):
        field.save(tmp_path / "f.tfm")


# -- grids beside the files that cannot hold them --------------------------------------


def _saved(tmp_path, d, kind):
    """A transform with both grids set, saved as ``kind``; ``(transform, path)``."""
    fixed_shape = SHAPES[d][0]
    transform = _physical_transform(d)
    if kind == "field":
        field = transform.to_displacement(fixed_shape)
        transform = DisplacementTransform(field).with_grids(*GRIDS[d])
        return transform, transform.save(tmp_path / "field.h5")
    if kind == "elastix":
        return transform, transform.save(
            tmp_path / "TransformParameters.0.txt", fixed_shape=fixed_shape
        )
    return transform, transform.save(tmp_path / f"t{kind}")


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("kind", [".tfm", ".h5", "field", "elastix"])
def test_grids_travel_beside_itk_and_elastix_files(tmp_path, d, kind):
    """Saved and loaded with no grid passed, the pixel form is the original (it was off by
    0.6-15 px when the grids were dropped), with no warning; SimpleITK still reads the
    file itself."""
    transform, path = _saved(tmp_path, d, kind)
    sidecar = path.with_name(path.name + ".grids.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, sidecar.name])
    if kind != "elastix":
        sitk.ReadTransform(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = load_transform(path)
    assert (back.fixed_grid, back.moving_grid) == GRIDS[d]
    fixed_shape = SHAPES[d][0]
    np.testing.assert_allclose(
        back.to_displacement(fixed_shape), transform.to_displacement(fixed_shape), atol=1e-5
    )


def test_without_grids_a_warning_says_the_pixel_form_depends_on_them(tmp_path):
    transform = _physical_transform(2)
    path = tmp_path / "theirs.tfm"
    sitk.WriteTransform(sitk.AffineTransform(2), str(path))  # no grids beside
    with pytest.warns(UserWarning, match="holds no fixed_grid and moving_grid .*unit grid"):
        load_transform(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_transform(path, fixed_grid=GRIDS[2][0], moving_grid=GRIDS[2][1])
    # an elastix file holds the fixed grid: only the moving one is missing
    elastix_path = transform.save(tmp_path / "TransformParameters.0.txt", fixed_shape=(40, 52))
    elastix_path.with_name(elastix_path.name + ".grids.json").unlink()
    with pytest.warns(UserWarning, match="holds no moving_grid \\("):
        back = load_transform(elastix_path)
    assert back.fixed_grid == GRIDS[2][0]


def test_grids_left_beside_a_rewritten_file_are_not_applied(tmp_path):
    _, path = _saved(tmp_path, 2, ".tfm")
    sitk.WriteTransform(sitk.TranslationTransform(2, (1.0, 2.0)), str(path))  # another tool
    with pytest.warns(UserWarning, match="written with another version"):
        back = load_transform(path, fixed_grid=GRIDS[2][1], moving_grid=GRIDS[2][1])
    np.testing.assert_allclose(back.physical_matrix[:2, 2], [2.0, 1.0])
    assert back.fixed_grid == GRIDS[2][1]


def test_a_transform_and_its_grids_are_written_together_or_not_at_all(tmp_path):
    transform = _physical_transform(2)
    (tmp_path / "t.tfm.grids.json").mkdir()  # the sidecar cannot be written
    with pytest.raises(OSError, match="t.tfm.grids.json"):
        transform.save(tmp_path / "t.tfm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tfm.grids.json"]


@pytest.mark.parametrize("shape", [(40.7, 50.2), (40, "x"), "40", (40,), (40, 0), (True, 3)])
def test_a_fixed_shape_that_is_not_whole_numbers_is_refused(tmp_path, shape):
    with pytest.raises(ValueError, match="fixed_shape must be .* positive ints") as info:
        _physical_transform(2).save(tmp_path / "TransformParameters.0.txt", fixed_shape=shape)
    assert repr(shape) in str(info.value)
    assert not list(tmp_path.iterdir())


def test_save_errors_name_the_users_path_and_long_names_fit(tmp_path):
    transform = _physical_transform(2)
    with pytest.raises(FileNotFoundError) as info:
        transform.save("/no/such/dir/t.npz")
    assert "'/no/such/dir/t.npz'" in str(info.value) and "partial" not in str(info.value)
    # a name of 255 bytes fits the file system: its temporary name must too
    longest = tmp_path / ("a" * 251 + ".npz")
    assert transform.save(longest) == longest
    assert sorted(p.name for p in tmp_path.iterdir()) == [longest.name]
    with pytest.raises(OSError, match="256 bytes, longer than the 255"):
        transform.save(tmp_path / ("a" * 252 + ".npz"))
