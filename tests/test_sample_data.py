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


def test_manifest_is_valid():
    npe2 = pytest.importorskip("npe2")
    path = pathlib.Path(__file__).parents[1] / "src" / "napari_simwarp" / "napari.yaml"
    manifest = npe2.PluginManifest.from_file(path)
    assert {w.display_name for w in manifest.contributions.widgets} == {
        "Similarity map",
        "Template matching",
        "Register",
    }
    assert len(manifest.contributions.sample_data) == 3


def test_import_does_not_pull_qt_or_napari():
    code = (
        "import sys, napari_simwarp, napari_simwarp.widgets_logic.similarity, "
        "napari_simwarp.widgets_logic.registration, napari_simwarp._sample_data; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('napari', 'qtpy', 'PyQt5', 'PySide2', 'PyQt6', 'PySide6', 'magicgui')]; "
        "print(bad); raise SystemExit(bool(bad))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
