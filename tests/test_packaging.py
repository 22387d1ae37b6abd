"""The wheel carries the kernel sources (built on first use after a plain install)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_kernel_sources(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("napari_simwarp-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    csrc = ROOT / "src" / "napari_simwarp" / "csrc"
    expected = {f"napari_simwarp/csrc/{p.relative_to(csrc).as_posix()}"
                for p in csrc.rglob("*") if p.suffix in {".cpp", ".cu", ".h"}}
    assert expected and expected <= names, sorted(expected - names)
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Classifier: Framework :: napari" in text
    assert "License-Expression: BSD-3-Clause" in text
    assert "PyQt" not in text.split("Provides-Extra")[0]
