#!/usr/bin/env bash
# Session 22 call 4 (the merged tree): build it and the base (7ee35cf, the session's start) side by
# side; CPU + every GPU test; memcheck on the engine API's and the prefill path's small cases;
# then the base and this tree one after the other per model, batches 1 to 16384; the prefill
# path's crossover (MOEKIT_EXPERTS_GROUPED_FROM=1 against 0) while time remains.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
cd "$(dirname "$0")/.."
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
( cd build-ab/base-src && cmake -S . -B /tmp/base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library > $OUT/base_build.log 2>&1 && \
  cmake --build /tmp/base -j 6 --target moekit_cli >> $OUT/base_build.log 2>&1; echo "base build rc=$? $(el)s" > $OUT/base_rc.txt ) &
STAGES="build test" STAGE_TIMEOUT=260 bash scripts/gpu_check.sh
mv $OUT/summary.txt $OUT/summary_tests.txt
wait; cat $OUT/base_rc.txt >> $OUT/summary_tests.txt
T=build-gpu/tests/moekit_cuda_tests
timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='EngineGpuSlices.*:EngineGpuStatus.*:GpuPrefill.SmallCaseForSanitizers' > $OUT/sanitizer_memcheck.log 2>&1
echo "memcheck rc=$? $(el)s" >> $OUT/summary_tests.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/sanitizer_memcheck.log | head -5 >> $OUT/summary_tests.txt
cp $OUT/summary_tests.txt $OUT/summary.txt
B=build-gpu/moekit; BASE=/tmp/base/moekit
run() {  # run LABEL BIN MODEL BATCHES [ENV]
  echo "== $1 $3" >> "$OUT/sweep.txt"
  timeout 60 env ${5:-MOEKIT_PDL=1} $2 bench --device cuda --model $3 --batch $4 --fuse-shared on \
    --iterations 5 --json >> "$OUT/sweep.txt" 2>> "$OUT/sweep_stderr.txt"
  echo "$1 $3 rc=$? $(el)s" >> $OUT/summary.txt
}
ALL=1,32,128,1024,4096,16384
for m in deepseek-v3 qwen3-30b-a3b minimax-m3 mixtral-8x7b; do
  [ $(el) -lt 500 ] && run new $B $m $ALL
  [ $(el) -lt 520 ] && run base $BASE $m $ALL
done
[ $(el) -lt 530 ] && run new $B qwen2-57b-a14b 1024,4096
for m in deepseek-v3 qwen3-30b-a3b; do
  [ $(el) -lt 550 ] && run from1 $B $m 64,96,128,192 MOEKIT_EXPERTS_GROUPED_FROM=1
  [ $(el) -lt 565 ] && run from0 $B $m 64,96,128,192 MOEKIT_EXPERTS_GROUPED_FROM=0
done
echo "total $(el)s" >> "$OUT/summary.txt"
