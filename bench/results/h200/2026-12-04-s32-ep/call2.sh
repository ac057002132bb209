#!/usr/bin/env bash
# Session 32 call 2: the pack of many CTAs per destination (token groups of 8), the bench's layer
# sized per batch: the EP GPU tests, memcheck (NCCL's own probing of kernel images at init is a
# handled API error: the one-GPU NCCL tests run with API errors unreported, the rest with them),
# racecheck (the router on the naive kernel where the tables give cuBLAS, as gpu_check.sh), the
# EP bench over the local transport, and the NCCL bench's answer on one GPU.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $OUT/summary.txt; }
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
NCCL_DIR=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library -DMOEKIT_NCCL_DIR=$NCCL_DIR"
R=/tmp/res; mkdir -p $R
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cat $R/b/summary.txt >> $OUT/summary.txt
T=build-gpu/tests/moekit_cuda_tests; M=build-gpu/moekit
stamp build
( time timeout 120 $T --gtest_filter='Ep*:Models/Ep*' ) > $OUT/ep_tests.txt 2>&1
stamp "ep tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|tests ran" $OUT/ep_tests.txt | head -12 >> $OUT/summary.txt
naive=$R/router_without_cublas.json
echo '{"rows":[{"dtype":"BF16","backend":"naive","k":0,"n":0,"m_min":49,"m_max":1048576},
  {"dtype":"F32","backend":"naive","k":0,"n":0,"m_min":17,"m_max":1048576}]}' > $naive
F='Models/EpGpu.LocalTransport*/deepseek_v3:Models/EpGpu.LocalTransport*/qwen2_57b_a14b:Models/EpGpu.LocalTransport*/gpt_oss_120b:EpLocalErrors.*'
san() {  # san NAME ENV TOOL_ARGS FILTER
  ( env $2 timeout 150 compute-sanitizer $3 --print-limit 30 --error-exitcode 9 $T --gtest_filter="$4" --gtest_brief=1 ) > $R/$1.txt 2>&1
  stamp "$1 rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/$1.txt | tail -3 >> $OUT/summary.txt
}
san memcheck_local "MOEKIT_X=0" "--tool memcheck" "$F"
san memcheck_nccl "MOEKIT_X=0" "--tool memcheck --report-api-errors no" "EpNcclOneGpu.*"
san racecheck_local "MOEKIT_TUNING_FILE=$naive" "--tool racecheck" "$F"
san synccheck_local "MOEKIT_X=0" "--tool synccheck" "$F"
cat $R/memcheck_local.txt $R/memcheck_nccl.txt $R/racecheck_local.txt $R/synccheck_local.txt > $OUT/sanitizers_ep.txt
for spec in "deepseek-v3 2" "qwen3-30b-a3b 2" "qwen3-30b-a3b 4"; do
  set -- $spec
  ( timeout 90 $M bench --model $1 --ep $2 --ep-transport local --batch 1,8,32,128,512,2048 --json ) > $OUT/bench_ep_local_$1_w$2.json 2> $R/bench_$1_$2.err
  stamp "bench ep local $1 W=$2 rc=$?"; tail -3 $R/bench_$1_$2.err >> $OUT/summary.txt
done
$M bench --model deepseek-v3 --ep 2 --ep-transport local --batch 1,32 >> $OUT/summary.txt 2>&1; stamp "table rc=$?"
$M bench --model deepseek-v3 --ep 2 --batch 1 >> $OUT/summary.txt 2>&1; stamp "bench --ep 2 nccl rc=$?"
