#!/usr/bin/env bash
# The one-call GPU check, run on the GPU machine (the H200): build, run every test (CPU and GPU),
# compute-sanitizer over the GPU tests on small shapes, the benchmarks, and the router GEMM tuner.
# Writes logs and JSON under $OUT (default ./gpu_out). Stages can be chosen:
#   STAGES="build test sanitize bench tune" scripts/gpu_check.sh
# Each stage's failure is recorded in $OUT/summary.txt and the script goes on, so one call
# returns everything there is to learn.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
STAGES="${STAGES:-build test sanitize bench tune}"
BUILD="${MOEKIT_BUILD_DIR:-build-gpu}"
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
stage_start=$(date +%s)
timed() {  # timed NAME LOGFILE COMMAND...: run, log, record status and seconds
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  "$@" >>"$log" 2>&1
  local rc=$?
  note "$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  return $rc
}

note "gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader \
  2>&1 | tee -a "$summary"
note "git $(git rev-parse --short HEAD 2>/dev/null || echo '?') stages: $STAGES"

if has_stage build; then
  export PATH="$PATH:/usr/local/cuda/bin"
  timed configure "$OUT/build.log" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMOEKIT_CUDA=ON || { note "configure failed: see build.log"; tail -30 "$OUT/build.log"; }
  timed build "$OUT/build.log" cmake --build "$BUILD" -j "$(nproc)" \
    || { note "build failed"; grep -E "error|Error" "$OUT/build.log" | head -40; }
  # Register and spill report of every kernel, for the notes.
  grep -E "ptxas info|spill" "$OUT/build.log" | grep -B1 -E "bytes spill" | grep -v " 0 bytes spill" \
    | head -20 >>"$OUT/build.log"
fi
MOEKIT="$BUILD/moekit"

if has_stage test; then
  timed ctest "$OUT/tests.log" ctest --test-dir "$BUILD" --output-on-failure -j 8 --timeout 900
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/tests.log" | tail -30 | tee -a "$summary"
  if [ -x "$BUILD/tests/moekit_cuda_tests" ]; then
    timed cuda_tests "$OUT/cuda_tests.log" "$BUILD/tests/moekit_cuda_tests" --gtest_brief=1
    grep -E "PASSED|FAILED|SKIPPED" "$OUT/cuda_tests.log" | tail -25 | tee -a "$summary"
  fi
fi

if has_stage sanitize && [ -x "$BUILD/tests/moekit_cuda_tests" ]; then
  # Small shapes only (tests named *Small*); full-size shapes under the sanitizer take too long.
  for tool in memcheck racecheck initcheck synccheck; do
    timed "sanitizer-$tool" "$OUT/sanitizer.log" compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$BUILD/tests/moekit_cuda_tests" --gtest_filter='*Small*' --gtest_brief=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log" | tail -1 | tee -a "$summary"
  done
fi

if has_stage bench && [ -x "$MOEKIT" ]; then
  for m in deepseek-v3 qwen3-30b-a3b kimi-k2 minimax-m2 qwen2-57b-a14b; do
    timed "bench-$m" "$OUT/bench.log" "$MOEKIT" bench --device cuda --model "$m" \
      --batch 1,2,4,8,16,32,64,128,256 --fuse-shared auto --json
  done
  # Each bench prints JSON records; keep them together, one JSON document per line group.
  cp "$OUT/bench.log" "$OUT/bench_layer.json" 2>/dev/null
  for m in $("$MOEKIT" inspect --help >/dev/null 2>&1 && ls configs/*.json | xargs -n1 basename | sed 's/\.json$//'); do
    timed "router-$m" "$OUT/bench_router.json" "$MOEKIT" bench router-gemm --model "$m" --json
  done
fi

if has_stage tune && [ -x "$MOEKIT" ]; then
  models=$(ls configs/*.json | xargs -n1 basename | sed 's/\.json$//' | sed 's/^/--model /' | tr '\n' ' ')
  timed tune "$OUT/tune.log" "$MOEKIT" tune $models --out "$OUT/tuning_sm90.json"
fi
note "total $(( $(date +%s) - stage_start )) s"
