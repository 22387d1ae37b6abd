"""``python -m napari_simwarp``: the ``napari-simwarp`` command, for environments whose
scripts folder is not on the PATH."""

from ._cli import main

if __name__ == "__main__":  # importing this module (tools, docs) runs nothing
    raise SystemExit(main())
