"""Optional packages: checked before any work, refused with the line that installs them.

A base install (``pip install napari-simwarp``) has no zarr, dask, ngff-zarr or
distributed. A command that will need one of them checks for all it will need first,
with :func:`require`, so a missing package costs nothing and names the extra that
brings it, instead of failing with a raw ``ModuleNotFoundError`` after hours of work.
No torch, no Qt.
"""

from __future__ import annotations

import importlib

#: what each optional module is installed as (the pip name) and which extra brings it
PACKAGES = {
    "zarr": ("zarr", "large"),
    "dask.array": ("dask", "large"),
    "ngff_zarr": ("ngff-zarr", "large"),
    "distributed": ("distributed", "large"),
    "h5py": ("h5py", "interop"),
    "napari": ("napari", "all"),
}


class MissingExtraError(ImportError):
    """Optional packages a command needs are not installed; the message says which,
    what for, and the ``pip install`` line that installs them."""


def install_line(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'napari-simwarp[large]'``."""
    return f"pip install 'napari-simwarp[{extra}]'"


def missing(modules) -> list[str]:
    """The modules of ``modules`` that cannot be imported here, in the order given.

    Each is imported (not only looked up): a package that is installed but broken, or
    blocked, counts as missing too. Its import is one the command will make anyway.
    """
    absent = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            absent.append(name)
    return absent


def _listed(words) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def require(needs: dict[str, list[str]]) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``needs`` imports.

    ``needs`` maps what the modules are for (``"writing an OME-Zarr store (-o out.zarr)"``)
    to the modules (keys of :data:`PACKAGES`). The message names every missing package
    and each purpose, with one ``pip install`` line per extra concerned.
    """
    wanted = list(dict.fromkeys(m for modules in needs.values() for m in modules))
    absent = set(missing(wanted))
    if not absent:
        return
    purposes = [why for why, modules in needs.items() if absent & set(modules)]
    names = list(dict.fromkeys(PACKAGES[m][0] for m in wanted if m in absent))
    extras = sorted({PACKAGES[m][1] for m in absent})
    verb = "needs" if len(purposes) == 1 else "need"
    raise MissingExtraError(
        f"{_listed(purposes)} {verb} {_listed(names)}, which {'is' if len(names) == 1 else 'are'} "
        "not installed: " + " and ".join(install_line(e) for e in extras)
    )
