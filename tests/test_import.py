"""`import napari_simwarp` stays light: no Qt, no napari, nothing compiled, torch on demand.

Each check runs in a fresh interpreter (this one has long imported everything) with an
empty build cache, and reads back ``sys.modules`` and the cache's contents.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

#: top-level names of the GUI stack
GUI = {"napari", "qtpy", "PyQt5", "PyQt6", "PySide2", "PySide6", "magicgui", "superqt", "vispy"}


def _fresh_import(code: str, cache_dir) -> tuple[set[str], list[str]]:
    """``(top-level modules loaded, files in the build cache)`` after running ``code``."""
    probe = (
        code + "\nimport sys, os, json\n"
        "print(json.dumps([sorted({m.split('.')[0] for m in sys.modules}), "
        "os.listdir(os.environ['SIMWARP_CACHE_DIR'])]))\n"
    )
    env = {**os.environ, "SIMWARP_CACHE_DIR": str(cache_dir), "SIMWARP_BACKEND": "auto"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    modules, cache = json.loads(result.stdout.strip().splitlines()[-1])
    return set(modules), cache


def test_import_napari_simwarp_loads_no_torch_no_gui_and_builds_nothing(tmp_path):
    modules, cache = _fresh_import("import napari_simwarp", tmp_path)
    assert "napari_simwarp" in modules
    assert not modules & GUI, sorted(modules & GUI)
    assert "torch" not in modules
    assert cache == []


def test_import_ops_loads_torch_but_no_gui_and_builds_nothing(tmp_path):
    modules, cache = _fresh_import("import napari_simwarp.ops", tmp_path)
    assert "torch" in modules
    assert not modules & GUI, sorted(modules & GUI)
    assert cache == []


def test_registration_and_command_line_parser_load_no_torch(tmp_path):
    # The registration package's names load on first use, and `napari-simwarp --help`
    # needs argparse only.
    modules, cache = _fresh_import(
        "import napari_simwarp.registration\n"
        "from napari_simwarp._cli import build_parser\n"
        "build_parser().format_help()\n",
        tmp_path,
    )
    assert "torch" not in modules and not modules & GUI
    assert cache == []


def test_register_is_the_registration_function_with_keyword_only_options():
    import importlib

    import napari_simwarp

    register_module = importlib.import_module("napari_simwarp.registration.pair")
    assert napari_simwarp.register is register_module.register
    assert inspect.isfunction(napari_simwarp.register)
    params = list(inspect.signature(napari_simwarp.register).parameters.values())
    assert [p.name for p in params[:2]] == ["fixed", "moving"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[:2])
    assert len(params) > 2
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[2:]), [
        p.name for p in params[2:] if p.kind is not inspect.Parameter.KEYWORD_ONLY
    ]
    assert {"model", "metric", "device", "callback"} <= {p.name for p in params}


def test_top_level_names_are_the_registration_ones_and_unknown_names_fail():
    import importlib

    import napari_simwarp
    from napari_simwarp import backend

    stack = importlib.import_module("napari_simwarp.registration.stack")
    transforms = importlib.import_module("napari_simwarp.registration.transforms")
    assert napari_simwarp.register_stack is stack.register_stack
    assert napari_simwarp.load_transform is transforms.load_transform
    assert napari_simwarp.backend_info is backend.backend_info
    assert {"register", "register_stack", "ops", "registration"} <= set(dir(napari_simwarp))
    with pytest.raises(AttributeError, match="no attribute 'regster'"):
        napari_simwarp.regster  # noqa: B018


def test_registration_exports_stay_functions_after_the_top_level_ones_are_used():
    # The README's `sw.register(...)`, then the registration package's documented
    # `from napari_simwarp.registration import register, register_stack`.
    code = (
        "import napari_simwarp as sw\n"
        "sw.register, sw.register_stack\n"
        "from napari_simwarp.registration import register, register_stack\n"
        "import json\n"
        "print(json.dumps([callable(register), callable(register_stack)]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [True, True]


def test_version():
    import napari_simwarp

    parts = napari_simwarp.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts)
