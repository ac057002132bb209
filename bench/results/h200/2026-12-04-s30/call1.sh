#!/usr/bin/env bash
# Session 30 call 1: the tree as committed (warp-wide MX path vote): the MX GPU tests, moekit run
# of MiniMax-M3 on MXFP8, memcheck + racecheck on GpuMxSmall, the MX layer benches beside bf16.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $OUT/build_summary.txt; stamp build; tail -3 $OUT/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests; M=build-gpu/moekit
( time timeout 120 $T --gtest_filter='*Mx*:*mxfp*' --gtest_brief=1 ) > $OUT/gpu_tests_mx.txt 2>&1
stamp "mx tests rc=$?"; grep -E "FAILED|Failure|PASSED" $OUT/gpu_tests_mx.txt | head; tail -4 $OUT/gpu_tests_mx.txt
( timeout 90 $M run --device cuda --model minimax-m3 --expert-dtype mxfp8 --tokens 1 ) > $OUT/run_minimax_mxfp8.txt 2>&1
stamp "run rc=$?"; tail -5 $OUT/run_minimax_mxfp8.txt
for tool in memcheck racecheck; do
  ( timeout 100 compute-sanitizer --tool $tool --print-limit 100 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*' --gtest_brief=1 ) > $R/${tool}_mx.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/${tool}_mx.txt | tail -3
done
cat $R/memcheck_mx.txt $R/racecheck_mx.txt > $OUT/sanitizers_mx.txt
for spec in "gpt-oss-120b mxfp4" "gpt-oss-120b bf16" "minimax-m3 mxfp8" "minimax-m3 bf16"; do
  set -- $spec
  ( timeout 100 $M bench --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --json ) > $OUT/bench_$1_$2.json 2> $R/bench_$1_$2.err
  stamp "bench $1 $2 rc=$?"
done
python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{r['model']:14s} {r.get('dtype','?'):6s} T={r['batch']:4d} fuse={r.get('fuse_shared')} "
              f"us={r['us_per_layer']:9.1f} floor={r['floor_us']:8.1f} bw={r['bw_fraction']:.3f}")
PY
