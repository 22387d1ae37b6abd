"""The warp optimizer (docs/maths.md §6): find the transform that makes a moving image look
like a fixed one, by gradient descent on the operators, coarse to fine, on any torch device.

    from napari_simwarp.registration import register, register_stack, load_transform

``napari_simwarp.register`` and friends are these same functions. No Qt, no napari: plain
Python and torch. Names load on first use, so importing the package (or its command-line
parser) does not import torch.
"""

from __future__ import annotations

import importlib

from ._names import LINEAR_MODELS, METRICS, MODELS

#: public name -> the submodule that defines it
_EXPORTS = {
    "register": "pair",
    "register_iter": "pair",
    "RegistrationResult": "pair",
    "register_stack": "stack",
    "register_stack_iter": "stack",
    "StackRegistrationResult": "stack",
    "StackProgress": "stack",
    "Progress": "optimize",
    "phase_correlation": "drift",
    "Transform": "transforms",
    "AffineTransform": "transforms",
    "DisplacementTransform": "transforms",
    "VelocityTransform": "transforms",
    "load_transform": "transforms",
}

__all__ = ["LINEAR_MODELS", "METRICS", "MODELS", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
