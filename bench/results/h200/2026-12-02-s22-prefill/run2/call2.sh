#!/usr/bin/env bash
# Session 22 call 2: build; memcheck and racecheck on the prefill path's small case (both
# instances); ncu per-kernel times, DRAM and tensor-pipe use of one DeepSeek-V3 and one
# Qwen3-30B-A3B forward at 4096 tokens.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
cd "$(dirname "$0")/.."
T0=$(date +%s)
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
STAGES="build" bash scripts/gpu_check.sh
mv $OUT/summary.txt $OUT/summary_build.txt
T=build-gpu/tests/moekit_cuda_tests
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $T \
    --gtest_filter='GpuPrefill.SmallCaseForSanitizers' > $OUT/sanitizer_$tool.log 2>&1
  echo "sanitizer $tool rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary_build.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/sanitizer_$tool.log >> $OUT/summary_build.txt
done
STAGES="profile" PROFILE_MODELS="deepseek-v3 qwen3-30b-a3b" PROFILE_TOKENS=4096 STAGE_TIMEOUT=150 \
  bash scripts/gpu_check.sh
cat $OUT/summary_build.txt $OUT/summary.txt > $OUT/s.txt; mv $OUT/s.txt $OUT/summary.txt
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/summary.txt"
