"""napari-simwarp: compare and align images on the GPU, in napari and in scripts.

Importing the package imports neither Qt nor napari and compiles nothing; the operators
live in :mod:`napari_simwarp.ops` and are loaded on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "backend_info", "ops"]


def __getattr__(name: str):
    # Lazy submodule access keeps `import napari_simwarp` cheap (torch loads on first use).
    import importlib

    if name == "ops":
        return importlib.import_module("napari_simwarp.ops")
    if name == "backend_info":
        return importlib.import_module("napari_simwarp.ops._backend").backend_info
    raise AttributeError(f"module 'napari_simwarp' has no attribute {name!r}")
