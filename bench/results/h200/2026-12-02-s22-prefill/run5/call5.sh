#!/usr/bin/env bash
# Session 22 call 5: the landed rule (from 64 tokens at 4 routed per expert): build, every GPU
# test, DeepSeek-V3 and Qwen3-30B-A3B at 64-256 tokens.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
cd "$(dirname "$0")/.."
T0=$(date +%s)
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
STAGES="build" bash scripts/gpu_check.sh
mv $OUT/summary.txt $OUT/summary_build.txt
timeout 150 build-gpu/tests/moekit_cuda_tests > $OUT/cuda_tests.log 2>&1
echo "cuda tests rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary_build.txt
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" $OUT/cuda_tests.log | head -20 >> $OUT/summary_build.txt
mv $OUT/summary_build.txt $OUT/summary.txt
for m in deepseek-v3 qwen3-30b-a3b; do
  echo "== rule $m" >> "$OUT/sweep.txt"
  timeout 30 build-gpu/moekit bench --device cuda --model $m --batch 64,128,256 --fuse-shared on \
    --iterations 5 --json >> "$OUT/sweep.txt" 2>/dev/null
  echo "rule $m rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary.txt
done
