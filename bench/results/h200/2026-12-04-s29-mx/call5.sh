#!/usr/bin/env bash
# Session 29 call 5: the tree as committed: the MX large-exponent test first, then every GPU test.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $OUT/build_summary.txt; stamp build; tail -3 $OUT/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( timeout 60 $T --gtest_filter='GpuMx.*' --gtest_brief=1 ) > $OUT/gpu_tests_mx.txt 2>&1
stamp "mx tests"; grep -E "FAILED|Failure|PASSED" $OUT/gpu_tests_mx.txt | head
( time timeout 280 $T --gtest_brief=1 ) > $OUT/gpu_tests.txt 2>&1
stamp gtest; grep -E "FAILED|Failure" $OUT/gpu_tests.txt | head -20; tail -6 $OUT/gpu_tests.txt
