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
if [ -z "${DISPLAY:-}" ] && [ -z "${WAYLAND_DISPLAY:-}" ]; then
    if ! command -v xvfb-run >/dev/null && [[ " $* " != *" --ignore=tests/_qt "* ]]; then
        # Without a display Qt aborts the test workers ("Fatal Python error: Aborted").
        echo "scripts/test.sh: no display and no xvfb-run: the napari widget tests need one." >&2
        echo "Install Xvfb and Mesa (the apt-get line in .ci/run), or run with a display;" >&2
        echo "or leave the widget tests out: bash scripts/test.sh --ignore=tests/_qt" >&2
        exit 2
    fi
    exec xvfb-run -a -s "-screen 0 1280x1024x24" "${cmd[@]}"
fi
exec "${cmd[@]}"
