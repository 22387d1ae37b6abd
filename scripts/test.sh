#!/usr/bin/env bash
# Quick start, tests: set up .venv with the test extras, lint, and run the whole test suite.
# Extra arguments go to pytest.
#
# The napari widget tests (tests/_qt) need a display. With none (CI, ssh) they run under
# `xvfb-run -a` (Qt's "offscreen" platform cannot create napari's OpenGL canvas). Where
# Xvfb, Mesa or Qt's xcb libraries are missing, this script installs them itself when it
# can (as root, or with sudo that asks no password: scripts/install_display.sh, the list
# .ci/run uses too); where it cannot, it runs every other test, says which it left out and
# the one command that installs what they need. `--ignore=tests/_qt` leaves them out.
#
# SIMWARP_TEST_DRY_RUN=1 prints the pytest command instead of setting up, linting and
# running it (the tests of this script use that; an install of the display still runs).
set -euo pipefail
cd "$(dirname "$0")/.."
dry="${SIMWARP_TEST_DRY_RUN:-}"
run() {
    if [ -n "$dry" ]; then
        echo "would run: $*"
    else
        "$@"
    fi
}

widget_tests_ignored() {  # --ignore=tests/_qt, --ignore tests/_qt, with or without ./ and /
    local previous="" arg path
    for arg in "$@"; do
        path=""
        case "$arg" in
            --ignore=*) path="${arg#--ignore=}" ;;
            *) [ "$previous" = "--ignore" ] && path="$arg" ;;
        esac
        path="${path#./}"
        path="${path%/}"
        [ "$path" = "tests/_qt" ] && return 0
        previous="$arg"
    done
    return 1
}

have_display() {
    [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ] || [ "$(uname)" = Darwin ]
}

display_ready() {  # xvfb-run and, where dpkg can tell, the libraries Qt and napari load
    command -v xvfb-run >/dev/null || return 1
    if command -v dpkg >/dev/null; then
        # shellcheck disable=SC2046
        dpkg -s $(bash scripts/install_display.sh --list) >/dev/null 2>&1 || return 1
    fi
    return 0
}

install_display() {  # as root or with passwordless sudo; false where neither
    local how
    if [ "$(id -u)" = 0 ]; then
        how=(bash scripts/install_display.sh)
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        how=(sudo bash scripts/install_display.sh)
    else
        return 1
    fi
    echo "scripts/test.sh: no display, and Xvfb or the libraries the napari widget tests" >&2
    echo "load are missing: installing them (${how[*]})" >&2
    "${how[@]}"
}

left_out=""
wrap=()
if ! widget_tests_ignored "$@" && ! have_display; then
    if ! display_ready; then
        install_display || true  # a failed install: the fallback below says so
    fi
    if display_ready; then
        wrap=(xvfb-run -a -s "-screen 0 1280x1024x24")
    else
        qt=(tests/_qt/test_*.py)
        left_out="the napari widget tests, tests/_qt (${#qt[@]} files: they need a display,
and there is none, nor Xvfb, and this user may not install it). To run them too, install
what they need, then run this script again:
    sudo bash scripts/install_display.sh"
        echo "scripts/test.sh: leaving out $left_out" >&2
        set -- "$@" --ignore=tests/_qt
    fi
fi

if [ -z "$dry" ]; then
    bash scripts/setup.sh testing
    # Lint and format first (seconds): configured in pyproject.toml.
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
fi
# Two workers on two cores; one thread each so they do not oversubscribe the CPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
status=0
run ${wrap[@]+"${wrap[@]}"} .venv/bin/python -m pytest -n "${SIMWARP_TEST_WORKERS:-2}" "$@" || status=$?
if [ -n "$left_out" ]; then
    # said again at the end, where it is read: the suite passed without these tests
    echo "scripts/test.sh: left out $left_out" >&2
fi
exit "$status"
