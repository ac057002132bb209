#!/usr/bin/env bash
# Session 30 call 4: the MXFP4 layout of one rotation and one mask a bf16 pair (pair 3: two),
# the tree as committed otherwise: the MX GPU tests (both paths, the widening, every MXFP4
# instance), memcheck on the small MX tests, gpt-oss-120b in MXFP4 beside bf16 at decode
# batches and at 1024 tokens (the plan's MX prefill path).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p /tmp/cutlass && tar -xJf build-ab/cutlass.tar.xz -C /tmp/cutlass
export MOEKIT_CMAKE_ARGS="-DMOEKIT_CUTLASS_DIR=/tmp/cutlass/cutlass_library"
R=/tmp/res; mkdir -p $R
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
STAGES=build OUT=$R/b bash scripts/gpu_check.sh > $R/build_stage.txt 2>&1
stamp build; tail -3 $R/b/summary.txt
T=build-gpu/tests/moekit_cuda_tests; M=build-gpu/moekit
( time timeout 120 $T --gtest_filter='GpuMx*:GpuPrefillMx*:*mxfp4*' --gtest_brief=1 ) > $OUT/gpu_tests_mx.txt 2>&1
stamp "mx tests rc=$?"; grep -E "FAILED|Failure|PASSED" $OUT/gpu_tests_mx.txt | head -20; tail -4 $OUT/gpu_tests_mx.txt
( timeout 60 compute-sanitizer --tool memcheck --print-limit 100 --error-exitcode 9 $T --gtest_filter='GpuMxSmall.*:GpuPrefillMxSmall.*' --gtest_brief=1 ) > $OUT/memcheck_mx.txt 2>&1
stamp "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck_mx.txt | tail -3
for dtype in mxfp4 bf16; do
  ( timeout 60 $M bench --device cuda --model gpt-oss-120b --dtype $dtype --batch 1,8,32,128,1024 --json ) > $OUT/bench_gpt-oss-120b_$dtype.json 2> $R/bench_$dtype.err
  stamp "bench $dtype rc=$?"; tail -2 $R/bench_$dtype.err
done
python3 - $OUT <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    try: recs = json.load(open(f))
    except Exception as e: print(os.path.basename(f), "unreadable", e); continue
    for r in recs:
        print(f"{r['model']:13s} {r.get('dtype','?'):6s} T={r['batch']:5d} us={r['us_per_layer']:9.1f} "
              f"bw={r['bw_fraction']:.3f} peak={r.get('peak_fraction',0):.3f} | {r['plan'][:120]}")
PY
