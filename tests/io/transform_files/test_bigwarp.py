"""BigWarp landmark CSV: BigWarp's own layout read as it is written, round trips, errors."""

import numpy as np
import pytest

from napari_simwarp.io.transform_files import TransformFileError
from napari_simwarp.io.transform_files.bigwarp import (
    read_bigwarp_landmarks,
    write_bigwarp_landmarks,
)

#: rows as BigWarp's LandmarkTableModel.save writes them (opencsv quotes every field):
#: name, active, moving x, y, z, target x, y, z
BIGWARP_3D = (
    '"Pt-0","true","10.5","20.0","3.0","11.0","19.5","2.5"\n'
    '"Pt-1","false","1.0","2.0","3.0","4.0","5.0","6.0"\n'
    '"Pt-2","true","-7.25","0.0","1e-3","-7.0","0.5","0.0"\n'
)


def test_reads_bigwarps_layout(tmp_path):
    path = tmp_path / "landmarks.csv"
    path.write_text(BIGWARP_3D)
    fixed, moving = read_bigwarp_landmarks(path)
    # array order is z, y, x; BigWarp's "target" is the fixed image
    np.testing.assert_array_equal(moving, [[3.0, 20.0, 10.5], [1e-3, 0.0, -7.25]])
    np.testing.assert_array_equal(fixed, [[2.5, 19.5, 11.0], [0.0, 0.5, -7.0]])
    fixed_all, _ = read_bigwarp_landmarks(path, include_inactive=True)
    np.testing.assert_array_equal(fixed_all[1], [6.0, 5.0, 4.0])


@pytest.mark.parametrize("d", [2, 3])
def test_round_trip_is_exact(tmp_path, rng, d):
    fixed, moving = rng.normal(0, 100, (7, d)), rng.normal(0, 100, (7, d))
    path = write_bigwarp_landmarks(tmp_path / "pairs.csv", fixed, moving)
    first = path.read_text().splitlines()[0].split(",")
    assert len(first) == 2 + 2 * d and first[:2] == ['"Pt-0"', '"true"']
    assert float(first[2].strip('"')) == moving[0, -1]  # x first
    back_fixed, back_moving = read_bigwarp_landmarks(path)
    np.testing.assert_array_equal(back_fixed, fixed)
    np.testing.assert_array_equal(back_moving, moving)


def test_never_writes_over_a_file_unless_asked(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("keep")
    points = np.zeros((2, 2))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_bigwarp_landmarks(path, points, points)
    assert path.read_text() == "keep"
    write_bigwarp_landmarks(path, points, points, overwrite=True)
    assert path.read_text().startswith('"Pt-0"')


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no rows"),
        ('"Pt-0","true","1","2","3"\n', "row 1 has 5 fields"),
        ('"Pt-0","yes","1","2","3","4"\n', "active field must be true or false"),
        ('"Pt-0","true","1","a","3","4"\n', "not a number"),
        ('"a","true","1","2","3","4"\n"b","true","1","2","3","4","5","6"\n', "row 2 is 3-D"),
    ],
)
def test_other_files_are_refused_with_the_path(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TransformFileError, match=message) as info:
        read_bigwarp_landmarks(path)
    assert str(path) in str(info.value)


def test_missing_binary_and_directory_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_bigwarp_landmarks(tmp_path / "none.csv")
    with pytest.raises(TransformFileError, match="is a directory"):
        read_bigwarp_landmarks(tmp_path)
    binary = tmp_path / "x.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(TransformFileError, match="not UTF-8"):
        read_bigwarp_landmarks(binary)
