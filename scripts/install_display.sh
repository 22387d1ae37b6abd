#!/usr/bin/env bash
# What the napari widget tests (tests/_qt) need on a machine with no display, on Debian or
# Ubuntu: Xvfb (a virtual display, run by xvfb-run), Mesa's software OpenGL (napari's
# canvas) and the libraries Qt's xcb platform loads. The one list, used by .ci/run and by
# scripts/test.sh (which runs it itself as root or with passwordless sudo). Run as root:
#     sudo bash scripts/install_display.sh
# Does nothing when everything is there already.
set -euo pipefail
PACKAGES=(
    xvfb xauth libgl1-mesa-dri libgl1 libegl1 libxkbcommon-x11-0
    libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0
    libxcb-xinerama0 libxcb-xfixes0 libxcb-shape0 libxcb-cursor0 libdbus-1-3
    libfontconfig1
)
if [ "${1:-}" = "--list" ]; then
    echo "${PACKAGES[*]}"
    exit 0
fi
if command -v xvfb-run >/dev/null && dpkg -s "${PACKAGES[@]}" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "scripts/install_display.sh: no apt-get here; install Xvfb, Mesa's software OpenGL" >&2
    echo "and Qt's xcb libraries with this system's package manager (Debian names:" >&2
    echo "${PACKAGES[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${PACKAGES[@]}" >/dev/null
