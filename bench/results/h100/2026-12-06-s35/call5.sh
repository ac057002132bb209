#!/usr/bin/env bash
# Session 35 call 5: the prefill and layer-family GPU tests on this tree's rule (auto runs the
# shared MLP dense beside the grouped path).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin" MOEKIT_CONFIG_DIR=$PWD/configs
R=$OUT/r; mkdir -p $R /tmp/bin
tar -xJf build-carry/bins.tar.xz -C /tmp/bin
T=/tmp/bin/moekit_cuda_tests
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
( time timeout 170 $T --gtest_filter='GpuPrefill*:AllFamilies/GpuLayerFamily*:GpuLayerSmall*' ) > $R/gpu_tests_rule.txt 2>&1
echo "rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" $R/gpu_tests_rule.txt | head; grep -c "\[       OK \]" $R/gpu_tests_rule.txt
tar -C $R -czf $OUT/results.tar.gz .
