#!/usr/bin/env bash
# Session 29 call 1: the MX instances (MXFP8, MXFP4) on the H200: build, the MX GPU tests and
# every instance's test, memcheck and racecheck on GpuMxSmall, then the layer bench of gpt-oss-120b
# (MXFP4 against bf16) and MiniMax-M3 (MXFP8 against bf16) side by side, with the read bandwidth.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
REPO=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
CUT=/tmp/cutlass/cutlass_library
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=$CUT"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
cp $R/b/summary.txt $R/build_summary.txt; tar -xzf $R/b/logs.tar.gz -C $R/b 2>/dev/null
grep -h -A4 "Compiling entry function.*12ExpertFormatE[23]E" $(find $R/b -name "build.log" -type f) 2>/dev/null | grep -E "Compiling|registers|spill|stack" | head -40 > $R/ptxas_mx.txt
rm -rf $R/b; stamp build; tail -3 $R/build_summary.txt
T=build-gpu/tests/moekit_cuda_tests
( time timeout 200 $T --gtest_filter='*Mx*:*mxfp*' --gtest_brief=1 ) > $R/gpu_tests_mx.txt 2>&1
stamp "mx tests"; grep -E "FAILED|Failure|PASSED|SKIPPED" $R/gpu_tests_mx.txt | head -20; tail -4 $R/gpu_tests_mx.txt
for tool in memcheck racecheck; do
  ( timeout 100 compute-sanitizer --tool $tool --print-limit 100 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*' --gtest_brief=1 ) > $R/${tool}_mx.txt 2>&1
  stamp "$tool rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/${tool}_mx.txt | tail -3
done
M=build-gpu/moekit
for spec in "gpt-oss-120b mxfp4" "gpt-oss-120b bf16" "minimax-m3 mxfp8" "minimax-m3 bf16"; do
  set -- $spec
  ( timeout 150 $M bench --device cuda --model $1 --dtype $2 --batch 1,8,32,128 --json ) > $R/bench_$1_$2.json 2> $R/bench_$1_$2.err
  stamp "bench $1 $2 rc=$?"
done
python3 - $R <<'PY' > $R/table.txt
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{r['model']:14s} {r.get('dtype','?'):6s} T={r['batch']:4d} fuse={r.get('fuse_shared')} "
              f"us={r['us_per_layer']:9.1f} floor={r['floor_us']:8.1f} bw={r['bw_fraction']:.3f} "
              f"bytes={r['touched_bytes']/1e6:8.1f}MB")
PY
cat $R/table.txt
tar -czf $OUT/res.tgz -C $R .
cp $R/table.txt $R/gpu_tests_mx.txt $R/memcheck_mx.txt $R/racecheck_mx.txt $R/ptxas_mx.txt $R/build_summary.txt $OUT/
