#!/usr/bin/env bash
# Session 32 call 1: expert parallelism's NCCL path on one H200: build with the machine's NCCL
# (the nvidia-nccl-cu13 wheel), the EP GPU tests, memcheck + racecheck on the small EP tests, the
# EP bench over the local transport (two and four ranks on one GPU) and the NCCL bench's answer on
# one GPU, then every other GPU test in the time left.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $OUT/summary.txt; }
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
NCCL_DIR=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
stamp "nccl wheel: $NCCL_DIR $(python3 -m pip show nvidia-nccl-cu13 2>/dev/null | grep ^Version)"
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library -DMOEKIT_NCCL_DIR=$NCCL_DIR"
R=/tmp/res; mkdir -p $R
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cat $R/b/summary.txt >> $OUT/summary.txt
tar -xzf $R/b/logs.tar.gz -C $R; grep -E "moekit: NCCL|error" $R/logs/build.log | head -20 >> $OUT/summary.txt
T=build-gpu/tests/moekit_cuda_tests; M=build-gpu/moekit
stamp build
( time timeout 200 $T --gtest_filter='Ep*:Models/Ep*' ) > $OUT/ep_tests.txt 2>&1
stamp "ep tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|tests ran" $OUT/ep_tests.txt | head -20 >> $OUT/summary.txt
F='Models/EpGpu.LocalTransport*/deepseek_v3:Models/EpGpu.LocalTransport*/qwen2_57b_a14b:EpNcclOneGpu.*:EpLocalErrors.*'
for tool in memcheck racecheck; do
  ( timeout 150 compute-sanitizer --tool $tool --print-limit 50 --error-exitcode 9 $T --gtest_filter="$F" --gtest_brief=1 ) > $R/${tool}_ep.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/${tool}_ep.txt | tail -3 >> $OUT/summary.txt
done
cat $R/memcheck_ep.txt $R/racecheck_ep.txt > $OUT/sanitizers_ep.txt
for spec in "deepseek-v3 2" "qwen3-30b-a3b 2" "qwen3-30b-a3b 4"; do
  set -- $spec
  ( timeout 60 $M bench --model $1 --ep $2 --ep-transport local --batch 1,8,32,128,512,2048 --json ) > $OUT/bench_ep_local_$1_w$2.json 2> $R/bench_$1_$2.err
  stamp "bench ep local $1 W=$2 rc=$?"; tail -3 $R/bench_$1_$2.err >> $OUT/summary.txt
done
$M bench --model deepseek-v3 --ep 2 --batch 1 >> $OUT/summary.txt 2>&1; stamp "bench --ep 2 nccl rc=$?"
python3 - $OUT >> $OUT/summary.txt <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_ep_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{r['model']:14s} W={r['world']} {r['mode']:11s} T={r['tokens_per_rank']:5d} fwd={r['us_per_forward']:8.1f} "
              f"route={r['route_us']:6.1f} home={r['home_us']:7.1f} pack={r['pack_us']:6.1f} cnt={r['counts_us']:6.1f} "
              f"disp={r['dispatch_us']:6.1f} remote={r['remote_us']:7.1f} ret={r['return_us']:6.1f} comb={r['combine_us']:6.1f} "
              f"1gpu={r['single_gpu_us']:8.1f} err={r['rel_error']:.2e} frac={r['link_fraction']:.3f}")
PY
left=$(( 570 - $(date +%s) + t0 ))
( time timeout $left $T --gtest_filter='-Ep*:Models/Ep*' --gtest_brief=1 ) > $OUT/gpu_tests_rest.txt 2>&1
stamp "rest of the gpu tests rc=$? (limit ${left}s)"; grep -E "FAILED|tests ran|PASSED" $OUT/gpu_tests_rest.txt | tail -8 >> $OUT/summary.txt
