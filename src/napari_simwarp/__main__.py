"""``python -m napari_simwarp``: the ``napari-simwarp`` command, for environments whose
scripts folder is not on the PATH."""

from ._cli import main

raise SystemExit(main())
