"""The npe2 sample-data functions and the manifest (no Qt needed)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from napari_simwarp import _sample_data


def test_samples_are_layer_data_tuples():
    pair = _sample_data.deformed_pair()
    assert [t[1]["name"] for t in pair] == ["fixed", "moving"]
    assert pair[1][1]["metadata"]["true_displacement"].shape == (2, 512, 512)
    ((stack, meta, kind),) = _sample_data.drifting_timelapse()
    assert stack.ndim == 3 and kind == "image" and meta["metadata"]["true_shifts"].shape[1] == 2
    vol = _sample_data.deformed_volume_pair()
    assert vol[0][0].ndim == 3 and np.isfinite(vol[1][0]).all()


def test_anisotropic_sample_carries_its_scale_and_a_true_physical_transform():
    from scipy import ndimage as ndi

    fixed, moving = _sample_data.anisotropic_volume_pair()
    spacing = np.array(fixed[1]["scale"])
    assert tuple(spacing) == (3.0, 1.0, 1.0) and moving[1]["scale"] == fixed[1]["scale"]
    physical = moving[1]["metadata"]["true_physical_matrix"]
    # the moving volume resampled by SciPy through the truth, in pixels, is the fixed one
    grid = np.diag([*spacing, 1.0])
    pixels = np.linalg.inv(grid) @ physical @ grid
    back = ndi.affine_transform(moving[0], pixels, order=1, mode="nearest")
    inner = (slice(3, -3), slice(12, -12), slice(12, -12))
    assert np.corrcoef(back[inner].ravel(), fixed[0][inner].ravel())[0, 1] > 0.98
    unaligned = np.corrcoef(moving[0][inner].ravel(), fixed[0][inner].ravel())[0, 1]
    assert unaligned < 0.9


def test_manifest_is_valid():
    npe2 = pytest.importorskip("npe2")
    path = pathlib.Path(__file__).parents[1] / "src" / "napari_simwarp" / "napari.yaml"
    manifest = npe2.PluginManifest.from_file(path)
    assert {w.display_name for w in manifest.contributions.widgets} == {
        "Similarity map",
        "Template matching",
        "Register",
    }
    assert len(manifest.contributions.sample_data) == 4


def test_import_does_not_pull_qt_or_napari():
    code = (
        "import sys, napari_simwarp, napari_simwarp.widgets_logic.similarity, "
        "napari_simwarp.widgets_logic.registration, napari_simwarp._sample_data; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('napari', 'qtpy', 'PyQt5', 'PySide2', 'PyQt6', 'PySide6', 'magicgui')]; "
        "print(bad); raise SystemExit(bool(bad))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
