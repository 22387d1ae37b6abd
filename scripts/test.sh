#!/usr/bin/env bash
# Quick start, tests: set up .venv with the test extras, lint, and run the whole test suite.
# Extra arguments go to pytest. The napari widget tests (tests/_qt) need a display: with
# none (CI, ssh), the suite runs under `xvfb-run -a` when it is installed (Qt's "offscreen"
# platform cannot create napari's OpenGL canvas; .ci/run installs Xvfb and Mesa).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh testing
# Lint and format first (seconds): configured in pyproject.toml.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers on two cores; one thread each so they do not oversubscribe the CPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cmd=(.venv/bin/python -m pytest -n "${SIMWARP_TEST_WORKERS:-2}" "$@")
if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ] && command -v xvfb-run >/dev/null; then
    exec xvfb-run -a -s "-screen 0 1280x1024x24" "${cmd[@]}"
fi
exec "${cmd[@]}"
