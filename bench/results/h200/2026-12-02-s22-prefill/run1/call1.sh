#!/usr/bin/env bash
# Session 22 call 1: build this tree and the base (7ee35cf: fp32 GEMM outputs, the 128-row tile
# only) side by side, CPU + GPU tests, then the prefill sweep: base vs tile 128 vs tile 64.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin"
cd "$(dirname "$0")/.."
T0=$(date +%s)
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
STAGES="build" bash scripts/gpu_check.sh
# the base builds while the GPU tests run
( cd build-ab/base-src && cmake -S . -B /tmp/base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOEKIT_CUDA=ON \
    -DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library > $OUT/base_build.log 2>&1 && \
  cmake --build /tmp/base -j 12 --target moekit_cli >> $OUT/base_build.log 2>&1 || \
  cmake --build /tmp/base -j 12 >> $OUT/base_build.log 2>&1; echo "base build rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary.txt ) &
BPID=$!
mv $OUT/summary.txt $OUT/summary_build.txt
STAGES="test" STAGE_TIMEOUT=240 bash scripts/gpu_check.sh
cat $OUT/summary_build.txt $OUT/summary.txt > $OUT/s.txt; mv $OUT/s.txt $OUT/summary.txt
grep -E "relative error" $OUT/logs/cuda_tests.log | sort -t' ' -k7 | tail -5 >> $OUT/summary.txt
wait $BPID
echo "tests done $(( $(date +%s) - T0 ))s" >> $OUT/summary.txt
B=build-gpu/moekit
BASE=/tmp/base/moekit
for m in deepseek-v3 qwen3-30b-a3b minimax-m3 mixtral-8x7b; do
  for k in base t128 t64; do
    echo "== $k $m" >> "$OUT/sweep.txt"
    BIN=$B; E="MOEKIT_PDL=1"
    [ $k = base ] && BIN=$BASE
    [ $k = t128 ] && E="MOEKIT_EXPERTS_GROUPED_TILE=128"
    [ $k = t64 ] && E="MOEKIT_EXPERTS_GROUPED_TILE=64"
    timeout 75 env $E $BIN bench --device cuda --model $m --batch 512,1024,2048,4096,16384 \
      --fuse-shared on --iterations 5 --json >> "$OUT/sweep.txt" 2>> "$OUT/sweep_stderr.txt"
    echo "$k $m rc=$? $(( $(date +%s) - T0 ))s" >> $OUT/summary.txt
  done
done
echo "total $(( $(date +%s) - T0 ))s" >> "$OUT/summary.txt"
