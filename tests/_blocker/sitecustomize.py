"""A base install, simulated: on the PYTHONPATH, this makes the optional packages of the
``large`` extra and napari (or those listed in ``SIMWARP_BLOCK_MODULES``, comma-separated)
fail to import with ModuleNotFoundError, as they do where they are not installed.

Used by :mod:`tests.base_install` (the command line run in a subprocess) and to run test
files as a base install would::

    PYTHONPATH=tests/_blocker:src python -m pytest --assert=plain -p no:napari -p no:zarr FILES

(pytest's assertion rewriting imports the modules of its plugins past any finder, zarr's
among them; napari's plugin needs dask.)
"""

import os
import sys

BLOCKED = tuple(
    n
    for n in os.environ.get(
        "SIMWARP_BLOCK_MODULES", "zarr,dask,ngff_zarr,distributed,napari"
    ).split(",")
    if n
)


class _Blocker:
    """A meta path finder, first in line, that refuses the blocked packages."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, _Blocker())
