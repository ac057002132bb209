#!/usr/bin/env bash
# The Python package's tests: pip-installs the package (pyproject.toml) into the project venv
# .venv, CPU ops only unless MOEKIT_PYTHON_CUDA=ON|AUTO (the ops' CUDA kernels, built only so),
# then runs pytest on python/tests. pytest's "no tests collected"
# (exit 5) fails like any other failure: the suite has tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation . \
  -Ccmake.define.MOEKIT_CUDA="${MOEKIT_PYTHON_CUDA:-OFF}"
echo "test_python: package built and installed in $(( $(date +%s) - start )) s"
# from python/tests, so that `import moekit` is the installed package, not the source folder
cd python/tests
../../.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
