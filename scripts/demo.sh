#!/usr/bin/env bash
# Quick start, main job: set up .venv and run the demo on the bundled sample data.
# With a display: opens napari with the sample data and the widgets docked
# (`napari-simwarp demo`, installs the napari extra with a Qt binding).
# With no display: runs the same pipeline headless and writes the results and demo.png
# into out/demo (`napari-simwarp demo --headless --out out/demo`).
# Extra arguments go to `napari-simwarp demo` instead of these defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -gt 0 ]; then
    # --headless needs no viewer: the base install (no napari, no Qt) runs it
    case " $* " in
        *" --headless "*) bash scripts/setup.sh ;;
        *) bash scripts/setup.sh all ;;
    esac
    exec .venv/bin/napari-simwarp demo "$@"
fi
if [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = Darwin ]; then
    bash scripts/setup.sh all
    exec .venv/bin/napari-simwarp demo
fi
bash scripts/setup.sh
exec .venv/bin/napari-simwarp demo --headless --out out/demo
