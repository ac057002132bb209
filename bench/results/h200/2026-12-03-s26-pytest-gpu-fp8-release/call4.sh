#!/usr/bin/env bash
# Session 26 call 4: ncu of the landed fp8 decode kernels (DeepSeek-V3, 1 token) with the
# per-instruction stall samples; the fp8 GPU tests of the final tree.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
rm -rf $R/b; stamp build
PROFILE_MODELS=deepseek-v3 PROFILE_TOKENS=1 PROFILE_SOURCE=1 PROFILE_ARGS="--expert-dtype fp8" \
  STAGES=profile OUT=$R/p timeout 110 bash scripts/gpu_check.sh > /dev/null 2>&1
stamp profile; cp $R/p/ncu.txt $OUT/ncu_fp8_T1.txt 2>/dev/null; cp $R/p/ncu_source.txt $OUT/ncu_source_fp8_T1.txt 2>/dev/null
cut -c1-160 $OUT/ncu_fp8_T1.txt | head -20; head -40 $OUT/ncu_source_fp8_T1.txt | cut -c1-160
( timeout 40 build-gpu/tests/moekit_cuda_tests --gtest_filter='GpuFp8*' --gtest_brief=1 ) > $OUT/test_fp8.txt 2>&1
stamp tests; tail -3 $OUT/test_fp8.txt
