#!/usr/bin/env bash
# Quick start, tests: set up .venv with the test extras and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh testing
# Two workers on two cores; one thread each so they do not oversubscribe the CPU.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -n "${SIMWARP_TEST_WORKERS:-2}" "$@"
