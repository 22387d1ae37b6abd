"""The wheel carries the kernel sources (built on first use after a plain install) and
installed from it, the loader finds them; no build product is tracked."""

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
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("napari_simwarp-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    csrc = ROOT / "csrc"
    expected = {
        f"napari_simwarp/csrc/{p.relative_to(csrc).as_posix()}"
        for p in csrc.rglob("*")
        if p.suffix in {".cpp", ".cu", ".h"}
    }
    assert expected and expected <= names, sorted(expected - names)
    metadata = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Classifier: Framework :: napari" in text
    assert "License-Expression: BSD-3-Clause" in text
    assert "PyQt" not in text.split("Provides-Extra")[0]


def test_no_build_products_are_tracked():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    built = [
        f
        for f in files
        if f.endswith((".o", ".so", ".pyd", ".ninja_deps", ".ninja_log", "build.ninja", ".whl"))
    ]
    assert not built, built
