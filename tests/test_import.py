"""`import napari_simwarp` stays light: no Qt, no napari, nothing compiled, torch on demand."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('\\n'.join(sys.modules))"],
        check=True, capture_output=True, text=True,
    ).stdout
    return set(out.split())


def test_import_pulls_no_gui_and_no_torch():
    mods = _modules_after("import napari_simwarp")
    gui = {m for m in mods if m.split(".")[0] in {"napari", "qtpy", "PyQt5", "PyQt6", "PySide2",
                                                  "PySide6", "magicgui", "vispy"}}
    assert not gui, f"GUI modules imported: {sorted(gui)}"
    assert "torch" not in mods


def test_ops_import_pulls_no_gui():
    mods = _modules_after("import napari_simwarp.ops")
    assert "torch" in mods
    assert not {m for m in mods if m.split(".")[0] in {"napari", "qtpy", "PyQt5", "magicgui"}}


def test_version():
    import napari_simwarp

    assert napari_simwarp.__version__.count(".") == 2
