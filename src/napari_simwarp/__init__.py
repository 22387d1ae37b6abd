"""napari-simwarp: compare and align images on the GPU, in napari and in scripts.

    import napari_simwarp as sw
    result = sw.register(fixed, moving, model="affine")
    sw.ops.local_std(x, window=15)

Importing the package imports neither Qt nor napari and compiles nothing; torch loads on
first use. The operators live in :mod:`napari_simwarp.ops`, the warp optimizer in
:mod:`napari_simwarp.registration` (its functions are also here at the top level).
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

#: public name -> the module that defines it (loaded on first access)
_EXPORTS = {
    "register": "napari_simwarp.registration.pair",
    "register_iter": "napari_simwarp.registration.pair",
    "register_stack": "napari_simwarp.registration.stack",
    "register_stack_iter": "napari_simwarp.registration.stack",
    "load_transform": "napari_simwarp.registration.transforms",
    "backend_info": "napari_simwarp.backend",
}
_SUBMODULES = ("ops", "registration", "data", "backend")

__all__ = ["__version__", *_SUBMODULES, *_EXPORTS]


def __getattr__(name: str):
    # Lazy access keeps `import napari_simwarp` cheap (torch loads on first use).
    if name in _SUBMODULES:
        return importlib.import_module(f"napari_simwarp.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'napari_simwarp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
