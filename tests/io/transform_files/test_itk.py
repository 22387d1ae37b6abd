"""ITK transform files: the types SimpleITK writes are read as SimpleITK applies them;
our files round-trip. (Resampling by SimpleITK: tests/registration/test_transform_files.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp.io.transform_files import TransformFileError
from napari_simwarp.io.transform_files.itk import read_itk, write_itk_displacement, write_itk_linear

sitk = pytest.importorskip("SimpleITK")


def test_simpleitk_written_types_are_read(tmp_path):
    """Euler, versor, similarity and composite transforms written by SimpleITK give the
    matrix SimpleITK applies."""
    cases = [
        sitk.Euler2DTransform((1.0, 2.0), 0.3, (4.0, -1.0)),
        sitk.Similarity2DTransform(1.2, 0.2, (0.5, 1.0), (2.0, 3.0)),
        sitk.Euler3DTransform((1.0, 2.0, 3.0), 0.1, -0.2, 0.3, (4.0, 5.0, 6.0)),
        sitk.VersorRigid3DTransform((0.1, 0.2, -0.1, np.sqrt(1 - 0.06)), (1.0, 2.0, 3.0)),
        sitk.Similarity3DTransform(0.9, (0.0, 0.1, 0.2, np.sqrt(0.95)), (1.0, -1, 2), (3, 2, 1)),
        sitk.ScaleTransform(2, (1.5, 0.5)),
        sitk.CompositeTransform(
            [sitk.TranslationTransform(2, (1.0, 2.0)), sitk.Euler2DTransform((0, 0), 0.4)]
        ),
    ]
    zyx = sitk.Euler3DTransform((1.0, 2.0, 3.0), 0.1, -0.2, 0.3, (4.0, 5.0, 6.0))
    zyx.SetComputeZYX(True)
    cases.append(zyx)
    for i, tx in enumerate(cases):
        path = tmp_path / f"t{i}.tfm"
        sitk.WriteTransform(tx, str(path))
        found, matrix, _ = read_itk(path)
        assert found == "linear"
        d = matrix.shape[0] - 1
        for point in np.random.default_rng(i).normal(0, 10, (5, d)):
            expected = np.array(tx.TransformPoint(tuple(point[::-1])))[::-1]
            got = matrix[:d, :d] @ point + matrix[:d, d]
            np.testing.assert_allclose(got, expected, atol=1e-9, err_msg=tx.GetName())


@pytest.mark.parametrize("suffix", [".tfm", ".h5"])
def test_linear_round_trip_and_kind(tmp_path, rng, suffix):
    matrix = np.eye(4)
    matrix[:3, :] = rng.normal(0, 1, (3, 4))
    path = write_itk_linear(tmp_path / f"a{suffix}", matrix)
    found, back, kind = read_itk(path)
    np.testing.assert_allclose(back, matrix, atol=1e-14)
    assert (found, kind) == ("linear", "affine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_itk_linear(path, matrix)


def test_displacement_round_trip_is_simpleitks_field(tmp_path, rng):
    field = rng.normal(0, 1, (2, 5, 7))
    path = write_itk_displacement(tmp_path / "d.h5", field, (0.5, 2.0), (1.0, -3.0))
    found, back, spacing, origin = read_itk(path)
    np.testing.assert_allclose(back, field)
    assert (found, spacing, origin) == ("displacement", (0.5, 2.0), (1.0, -3.0))
    image = sitk.DisplacementFieldTransform(sitk.ReadTransform(str(path))).GetDisplacementField()
    assert image.GetSize() == (7, 5) and image.GetSpacing() == (2.0, 0.5)
    vectors = sitk.GetArrayFromImage(image)  # (rows, cols, (x, y))
    np.testing.assert_allclose(vectors[..., ::-1], np.moveaxis(field, 0, -1))


def _text_file(path, type_name, parameters, fixed):
    path.write_text(
        f"#Insight Transform File V1.0\n#Transform 0\nTransform: {type_name}\n"
        f"Parameters: {parameters}\nFixedParameters: {fixed}\n"
    )
    return path


@pytest.mark.parametrize(
    "type_name, parameters, fixed, expected, found",
    [
        # a short list was broadcast: translation [7, 7], [5, 5], [4, 4], [2, 2, 2]
        ("AffineTransform_double_2_2", "1 0 0 1 7", "0 0", 6, 5),
        ("TranslationTransform_double_2_2", "5", "", 2, 1),
        ("Euler2DTransform_double_2_2", "0.1 4", "0 0", 3, 2),
        ("AffineTransform_double_3_3", "1 0 0 0 1 0 0 0 1 2", "0 0 0", 12, 10),
        # a long one was cut: the extras ignored
        ("AffineTransform_double_2_2", "1 0 0 1 2 3 4 5", "0 0", 6, 8),
        ("Similarity3DTransform_double_3_3", "0 0 0 1 2 3 1 9", "0 0 0", 7, 8),
    ],
)
def test_a_parameter_count_that_is_not_the_types_is_refused(
    tmp_path, type_name, parameters, fixed, expected, found
):
    path = _text_file(tmp_path / "t.tfm", type_name, parameters, fixed)
    with pytest.raises(TransformFileError, match=f"has {expected} parameters, found {found}"):
        read_itk(path)


def test_a_center_of_the_wrong_length_is_refused(tmp_path):
    """SimpleITK refuses a 2-D affine with one fixed parameter; so does the reader."""
    path = _text_file(tmp_path / "t.tfm", "AffineTransform_double_2_2", "1 0 0 1 2 3", "0")
    with pytest.raises(RuntimeError, match="fixed parameters"):
        sitk.ReadTransform(str(path))
    with pytest.raises(TransformFileError, match="has 0 or 2 fixed parameters, found 1"):
        read_itk(path)


def test_hdf5_parameter_count_is_checked(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = write_itk_linear(tmp_path / "a.h5", np.eye(3))
    with h5py.File(path, "r+") as h5:
        del h5["TransformGroup/0/TransformParameters"]
        h5["TransformGroup/0/TransformParameters"] = np.array([1.0, 0, 0, 1, 7])
    with pytest.raises(TransformFileError, match="has 6 parameters, found 5"):
        read_itk(path)
