#!/usr/bin/env bash
# Configures and builds moekit into build/ (CUDA backend when nvcc is found: MOEKIT_CUDA=AUTO).
# Extra arguments go to cmake's configure step, e.g. -DMOEKIT_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
build_dir="${MOEKIT_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
