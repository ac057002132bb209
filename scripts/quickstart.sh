#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run the main job — a benchmark of
# one real model's MoE layer (on the GPU when there is one, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
./build/moekit inspect --model qwen3-30b-a3b
./build/moekit run --model deepseek-v3 --tokens 4 --fuse-shared on
./build/moekit bench --model qwen3-30b-a3b --batch 1,32
