#!/usr/bin/env bash
# The README's test command: build (if needed) and run the whole test suite with ctest, then the
# Python package's (scripts/test_python.sh: pip install into .venv, pytest).
# GPU tests compile wherever nvcc is and skip with a message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
ctest --test-dir "${MOEKIT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
./scripts/test_python.sh
