"""elastix parameter files: Euler/similarity files read as ITK's types apply them, chains
composed in elastix's order, bad files named. (transformix applying our files:
tests/registration/test_transform_files.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from napari_simwarp.io.transform_files import TransformFileError
from napari_simwarp.io.transform_files.elastix import read_elastix, write_elastix

sitk = pytest.importorskip("SimpleITK")


def _file(path, transform, parameters, center, initial="NoInitialTransform", d=2, extra=""):
    path.write_text(
        f'(Transform "{transform}")\n(TransformParameters {" ".join(map(str, parameters))})\n'
        f"(CenterOfRotationPoint {' '.join(map(str, center))})\n"
        f'(InitialTransformParameterFileName "{initial}")\n(FixedImageDimension {d})\n'
        f"(Size {' '.join(['9'] * d)})\n(Spacing {' '.join(['0.5'] * d)})\n"
        f"(Origin {' '.join(['1'] * d)})\n{extra}"
    )
    return path


def _apply(matrix, point):
    d = len(point)
    return matrix[:d, :d] @ point + matrix[:d, d]


@pytest.mark.parametrize(
    "name, parameters, center, itk, extra",
    [
        ("EulerTransform", [0.3, 1.0, -2.0], [4.0, 5.0], sitk.Euler2DTransform, ""),
        ("SimilarityTransform", [1.1, 0.2, 1.0, 2.0], [1.0, 3.0], sitk.Similarity2DTransform, ""),
        (
            "EulerTransform",
            [0.1, -0.2, 0.3, 1.0, 2.0, 3.0],
            [1.0, 2.0, 3.0],
            sitk.Euler3DTransform,
            '(ComputeZYX "true")\n',
        ),
    ],
)
def test_elastix_types_are_read_as_itk_applies_them(tmp_path, name, parameters, center, itk, extra):
    d = len(center)
    path = _file(tmp_path / "p.txt", name, parameters, center, d=d, extra=extra)
    matrix, kind, size, spacing, origin = read_elastix(path)
    reference = itk()
    reference.SetCenter(center)
    reference.SetParameters(parameters)
    if extra:
        reference.SetComputeZYX(True)
    for point in np.random.default_rng(0).normal(0, 5, (4, d)):
        expected = np.array(reference.TransformPoint(tuple(point[::-1])))[::-1]
        np.testing.assert_allclose(_apply(matrix, point), expected, atol=1e-10)
    assert kind == {"EulerTransform": "rigid", "SimilarityTransform": "similarity"}[name]
    assert (size, spacing, origin) == ((9,) * d, (0.5,) * d, (1.0,) * d)


def test_a_chain_applies_the_initial_transform_first(tmp_path):
    first = _file(
        tmp_path / "TransformParameters.0.txt", "TranslationTransform", [3.0, -1.0], [0, 0]
    )
    second = _file(
        tmp_path / "TransformParameters.1.txt",
        "AffineTransform",
        [1.0, 0.2, 0.0, 0.9, 0.5, 0.5],
        [0, 0],
        initial=first.name,  # relative to the file's folder, as elastix writes it here
    )
    matrix, kind, *_ = read_elastix(second)
    point = np.array([2.0, 7.0])  # array order (y, x)
    x, y = point[::-1] + [3.0, -1.0]  # the translation first, in x, y
    expected = np.array([1.0 * x + 0.2 * y + 0.5, 0.9 * y + 0.5])[::-1]
    np.testing.assert_allclose(_apply(matrix, point), expected)
    assert kind == "affine"


def test_round_trip(tmp_path, rng):
    matrix = np.eye(3)
    matrix[:2] = rng.normal(0, 1, (2, 3))
    path = write_elastix(tmp_path / "t.txt", matrix, (20, 30), (0.5, 0.25), (1.0, 2.0))
    back, kind, size, spacing, origin = read_elastix(path)
    np.testing.assert_allclose(back, matrix, atol=1e-14)
    assert (kind, size, spacing, origin) == ("affine", (20, 30), (0.5, 0.25), (1.0, 2.0))


def test_loops_missing_initial_files_and_added_chains_are_refused(tmp_path):
    loop = _file(tmp_path / "a.txt", "TranslationTransform", [1, 1], [0, 0], initial="a.txt")
    with pytest.raises(TransformFileError, match="loop"):
        read_elastix(loop)
    missing = _file(tmp_path / "b.txt", "TranslationTransform", [1, 1], [0, 0], initial="no.txt")
    with pytest.raises(TransformFileError, match="'no.txt', which does not exist"):
        read_elastix(missing)
    added = _file(
        tmp_path / "c.txt",
        "TranslationTransform",
        [1, 1],
        [0, 0],
        initial="b.txt",
        extra='(HowToCombineTransforms "Add")\n',
    )
    with pytest.raises(TransformFileError, match="composed chains only"):
        read_elastix(added)


@pytest.mark.parametrize(
    "name, parameters, d, extra, message",
    [
        # a short list was broadcast: (TransformParameters 1 0 0 1 7) gave translation [7, 7]
        ("AffineTransform", [1, 0, 0, 1, 7], 2, "", "'AffineTransform' has 6 parameters, found 5"),
        ("EulerTransform", [0.1, 4], 2, "", "'EulerTransform' has 3 parameters, found 2"),
        ("AffineTransform", [1, 0, 0, 1, 2, 3, 4, 5], 2, "", "has 6 parameters, found 8"),
        ("SimilarityTransform", [0, 0, 0, 1, 2, 3], 3, "", "has 7 parameters, found 6"),
        (
            "AffineTransform",
            [1, 0, 0, 1, 2, 3],
            2,
            "(NumberOfParameters 5)\n",
            r"\(NumberOfParameters 5\) but \(TransformParameters ...\) has 6 values",
        ),
        # a 2-D file's direction needs 4 values (a raw reshape error before)
        ("AffineTransform", [1, 0, 0, 1, 2, 3], 2, "(Direction 1 0 0)\n", "3 values, expected 4"),
    ],
)
def test_counts_that_do_not_fit_the_transform_are_refused(
    tmp_path, name, parameters, d, extra, message
):
    path = _file(tmp_path / "p.txt", name, parameters, [0] * d, d=d, extra=extra)
    with pytest.raises(TransformFileError, match=message) as info:
        read_elastix(path)
    assert str(path) in str(info.value)


def test_a_center_of_the_wrong_length_is_refused(tmp_path):
    path = _file(tmp_path / "p.txt", "EulerTransform", [0.1, 1, 2], [1, 2, 3])
    with pytest.raises(TransformFileError, match=r"CenterOfRotationPoint .*3 values, expected 2"):
        read_elastix(path)
