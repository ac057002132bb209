#!/usr/bin/env bash
# Session 22 call 3: build; the prefill and family GPU tests; ncu per-kernel (CUTLASS GEMMs
# included) at 4096 tokens; DeepSeek-V3 and Qwen3-30B-A3B at 1024, 4096, 16384 tokens.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
cd "$(dirname "$0")/.."
T0=$(date +%s)
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
STAGES="build" bash scripts/gpu_check.sh
mv $OUT/summary.txt $OUT/summary_build.txt
timeout 150 build-gpu/tests/moekit_cuda_tests --gtest_filter='GpuPrefill.*:*Family*' > $OUT/cuda_tests.log 2>&1
echo "prefill+family tests rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary_build.txt
grep -E "^\[  (PASSED|FAILED) |tests ran" $OUT/cuda_tests.log >> $OUT/summary_build.txt
grep "relative error" $OUT/cuda_tests.log | awk '{print $NF}' | sort -g | tail -1 >> $OUT/summary_build.txt
STAGES="profile" PROFILE_MODELS="deepseek-v3 qwen3-30b-a3b" PROFILE_TOKENS=4096 STAGE_TIMEOUT=150 \
  bash scripts/gpu_check.sh
cat $OUT/summary_build.txt $OUT/summary.txt > $OUT/s.txt; mv $OUT/s.txt $OUT/summary.txt
for m in deepseek-v3 qwen3-30b-a3b; do
  echo "== new $m" >> "$OUT/sweep.txt"
  timeout 60 build-gpu/moekit bench --device cuda --model $m --batch 1024,4096,16384 \
    --fuse-shared on --iterations 5 --json >> "$OUT/sweep.txt" 2>> "$OUT/sweep_stderr.txt"
  echo "new $m rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary.txt
done
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/summary.txt"
