"""The package's import graph: no cycles, and the layering of the design notes (DESIGN.md).

Every module under ``src/napari_simwarp`` is parsed with ``ast`` (nothing is imported).
An edge joins two modules of the package when one imports the other anywhere in the file,
function-local imports included; ``if TYPE_CHECKING:`` blocks are skipped. Relative
imports are resolved; ``from pkg import x`` is an edge to ``pkg.x`` when that is a module,
else to ``pkg``. (The lazy ``importlib.import_module`` exports of the two ``__init__``
files are not imports in this sense and are not counted.)
"""

from __future__ import annotations

import ast
import itertools
import pathlib

import pytest

PACKAGE = "napari_simwarp"
ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / PACKAGE
#: top-level names of the GUI stack: only ``_qt/`` may import them
GUI = {"qtpy", "napari", "magicgui", "superqt", "vispy", "PyQt5", "PyQt6", "PySide2", "PySide6"}


def find_modules(
    root: pathlib.Path, package: str = PACKAGE
) -> dict[str, tuple[pathlib.Path, bool]]:
    """Dotted module name → (file, is_package) for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join([package, *parts])] = (path, is_package)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, outside ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(source: str, module: str, is_package: bool, known: set[str]):
    """``(internal, external)`` imports of one module's source.

    internal: ``{(target module, line)}`` within the package; external: ``{(top-level
    name, line)}`` of everything else.
    """
    internal, external = set(), set()
    here = module if is_package else module.rpartition(".")[0]
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [(alias.name, node.lineno) for alias in node.names]
            targets = names
        else:
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append((sub if sub in known else base, node.lineno))
        for name, line in targets:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                # `import a.b.c` names a.b.c; keep the longest prefix that is a module
                while name not in known and "." in name:
                    name = name.rpartition(".")[0]
                internal.add((name, line))
            else:
                external.add((name.split(".")[0], line))
    return internal, external


def build_graph(root: pathlib.Path = ROOT, package: str = PACKAGE):
    modules = find_modules(root, package)
    known = set(modules)
    graph, external = {}, {}
    for name, (path, is_package) in modules.items():
        internal, ext = imports_of(path.read_text(encoding="utf-8"), name, is_package, known)
        graph[name] = {target: line for target, line in sorted(internal) if target != name}
        external[name] = ext
    return graph, external


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    color = dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done
    for start in sorted(graph):
        if color[start]:
            continue
        path, iters = [start], [iter(sorted(graph[start]))]
        color[start] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                iters.pop()
            elif color.get(nxt, 2) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif color.get(nxt, 2) == 0:
                color[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def _in(module: str, subpackage: str) -> bool:
    prefix = f"{PACKAGE}.{subpackage}"
    return module == prefix or module.startswith(prefix + ".")


@pytest.fixture(scope="module")
def graph():
    return build_graph()[0]


# -- the machinery, on sources written for it ------------------------------------------


def test_imports_are_resolved_relative_local_and_outside_type_checking():
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b", "pkg.sub.c", "pkg.d"}
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import numpy as np\n"
        "from . import c\n"  # a submodule: edge to pkg.sub.c
        "from . import helper\n"  # a name of pkg.sub: edge to pkg.sub
        "from ..a import thing\n"  # edge to pkg.a
        "if TYPE_CHECKING:\n"
        "    from ..d import Hint\n"  # skipped
        "    import qtpy\n"  # skipped
        "else:\n"
        "    import scipy\n"
        "def f():\n"
        "    import napari\n"  # function-local: counted
        "    from pkg.sub.c import x\n"
    )
    internal, external = imports_of(
        source.replace("pkg", PACKAGE),
        f"{PACKAGE}.sub.b",
        False,
        {k.replace("pkg", PACKAGE) for k in known},
    )
    assert {t.replace(PACKAGE, "pkg") for t, _ in internal} == {"pkg.sub.c", "pkg.sub", "pkg.a"}
    assert {name for name, _ in external} == {"__future__", "typing", "numpy", "scipy", "napari"}


def test_package_init_imports_resolve_against_the_package_itself():
    known = {f"{PACKAGE}.sub", f"{PACKAGE}.sub.b", f"{PACKAGE}.x"}
    internal, _ = imports_of("from .b import y\nfrom .. import x\n", f"{PACKAGE}.sub", True, known)
    assert {t for t, _ in internal} == {f"{PACKAGE}.sub.b", f"{PACKAGE}.x"}


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None
    cycle = find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}})
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}


def test_the_graph_sees_the_package(graph):
    assert len(graph) > 50
    assert "napari_simwarp.ops" in graph["napari_simwarp.backend"]
    assert "napari_simwarp.ops.integrate_velocity" in graph["napari_simwarp.registration.models"]
    # function-local imports count
    assert "napari_simwarp.registration" in graph["napari_simwarp._demo"]
    assert "napari_simwarp._qt._demo" in graph["napari_simwarp._cli"]


# -- the rules --------------------------------------------------------------------------


def test_no_import_cycles(graph):
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle: "
        + " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


def test_only_qt_imports_the_gui_stack():
    # The _qt package (and, through napari.yaml, napari) are the only Qt users: not the
    # operators, the registration, the widgets' logic, the CLI or _sample_data.
    _, external = build_graph()
    offenders = sorted(
        f"{module}:{line} imports {name}"
        for module, names in external.items()
        if not _in(module, "_qt")
        for name, line in names
        if name in GUI
    )
    assert not offenders, offenders


@pytest.mark.parametrize(
    "layer,forbidden",
    [
        ("ops", ("registration", "widgets_logic", "_qt")),
        ("registration", ("widgets_logic", "_qt")),
        ("widgets_logic", ("_qt",)),
    ],
)
def test_lower_layers_import_nothing_from_higher_ones(graph, layer, forbidden):
    offenders = sorted(
        f"{module}:{line} imports {target}"
        for module, targets in graph.items()
        if _in(module, layer)
        for target, line in targets.items()
        if any(_in(target, f) for f in forbidden)
    )
    assert not offenders, offenders
