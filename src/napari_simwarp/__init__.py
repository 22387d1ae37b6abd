"""napari-simwarp: compare and align images on the GPU, in napari and in scripts.

Importing the package imports neither Qt nor napari and compiles nothing; the operators
live in :mod:`napari_simwarp.ops`, the warp optimiser in :mod:`napari_simwarp.register`
(``napari_simwarp.register(fixed, moving)``), both loaded on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "backend_info",
    "load_transform",
    "ops",
    "register",
    "register_iter",
    "register_stack",
]


def __getattr__(name: str):
    # Lazy submodule access keeps `import napari_simwarp` cheap (torch loads on first use).
    import importlib

    if name == "ops":
        return importlib.import_module("napari_simwarp.ops")
    if name == "backend_info":
        return importlib.import_module("napari_simwarp.ops._backend").backend_info
    if name in ("register", "register_iter", "register_stack", "load_transform"):
        # napari_simwarp.register is both the subpackage and the function: the package
        # module is callable (register(fixed, moving) works whichever Python binds).
        module = importlib.import_module("napari_simwarp.register")
        return module if name == "register" else getattr(module, name)
    raise AttributeError(f"module 'napari_simwarp' has no attribute {name!r}")
