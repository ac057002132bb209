#!/usr/bin/env bash
# The one-call GPU check, run on the GPU machine (the H200): build, run every test (CPU and GPU),
# compute-sanitizer over the GPU tests on small shapes, the layer and router GEMM benchmarks, and
# the router GEMM tuner. Writes under $OUT (default ./gpu_out):
#   summary.txt        one line per stage (rc, seconds) and the key results
#   logs.tar.gz        every log (build with ptxas report, tests, sanitizer, bench stderr)
#   bench_layer.jsonl  `moekit bench --device cuda --json` records, one JSON document per model
#   bench_router.jsonl `moekit bench router-gemm --json`, one per model
#   sm90.inc           the tuner's table (commit as tuning/sm90.inc; its JSON form is in the logs)
#   MODEL_sweep.png    the batch sweep of PLOT_MODEL (default: the first of BENCH_MODELS), fused
#                      vs unfused vs floor
#   trace_MODEL.txt    its kernel timelines (--trace)
#   ab.txt             the values of one setting side by side (stage ab; its stderr, with
#                      --trace's timelines, in ab_stderr.txt)
#   stream.txt         the bulk-copy stream's ceiling per copy / stage / ring shape (stage stream)
#   ncu.txt            per-kernel time and DRAM bytes of one forward under ncu (stage profile)
#   ncu_source.txt     with PROFILE_SOURCE=1: stall reasons and the most-stalled instructions
# The device tool returns at most 8 files from $OUT (its README): all the stages together write
# more, so pick the stages a run needs, and keep ad-hoc logs under $OUT/logs (tarred at the end).
# MOEKIT_CMAKE_ARGS: more configure arguments (e.g. -DMOEKIT_CUTLASS_DIR=... where no .venv is).
# Stages: STAGES="build test sanitize tune router stream layer" (the default; router, stream and
# layer are the router GEMM, bulk-copy stream and MoE layer benchmarks); also "ab" (AB_VAR=each
# of AB_VALUES x AB_MODELS x AB_BATCHES; by default the expert-kernel variants; AB_VAR=ENV:
# values like A=1,B=2, where MOEKIT_BIN=path picks the binary) and
# "profile" (PROFILE_MODELS at PROFILE_TOKENS tokens under ncu; PROFILE_SOURCE=1 adds the
# per-instruction stall samples, ncu_source.txt). A failing stage is recorded and the script goes
# on, so one call returns everything there is to learn.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
STAGES="${STAGES:-build test sanitize tune router stream layer}"
BUILD="${MOEKIT_BUILD_DIR:-build-gpu}"
BENCH_MODELS="${BENCH_MODELS:-deepseek-v3 qwen3-30b-a3b kimi-k2 minimax-m2 qwen2-57b-a14b gpt-oss-120b}"
BENCH_BATCHES="${BENCH_BATCHES:-1,2,4,8,16,32,64,128,256}"
TUNE_BATCHES="${TUNE_BATCHES:-1-16,20,24,28,32,40,48,56,64,80,96,112,128}"
AB_VAR="${AB_VAR:-MOEKIT_EXPERTS_KERNEL}"  # the environment variable the ab stage varies
AB_VALUES="${AB_VALUES:-regs-early regs bulk}"
AB_MODELS="${AB_MODELS:-deepseek-v3 qwen3-30b-a3b}"
AB_BATCHES="${AB_BATCHES:-1,8,32,128}"
AB_ARGS="${AB_ARGS:-}"  # more `moekit bench` arguments for the ab stage, e.g. --trace
# ROUTER_MODELS: the router stage's models (default: every config)
PROFILE_MODELS="${PROFILE_MODELS:-deepseek-v3 qwen3-30b-a3b}"
PROFILE_KERNEL="${PROFILE_KERNEL:-${MOEKIT_EXPERTS_KERNEL:-}}"  # expert-kernel variant under ncu
PROFILE_TOKENS="${PROFILE_TOKENS:-1}"
# PROFILE_ARGS: more `moekit run` arguments for the profile stage (e.g. --expert-dtype fp8)
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
t_start=$(date +%s)
timed() {  # timed NAME LOGFILE COMMAND...: run with output appended to LOGFILE, record rc and time
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  # STAGE_TIMEOUT: a hung kernel costs one stage (rc 124), not the whole call (the commands
  # run through `sh -c "exec ..."`, so the signal reaches moekit itself, not only its shell)
  timeout "${STAGE_TIMEOUT:-1800}" "$@" >>"$log" 2>&1
  local rc=$?
  note "$(printf '%-34s rc=%-3s %5ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  return $rc
}
models_all=$(ls configs/*.json | xargs -n1 basename | sed 's/\.json$//')

note "gpu_check $(date -u +%FT%TZ) on $(hostname), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader \
  2>&1 | tee -a "$summary"
note "stages: $STAGES"

if has_stage build; then
  export PATH="$PATH:/usr/local/cuda/bin"
  # why CMAKE_MAKE_PROGRAM: a build folder configured on another machine (carried to save the
  # build) records that machine's ninja path
  timed configure "$LOGS/build.log" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMOEKIT_CUDA=ON "-DCMAKE_CUDA_FLAGS=-Xptxas=-v" "-DCMAKE_MAKE_PROGRAM=$(command -v ninja)" \
    ${MOEKIT_CMAKE_ARGS:-}
  timed build "$LOGS/build.log" cmake --build "$BUILD" -j "$(nproc)" \
    || grep -E "error" "$LOGS/build.log" | head -30 | tee -a "$summary"
  note "ptxas: $(grep -c 'Used [0-9]* registers' "$LOGS/build.log") kernels reported," \
       "$(grep -E 'bytes spill' "$LOGS/build.log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads') with spills"
fi
MOEKIT="$BUILD/moekit"
CUDA_TESTS="$BUILD/tests/moekit_cuda_tests"

if has_stage test; then
  # (the GPU tests are ctest entries too, labelled gpu: run once below, through their binary)
  timed ctest-cpu "$LOGS/tests.log" ctest --test-dir "$BUILD" --output-on-failure -j 8 \
    --timeout 900 -LE gpu
  grep -E "tests passed|tests failed" "$LOGS/tests.log" | tail -1 | tee -a "$summary"
  grep -E "^\s+[0-9]+ - .*\(Failed|Timeout|SEGFAULT" "$LOGS/tests.log" | head -20 | tee -a "$summary"
  if [ -x "$CUDA_TESTS" ]; then
    timed cuda-tests "$LOGS/cuda_tests.log" "$CUDA_TESTS"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]" "$LOGS/cuda_tests.log" | tail -30 \
      | tee -a "$summary"
  fi
fi

if has_stage sanitize && [ -x "$CUDA_TESTS" ]; then
  # Small shapes only (tests with Small in their name: GpuLayerSmall.*, the knob tests of
  # tests/cuda/test_layer_small*.cpp): full shapes under the tools take too long. The tests' layers
  # take the plan's knobs from the environment (base_options: plan_overrides_from_env), so the
  # MOEKIT_SHARED_DENSE below reaches them.
  # cuBLAS under racecheck and initcheck (H200, bench/results/h200/2026-11-30-s7-experiments):
  # racecheck reports hazards inside its nvjet kernels, initcheck uninitialized reads inside its
  # split-K reduction, and initcheck does not see its stores of the router logits (18176
  # "uninitialized" reads of them by the routing kernel at T=300 in a passing test; 0 with the
  # naive router kernel in cuBLAS's place). So for those two tools the naive router kernel takes
  # the shapes the tables give cuBLAS (from M = 49), and the test that runs cuBLAS on purpose is
  # left to memcheck and synccheck. (--kernel-name-exclude on cuBLAS's kernels was worse: racecheck
  # failed with an internal error in them.)
  naive_router="$LOGS/router_without_cublas.json"
  echo '{"rows":[{"dtype":"BF16","backend":"naive","k":0,"n":0,"m_min":49,"m_max":1048576},
    {"dtype":"F32","backend":"naive","k":0,"n":0,"m_min":17,"m_max":1048576}]}' >"$naive_router"
  filter="${SANITIZE_FILTER:-*Small*:RouterGemmCuda.Dispatch*:RouterGemmCuda.Graph*}"
  for tool in memcheck racecheck initcheck synccheck; do
    tuning="${MOEKIT_TUNING_FILE:-}"
    shared_dense="${MOEKIT_SHARED_DENSE:-}"
    tool_filter="$filter"
    if [ "$tool" = racecheck ] || [ "$tool" = initcheck ]; then
      tuning="$naive_router"
      # and the unfused shared MLP through the expert kernels, not cuBLAS' dense GEMMs (the
      # default from 8 tokens, PlanOverrides::shared_dense_tokens; racecheck reports hazards in
      # its nvjet kernel)
      shared_dense=0
      # (gtest: negative patterns follow the first '-')
      case "$filter" in *-*) tool_filter="$filter:" ;; *) tool_filter="$filter-" ;; esac
      tool_filter="${tool_filter}RouterGemmCuda.GraphCaptureAfterWarmUpFromTheSpec"
      tool_filter="${tool_filter}:GpuLayerSmall.SharedDenseMlp"  # (cuBLAS' GEMMs on purpose)
    fi
    timed "sanitizer-$tool" "$LOGS/sanitizer_$tool.log" env MOEKIT_TUNING_FILE="$tuning" \
      MOEKIT_SHARED_DENSE="$shared_dense" \
      compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$CUDA_TESTS" --gtest_filter="$tool_filter" --gtest_brief=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$LOGS/sanitizer_$tool.log" \
      | tail -3 | tee -a "$summary"
  done
fi

if has_stage tune && [ -x "$MOEKIT" ]; then
  args=""
  for m in $models_all; do args="$args --model $m"; done
  timed tune "$LOGS/tune.log" "$MOEKIT" tune $args --batch "$TUNE_BATCHES" \
    --out "$LOGS/tuning_sm90.json" --inc "$OUT/sm90.inc"
  [ -f "$LOGS/tuning_sm90.json" ] && export MOEKIT_TUNING_FILE="$LOGS/tuning_sm90.json"
fi

if has_stage router && [ -x "$MOEKIT" ]; then
  for m in ${ROUTER_MODELS:-$models_all}; do
    timed "router-gemm $m" "$LOGS/bench_router.log" \
      sh -c "exec '$MOEKIT' bench router-gemm --model $m --json >>'$OUT/bench_router.jsonl'"
  done
  "$MOEKIT" bench router-gemm --model deepseek-v3 >>"$summary" 2>>"$LOGS/bench_router.log"
fi

if has_stage stream && [ -x "$MOEKIT" ]; then
  # the bulk-copy stream's ceiling by copy, stage and ring shape (moekit bench stream)
  timed stream "$LOGS/bench_stream.log" sh -c "exec '$MOEKIT' bench stream >>'$OUT/stream.txt'"
  "$MOEKIT" bench stream --json >"$LOGS/bench_stream.json" 2>>"$LOGS/bench_stream.log"
fi

if has_stage layer && [ -x "$MOEKIT" ]; then
  for m in $BENCH_MODELS; do
    timed "bench $m" "$LOGS/bench_layer.log" \
      sh -c "exec '$MOEKIT' bench --device cuda --model $m --batch $BENCH_BATCHES --json >>'$OUT/bench_layer.jsonl'"
  done
  plot_model="${PLOT_MODEL:-${BENCH_MODELS%% *}}"
  "$MOEKIT" bench --device cuda --model "$plot_model" --batch "$BENCH_BATCHES" \
    --plot "$OUT/${plot_model}_sweep.png" --trace >>"$summary" 2>>"$OUT/trace_$plot_model.txt"
  "$MOEKIT" run --device cuda --model "$plot_model" --tokens 4 --fuse-shared auto >>"$summary" 2>&1
fi

if has_stage ab && [ -x "$MOEKIT" ]; then
  # one value of AB_VAR per run of the benchmark (the layer reads it at creation)
  for m in $AB_MODELS; do
    for k in $AB_VALUES; do
      echo "== $AB_VAR=$k $m" >>"$OUT/ab.txt"
      echo "== $AB_VAR=$k $m" >>"$OUT/ab_stderr.txt"
      # AB_VAR=MOEKIT_BIN: the values are moekit binaries (e.g. one built from an older commit,
      # carried beside the tree), compared in the same run
      # AB_VAR=ENV: each value is a comma-separated list of VAR=value settings
      bin=$MOEKIT
      [ "$AB_VAR" = MOEKIT_BIN ] && bin=$k
      settings="$AB_VAR=$k"
      [ "$AB_VAR" = ENV ] && settings=$(echo "$k" | tr , ' ')
      # (an ENV value may name the binary too: MOEKIT_BIN=path,MOEKIT_EXPERTS_KERNEL=...)
      for s in $settings; do case $s in MOEKIT_BIN=*) bin=${s#MOEKIT_BIN=} ;; esac; done
      timed "ab $settings $m" "$LOGS/ab.log" sh -c "exec env $settings '$bin' bench --device cuda \
        --model $m --batch $AB_BATCHES $AB_ARGS >>'$OUT/ab.txt' 2>>'$OUT/ab_stderr.txt'"
    done
  done
fi

if has_stage profile && [ -x "$MOEKIT" ]; then
  # ncu serialises the kernels: per-kernel times, not the graph's overlapped step
  for m in $PROFILE_MODELS; do for tk in $PROFILE_TOKENS; do
    echo "== ncu --clock-control none, moekit run --device cuda --model $m --tokens $tk" \
      "(MOEKIT_EXPERTS_KERNEL=${PROFILE_KERNEL:-default})" >>"$OUT/ncu.txt"
    timed "ncu $m T=$tk" "$LOGS/ncu.log" sh -c "exec env MOEKIT_EXPERTS_KERNEL='$PROFILE_KERNEL' ncu --clock-control none --csv --page raw -k regex:'router|routing|experts|prefill|device_kernel|gemm|sm90' \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread \
      '$MOEKIT' run --device cuda --model $m --tokens $tk ${PROFILE_ARGS:-} >'$LOGS/ncu_${m}_$tk.csv'"
    python3 - "$LOGS/ncu_${m}_$tk.csv" >>"$OUT/ncu.txt" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, units, data = rows[0], rows[1], rows[2:]
col = {h: i for i, h in enumerate(head)}
keys = ["gpu__time_duration.sum", "dram__bytes_read.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size",
        "launch__block_size", "launch__registers_per_thread"]
print("kernel".ljust(60), " ".join(k.split("__")[1].split(".")[0][-14:].rjust(14) for k in keys))
for r in data:
    name = r[col["Kernel Name"]][:60]
    print(name.ljust(60), " ".join(r[col[k]].rjust(14) for k in keys))
print("units:", " ".join(units[col[k]] for k in keys))
PY
    if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
      # where each expert kernel's warps stall, per SASS instruction (ncu_source_summary.py)
      timed "ncu source $m T=$tk" "$LOGS/ncu.log" sh -c "exec env MOEKIT_EXPERTS_KERNEL='$PROFILE_KERNEL' ncu --clock-control none \
        --section SourceCounters --section WarpStateStats -k regex:experts --launch-count 3 \
        --page source --csv --print-source sass '$MOEKIT' run --device cuda --model $m --tokens $tk \
        ${PROFILE_ARGS:-} >'$LOGS/ncu_source_${m}_$tk.csv'"
      python3 scripts/ncu_source_summary.py "$LOGS/ncu_source_${m}_$tk.csv" >>"$OUT/ncu_source.txt"
    fi
  done; done
fi

note "total $(( $(date +%s) - t_start )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$LOGS"
