"""The warp optimiser (SPEC §6): find the transform that makes a moving image look like a
fixed one, by gradient descent on the operators, coarse to fine, on any torch device.

    from napari_simwarp.register import register, register_stack, load_transform

No Qt, no napari: plain Python and torch. Names load on first use, so importing the
package (or its command-line parser) does not import torch.
"""

from __future__ import annotations

import importlib
import sys
import types

from ._names import METRICS, MODELS

#: public name -> the submodule that defines it
_EXPORTS = {
    "register": "api",
    "register_iter": "api",
    "RegistrationResult": "api",
    "register_stack": "stack",
    "StackRegistrationResult": "stack",
    "Progress": "optimise",
    "Transform": "transforms",
    "AffineTransform": "transforms",
    "DisplacementTransform": "transforms",
    "VelocityTransform": "transforms",
    "load_transform": "transforms",
}

__all__ = ["METRICS", "MODELS", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


# ``napari_simwarp.register`` is both this package and, per the issue, the function
# ``napari_simwarp.register(fixed, moving, ...)``. Python rebinds a package's attribute to
# the subpackage whenever it is first imported, so a top-level re-export of the function
# would be silently replaced by the module depending on import order. Making the module
# itself callable (delegating to :func:`register`) gives the same answer either way.
class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        """``napari_simwarp.register(fixed, moving, ...)``: see :func:`.api.register`."""
        from .api import register

        return register(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
