#!/usr/bin/env bash
# Quick start, main job: set up .venv and run the demo on the bundled sample data.
# Extra arguments go to `napari-simwarp demo` (default: --out out/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then set -- --out out/demo; fi
exec .venv/bin/napari-simwarp demo "$@"
